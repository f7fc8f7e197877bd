"""How many scrapes a diagnosis window holds at a scrape interval, and the rules it leaves unjudged.

A rule that needs N scrapes in its window (every rule ``thresholds.min_scrapes``; some more,
:attr:`app.diagnosis.rules.base.Rule.min_scrapes`) is never judged over a window of fewer
scrape intervals: a bandwidth-bound engine scraped every 30 s and judged over 1m shows
"healthy" with bandwidth_bound "not judged". ``check-config``, ``GET /api/v1/sources`` and the
status page say so with :func:`window_warning`, naming each rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.core.durations import format_duration
from app.core.thresholds import Thresholds
from app.diagnosis.rules import RULES


def scrapes_held(window: float, interval: float) -> int:
    """The scrapes a window surely holds: one per whole interval in it (a window that ends just
    before a scrape holds no more, whatever its alignment)."""
    return int(math.floor(window / interval + 1e-9))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A rule a window holds too few scrapes for: ``regime`` ("" for every rule, below
    ``min_scrapes``), the scrapes it needs and the threshold that says so."""

    regime: str
    needed: int
    threshold: str

    def text(self) -> str:
        return f"{self.regime or 'every rule'} needs {self.needed} (diagnosis.thresholds.{self.threshold})"


def shortfalls(window: float, interval: float, t: Thresholds) -> list[Shortfall]:
    """Every rule that needs more scrapes than ``window`` holds at ``interval``."""
    held = scrapes_held(window, interval)
    out = [Shortfall("", t.min_scrapes, "min_scrapes")] if held < t.min_scrapes else []
    for rule in RULES:
        needed = rule.scrapes_needed(t)
        # a rule needing only min_scrapes is already in "every rule"
        if rule.min_scrapes and needed > held and (held >= t.min_scrapes or needed > t.min_scrapes):
            out.append(Shortfall(rule.regime, needed, rule.min_scrapes))
    return out


def window_warning(window: float, interval: float, t: Thresholds) -> str | None:
    """One sentence naming every rule that ``window`` at ``interval`` leaves unjudged (None: none),
    with the shortest window that judges them all."""
    short = shortfalls(window, interval, t)
    if not short:
        return None
    held = scrapes_held(window, interval)
    enough = format_duration(max(s.needed for s in short) * interval)
    return (f"scraped every {format_duration(interval)}, the {format_duration(window)} diagnosis window holds "
            f"{held} scrape{'' if held == 1 else 's'}: {'; '.join(s.text() for s in short)}, so "
            f"{'it is' if len(short) == 1 else 'they are'} never judged; a window of {enough} holds enough")
