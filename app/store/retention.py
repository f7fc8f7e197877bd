"""Retention: one round deletes everything older than the retention period.

The store's own tables (samples, scrapes, dropped findings) are pruned by
:func:`app.store.repository.prune`; a feature with tables of its own (probe runs) passes its
pruner in, so its SQL stays in its repository and the store does not import the feature.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from sqlalchemy.orm import Session, sessionmaker

from app.store import repository

#: Deletes a feature's rows older than ``before`` in the given session; returns how many.
Pruner = Callable[[Session, float], int]


def prune(sessions: sessionmaker[Session], retention: float, *, now: float | None = None,
          also: Mapping[str, Pruner] | None = None) -> dict[str, int]:
    """Delete what is older than ``retention`` seconds, in one transaction; rows deleted per
    table (and per name of ``also``)."""
    before = (time.time() if now is None else now) - retention
    with sessions.begin() as session:
        deleted = repository.prune(session, before)
        for name, pruner in (also or {}).items():
            deleted[name] = pruner(session, before)
        return deleted
