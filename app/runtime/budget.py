"""A request's time budget and its client's presence, checked cooperatively by long reads.

A latency answer over days, the fleet view, a long quantile series or a status page is
Python work proportional to the series and windows it reads. The route opens a
:class:`RequestBudget` around that work (:func:`bounded`); the computation calls
:func:`checkpoint` between series and windows (:mod:`app.latency`). A checkpoint raises
:class:`BudgetExceeded` once the budget is spent (the API answers 503 naming it) and
:class:`ClientGone` once the client has disconnected (the work stops; nobody is there to
read an answer). Outside a budget (the periodic rounds, the CLI) a checkpoint does nothing.
A database statement is bounded by the budget's remainder too
(:func:`app.store.db.statement_budget`): one long read cannot outlive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

#: Checks between two polls of the client's connection (a poll is a hop to the event loop).
POLL_EVERY = 64


class BudgetExceeded(Exception):
    """The request ran out of its time budget."""

    def __init__(self, seconds: float, checks: int) -> None:
        super().__init__(f"the request exceeded its time budget of {seconds:g} s (LLM_LATENCY_API_REQUEST_BUDGET); "
                         "ask for a shorter window, fewer targets or a larger step")
        self.seconds = seconds
        self.checks = checks


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""

    def __init__(self, checks: int) -> None:
        super().__init__(f"the client went away; the work stopped after {checks} checks")
        self.checks = checks


@dataclass
class RequestBudget:
    """``seconds`` from creation on ``clock``; ``disconnected`` is polled at the first check
    and every :data:`POLL_EVERY` checks after it (a fixed count, not a time: deterministic)."""

    seconds: float
    disconnected: Callable[[], bool] | None = None
    clock: Callable[[], float] = time.monotonic
    checks: int = 0
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = self.clock() + self.seconds

    def remaining(self) -> float:
        """Seconds left (negative once spent)."""
        return self.deadline - self.clock()

    def check(self) -> None:
        self.checks += 1
        if self.clock() > self.deadline:
            raise BudgetExceeded(self.seconds, self.checks)
        if self.disconnected is not None and (self.checks - 1) % POLL_EVERY == 0 and self.disconnected():
            raise ClientGone(self.checks)


_current: ContextVar[RequestBudget | None] = ContextVar("request_budget", default=None)


def current() -> RequestBudget | None:
    """The budget of the request this thread works for, if any (a round has none)."""
    return _current.get()


def checkpoint() -> None:
    """Between two pieces of a long computation: stop if its request's budget is spent or its
    client is gone; nothing outside a request budget."""
    budget = _current.get()
    if budget is not None:
        budget.check()


@contextmanager
def bounded(budget: RequestBudget) -> Iterator[RequestBudget]:
    """Run the block under ``budget`` (in the thread that does the work)."""
    token = _current.set(budget)
    try:
        yield budget
    finally:
        _current.reset(token)
