"""How many scrapes a diagnosis window holds at a scrape interval, and the rules a short window
leaves unjudged: each named with the threshold that says how many scrapes it needs."""

from __future__ import annotations

import pytest

from app.core.thresholds import Thresholds
from app.diagnosis import engine
from app.diagnosis.rules import RULES, bandwidth_bound
from app.diagnosis.rules.base import NotJudged
from app.diagnosis.sampling import Shortfall, scrapes_held, shortfalls, window_warning
from tests.diagnosis.test_rules import healthy_signals, summary

T = Thresholds()


def test_a_window_holds_one_scrape_per_whole_interval() -> None:
    assert [scrapes_held(60.0, interval) for interval in (15.0, 20.0, 30.0, 45.0, 60.0, 90.0)] == [4, 3, 2, 1, 1, 0]
    assert scrapes_held(120.0, 30.0) == 4 and scrapes_held(0.3, 0.1) == 3  # no float rounding below a whole interval


def test_only_bandwidth_bound_states_a_minimum_above_every_rules_min_scrapes() -> None:
    needs = {rule.regime: rule.scrapes_needed(T) for rule in RULES}
    assert needs.pop("bandwidth_bound") == T.steady_min_scrapes == 4
    assert set(needs.values()) == {T.min_scrapes} == {2}
    assert bandwidth_bound.RULE.min_scrapes == "steady_min_scrapes"
    assert bandwidth_bound.RULE.scrapes_needed(Thresholds(steady_min_scrapes=7)) == 7


def test_bandwidth_bound_is_judged_from_exactly_the_scrapes_its_rule_states() -> None:
    """The declared minimum is the one the rule applies: one scrape fewer is "not judged"."""
    slow_steady = dict(itl=summary(0.062, 0.075, 0.06, 5000), itl_ratio=1.2, running_mean=3.9,
                       decode_floor_seconds=0.0409, itl_over_floor=1.53)
    needed = bandwidth_bound.RULE.scrapes_needed(T)
    for profile in ({}, {"decode_floor_seconds": None, "itl_over_floor": None}):  # with and without hardware
        with pytest.raises(NotJudged, match="from 3 scrape\\(s\\) and 5000 decode steps; steadiness needs at "
                                            "least 4"):
            bandwidth_bound.evaluate(healthy_signals(scrapes=needed - 1, **{**slow_steady, **profile}), T)
        assert bandwidth_bound.evaluate(healthy_signals(scrapes=needed, **{**slow_steady, **profile}), T) is not None
    d = engine.diagnose(healthy_signals(scrapes=2, **slow_steady), T)  # a 1m window at a 30 s scrape
    assert d.verdict == "not_judged" and [f.regime for f in d.findings] == []


@pytest.mark.parametrize(("window", "interval", "expected"), [
    (60.0, 15.0, []),
    (60.0, 30.0, [Shortfall("bandwidth_bound", 4, "steady_min_scrapes")]),
    (90.0, 30.0, [Shortfall("bandwidth_bound", 4, "steady_min_scrapes")]),
    (120.0, 30.0, []),
    (60.0, 60.0, [Shortfall("", 2, "min_scrapes"), Shortfall("bandwidth_bound", 4, "steady_min_scrapes")]),
])
def test_shortfalls(window: float, interval: float, expected: list[Shortfall]) -> None:
    assert shortfalls(window, interval, T) == expected


def test_a_rule_needing_only_min_scrapes_is_not_listed_twice() -> None:
    t = Thresholds(min_scrapes=4, steady_min_scrapes=4)
    assert shortfalls(60.0, 30.0, t) == [Shortfall("", 4, "min_scrapes")]
    assert shortfalls(120.0, 30.0, Thresholds(steady_min_scrapes=6)) == [Shortfall("bandwidth_bound", 6,
                                                                                  "steady_min_scrapes")]


def test_the_warning_names_each_rule_its_threshold_and_the_window_that_holds_enough() -> None:
    assert window_warning(60.0, 15.0, T) is None
    assert window_warning(60.0, 30.0, T) == (
        "scraped every 30s, the 1m diagnosis window holds 2 scrapes: bandwidth_bound needs 4 "
        "(diagnosis.thresholds.steady_min_scrapes), so it is never judged; a window of 2m holds enough")
    assert window_warning(60.0, 60.0, T) == (
        "scraped every 1m, the 1m diagnosis window holds 1 scrape: every rule needs 2 "
        "(diagnosis.thresholds.min_scrapes); bandwidth_bound needs 4 (diagnosis.thresholds.steady_min_scrapes), so "
        "they are never judged; a window of 4m holds enough")
