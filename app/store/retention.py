"""Retention and downsampling rounds.

:func:`prune` removes what is older than the retention period: raw samples after
``raw_retention`` (their downsampled levels stay), levels and scrapes after ``retention``
(:func:`app.store.repository.prune_samples`: whole time partitions on PostgreSQL, small
batches on SQLite), dropped findings, and the rows of features that pass their pruner in
(probe runs), so their SQL stays in their repository and the store does not import them.
On PostgreSQL it also creates the partitions ahead (app/store/partitions.py).

:func:`downsample` builds the 5-minute and 1-hour levels of the intervals that ended
(:mod:`app.store.levels`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.store import partitions, repository

#: Deletes a feature's rows older than ``before`` in the given session; returns how many.
Pruner = Callable[[Session, float], int]


def _engine(sessions: sessionmaker[Session]) -> Engine:
    return sessions.kw["bind"]


def prune(sessions: sessionmaker[Session], retention: float, *, now: float | None = None,
          also: Mapping[str, Pruner] | None = None, raw_retention: float | None = None) -> dict[str, int]:
    """Delete what is older than ``retention`` seconds (raw samples: ``raw_retention``, at
    most ``retention``); rows deleted per table (and per name of ``also``)."""
    now = time.time() if now is None else now
    before = now - retention
    raw_before = now - min(retention, raw_retention or retention)
    engine = _engine(sessions)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            partitions.ensure_ahead(conn, now)
    deleted = repository.prune_samples(engine, before, raw_before)
    with sessions.begin() as session:
        deleted.update(repository.prune_records(session, before))
        for name, pruner in (also or {}).items():
            deleted[name] = pruner(session, before)
    return deleted


def downsample(sessions: sessionmaker[Session], *, now: float | None = None) -> dict[int, int]:
    """Build the level rows of every finished interval; rows written per level."""
    return repository.downsample(_engine(sessions).begin, time.time() if now is None else now)
