"""Progress of a long audit on stderr: what it reads, then how far Spark is with it.

Spark's own console progress bar names stages a user cannot place, and draws over itself even where
stderr is a file. This prints the input first (files, bytes), then, while Spark works, the tasks
its running jobs have done: on a terminal one line redrawn in place, elsewhere (a log, a pipe) a
line each time it changed, at most every PERIOD seconds.
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
        self.context, self.what, self.out = context, what, out
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._report, name="audit-progress", daemon=True)
        self.terminal = out.isatty()

    def __enter__(self) -> Progress:
        self._show(f"reading {self.what}")
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()
        if self.terminal:
            self.out.write("\n")
            self.out.flush()

    def _report(self) -> None:
        tracker = self.context.statusTracker()
        last = ""
        seen: set[int] = set()
        while not self.done.wait(PERIOD):
            total = finished = 0
            for job in tracker.getActiveJobsIds():
                seen.add(job)
                info = tracker.getJobInfo(job)
                for stage in (tracker.getStageInfo(s) for s in (info.stageIds if info else ())):
                    if stage is not None:
                        total += stage.numTasks
                        finished += stage.numCompletedTasks
            if total:
                line = f"Spark job {len(seen)}: {finished:,}/{total:,} tasks"
                if line != last:
                    self._show(line)
                    last = line

    def _show(self, line: str) -> None:
        text = f"haqueue audit: {line}"
        self.out.write(f"\r{text:<79}" if self.terminal else text + "\n")
        self.out.flush()
