"""Progress of a long audit on stderr: what it reads, then how far Spark is with it.

Spark's own console progress bar names stages a user cannot place, and draws over itself even where
stderr is a file. This prints the input first (files, bytes), then, while Spark works, how many jobs
the audit has started and the tasks they have done of those they have started, all counted from the
audit's start, so that no figure ever goes down: on a terminal one line redrawn in place, elsewhere (a
log, a pipe) a line each time it changed, at most every PERIOD seconds, and once more at the end. A look
counts the jobs that started and ended since the last one as well as the running ones: an audit of small
jobs spends much of its time between jobs, where a look at the running ones alone can see nothing all along.
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
        self.ended_tasks = self.ended_finished = 0  # of the audit's jobs in `ended`
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
        """One line: the jobs this audit has started so far, and the tasks done of those in their stages that
        started. A stage counts once its tasks start: one Spark skips (its shuffle output already there) never
        does, and counted while its job ran, it would leave the total when the job ended."""
        total, finished, running = self.ended_tasks, self.ended_finished, 0
        for job in set(self.tracker.getJobIdsForGroup()) - self.ended:
            info = self.tracker.getJobInfo(job)
            if info is None:
                continue
            tasks = done = 0
            for stage in (self.tracker.getStageInfo(s) for s in info.stageIds):
                if stage is not None and (stage.numActiveTasks or stage.numCompletedTasks or stage.numFailedTasks):
                    tasks += stage.numTasks
                    done += stage.numCompletedTasks
            total, finished = total + tasks, finished + done
            if info.status == "RUNNING":
                running += 1
            else:
                self.ended.add(job)
                self.ended_tasks, self.ended_finished = self.ended_tasks + tasks, self.ended_finished + done
        jobs = len(self.ended) - self.before + running
        line = f"{jobs:,} Spark job{'' if jobs == 1 else 's'}, {finished:,}/{total:,} tasks"
        if total and line != self.last:
            self._show(line)
            self.last = line

    def _show(self, line: str) -> None:
        text = f"haqueue audit: {line}"
        self.out.write(f"\r{text:<79}" if self.terminal else text + "\n")
        self.out.flush()
