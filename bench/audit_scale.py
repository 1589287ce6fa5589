#!/usr/bin/env python3
"""Scale benchmark of `haqueue audit lag`: generate an event set of --events events (default 10 million)
shaped like a real cluster's, convert it to Parquet (haqueue/audit/columnar.py), and audit it round by
round, every set-up once a round in an order rotated each round (this machine's speed drifts up to 1.7x
from minute to minute): the JSON lines and the Parquet files on `local[*]`, and with --workers the Parquet
files on a Spark standalone master with 1 and 2 one-core workers started from the pyspark package. Each
audit runs in a process of its own (a fresh JVM); audit s is reading, every table, the chart and the
summary, the Spark session's start apart. Checks the planted answers every time and appends a section
to bench/RESULTS.md.

The set: 4 queues on b0 (primary, epoch 1) with backups b1 and b2, 50,000 msg/s; halfway b0 dies,
b1 takes over (epoch 2) and b0 returns as a backup. Each message is enqueued, confirmed and dequeued
on its primary and replicated and dequeued on both backups: 7 events. Planted: 3 confirmed
messages b2 never received, 2 that b1 received twice.

    .venv/bin/python bench/audit_scale.py [--events 10000000] [--rounds 3] [--workers [--only-workers]] [--warm]
        [--dir DIR] [--no-record]
    .venv/bin/python bench/audit_scale.py --run DIR [--master URL] [--profile]   # one audit; --profile: each
        Spark action's wall time, jobs, tasks and task CPU, from Spark's event log
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO, Sequence

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from cpu_cap import CpuCap  # noqa: E402
from run import CLK_TCK, free_port, loadavg, machine_busy_ticks, rotated  # noqa: E402  bench/run.py, stdlib only

RESULTS = BENCH / "RESULTS.md"
T0 = 1_800_000_000_000_000
GAP_US = 20  # 50,000 messages a second
EVENTS_PER_MESSAGE = 7
MISSING_ON_B2, DUPLICATED_ON_B1 = (1001, 2002, 3003), (4004, 5005)
PART_BYTES = 256 * 1024 * 1024
EXECUTOR_MEMORY = "2g"  # each standalone worker's executor: a 1-core one holds the whole cache


class Files:
    """One broker process's log, rotated by size like the real writer's."""

    def __init__(self, directory: Path, broker: str, run: int) -> None:
        self.directory, self.broker, self.run = directory, broker, run
        self.part, self.size, self.n = 0, 0, 0
        self.file: BinaryIO | None = None
        self.buffer: list[str] = []

    def line(self, t: int, event: str, role: str, epoch: int, rest: str) -> None:
        self.n += 1
        self.buffer.append(f'{{"t":{t},"event":"{event}","broker":"{self.broker}","role":"{role}","epoch":{epoch},'
                           f'"run":{self.run},"n":{self.n}{rest}}}\n')
        if len(self.buffer) >= 50_000:
            self.flush()

    def flush(self) -> None:
        data = "".join(self.buffer).encode()
        self.buffer.clear()
        file = self.file
        if file is None or self.size >= PART_BYTES:
            if file is not None:
                file.close()
            self.part += 1
            file = self.file = open(self.directory / f"{self.broker}-r{self.run}-{self.part:06d}.jsonl", "wb")
            self.size = 0
        file.write(data)
        self.size += len(data)

    def close(self) -> None:
        self.flush()
        if self.file is not None:
            self.file.close()


def generate(directory: Path, events: int) -> int:
    """Write the set; returns the number of messages."""
    messages = events // EVENTS_PER_MESSAGE
    half = messages // 2
    logs = {"b0": Files(directory, "b0", 1), "b1": Files(directory, "b1", 2), "b2": Files(directory, "b2", 3)}
    b0_again = Files(directory, "b0", 4)
    next_mark = {name: T0 for name in ("b0", "b1", "b2", "b0 again")}
    for i in range(messages):
        epoch = 1 if i < half else 2
        primary, backups = (logs["b0"], (logs["b1"], logs["b2"])) if epoch == 1 else \
            (logs["b1"], (logs["b2"], b0_again))
        failover_pause = 0 if epoch == 1 else 2_000_000  # two seconds without traffic
        t = T0 + i * GAP_US + failover_pause
        q = i % 4
        seq = (i // 4 + 1) if epoch == 1 else (2 << 40) + (i - half) // 4 + 1
        message = f',"queue":"q{q}","uid":"u{q}","seq":{seq},"message_id":"m-{i}"'
        primary.line(t, "enqueue", "primary", epoch, message)
        ready = '"b1","b2"' if epoch == 1 else '"b2","b0"'
        for k, backup in enumerate(backups):
            if backup.broker == "b2" and i in MISSING_ON_B2:
                continue
            lag_us = 150 + (i * 7919 + k * 104_729) % 900 + (4000 if i % 50_000 < 500 else 0)
            copies = 2 if backup.broker == "b1" and i in DUPLICATED_ON_B1 else 1
            for _ in range(copies):
                backup.line(t + lag_us, "replicate", "backup", epoch, message + f',"mode":"live","enqueued":{t}')
        primary.line(t + 1200, "complete", "primary", epoch, message + f',"backups":[{ready}]')
        primary.line(t + 5000, "dequeue", "primary", epoch, message)
        for backup in backups:
            backup.line(t + 5300, "dequeue", "backup", epoch, message)
        for name, log in (("b0", logs["b0"]), ("b1", logs["b1"]), ("b2", logs["b2"]), ("b0 again", b0_again)):
            if t >= next_mark[name] and (name != "b0" or epoch == 1) and (name != "b0 again" or epoch == 2):
                role = "primary" if log is primary else "backup"
                log.line(t, "mark", role, epoch, "")
                next_mark[name] = t + 1_000_000
    end = T0 + messages * GAP_US + 2_000_000 + 2_000_000
    for log, role in ((logs["b1"], "primary"), (logs["b2"], "backup"), (b0_again, "backup")):
        log.line(end, "mark", role, 2, "")
    for log in (*logs.values(), b0_again):
        log.close()
    return messages


# ---- one audit, in a process of its own ---------------------------------------------------------

def audit_once(events: str, master: str | None, profile: bool, extra: dict[str, str] | None = None,
               warm: bool = False) -> dict:
    """Audit `events` on `master` (None: local[*]) with the session settings `extra`; its times, task CPU
    (Spark's event log) and the check. warm: then audit them again in the same session (`warm_s`): the JVMs'
    compilers have done their work, the executors are up; the figures are the first audit's, the check both's."""
    from haqueue.audit import lag, report, sources
    from haqueue.audit.storage import Storage

    scratch = Path(tempfile.mkdtemp(prefix="haqueue-audit-run-"))
    (scratch / "log").mkdir()
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{scratch}/log",
            "spark.eventLog.compress": "false", "spark.executor.memory": EXECUTOR_MEMORY, **(extra or {})}
    try:
        started = time.monotonic()
        spark = sources.session(master, conf, size=sources.input_size(events))  # as `haqueue audit lag` sizes it
        session_s = time.monotonic() - started
        started, busy, begun = time.monotonic(), machine_busy_ticks(), time.time() * 1000  # ms, as the event log's
        audit = lag.analyse(spark, events)
        Storage(spark).write(str(scratch / "out"), report.outputs(audit))
        audit_s = time.monotonic() - started
        busy_cores = (machine_busy_ticks() - busy) / CLK_TCK / audit_s
        warm_s, first_ends, ok = None, time.time() * 1000, planted_found(audit)  # ms, as the event log's times
        if warm:
            started = time.monotonic()
            again = lag.analyse(spark, events)
            Storage(spark).write(str(scratch / "warm"), report.outputs(again))
            warm_s = time.monotonic() - started
            ok = ok and planted_found(again)
        jvm = jvm_threads_cpu(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore
        spark.stop()
        actions = [a for a in spark_actions(scratch / "log") if a["start"] < first_ends]
        if profile:
            print(report.summary(audit))
            for a in actions:
                print(f"{(a['start'] - begun) / 1000:6.1f}-{(a['end'] - begun) / 1000:5.1f} s {a['wall_s']:6.1f} s  "
                      f"{a['jobs']:3d} jobs {a['tasks']:5d} tasks  task CPU {a['cpu_s']:6.1f} s  GC {a['gc_s']:5.1f} s  "
                      f"{a['what']}")
            print("JVM CPU s by thread: " + ", ".join(f"{kind} {cpu:.1f}" for kind, cpu in
                                                      sorted(jvm.items(), key=lambda item: -item[1])))
        return {"events": audit.totals["events"], "summary": report.summary(audit), "session_s": session_s,
                "audit_s": audit_s, "warm_s": warm_s,
                "task_cpu_s": sum(a["cpu_s"] for a in actions), "gc_s": sum(a["gc_s"] for a in actions),
                "actions": len(actions),
                "jobs": sum(a["jobs"] for a in actions), "jvm_cpu_s": sum(jvm.values()), "busy_cores": busy_cores,
                "ok": ok}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# The JVM's threads by kind, from the first characters of their names (Linux keeps 15).
THREAD_KINDS = (("C2 Compiler", "C2"), ("C1 Compiler", "C1"), ("Executor task", "tasks"), ("GC Thread", "GC"),
                ("ParGC", "GC"), ("Thread-", "driver (Py4J)"), ("java", "main"))


def jvm_threads_cpu(pid: int) -> dict[str, float]:
    """CPU-s (user + system) of the JVM `pid`'s live threads so far, by kind (THREAD_KINDS, else "other"), as
    /proc counts it, and those of the threads that ended ("ended"): the whole cost of an audit in its JVM, which
    Spark's task CPU leaves out (compilers, planning)."""
    cpu: dict[str, float] = {}

    def ticks(stat: Path) -> int:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    whole = ticks(Path(f"/proc/{pid}/stat")) / CLK_TCK
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, used = (task / "comm").read_text().strip(), ticks(task / "stat") / CLK_TCK
        except OSError:  # the thread ended meanwhile
            continue
        kind = next((k for prefix, k in THREAD_KINDS if name.startswith(prefix)), "other")
        cpu[kind] = cpu.get(kind, 0.0) + used
    cpu["ended"] = max(0.0, whole - sum(cpu.values()))
    return cpu


def planted_found(audit: Any) -> bool:
    """Whether `audit` (a lag.Audit) found what generate planted, and nothing else."""
    b = audit.backups.groupby("backup").sum(numeric_only=True)
    return bool(b["missing"].sum() == 3 and b.loc["b2", "missing"] == 3 and b["duplicates"].sum() == 2
                and b.loc["b1", "duplicates"] == 2 and b["order_violations"].sum() == 0
                and b["dequeues_not_mirrored"].sum() == 0 and audit.totals["bad_lines"] == 0)


def spark_actions(log: Path) -> list[dict]:
    """Each SQL execution (a Spark action) of the event log in `log`: wall s, jobs, tasks, task CPU s, call site."""
    actions: dict[int, dict] = {}
    stage_action: dict[int, int] = {}
    files = sorted((f for f in log.rglob("events_*") if not f.name.endswith(".crc")),
                   key=lambda f: int(f.name.split("_")[1]))  # a rolling log: events_1_APP, events_2_APP...
    for line in (line for f in files for line in f.read_text().splitlines()):
        e = json.loads(line)
        kind = e["Event"]
        if kind.endswith("SQLExecutionStart"):
            actions[e["executionId"]] = {"what": e["description"], "start": e["time"], "end": e["time"], "jobs": 0,
                                         "tasks": 0, "cpu_s": 0.0, "gc_s": 0.0}
        elif kind.endswith("SQLExecutionEnd") and e["executionId"] in actions:
            actions[e["executionId"]]["end"] = e["time"]
        elif kind == "SparkListenerJobStart":
            action = e.get("Properties", {}).get("spark.sql.execution.id")
            if action is not None and int(action) in actions:
                actions[int(action)]["jobs"] += 1
                stage_action.update((stage, int(action)) for stage in e["Stage IDs"])
        elif kind == "SparkListenerTaskEnd" and e["Stage ID"] in stage_action:
            action = actions[stage_action[e["Stage ID"]]]
            action["tasks"] += 1
            metrics = e.get("Task Metrics") or {}
            action["cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
            action["gc_s"] += metrics.get("JVM GC Time", 0) / 1e3
    return [{**a, "wall_s": (a["end"] - a["start"]) / 1000} for _, a in sorted(actions.items())]


# ---- a standalone cluster ------------------------------------------------------------------------

class Standalone:
    """A Spark standalone master and `workers` one-core workers, started from the pyspark package's own
    spark-class on loopback ports chosen free, their logs and work directories under `directory`. cpu: each
    worker and the executor it starts get this share of one core between them (cpu_cap.py), standing for a
    worker machine of its own; None: uncapped."""

    def __init__(self, workers: int, directory: Path, cpu: float | None = None) -> None:
        import pyspark

        home = Path(pyspark.__file__).parent
        directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(directory)}
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.caps = [CpuCap(f"haqueue-bench-{os.getpid()}-{workers}-{i}", cpu) for i in range(workers)] if cpu else []
        self.processes = [self._start(home, env, directory / "master.log", "org.apache.spark.deploy.master.Master",
                                      "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui))]
        for i in range(workers):
            self.processes.append(self._start(
                home, env, directory / f"worker{i}.log", "org.apache.spark.deploy.worker.Worker", "--host",
                "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
                "--memory", "3g", "--work-dir", str(directory / f"work{i}"), self.url,
                prefix=self.caps[i].prefix() if self.caps else []))
        deadline = time.monotonic() + 120
        while self._alive_workers() < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"standalone cluster not up; see {directory}/*.log")
            time.sleep(0.5)

    @staticmethod
    def _start(home: Path, env: dict, log: Path, *args: str, prefix: Sequence[str] = ()) -> subprocess.Popen:
        with open(log, "wb") as out:
            return subprocess.Popen([*prefix, str(home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                    stderr=subprocess.STDOUT)

    def _alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except OSError:
            return 0

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for cap in self.caps:
            cap.remove()


# ---- the rounds ----------------------------------------------------------------------------------

def run_setup(events: Path, master: str | None, warm: bool = False) -> dict:
    """One audit in a process of its own (warm: and then another, audit_once): what audit_once returned, or
    {"error": ...}."""
    load = float(loadavg().split()[0])  # the machine's 1-minute load average as the audit starts
    command = ([sys.executable, __file__, "--run", str(events)] + (["--master", master] if master else [])
               + (["--warm"] if warm else []))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH.parent), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return {**json.loads(line[len("RESULT "):]), "load": load}
    last = done.stderr.strip().splitlines()[-1:] or done.stdout[-500:]
    return {"load": load, "error": f"exit {done.returncode}: {last}"}


def prime_class_archive(events: Path) -> None:
    """If the driver JVM's class archive (haqueue/audit/class_archive.py) is not made yet, an audit of `events`, not
    counted, makes it (run_setup waits for its JVM to write it as it exits): every audit counted then starts as a
    user's second audit does, whatever the order of the set-ups."""
    from haqueue.audit import class_archive

    if class_archive.java_options().startswith("-XX:ArchiveClassesAtExit="):
        print("the driver JVM's class archive is not made yet: one audit, not counted, makes it", flush=True)
        run_setup(events, None)


def convert(source: Path, target: Path) -> tuple[float, int]:
    """Every event file of `source` converted into `target` (columnar.convert): (seconds, bytes written)."""
    from haqueue.audit import columnar, parts

    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for log in sorted(source.glob("*.jsonl")):
        columnar.convert(str(log), str(target / (log.stem + parts.PARQUET)))
    return time.monotonic() - started, sum(f.stat().st_size for f in target.iterdir())


def made_set(base: Path, events: int) -> tuple[int, int, float, int]:
    """The set of `events` events in base/events and base/parquet: (messages, JSON bytes, conversion s, Parquet
    bytes). Made there, and its facts noted in base/set.json, unless an earlier run made it."""
    facts = base / "set.json"
    if facts.exists() and json.loads(facts.read_text())["events"] == events:
        made = json.loads(facts.read_text())
        return made["messages"], made["json_bytes"], made["convert_s"], made["parquet_bytes"]
    for directory in (base / "events", base / "parquet"):
        shutil.rmtree(directory, ignore_errors=True)
    (base / "events").mkdir(parents=True)
    messages = generate(base / "events", events)
    json_bytes = sum(f.stat().st_size for f in (base / "events").iterdir())
    convert_s, parquet_bytes = convert(base / "events", base / "parquet")
    facts.write_text(json.dumps({"events": events, "messages": messages, "json_bytes": json_bytes,
                                 "convert_s": convert_s, "parquet_bytes": parquet_bytes}))
    return messages, json_bytes, convert_s, parquet_bytes


def answers(results: list[dict]) -> str:
    """The planted answers cell of a set-up's runs: how many found them, and each run's error."""
    ok = [r for r in results if "error" not in r]
    return f"{sum(r['ok'] for r in ok)} of {len(results)} found" + "".join(
        f"; {r['error']}" for r in results if "error" in r)


def med_range(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"


def section(command: str, setups: dict[str, str], runs: dict[str, list[dict]], facts: dict) -> str:
    """The RESULTS.md section of a run."""
    warm = any(r.get("warm_s") for rs in runs.values() for r in rs)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Audit: JSON lines vs Parquet, local vs standalone workers (bench/audit_scale.py), {date}", "",
             "```", command, "```", "",
             f"{facts['events']:,} events ({facts['messages']:,} messages), "
             f"JSON lines {facts['json_bytes'] / 1e9:.2f} GB, "
             f"converted to Parquet ({facts['parquet_bytes'] / 1e6:.0f} MB) by `columnar.convert` in "
             f"{facts['convert_s']:.0f} s, one process ({facts['events'] / facts['convert_s']:,.0f} lines/s). "
             f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; load average at the start "
             f"{facts['load'][0]}, at the end {loadavg()}. Each audit in a fresh process and JVM, set-ups in an "
             "order rotated each round; audit s = reading, every table, the chart and the summary (the session's "
             "start apart); task CPU = Spark's executor CPU time over every task (its event log); JVM CPU = the "
             "driver JVM's own, compilers and planning included, session start included (/proc); busy = cores the "
             "whole machine used during the audit (the audit's own and everyone else's); load at start = the "
             "machine's 1-minute load average as each audit started (other work on the machine included)."
             + (" Warm s: a second audit of the same files in the same process, once the JVMs' compilers have "
                "done their work and the executors are up." if warm else ""), "",
             "| set-up | master | audit s | events/s | task CPU s | JVM CPU s | busy cores | load at start | "
             "session s | Spark actions / jobs | planted answers | summary as the JSON lines' |" + (" warm s |" if warm else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if warm else "")]
    reference = next((r["summary"] for r in runs.get("jsonl", []) if "error" not in r), None)
    for name, master in setups.items():
        ok = [r for r in runs[name] if "error" not in r]
        same = f"{sum(r['summary'] == reference for r in ok)} of {len(ok)}" if reference else "—"
        figures = [med_range([r["audit_s"] for r in ok]), med_range([r["events"] / r["audit_s"] for r in ok], 0),
                   med_range([r["task_cpu_s"] for r in ok]), med_range([r["jvm_cpu_s"] for r in ok]),
                   med_range([r["busy_cores"] for r in ok], 2),
                   med_range([r["load"] for r in runs[name]]), med_range([r["session_s"] for r in ok]),
                   f"{ok[0]['actions']} / {ok[0]['jobs']}" if ok else "—"]
        lines.append(f"| {name} | {master} | " + " | ".join(figures) + f" | {answers(runs[name])} | {same} |"
                     + (f" {med_range([r['warm_s'] for r in ok])} |" if warm else ""))
    lines += ["", "Ratios of audit s, round by round (median, min–max, each round's):", "",
              "| ratio | median (min–max) | per round |", "|---|---|---|"]
    for slow, fast in facts["pairs"]:
        pairs = [(a, b) for a, b in zip(runs[slow], runs[fast]) if "error" not in a and "error" not in b]
        for what, key in (("", "audit_s"), (", warm", "warm_s")) if warm else (("", "audit_s"),):
            ratios = [a[key] / b[key] for a, b in pairs]
            lines.append(f"| {slow} / {fast}{what} | {med_range(ratios, 2)} | " + " ".join(f"{x:.2f}" for x in ratios)
                         + " |")
    return "\n".join(lines) + "\n"


def append(text: str) -> None:
    """Append a section to RESULTS.md, read just now: another benchmark appends too."""
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    RESULTS.write_text(current.rstrip("\n") + "\n\n" + text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", action="store_true",
                    help="also audit the Parquet files on a standalone master with 1, then 2 one-core workers")
    ap.add_argument("--only-workers", action="store_true", help="with --workers: the standalone set-ups alone")
    ap.add_argument("--worker-cpu", type=float, metavar="CORES",
                    help="with --workers: each worker and its executor capped to this share of one core (root, a "
                         "cgroup each), standing for worker machines that do not share their cores with the driver")
    ap.add_argument("--warm", action="store_true",
                    help="each audit followed by a second in the same process (warm s): with --workers, whether the "
                         "work scales onto a second worker once the JVMs have warmed up")
    ap.add_argument("--dir", help="where the events go (default: a temporary directory); kept if given, and a set "
                                  "made there before for the same --events is used again")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    ap.add_argument("--run", metavar="DIR", help="audit DIR once in this process and print its figures")
    ap.add_argument("--master", help="with --run: the Spark master (default local[*])")
    ap.add_argument("--profile", action="store_true", help="with --run: each Spark action's figures")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="with --run: a Spark setting (as `haqueue audit lag --conf`)")
    args = ap.parse_args()
    if (args.only_workers or args.worker_cpu) and not args.workers:
        ap.error("--only-workers and --worker-cpu need --workers")
    if args.run:
        print("RESULT " + json.dumps(audit_once(args.run, args.master, args.profile,
                                                dict(c.split("=", 1) for c in args.conf), args.warm)), flush=True)
        return 0
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="haqueue-audit-scale-"))
    events_dir, parquet_dir = base / "events", base / "parquet"
    clusters: list[Standalone] = []
    try:
        load = loadavg(), None
        messages, json_bytes, convert_s, parquet_bytes = made_set(base, args.events)
        print(f"{messages:,} messages in {json_bytes / 1e9:.2f} GB of JSON lines, {parquet_bytes / 1e6:.0f} MB of "
              f"Parquet (converted in {convert_s:.0f} s)", flush=True)
        setups: dict[str, tuple[Path, str | None]] = ({} if args.only_workers else {"jsonl": (events_dir, None),
                                                                                   "parquet": (parquet_dir, None)})
        if args.workers:
            capped = f" of {args.worker_cpu:g} core" if args.worker_cpu else ""
            for workers in (1, 2):
                clusters.append(Standalone(workers, base / f"standalone{workers}", args.worker_cpu))
                setups[f"parquet, {workers} worker{'s' if workers > 1 else ''}{capped}"] = (parquet_dir,
                                                                                          clusters[-1].url)
        names = list(setups)
        prime_class_archive(parquet_dir)
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            for name in rotated(names, round_):
                result = run_setup(*setups[name], args.warm)
                runs[name].append(result)
                print(f"round {round_ + 1} {name} (load {result['load']:.1f}): " + (result.get("error") or
                      f"{result['audit_s']:.1f} s, {result['events'] / result['audit_s']:,.0f} events/s, task CPU "
                      f"{result['task_cpu_s']:.0f} s, busy {result['busy_cores']:.2f} cores, answers "
                      f"{'found' if result['ok'] else 'WRONG'}" + (f", warm {result['warm_s']:.1f} s" if result.get(
                          "warm_s") else "")), flush=True)
        events = next((r["events"] for rs in runs.values() for r in rs if "error" not in r), 0)
        pairs = (([] if args.only_workers else [("jsonl", "parquet")])
                 + ([(names[-2], names[-1])] if args.workers else []))
        text = section(" ".join(["bench/audit_scale.py", *sys.argv[1:]]), {n: m or "local[*]" for n, (_, m) in
                                                                           setups.items()}, runs,
                       {"events": events, "messages": messages, "json_bytes": json_bytes,
                        "parquet_bytes": parquet_bytes,
                        "convert_s": convert_s, "load": load, "pairs": pairs})
        print(text)
        if not args.no_record:
            append(text)
        return 0 if all(r.get("ok") for rs in runs.values() for r in rs) else 1
    finally:
        for cluster in clusters:
            cluster.stop()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
