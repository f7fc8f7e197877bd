"""What this process has changed: a number that moves whenever the service commits a write to
its database or keeps a round's result in memory.

A read answered a moment ago is still the answer when nothing changed since it began
(:mod:`app.api.coalesce` reuses it); this is how the API knows. Every engine made by
:func:`app.store.db.make_engine` moves it on each commit of a transaction that wrote, once when
the commit starts and again when the connection goes back to the pool (after the commit
completed), so an answer that began while a commit was under way is never taken for one that saw
it. Not counted, because they come as steadily as the clock moves and a reused answer is at most
``read_max_age`` old anyway: what the scrape writer stores (every half second), this replica's
heartbeat and lease renewals (:data:`app.store.db.NOT_A_CHANGE`), and transactions that only read.
Counted, they kept every answer from living a second. Writes by other processes (other replicas)
are not seen here: a reused answer is at most ``read_max_age`` old.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Changes:
    """A counter of changes; only ever compared for equality ("did anything change since?")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def current(self) -> int:
        return self._count

    def bump(self) -> None:
        with self._lock:
            self._count += 1


#: The process' one counter: every engine and every round of the process moves it.
changes = Changes()


class Changing(Generic[T]):
    """A class attribute whose every assignment on an instance counts as a change: for results a
    round keeps in memory and the API reads (unset: ``None``). One assignment replaces the
    result, so a reader gets the old or the new, never half."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = f"_changing_{name}"

    def __get__(self, instance: object, owner: type | None = None) -> T | None:
        return getattr(instance, self._attribute, None)

    def __set__(self, instance: object, value: T | None) -> None:
        setattr(instance, self._attribute, value)
        changes.bump()
