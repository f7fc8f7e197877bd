"""Is one target URL answered by several engine processes (a Service / load balancer)?

Then every switch between replicas looks like a counter reset, and rates, increases and
percentiles computed from the mixed pages are wrong while looking exact (two replicas
behind a round-robin proxy read as many times the request rate either one serves).
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
from collections.abc import Iterator
from operator import le

from app.sources.base import Canonical

HISTORY = 12  # scrapes a bounce is remembered for
COUNTER_BOUNCES = 2  # counter bounces within HISTORY scrapes that prove several processes
START_TIME_TOLERANCE = 0.5  # seconds: renderings of one process' start time agree far better
_START_NAME = b"process_start_time_seconds"
_START_LINE = b"\n" + _START_NAME
_START_VALUE = re.compile(rb"(?:\{[^}\n]*\})?[ \t]+(\S+)")  # after the name: labels, blanks, the value
MESSAGE = ("this URL is answered by several engine processes (a load balancer or Service in front of "
           "replicas): {evidence}; rates and percentiles from it would mix replicas, so none are stored. "
           "Scrape the pods instead (file_sd_configs / http_sd_configs in the targets file) or read "
           "the cluster's Prometheus")


def process_start_time(body: bytes) -> float | None:
    """``process_start_time_seconds`` of a text page, without parsing the rest of it.

    The name is located with ``bytes.find`` (C, memchr-fast) at a line start and only the
    rest of that line goes through the regex: a ``^name`` regex in MULTILINE mode would try
    every position of the page, on every scrape.
    """
    for end in _after_start_names(body):
        match = _START_VALUE.match(body, end)
        if match is not None:
            try:
                return float(match.group(1))
            except ValueError:
                return None
    return None


def _after_start_names(body: bytes) -> Iterator[int]:
    """The offset right after each ``process_start_time_seconds`` that begins a line."""
    if body.startswith(_START_NAME):
        yield len(_START_NAME)
    at = body.find(_START_LINE)
    while at >= 0:
        yield at + len(_START_LINE)
        at = body.find(_START_LINE, at + 1)


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
        self._last: dict[tuple[str, str, str], float] | None = None  # the previous scrape's values
        # per scrape of the last two: its values that went down against the scrape before it
        self._drops: deque[dict[tuple[str, str, str], tuple[float, float]]] = deque(maxlen=2)
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
        undone by this scrape: ``v[j] > v[j+1]`` and ``v[now] >= v[j]``.

        Each scrape's drops against the one before it are found once, when it arrives (one
        C-level comparison of all values when the keys come in the same order, as a page of
        one shape gives them), so a scrape without drops costs no per-key Python loop."""
        found = None
        for drops in self._drops:
            for key, (old, dropped) in drops.items():
                value = values.get(key)
                if value is not None and old <= value:
                    found = (f"counter {key[0]} went down from {old:g} to {dropped:g} and back up to "
                             f"{value:g} (a restart starts again from zero)")
                    break
            if found:
                break
        last = self._last
        self._last = values
        if found:
            self._drops.clear()  # one bounce is counted once
        elif last is not None:
            self._drops.append(_drops(last, values))
        return found


def _drops(before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float]
           ) -> dict[tuple[str, str, str], tuple[float, float]]:
    """key -> (value before, lower value after) for every value that went down."""
    if tuple(before) == tuple(after) and all(map(le, before.values(), after.values())):
        return {}
    return {key: (old, dropped) for key, dropped in after.items()
            if (old := before.get(key)) is not None and dropped < old}
