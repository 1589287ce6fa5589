"""The audit's outputs: Parquet and CSV tables, the lag chart (PNG) and the text summary."""
from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import matplotlib.dates as mdates
import pandas as pd
from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global state

if TYPE_CHECKING:
    from .lag import Audit
    from .mirror_rpo import MirrorAudit

CHART = "lag.png"
SUMMARY = "summary.txt"


def outputs(audit: "Audit") -> Iterator[tuple[str, bytes]]:
    """(file name, contents) of every table as NAME.parquet and NAME.csv, the chart and the summary: made
    in memory, for storage.py to write on whatever file system --out is."""
    for name, table in audit.tables.items():
        parquet = io.BytesIO()
        table.to_parquet(parquet, index=False)
        yield f"{name}.parquet", parquet.getvalue()
        yield f"{name}.csv", table.to_csv(index=False).encode()
    png = io.BytesIO()
    chart(audit, png)
    yield CHART, png.getvalue()
    yield SUMMARY, (summary(audit) + "\n").encode()


def chart(audit: "Audit", path: str | IO[bytes]) -> None:
    """Lag over time, one line per backup (p99 per time bucket, max as a faint band), failovers marked."""
    fig = Figure(figsize=(11, 5), dpi=100)
    ax = fig.subplots()
    timeline = audit.timeline
    for i, (backup, points) in enumerate(timeline.groupby("backup", sort=True)):
        color = f"C{i}"
        points = _break_gaps(points, audit.totals.get("bucket_ms", 1000.0))
        ax.plot(points["time"], points["lag_p99_ms"], color=color, linewidth=1.4, label=f"{backup} p99",
                marker="o" if len(points) < 60 else None, markersize=3)
        ax.fill_between(points["time"], points["lag_p50_ms"], points["lag_max_ms"], color=color, alpha=0.15,
                        linewidth=0, label=f"{backup} p50–max")
    for _, epoch in audit.epochs.iloc[1:].iterrows():  # the first epoch's start is not a failover
        ax.axvline(epoch["first_event"], color="0.3", linestyle="--", linewidth=1)
        ax.annotate(f"epoch {epoch['epoch']}: {epoch['primary']} primary", (epoch["first_event"], 1.0),
                    xycoords=("data", "axes fraction"), xytext=(-12, -6), textcoords="offset points", fontsize=8,
                    rotation=90, ha="left", va="top")
    if timeline.empty:
        ax.text(0.5, 0.5, "no live replication in these events", transform=ax.transAxes, ha="center")
    else:
        if timeline["lag_max_ms"].max() > 100 * max(timeline["lag_p50_ms"].median(), 0.01):
            ax.set_yscale("log")  # a catch-up burst would flatten the usual lag to the axis
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.set_title("Replication lag per backup (backup receive − primary enqueue)")
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("lag (ms)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _break_gaps(points: pd.DataFrame, bucket_ms: float) -> pd.DataFrame:
    """A row of NaN wherever a backup received nothing for a while, so its line stops there
    instead of joining the two sides of a failover."""
    gaps = points["time"].diff() > pd.Timedelta(milliseconds=1.5 * bucket_ms)
    breaks = points.loc[gaps, ["time"]].assign(time=lambda f: f["time"] - pd.Timedelta(milliseconds=bucket_ms / 2))
    return pd.concat([points, breaks]).sort_values("time", ignore_index=True)


def summary(audit: "Audit") -> str:
    t = audit.totals
    lines = [f"haqueue audit: {t['events']:,} events from {t['brokers']} brokers, {_time(t['first'])} to "
             f"{_time(t['last'])} UTC; {t['judged']:,} in the window judged"]
    if t["bad_lines"]:
        counts = audit.bad_input.groupby("problem")["lines"].sum()
        lines.append(f"bad input: {_count(t['bad_lines'], 'line')} skipped ("
                     + ", ".join(f"{n:,} {problem}" for problem, n in counts.items()) + "; see bad_input.csv)")
    for _, e in audit.epochs.iterrows():
        primary = "no primary event" if pd.isna(e["primary"]) else \
            f"primary {e['primary']} {_time(e['first_event'])}–{_time(e['last_event'])}"
        lines.append(f"epoch {e['epoch']}: {primary}, "
                     f"{e['enqueued']:,} enqueued, {e['completed']:,} confirmed, {e['dequeued']:,} dequeued"
                     + (f" ({e['inherited_dequeued']:,} from earlier epochs)" if e["inherited_dequeued"] else "")
                     + (f"; {e['unattested']:,} unattested" if e["unattested"] else ""))
    for _, s in audit.shards.astype(object).iterrows():  # object: a row of numbers only would be floats
        lines.append(f"shard {s['shard']}: {_count(s['queues'], 'queue')}, {s['completed']:,} confirmed; "
                     f"{_count(s['backups'], 'backup')} received {s['received']:,}, lag p50 {_ms(s['lag_p50_ms'])} "
                     f"p99 {_ms(s['lag_p99_ms'])} max {_ms(s['lag_max_ms'])}; missing {s['missing']}, "
                     f"duplicates {s['duplicates']}")
    for _, q in audit.queues.iterrows():
        lines.append(f"queue {q['queue']}: {q['enqueued']:,} enqueued, {q['completed']:,} confirmed "
                     f"(completion p50 {_ms(q['completion_p50_ms'])} p99 {_ms(q['completion_p99_ms'])}), "
                     f"{q['dequeued']:,} dequeued"
                     + (f", {q['unattested']:,} unattested (held by backups, unknown to the primary's log)"
                        if q["unattested"] else "")
                     + (f", {q['at_risk']:,} at risk (confirmed while fewer than a majority held them)"
                        if q["at_risk"] else "")
                     + (f", {q['diverged']:,} diverged (kept aside at a rejoin)" if q["diverged"] else "")
                     + (f", {q['kept_aside']:,} kept aside at a rejoin (never confirmed as replicated)"
                        if q["kept_aside"] else ""))
        for _, b in audit.backups[audit.backups["queue"] == q["queue"]].iterrows():
            lines.append(f"  backup {b['backup']}: {b['received']:,} received ({b['catchup']:,} in catch-up), "
                         f"lag p50 {_ms(b['lag_p50_ms'])} p95 {_ms(b['lag_p95_ms'])} p99 {_ms(b['lag_p99_ms'])} "
                         f"max {_ms(b['lag_max_ms'])}; missing {b['missing']}, duplicates {b['duplicates']}, "
                         f"out of order {b['order_violations']}, dequeues not mirrored {b['dequeues_not_mirrored']}"
                         + (f", {b['unverified']} not verifiable" if b["unverified"] else ""))
    for _, q in audit.ledgers.iterrows():
        lines.append(f"ledgers, queue {q['queue']}: {q['confirmed']:,} confirmed by producers, {q['received']:,} "
                     f"received by consumers; lost {q['lost']}, duplicated {q['duplicated']}, "
                     f"unexpected {q['unexpected']}, {q['left_on_queue']:,} left on the queue"
                     + (f", {q['kept_local']:,} kept off the backups, gone with their broker (not lost)"
                        if q.get("kept_local") else ""))
    if audit.mirror is not None:
        lines += _mirror_lines(audit.mirror)
    return "\n".join(lines + _verdict(audit))


def _mirror_lines(mirror: "MirrorAudit") -> list[str]:
    """Per mirrored queue: what reached the standby, the recovery point (information, unless over --mirror-rpo-max),
    duplicates and the mirror's lag."""
    if mirror.queues.empty:
        return ["mirror: no queue of these events was applied on the standby (is --standby-events the standby's?)"]
    return [f"mirror, queue {q['queue']}: {q['confirmed']:,} confirmed at the source, {q['applied']:,} applied on the "
            f"standby; {_count(q['unmirrored'], 'confirmed message')} never on the standby at the end of the source's "
            f"log (the recovery point: lost with the source's site), at most {q['rpo_max_messages']:,} at risk at "
            f"once, for at most {q['rpo_max_s']:g} s; {q['duplicates']} duplicates; lag p50 {_ms(q['lag_p50_ms'])} "
            f"p99 {_ms(q['lag_p99_ms'])} max {_ms(q['lag_max_ms'])}" for _, q in mirror.queues.iterrows()]


def _verdict(audit: "Audit") -> list[str]:
    """The summary's last lines: each kind of loss or risk found, what cannot be told, or no loss."""
    over_rpo = _mirror_over_limit(audit)
    findings = [
        (audit.missing, f"LOSS: {_count(audit.missing, 'confirmed message')} missing on a ready backup "
                        f"(see problems.csv)"),
        (audit.lost, f"LOSS: {_count(audit.lost, 'confirmed message')} lost: never received by a consumer and not "
                     f"on the queue at the end (see ledger_problems.csv)"),
        (audit.at_risk, f"AT RISK: {_count(audit.at_risk, 'message')} confirmed while fewer than a majority of the "
                        f"cluster held them (ha.min_confirmations below a majority): a partition can lose such a "
                        f"message (see problems.csv)"),
        (audit.diverged, f"DIVERGED: {_count(audit.diverged, 'confirmed message')} kept aside by a rejoining broker, never on "
                         f"the new primary: `haqueue diverged list` / `republish` on that broker's data_dir "
                         f"(see problems.csv)"),
        (over_rpo, f"MIRROR RPO: {over_rpo}, over --mirror-rpo-max (see mirror_problems.csv)"),
        (audit.unattested, f"CANNOT TELL: {_count(audit.unattested, 'message')} held by backups with no record from "
                           f"the primary that sent them (its log lost its tail: a machine crash?), so loss there "
                           f"cannot be ruled out (see problems.csv)")]
    found = [line for count, line in findings if count]
    verdict = found or ["no loss: every confirmed message reached every backup that was ready"
                        + ("; every message producers had confirmed was received or is still queued"
                           if len(audit.ledgers) else "")]
    if audit.kept_aside:  # not a loss (no publisher was told they were safe), but a broker holds them in a file
        verdict.append(f"KEPT ASIDE: {_count(audit.kept_aside, 'message')} never confirmed as replicated, held by "
                       f"a rejoining broker and never on the new primary (a publisher may have sent it again): "
                       f"`haqueue diverged list` / `republish` on that broker's data_dir (see problems.csv)")
    return verdict


def _mirror_over_limit(audit: "Audit") -> str:
    """The queues whose messages were at risk of a site loss for longer than --mirror-rpo-max, said; else ''."""
    over = audit.mirror.over_limit if audit.mirror is not None else None
    if over is None or over.empty:
        return ""
    return "; ".join(f"queue {q['queue']}'s confirmed messages were at risk of a site loss for up to "
                     f"{q['rpo_max_s']:g} s" for _, q in over.iterrows())


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _ms(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:g} ms"


def _time(value: object) -> str:
    return "-" if value is None or pd.isna(value) else pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
