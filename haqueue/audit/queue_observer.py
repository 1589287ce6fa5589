"""The audit's C recorder as a queue's observer. A queue calls its observers through a compiled trait
(broker/queue.py's QueueObserver), which a C type cannot join: this compiled class does, and hands each call on."""
from __future__ import annotations

from ..broker.queue import Entry, Queue, QueueObserver
from ._lines import Recorder


class RecorderObserver(QueueObserver):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        self.recorder.enqueued(queue, entry)

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        self.recorder.dequeued(queue, entry)
