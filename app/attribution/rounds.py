"""The events round: every target's window since the last round, read together through the
windows, compared with what its detector remembers (:func:`app.attribution.events.detect`);
the events and the new memory are stored in one transaction. Findings that became active or
resolved since the last round are stored as ``regime`` events.

A plain function of its inputs (sessions, windows, ``now``), scheduled by the composition root
on the leader; tests drive it on an emulator's clock.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.orm import Session, sessionmaker

from app.attribution import repository
from app.attribution.changepoint import CusumSettings
from app.attribution.events import ChangeEvent, Memory, detect
from app.attribution.measures import facts_of
from app.attribution.telemetry import ChangeEventsCollector
from app.store.models import SERVICE_KIND
from app.targets import repository as target_repository
from app.windows.base import WindowReader

log = logging.getLogger(__name__)

#: the change-point test's settings (app.attribution.changepoint)
SETTINGS = CusumSettings()
#: what the round reads of each window: request counts and mean lengths (plus every gauge and counter)
ROUND_SIGNALS = ("ttft", "e2e", "prompt_tokens", "generation_tokens")
#: the gauges and counters its facts read (app.attribution.measures.facts_of): the load, the
#: finished requests and tokens, the prefix cache, and the KV transfers that tell a decode worker
ROUND_SCALARS = ("running", "waiting", "requests_total", "prompt_tokens_total", "generation_tokens_total",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "kv_transfers_total")


def _regime_events(session: Session, since: dict[int, float], now: float) -> dict[int, list[ChangeEvent]]:
    """Findings activated or resolved in ``(since[target], now]``, as events."""
    out: dict[int, list[ChangeEvent]] = {}
    for row in repository.finding_transitions(session, min(since.values(), default=now), now):
        target_id = row.target_id
        if target_id not in since:
            continue
        where = f"{row.regime}[{row.model}]" if row.model else row.regime
        for ts, before, after in ((row.activated_at, "inactive", "active"), (row.resolved_at, "active", "resolved")):
            if ts is not None and since[target_id] < ts <= now:
                out.setdefault(target_id, []).append(ChangeEvent(
                    "regime", ts, where, before, after, f"{row.regime} {after}: {row.summary}"[:500]))
    return out


def detect_events(sessions: sessionmaker[Session], windows: WindowReader, interval: float,
                  now: float | None = None, settings: CusumSettings = SETTINGS,
                  telemetry: ChangeEventsCollector | None = None) -> list[ChangeEvent]:
    """One round at ``now`` (default: the clock) over the window ``[now - interval, now]``; the
    events found (also stored); ``telemetry`` gets each target's newest event of each kind."""
    now = time.time() if now is None else now
    with sessions() as session:
        targets = [t for t in target_repository.target_rows(session) if t.gone_at is None]
        if not targets:
            return []
        # means, counts and the rates and gauges its facts read only: no bucket, no other gauge (a
        # source reads each histogram's _sum/_count alone, and those gauges and counters)
        read = windows.windows(session, targets, now - interval, now, ROUND_SIGNALS, diagnosis=True, buckets=(),
                               scalars=ROUND_SCALARS)
        rows = repository.detectors(session, [t.id for t in targets])
        since = {t.id: rows[t.id].read_until if t.id in rows else now - interval for t in targets}
        regimes = _regime_events(session, since, now)
    found: list[ChangeEvent] = []
    with sessions.begin() as session:
        rows = repository.detectors(session, [t.id for t in targets])
        for target in targets:
            if target.id in read.failed:
                continue  # its backend did not answer: the next round reads on from the same point
            window = read.found.get(target.id)
            row = rows.get(target.id)
            events = list(regimes.get(target.id, []))
            memory = Memory.from_json(row.state if row is not None else None)
            if window is not None:
                events += detect(memory, facts_of(window), window.infos, target.source == SERVICE_KIND, settings)
            events.sort(key=lambda e: e.ts)
            repository.add_events(session, target.id, events, now)
            repository.save_detector(session, row, target.id, now, memory.to_json())
            found += [ChangeEvent(e.kind, e.ts, e.subject, e.before, e.after, e.summary, None, target.name, now)
                      for e in events]
    if found:
        log.info("change events: %s", "; ".join(f"{e.target}: {e.summary}" for e in found[:10]))
    if telemetry is not None:
        with sessions() as session:
            telemetry.last = repository.last_times(session)
    return found
