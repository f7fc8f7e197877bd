"""Attribution from hand-built windows: each known cause is the top driver with the seconds its
model gives, noise keeps steady drivers unnamed, and the sentence says it first."""

from __future__ import annotations

import math

import pytest

from app.attribution import drivers
from app.attribution.events import ChangeEvent
from app.attribution.explain import attribute
from app.window import ItlInterval
from tests.attribution.factories import facts, steady_parts

BASE = dict(ttft=0.07, queue=0.01, prefill=0.05, rate=3.1, running=7.0, running_max=12.0, waiting=0.0, e2e=2.4,
            decode=2.3)


def test_a_load_step_into_saturation_is_put_on_the_load() -> None:
    before = facts(**BASE, p99={"ttft": 1.1})
    after = facts(600, 1200, ttft=1.87, queue=1.61, prefill=0.2, rate=4.5, running=12.0, running_max=12.0, waiting=9.0,
                  e2e=4.2, decode=2.3, p99={"ttft": 2.9})
    a = attribute(before, after, steady_parts(**BASE))
    assert a.summary == ("TTFT p99 1.10 s → 2.90 s over the last 10m vs the 10m before: queue +1.60 s of +1.80 s "
                         "(means); request rate +45% (3.1 → 4.5 req/s) with the same prompts; no restart or config "
                         "change.")
    assert a.lead == "ttft" and a.changed
    top = a.drivers[0]
    assert top.name == "load" and top.explains["ttft"] == pytest.approx(1.6)  # all of the queue's change
    ttft = a.signals["ttft"]
    assert ttft.not_explained == pytest.approx(0.2)  # prefill and the rest: no model names a cause
    body = a.to_dict()
    assert body["drivers"][0]["share"]["ttft"] == pytest.approx(1.6 / 1.8)
    assert body["signals"]["ttft"]["change"]["p99"] == pytest.approx(1.8)
    assert math.isclose(math.fsum(c["change"] for c in body["signals"]["ttft"]["components"]), 1.8, abs_tol=1e-9)


def test_a_lower_capacity_after_a_restart_is_put_on_the_capacity() -> None:
    """Same traffic; after a restart requests wait at 4 running, where 14 ran at once before."""
    before = facts(**{**BASE, "running_max": 14.0})
    after = facts(600, 1200, ttft=3.0, queue=2.9, prefill=0.05, rate=3.05, running=4.0, running_max=4.0, waiting=20.0,
                  e2e=5.2, decode=2.2, restarts=1)
    restart = ChangeEvent("restart", 700.0, "engine", None, None, "the engine restarted")
    a = attribute(before, after, steady_parts(**{**BASE, "running_max": 14.0}), [restart])
    top = a.drivers[0]
    assert top.name == "capacity" and top.significant and top.at_least == "before"
    assert (top.before, top.after) == (14.0, 4.0)
    assert top.explains["ttft"] == pytest.approx(2.89)
    assert "restarted 00:11 UTC" in top.note
    assert [d.name for d in a.drivers if d.name in ("restart", "config")] == ["restart"]
    assert a.summary.startswith("TTFT mean 70.0 ms → 3.00 s since 00:11 UTC: queue +2.89 s of +2.93 s (means); "
                                "capacity 4 running requests, down from at least 14; restarted 00:11 UTC")


def test_prefix_caching_turned_off_is_put_on_the_cache() -> None:
    base = {**BASE, "prefill": 0.08, "ttft": 0.1, "hit": 0.6}
    after = facts(600, 1200, ttft=0.2, queue=0.01, prefill=0.18, hit=0.0, rate=3.1, e2e=2.5, decode=2.3)
    config = ChangeEvent("config", 650.0, "cache_config.enable_prefix_caching", "True", "False", "")
    a = attribute(facts(**base), after, steady_parts(**base), [config])
    top = a.drivers[0]
    assert top.name == "prefix_cache" and (top.before, top.after) == (0.6, 0.0)
    # prefill x (1 - 0)/(1 - 0.6) predicts +0.12 s, more than the +0.10 s measured: all of it explained
    assert top.explains["ttft"] == pytest.approx(0.10)
    assert "configuration: cache_config.enable_prefix_caching: True -> False" in top.note
    assert "prefix-cache hit rate 60% → 0%" in a.summary and "cache_config.enable_prefix_caching: True -> False" \
        in a.summary


def test_longer_prompts_explain_prefill_up_to_the_measured_change() -> None:
    base = {**BASE, "prefill": 0.08, "ttft": 0.1}
    after = facts(600, 1200, ttft=0.25, queue=0.01, prefill=0.22, prompt=900.0, rate=3.1, e2e=2.6, decode=2.3)
    a = attribute(facts(**base), after, steady_parts(**base))
    top = a.drivers[0]
    assert top.name == "prompt_length" and top.explains["ttft"] == pytest.approx(0.14)
    assert "prompts 200% longer (300 → 900 tokens)" in a.summary


def _intervals(itl: float, batches: list[float]) -> tuple[ItlInterval, ...]:
    return tuple(ItlInterval(100 * (itl + 0.0004 * b), 100.0, b) for b in batches)


def test_a_slower_step_at_the_same_batch_is_put_on_the_step_time() -> None:
    """A neighbour takes HBM bandwidth: every step is 6 ms slower at the same batch sizes."""
    batches = [5.0, 6.0, 7.0, 8.0, 9.0]
    before_iv, after_iv = _intervals(0.010, batches), _intervals(0.016, batches)
    itl_b = math.fsum(i.itl_sum for i in before_iv) / 500
    itl_a = math.fsum(i.itl_sum for i in after_iv) / 500
    base = {**BASE, "itl": itl_b}
    parts = steady_parts(**base)
    a = attribute(facts(**base, intervals=before_iv),
                  facts(600, 1200, **{**BASE, "itl": itl_a, "e2e": 3.5, "decode": 3.4}, intervals=after_iv), parts)
    assert a.lead == "itl"
    top = a.drivers[0]
    assert top.name == "step_time" and top.explains["itl"] == pytest.approx(0.006, rel=1e-9)
    assert a.signals["itl"].split.component("batch").change == pytest.approx(0.0, abs=1e-15)
    assert "decode steps 47% slower at the same batch size (12.8 ms → 18.8 ms)" in a.summary


def test_more_requests_in_the_batch_trace_back_to_the_load() -> None:
    """ITL rises with the batch, and the batch with the request rate (Little's law)."""
    before_iv = _intervals(0.010, [5.0, 6.0, 7.0, 8.0, 9.0])
    after_iv = _intervals(0.010, [12.0, 13.0, 14.0, 15.0, 16.0])
    itl_b = math.fsum(i.itl_sum for i in before_iv) / 500
    itl_a = math.fsum(i.itl_sum for i in after_iv) / 500
    base = {**BASE, "itl": itl_b}
    a = attribute(facts(**base, intervals=before_iv),
                  facts(600, 1200, **{**BASE, "itl": itl_a, "rate": 6.2, "running": 14.0}, intervals=after_iv),
                  steady_parts(**base))
    assert a.lead == "itl"
    assert a.drivers[0].name == "load" and a.drivers[0].explains["itl"] == pytest.approx(0.0028, rel=1e-6)


def test_a_replica_gone_is_put_on_the_replicas() -> None:
    base = {**BASE, "running_max": 24.0, "replicas": ("a", "b")}
    after = facts(600, 1200, ttft=1.2, queue=1.1, prefill=0.05, rate=3.1, running=12.0, running_max=12.0, waiting=6.0,
                  e2e=3.6, decode=2.4, replicas=("a",))
    a = attribute(facts(**base), after, steady_parts(**base))
    top = a.drivers[0]
    assert top.name == "replicas" and (top.before, top.after) == (2.0, 1.0) and top.note == "gone: b"
    assert top.explains["ttft"] == pytest.approx(1.09)
    assert "replicas 2 → 1 (gone: b)" in a.summary


def test_steady_numbers_say_nothing_changed() -> None:
    parts = steady_parts(**BASE, spread=0.05)
    a = attribute(facts(**BASE), facts(600, 1200, **{**BASE, "ttft": 0.072, "rate": 3.2}), parts)
    assert not a.changed and a.lead is None
    assert a.summary == ("Nothing changed over the last 10m vs the 10m before: TTFT mean 70.0 ms → 72.0 ms, ITL mean "
                         "12.6 ms → 12.6 ms, within the baseline's noise; no restart or config change.")
    # a request rate 3.1 -> 3.2 req/s is within 3 x its noise (0.071 req/s): no driver is named
    assert a.drivers == [] and not a.signals["ttft"].changed


def test_noise_is_the_spread_of_the_sub_windows() -> None:
    parts = [facts(rate=r) for r in (2.8, 3.0, 3.2, 3.0, 2.9, 3.1)]
    sd = drivers.noise(parts, lambda f: f.request_rate)
    spread = math.sqrt(sum((r - 3.0) ** 2 for r in (2.8, 3.0, 3.2, 3.0, 2.9, 3.1)) / 5)
    assert sd == pytest.approx(spread * math.sqrt(2 / 6))
    assert drivers.significant(3.0, 3.0 + 3.01 * sd, sd) and not drivers.significant(3.0, 3.0 + 2.99 * sd, sd)
    assert drivers.noise(parts[:2], lambda f: f.request_rate) is None
    assert drivers.significant(3.0, 3.7, None) and not drivers.significant(3.0, 3.5, None)  # 20 % without noise


def test_gaps_are_said() -> None:
    parts = steady_parts(**BASE)
    parts[2] = facts(200, 300, scrapes=0)
    a = attribute(facts(**BASE), facts(600, 1200, **BASE, scrapes=60), parts)
    assert a.gaps == ["the baseline has no scrape in 1 of its 6 parts (00:03-00:05 UTC)",
                      "the current window holds scrapes for 50% of it"]
    assert a.summary.endswith("data missing: the baseline has no scrape in 1 of its 6 parts (00:03-00:05 UTC); the "
                              "current window holds scrapes for 50% of it.")
