"""The windows an attribution reads, through :class:`~app.windows.base.WindowReader` only, and
its baselines.

A baseline is ``previous`` (the window of the same length just before), an offset (``1d``,
``7d``: the same window that long earlier), or ``event:<id>`` (the window before a change
event; the current window then starts at the event, as long as the window asked, up to now).
Reads: the current window and the baseline (diagnosis reads: ITL by scrape interval, counter
resets, scrapes) and the baseline again as :data:`app.attribution.drivers.PARTS` sub-windows
(the drivers' noise, the gaps) - a fixed number of reads whatever is asked. An attribution
shows quantiles of its signals alone (:data:`QUANTILE_SIGNALS`, the two windows compared): every
other histogram, and every histogram of the sub-windows, is read as its mean (``_sum`` and
``_count``: a source reads no bucket for them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.attribution import algebra, drivers, explain
from app.attribution import repository as events_repository
from app.attribution.events import ChangeEvent
from app.attribution.explain import Attribution
from app.attribution.measures import ATTRIBUTION_HISTOGRAMS, Facts, facts_of
from app.core.durations import format_duration, parse_duration
from app.store.models import TargetView
from app.windows.base import WindowReader

_EVENT = re.compile(r"^event:(\d{1,12})$")
#: the longest offset of a baseline (a window that long ago may be past the retention: it reads empty)
MAX_OFFSET = 31 * 86400.0


@dataclass(frozen=True, slots=True)
class ComparedWindows:
    """The two windows compared, and how the baseline was chosen."""

    kind: str          # "previous", "offset:1d", "event:12"
    start: float       # current window
    end: float
    baseline_start: float
    baseline_end: float


def parse_baseline(spec: str) -> str | float | int:
    """``"previous"``, an offset in seconds, or an event id; ValueError naming the problem."""
    text = spec.strip()
    if text == "previous":
        return text
    match = _EVENT.match(text)
    if match:
        return int(match[1])
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ValueError(f"baseline must be 'previous', a duration such as 1d or 7d (the same window that long "
                         f"earlier) or event:<id>, got {spec[:40]!r}") from None
    if not 0 < seconds <= MAX_OFFSET:
        raise ValueError(f"a baseline offset must be between 1s and 31d, got {spec[:40]!r}")
    return seconds


def choose(spec: str | float | int, window: float, end: float,
           event_at: Callable[[int], ChangeEvent | None]) -> ComparedWindows:
    """The two windows for a parsed baseline; ValueError for an offset shorter than the window
    (they would overlap) or an unknown event."""
    if spec == "previous":
        return ComparedWindows("previous", end - window, end, end - 2 * window, end - window)
    if isinstance(spec, int):
        found = event_at(spec)
        if found is None:
            raise ValueError(f"no change event {spec} on this target")
        length = min(window, end - found.ts) if end > found.ts else window
        return ComparedWindows(f"event:{spec}", found.ts, found.ts + length, found.ts - length, found.ts)
    assert isinstance(spec, float)
    if spec < window:
        raise ValueError(f"a baseline offset ({format_duration(spec)}) must be at least the window "
                         f"({format_duration(window)}): the two would overlap")
    return ComparedWindows(f"offset:{format_duration(spec)}", end - window, end, end - window - spec, end - spec)


#: the histograms whose quantiles an attribution shows (its signals' p50 and p99, before and after)
QUANTILE_SIGNALS = explain.ORDER


def _facts(reader: WindowReader, session: Session, target: TargetView, start: float, end: float,
           model: str | None, buckets: tuple[str, ...] = QUANTILE_SIGNALS) -> Facts:
    return facts_of(reader.window(session, target, start, end, ATTRIBUTION_HISTOGRAMS, diagnosis=True,
                                  buckets=buckets), model)


def read(reader: WindowReader, session: Session, target: TargetView, chosen: ComparedWindows,
         model: str | None = None, before: Facts | None = None) -> tuple[Facts, Facts, list[Facts]]:
    """(baseline, current, the baseline's sub-windows) as facts (``before``: the baseline, read already)."""
    if before is None:
        before = _facts(reader, session, target, chosen.baseline_start, chosen.baseline_end, model)
    after = _facts(reader, session, target, chosen.start, chosen.end, model)
    width = (chosen.baseline_end - chosen.baseline_start) / drivers.PARTS
    parts = [_facts(reader, session, target, chosen.baseline_start + i * width,
                    chosen.baseline_start + (i + 1) * width, model, buckets=()) for i in range(drivers.PARTS)]
    return before, after, parts


def attribution(reader: WindowReader, session: Session, target: TargetView, window: float, end: float,
                baseline: str = "previous", model: str | None = None,
                prefill_per_token: float | None = None) -> Attribution:
    """The attribution of ``target``'s last ``window`` before ``end`` against ``baseline``
    (ValueError for a baseline that cannot be read; WindowError from the backend);
    ``prefill_per_token``: the compute per prompt token of the target's hardware profile."""
    chosen = _chosen(session, target, window, end, baseline)
    before, after, parts = read(reader, session, target, chosen, model)
    return _attribute(session, target, chosen, before, after, parts, prefill_per_token)


def _chosen(session: Session, target: TargetView, window: float, end: float, baseline: str) -> ComparedWindows:
    return choose(parse_baseline(baseline), window, end,
                  lambda event_id: events_repository.event(session, target.id, event_id))


def _attribute(session: Session, target: TargetView, chosen: ComparedWindows, before: Facts, after: Facts,
               parts: list[Facts], prefill_per_token: float | None) -> Attribution:
    between = events_repository.events(session, [target.id], since=chosen.baseline_start, until=chosen.end)
    return explain.attribute(before, after, parts, between, chosen.kind, prefill_per_token)


#: the window the status page explains
DEFAULT_WINDOW = 600.0
#: how far back the status page's baseline looks for the last change event
EVENT_LOOKBACK = 86400.0


def event_baseline(session: Session, target_id: int, end: float, lookback: float) -> str | None:
    """``event:<id>`` of the last change event in the ``lookback`` before ``end`` (a regime change is
    the symptom, not a cause: not counted; one in the last minute has no window after it yet)."""
    found = [e for e in events_repository.events(session, [target_id], since=end - lookback, until=end - 60.0)
             if e.kind != "regime" and e.id is not None]
    return f"event:{found[-1].id}" if found else None


def what_changed(reader: WindowReader, session: Session, target: TargetView, end: float,
                 prefill_per_token: float | None = None, window: float = DEFAULT_WINDOW,
                 lookback: float = EVENT_LOOKBACK, fallbacks: tuple[str, ...] = ("1d", "previous")
                 ) -> Attribution | None:
    """The attribution the status page and a firing alert show: the last ``window`` against the
    window before the last change event in ``lookback``, else against each of ``fallbacks`` until
    one has data (the status page: a day earlier, then the window before); None when none can be
    read."""
    for baseline in dict.fromkeys((event_baseline(session, target.id, end, lookback) or fallbacks[0], *fallbacks)):
        try:
            chosen = _chosen(session, target, window, end, baseline)
        except ValueError:
            continue
        # a baseline with nothing to split (no history that long ago) explains nothing: one read, not eight
        before = _facts(reader, session, target, chosen.baseline_start, chosen.baseline_end, None)
        if not algebra.splittable(before):
            continue
        found = _attribute(session, target, chosen, *read(reader, session, target, chosen, None, before),
                           prefill_per_token)
        if found.signals:
            return found
    return None
