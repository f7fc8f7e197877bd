"""Is one target URL answered by several engine processes (a Service / load balancer)?

Then every switch between replicas looks like a counter reset, and rates, increases and
percentiles computed from the mixed pages are wrong while looking exact (two emulated
replicas behind a round-robin proxy read as 234 requests/s against 3.8 for one replica).
The scraper marks such a target ``error_class: load_balanced`` and stores no samples for it
while the evidence stands; the fix is to scrape the pods (file/HTTP discovery) or to read
the cluster's Prometheus.

The evidence, from consecutive scrapes of one target:

* ``process_start_time_seconds`` returns to a value seen before, after a different one: a
  restart moves it forward once and never back, so one return is proof.
* a counter (or histogram count) goes down and then, within the next two scrapes, back up
  to at least where it was before the drop. A restart drops the counters once and they
  climb from zero; they do not come back to the old level a scrape later. Two such
  bounces within :data:`HISTORY` scrapes are required, so a restart right after a small
  start is not mistaken for load balancing.

The verdict stands until :data:`HISTORY` scrapes in a row show no bounce.
"""

from __future__ import annotations

import re
from collections import deque

from app.sources.base import Canonical

HISTORY = 12  # scrapes a bounce is remembered for
COUNTER_BOUNCES = 2  # counter bounces within HISTORY scrapes that prove several processes
START_TIME_TOLERANCE = 0.5  # seconds: renderings of one process' start time agree far better
_START_TIME = re.compile(rb"^process_start_time_seconds(?:\{[^}\n]*\})?\s+(\S+)", re.MULTILINE)
MESSAGE = ("this URL is answered by several engine processes (a load balancer or Service in front of "
           "replicas): {evidence}; rates and percentiles from it would mix replicas, so none are stored. "
           "Scrape the pods instead (file_sd_configs / http_sd_configs in the targets file) or read "
           "the cluster's Prometheus")


def process_start_time(body: bytes) -> float | None:
    """``process_start_time_seconds`` of a text page, without parsing the rest of it."""
    match = _START_TIME.search(body)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def counter_values(canonical: Canonical) -> dict[tuple[str, str, str], float]:
    """Every monotonic number of a scrape: counters and histogram observation counts."""
    values = {(s.signal, s.model, s.rank): s.value for s in canonical.scalars if s.kind == "counter"}
    for h in canonical.histograms:
        values[(h.signal, h.model, h.rank)] = h.count
    return values


class ReplicaDetector:
    """Fed every successful scrape of one target; :attr:`evidence` is set while it is load balanced."""

    def __init__(self) -> None:
        self._starts: deque[float] = deque(maxlen=HISTORY)
        self._values: deque[dict[tuple[str, str, str], float]] = deque(maxlen=3)
        self._bounces: deque[str | None] = deque(maxlen=HISTORY)  # per scrape: the evidence seen, if any

    @property
    def evidence(self) -> str | None:
        starts = [e for e in self._bounces if e and e.startswith("process")]
        if starts:
            return starts[-1]
        counters = [e for e in self._bounces if e]
        return counters[-1] if len(counters) >= COUNTER_BOUNCES else None

    def observe(self, start_time: float | None, values: dict[tuple[str, str, str], float]) -> str | None:
        """Record one scrape; returns the evidence (a sentence) while the target is load balanced."""
        found = self._start_time_return(start_time) or self._counter_bounce(values)
        self._bounces.append(found)
        return self.evidence

    def _start_time_return(self, start_time: float | None) -> str | None:
        if start_time is None:
            return None
        starts = self._starts
        found = None
        if starts and abs(starts[-1] - start_time) > START_TIME_TOLERANCE and any(
                abs(seen - start_time) <= START_TIME_TOLERANCE for seen in starts):
            found = (f"process_start_time_seconds went back to {start_time:.0f} after {starts[-1]:.0f} "
                     "(a restart never goes back)")
        starts.append(start_time)
        return found

    def _counter_bounce(self, values: dict[tuple[str, str, str], float]) -> str | None:
        """A drop between the scrape before last (or the one before it) and its successor,
        undone by this scrape: ``v[j] > v[j+1]`` and ``v[now] >= v[j]``."""
        history = self._values
        found = None
        for j in range(len(history) - 1):
            before, after = history[j], history[j + 1]
            for key, value in values.items():
                old, dropped = before.get(key), after.get(key)
                if old is not None and dropped is not None and dropped < old <= value:
                    found = (f"counter {key[0]} went down from {old:g} to {dropped:g} and back up to "
                             f"{value:g} (a restart starts again from zero)")
                    break
            if found:
                break
        history.append(values)
        if found:
            history.clear()  # one bounce is counted once
            history.append(values)
        return found
