"""The change-point test for load and workload steps: a two-sided, winsorized CUSUM on the
per-round values of a series, normalised by a robust reference.

Why this test. A step in the request rate or the prompt length is a shift of a series' level
that then persists; CUSUM is the test with the shortest delay for a given false-alarm rate for
exactly that (Page 1954; Lorden's optimality), it needs no window to be chosen, and its state is
two numbers, kept between rounds. Page-Hinkley is its one-sided form for a fixed mean; a
two-sample test over sliding windows detects later for the same false alarms.

How. The first :attr:`CusumSettings.reference` values give the reference: their median and
their spread, the larger of 1.4826 x the median absolute deviation and the standard deviation
of the values within 3 of those (robust to a burst among them, and efficient where the MAD
alone is not), times ``1 + 2/sqrt(n)`` for estimating it from ``n`` values (a CUSUM's false
alarms grow steeply when its spread is underestimated: 1.37 from 30 values, 1.18 from 120), at least
:attr:`CusumSettings.min_relative` of the median and the series' absolute floor. The reference
keeps learning from the values outside a shift (an excursion's once both sums are back at
zero), up to :attr:`CusumSettings.history` of them.
Each value is then ``z = (x - median) / spread``, clipped to +-:attr:`CusumSettings.clip`, and
``up = max(0, up + z - k)``, ``down = max(0, down - z - k)``; a sum above ``h`` is a step. The
clip means one wild interval (a burst, a scrape missed) adds at most ``clip - k`` and never
alarms alone: a step needs three intervals of ``clip`` or more, or a smaller shift that lasts.
The step is dated where its sum last left zero (the CUSUM estimate of the change time); its
"after" is the median of the values since; the test then learns a new reference from them.

False alarms: ``tests/attribution/test_changepoint.py`` measures them on steady synthetic load
(Poisson arrivals, lognormal lengths) and ``tests/attribution/test_scenarios.py`` on steady
emulated engines; the numbers are in docs/changes.md. With ``k = 1``, ``h = 10``, ``clip = 5`` a
shift of 5 spreads or more is found in 3 rounds, one of 2 spreads in about 11.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class CusumSettings:
    reference: int = 30       # values the reference is first learned from
    history: int = 120        # ... then kept learning from, up to this many in-control values
    k: float = 1.0            # allowance per value, in spreads: shifts below it are not accumulated
    h: float = 10.0           # decision threshold, in spreads
    clip: float = 5.0         # the most one value moves a sum, in spreads (before the allowance)
    min_relative: float = 0.02  # the spread is at least this share of the reference's median
    floor: float = 0.0        # ... and at least this (the series' unit)


def _stdev(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass(frozen=True, slots=True)
class Step:
    at: float         # when the shift began (start of the first interval of it)
    before: float     # the reference's median
    after: float      # the median since
    direction: str    # "up" or "down"


@dataclass(slots=True)
class Cusum:
    """One series' test; :meth:`to_json`/:meth:`from_json` keep it between rounds."""

    settings: CusumSettings
    learning: list[float] = field(default_factory=list)  # the reference's values (the latest in-control ones)
    fresh: int = 0                   # values added since the reference was last estimated
    pending: list[float] = field(default_factory=list)  # values of an excursion, learned once it ends
    median: float | None = None
    spread: float | None = None
    up: float = 0.0
    down: float = 0.0
    up_since: float | None = None    # start of the interval where ``up`` left zero
    down_since: float | None = None
    up_values: list[float] = field(default_factory=list)    # the values since
    down_values: list[float] = field(default_factory=list)

    def _learn(self, value: float) -> None:
        """Keep ``value`` for the reference; estimate it again with every value until the history is
        full, then every :attr:`CusumSettings.reference` values."""
        s = self.settings
        self.learning = (self.learning + [value])[-s.history:]
        self.fresh += 1
        if len(self.learning) < s.reference or (len(self.learning) == s.history and self.fresh < s.reference):
            return
        self.fresh = 0
        values = self.learning
        median = statistics.median(values)
        mad = 1.4826 * statistics.median(abs(v - median) for v in values)
        kept = [v for v in values if abs(v - median) <= 3.0 * mad] if mad > 0 else values
        spread = max(mad, _stdev(kept)) if len(kept) > 2 else mad
        spread *= 1.0 + 2.0 / math.sqrt(len(values))
        self.median, self.spread = median, max(spread, s.min_relative * abs(median), s.floor, 1e-12)

    def update(self, value: float, start: float, end: float) -> Step | None:
        """One round's value over ``[start, end]``; the step it completes, if any."""
        if not math.isfinite(value):
            return None
        if self.median is None or self.spread is None:
            self._learn(value)
            return None
        s = self.settings
        z = max(-s.clip, min(s.clip, (value - self.median) / self.spread))
        self.up, self.up_since, self.up_values = self._accumulate(self.up, z, self.up_since, self.up_values,
                                                                  value, start)
        self.down, self.down_since, self.down_values = self._accumulate(self.down, -z, self.down_since,
                                                                        self.down_values, value, start)
        for total, since, values, direction in ((self.up, self.up_since, self.up_values, "up"),
                                                (self.down, self.down_since, self.down_values, "down")):
            if total > s.h and since is not None:
                step = Step(since, self.median, statistics.median(values), direction)
                self._restart(values)
                return step
        # the reference keeps learning from every value outside a shift: an excursion's values once
        # both sums are back at zero (so the first values of a real step never move the reference)
        self.pending = (self.pending + [value])[-s.history:]
        if self.up == 0.0 and self.down == 0.0:
            for v in self.pending:
                self._learn(v)
            self.pending = []
        return None

    def _accumulate(self, total: float, z: float, since: float | None, values: list[float], value: float,
                    start: float) -> tuple[float, float | None, list[float]]:
        new = max(0.0, total + z - self.settings.k)
        if new == 0.0:
            return 0.0, None, []
        if total == 0.0:
            return new, start, [value]
        return new, since, (values + [value])[-4 * self.settings.reference:]

    def _restart(self, values: list[float]) -> None:
        """After a step: a new reference, learned from the values of the new level."""
        self.median = self.spread = None
        self.up = self.down = 0.0
        self.up_since = self.down_since = None
        self.up_values, self.down_values = [], []
        self.learning, self.fresh, self.pending = [], 0, []
        for v in values[-self.settings.reference:]:
            self._learn(v)

    def to_json(self) -> dict[str, Any]:
        return {"learning": self.learning, "fresh": self.fresh, "pending": self.pending, "median": self.median,
                "spread": self.spread, "up": self.up, "down": self.down, "up_since": self.up_since,
                "down_since": self.down_since, "up_values": self.up_values, "down_values": self.down_values}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, settings: CusumSettings) -> Cusum:
        if not data:
            return cls(settings)
        return cls(settings, list(data.get("learning") or []), int(data.get("fresh") or 0),
                   list(data.get("pending") or []), data.get("median"), data.get("spread"),
                   float(data.get("up") or 0.0), float(data.get("down") or 0.0), data.get("up_since"),
                   data.get("down_since"), list(data.get("up_values") or []), list(data.get("down_values") or []))
