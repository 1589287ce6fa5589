"""Progress of a long audit on stderr: what it reads, then how far Spark is with it.

Spark's own console progress bar names stages a user cannot place, and draws over itself even where
stderr is a file. This prints the input first (files, bytes), then, while Spark works, the tasks
its jobs have done: on a terminal one line redrawn in place, elsewhere (a log, a pipe) a line each
time it changed, at most every PERIOD seconds, and once more at the end. A look counts the jobs that
started and ended since the last one as well as the running ones: an audit of small jobs spends
much of its time between jobs, where a look at the running ones alone can see nothing all along.
"""
from __future__ import annotations

import sys
import threading
from typing import TextIO

from pyspark import SparkContext

PERIOD = 1.0  # seconds between looks at Spark's status


class Progress:
    """Reports Spark's running jobs on `out` from a thread, between `with` and its end."""

    def __init__(self, context: SparkContext, what: str, out: TextIO = sys.stderr) -> None:
        self.tracker, self.what, self.out = context.statusTracker(), what, out
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._report, name="audit-progress", daemon=True)
        self.terminal = out.isatty()
        self.ended: set[int] = set()  # jobs counted in a look when they had ended, and the context's earlier ones
        self.before = 0  # how many of `ended` are earlier ones
        self.last = ""

    def __enter__(self) -> Progress:
        self._show(f"reading {self.what}")
        self.ended.update(self.tracker.getJobIdsForGroup())  # an earlier audit's, in the same context
        self.before = len(self.ended)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()
        self._look()
        if self.terminal:
            self.out.write("\n")
            self.out.flush()

    def _report(self) -> None:
        while not self.done.wait(PERIOD):
            self._look()

    def _look(self) -> None:
        """One line for the jobs running now or ended since the last look: their tasks done and in all,
        numbered by how many jobs this audit has run so far."""
        total = finished = running = 0
        for job in set(self.tracker.getJobIdsForGroup()) - self.ended:
            info = self.tracker.getJobInfo(job)
            if info is None:
                continue
            live = info.status == "RUNNING"
            if live:
                running += 1
            else:
                self.ended.add(job)
            for stage in (self.tracker.getStageInfo(s) for s in info.stageIds):
                # An ended job's stage that ran no task was skipped (its shuffle output was already there).
                if stage is not None and (live or stage.numCompletedTasks):
                    total += stage.numTasks
                    finished += stage.numCompletedTasks
        line = f"Spark job {len(self.ended) - self.before + running}: {finished:,}/{total:,} tasks"
        if total and line != self.last:
            self._show(line)
            self.last = line

    def _show(self, line: str) -> None:
        text = f"haqueue audit: {line}"
        self.out.write(f"\r{text:<79}" if self.terminal else text + "\n")
        self.out.flush()
