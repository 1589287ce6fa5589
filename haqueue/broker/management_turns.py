"""The turns management requests take (design/management.md, flow control of requests): a client's burst of
pipelined requests must not hold up the broker (a supervisor's health ping waited behind one and failed it
over), so requests wait at their link and are answered at the end of each pass, a link at a time, within a
time budget."""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Protocol, Sized

# Seconds of each pass spent answering waiting requests (at least one): a burst waits for later passes.
PASS_BUDGET = 0.01


class Waiting(Protocol):
    """What Turns needs of a link with requests waiting (management.ManagementEndpoint)."""

    @property
    def waiting(self) -> Sized:
        """Its requests not yet answered: none once it has detached."""

    def answer_next(self) -> None:
        """Answer its oldest waiting request."""


class Turns:
    """The endpoints with requests waiting, in the order their turns come: at the end of each pass
    (broker.schedule), each answers one request per round, for PASS_BUDGET (at least one request); what is
    left waits for the next pass, after the sockets. An endpoint whose request is its only one goes first,
    one with more after its turn goes last: a client's burst takes one turn a round, and another client's
    request (a health check's ping) waits for at most one of the burst's."""

    deleted = False  # never: what broker.schedule asks before calling dispatch

    def __init__(self, schedule: Callable[[Any], None]) -> None:
        self._schedule = schedule
        self._endpoints: deque[Waiting] = deque()

    def add(self, endpoint: Waiting) -> None:
        """`endpoint` has a request waiting now, and had none."""
        self._endpoints.appendleft(endpoint)
        self._schedule(self)

    def dispatch(self) -> None:
        deadline = time.monotonic() + PASS_BUDGET
        endpoints = self._endpoints
        while endpoints:
            endpoint = endpoints.popleft()
            if not endpoint.waiting:  # detached meanwhile
                continue
            endpoint.answer_next()
            if endpoint.waiting:
                endpoints.append(endpoint)
            if time.monotonic() >= deadline:
                break
        if endpoints:
            self._schedule(self)
