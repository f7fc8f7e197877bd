"""The component algebra: every split's components add up to the signal's change (to 1e-9 s), the
ITL-by-batch fit recovers a known line exactly, and products split symmetrically."""

from __future__ import annotations

import math
import random

import pytest

from app.attribution import algebra
from app.window import ItlInterval
from tests.attribution.factories import facts


def _sum_of_changes(split: algebra.Split) -> float:
    return math.fsum(c.change for c in split.components)


def _random_facts(rng: random.Random, end: float):
    """A window with every component drawn at random over five orders of magnitude."""
    def draw() -> float:
        return 10 ** rng.uniform(-4, 1)

    queue, prefill, transfer, render = draw(), draw(), draw(), draw()
    ttft = (queue + prefill + transfer + render) * rng.uniform(0.7, 1.3)  # the rest may be negative
    intervals = tuple(ItlInterval(draw() * 50, rng.uniform(1, 400), rng.uniform(0, 64))
                      for _ in range(rng.randint(1, 30)))
    decode = draw()
    return facts(end - 600, end, ttft=ttft, queue=queue, prefill=prefill, kv_transfer_time=transfer,
                 render_time=render, itl=draw() / 10, e2e=ttft + decode * rng.uniform(0.9, 1.1), decode=decode,
                 output=rng.uniform(2, 3000), intervals=intervals)


def test_components_add_up_to_the_change_within_1e9_seconds() -> None:
    rng = random.Random(37)
    worst = 0.0
    for _ in range(2000):
        before, after = _random_facts(rng, 600.0), _random_facts(rng, 1200.0)
        found = algebra.splits(before, after)
        assert set(found) == {"ttft", "itl", "e2e"}
        for split in found.values():
            error = abs(_sum_of_changes(split) - split.change)
            worst = max(worst, error)
            assert error <= 1e-9, (split.signal, error)
        assert [c.name for c in found["ttft"].components] == ["queue", "prefill", "transfer", "front_end", "rest"]
        assert [c.name for c in found["itl"].components] == ["batch", "step_time", "rest"]
        e2e = found["e2e"]
        assert [c.name for c in e2e.components] == ["ttft", "decode", "rest"]
        decode = e2e.component("decode")
        assert decode is not None
        assert abs(e2e.extra["decode_length"] + e2e.extra["decode_per_token"] - decode.change) <= 1e-9
        assert e2e.component("ttft").change == pytest.approx(found["ttft"].change, abs=1e-12)
    assert worst < 1e-12  # in practice a few ulps of the largest mean


def test_the_shares_of_the_components_add_up_to_one() -> None:
    before = facts(ttft=0.5, queue=0.1, prefill=0.3)
    after = facts(ttft=2.5, queue=1.9, prefill=0.45)
    split = algebra.ttft_split(before, after)
    assert split is not None
    assert [(c.name, round(c.change, 12), round(c.share, 12)) for c in split.components] == [
        ("queue", 1.8, 0.9), ("prefill", 0.15, 0.075), ("rest", 0.05, 0.025)]
    assert split.component("rest").before == pytest.approx(0.1) and split.component("rest").after == pytest.approx(0.15)


def test_a_part_timed_in_one_window_only_goes_to_the_rest() -> None:
    split = algebra.ttft_split(facts(ttft=0.5, queue=0.1, prefill=0.3),
                               facts(ttft=0.9, queue=None, prefill=0.3))
    assert split is not None
    assert [c.name for c in split.components] == ["prefill", "rest"]
    assert split.notes == ("queue is timed in only one of the windows: it is in the rest",)
    assert _sum_of_changes(split) == pytest.approx(0.4, abs=1e-12)


def test_a_decode_worker_names_its_queue_and_first_step() -> None:
    from dataclasses import replace
    before = replace(facts(), decode_worker=True)
    split = algebra.ttft_split(before, facts(ttft=0.2))
    assert split is not None
    assert [c.label for c in split.components][:2] == ["decode-side queue", "first step"]


def _line(a: float, c: float, d: float, batches: list[float], steps: float = 100.0) -> tuple[ItlInterval, ...]:
    return tuple(ItlInterval(steps * (a + c * b + d), steps, b) for b in batches)


def test_the_batch_fit_recovers_a_known_line_and_step() -> None:
    """ITL = 8 ms + 0.5 ms per running request; after, every step 3 ms slower and 10 more requests
    running: the batch part is 5 ms, the step time 3 ms, exactly."""
    before = facts(itl=None, intervals=_line(0.008, 0.0005, 0.0, [4, 6, 8, 10, 12]))
    after = facts(itl=None, intervals=_line(0.008, 0.0005, 0.003, [14, 16, 18, 20, 22]))
    slope, xb, xa, yb, ya = algebra.batch_fit(before, after)
    assert slope == pytest.approx(0.0005, rel=1e-12)
    assert (xb, xa) == pytest.approx((8.0, 18.0), rel=1e-12)
    # the histogram's means equal the intervals' here: nothing uncovered
    split = algebra.itl_split(facts(itl=yb, intervals=before.intervals), facts(itl=ya, intervals=after.intervals))
    assert split is not None
    changes = {c.name: c.change for c in split.components}
    assert changes["batch"] == pytest.approx(0.005, rel=1e-9)
    assert changes["step_time"] == pytest.approx(0.003, rel=1e-9)
    assert changes["rest"] == pytest.approx(0.0, abs=1e-15)


def test_a_batch_that_never_varies_puts_nothing_on_the_batch_size() -> None:
    before = facts(itl=0.010, intervals=_line(0.010, 0.0, 0.0, [8, 8, 8]))
    after = facts(itl=0.014, intervals=_line(0.010, 0.0, 0.004, [8.2, 8.2, 8.2]))
    split = algebra.itl_split(before, after)
    assert split is not None
    assert split.extra["slope"] == 0.0 and split.component("batch").change == 0.0
    assert split.component("step_time").change == pytest.approx(0.004, rel=1e-9)
    assert "did not vary enough" in split.notes[0]


def test_without_intervals_itl_is_not_split_and_tpot_stands_in_without_itl() -> None:
    split = algebra.itl_split(facts(itl=0.01), facts(itl=0.02))
    assert split is not None and [c.name for c in split.components] == ["rest"]
    found = algebra.splits(facts(itl=None, tpot=0.02), facts(itl=None, tpot=0.03))
    assert "itl" not in found and found["tpot"].change == pytest.approx(0.01)


def test_a_product_splits_symmetrically_and_exactly() -> None:
    length, per_token = algebra.product_split(100.0, 0.01, 150.0, 0.02)
    assert (length, per_token) == pytest.approx((50 * 0.015, 0.01 * 125))
    assert length + per_token == pytest.approx(150 * 0.02 - 100 * 0.01, abs=1e-15)
    swapped = algebra.product_split(0.01, 100.0, 0.02, 150.0)
    assert swapped == pytest.approx((per_token, length))
