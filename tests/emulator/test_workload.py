"""Traffic generation: the statistics the scenarios rely on, checked on large samples.

Tolerances are a few standard errors of the sample sizes used (stated per test), so a
correct generator passes for any seed and a wrong rate, burst factor or median fails.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from app.emulator.workload import Burst, LengthDist, StreamRuntime, TrafficStream


def runtime(stream: TrafficStream, seed: int = 0, index: int = 0) -> StreamRuntime:
    return StreamRuntime(stream, seed=seed, index=index, start=0.0, max_model_len=131_072)


def arrivals(rt: StreamRuntime, horizon_s: float) -> list[float]:
    out = []
    while (t := rt.next_open_loop_arrival()) < horizon_s:
        out.append(t)
    return out


def test_open_loop_arrivals_are_poisson_at_the_rate() -> None:
    # 5 req/s for 4,000 s: ~20,000 arrivals; the count's relative s.e. is 0.7 %.
    times = arrivals(runtime(TrafficStream(rate=5.0)), 4000.0)
    assert len(times) / 4000.0 == pytest.approx(5.0, rel=0.025)
    gaps = [b - a for a, b in zip(times, times[1:])]
    # exponential gaps: coefficient of variation 1 (s.e. ~0.01 here)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.04)
    # counts per second: Poisson, variance = mean (index of dispersion 1, s.e. ~0.02)
    per_second = Counter(int(t) for t in times)
    counts = [per_second.get(s, 0) for s in range(4000)]
    assert statistics.pvariance(counts) / statistics.fmean(counts) == pytest.approx(1.0, abs=0.08)


def test_bursts_multiply_the_rate_inside_the_burst_only() -> None:
    # 2 req/s, x4 for 2 s of every 10 s: 8 req/s inside (800 burst-seconds, ~6,400
    # arrivals, s.e. 1.3 %), 2 req/s outside (3,200 s, ~6,400 arrivals), 3.2 req/s overall.
    burst = Burst(period_s=10.0, duration_s=2.0, multiplier=4.0)
    times = arrivals(runtime(TrafficStream(rate=2.0, burst=burst)), 4000.0)
    inside = sum(1 for t in times if t % 10.0 < 2.0)
    outside = len(times) - inside
    assert inside / 800.0 == pytest.approx(8.0, rel=0.05)
    assert outside / 3200.0 == pytest.approx(2.0, rel=0.05)
    assert len(times) / 4000.0 == pytest.approx(3.2, rel=0.04)


def test_lognormal_lengths_have_the_median_and_are_clamped() -> None:
    rt = runtime(TrafficStream(rate=1.0))
    free = [LengthDist.lognormal(500, 0.8).sample(rt.rng) for _ in range(20_000)]
    # sample median of 20,000: s.e. ~0.9 % of the median at sigma 0.8
    assert statistics.median(free) == pytest.approx(500, rel=0.035)
    # log-space sigma recovered (s.e. ~0.5 %)
    assert statistics.pstdev(math.log(x) for x in free) == pytest.approx(0.8, rel=0.03)
    clamped = [LengthDist.lognormal(500, 0.8, low=100, high=600).sample(rt.rng) for _ in range(20_000)]
    assert min(clamped) >= 100 and max(clamped) == 600
    # P(X >= 600) = 1 - Phi(ln(600/500) / 0.8) = 0.410 (s.e. 0.0035)
    expected_top = 1 - statistics.NormalDist().cdf(math.log(600 / 500) / 0.8)
    assert sum(1 for x in clamped if x == 600) / len(clamped) == pytest.approx(expected_top, abs=0.015)


def test_uniform_and_fixed_lengths() -> None:
    rt = runtime(TrafficStream(rate=1.0))
    uniform = [LengthDist.uniform(100, 200).sample(rt.rng) for _ in range(20_000)]
    assert min(uniform) == 100 and max(uniform) == 200  # inclusive at both ends
    assert statistics.fmean(uniform) == pytest.approx(150, abs=0.6)  # s.e. 0.2
    assert LengthDist.uniform(100, 200).mean == 150
    assert {LengthDist.fixed(256).sample(rt.rng) for _ in range(100)} == {256}


def test_shared_prefixes_are_drawn_with_their_share_and_counted_in_the_prompt() -> None:
    stream = TrafficStream(rate=1.0, prompt=LengthDist.fixed(300), prefix_tokens=1000, prefix_share=0.3,
                           num_prefixes=4)
    rt = runtime(stream)
    draws = [rt.draw() for _ in range(10_000)]
    with_prefix = [d for d in draws if d.prefix_id is not None]
    assert len(with_prefix) / len(draws) == pytest.approx(0.3, abs=0.015)  # s.e. 0.005
    assert {d.prompt_tokens for d in with_prefix} == {1300} and {d.prefix_tokens for d in with_prefix} == {1000}
    assert {d.prompt_tokens for d in draws if d.prefix_id is None} == {300}
    assert len({d.prefix_id for d in with_prefix}) == 4


def test_closed_loop_think_time_is_exponential_with_its_mean() -> None:
    rt = runtime(TrafficStream(clients=16, think_time_s=2.0))
    thinks = [rt.think() for _ in range(20_000)]
    assert statistics.fmean(thinks) == pytest.approx(2.0, rel=0.025)  # s.e. 0.7 %
    starts = rt.initial_client_times()
    assert len(starts) == 16 and all(0.0 <= t <= 2.0 for t in starts)


def test_prompts_are_capped_by_the_model_length() -> None:
    rt = StreamRuntime(TrafficStream(rate=1.0, prompt=LengthDist.fixed(9000), max_tokens=4096), seed=0, index=0,
                       start=0.0, max_model_len=8192)
    draw = rt.draw()
    assert draw.prompt_tokens == 8191 and draw.max_tokens == 1


def test_streams_are_reproducible_and_independent() -> None:
    stream = TrafficStream(rate=3.0, prompt=LengthDist.lognormal(800, 0.5))
    a, b, other = runtime(stream, seed=7), runtime(stream, seed=7), runtime(stream, seed=7, index=1)
    sequence = [(a.next_open_loop_arrival(), a.draw().prompt_tokens) for _ in range(50)]
    assert sequence == [(b.next_open_loop_arrival(), b.draw().prompt_tokens) for _ in range(50)]
    assert sequence != [(other.next_open_loop_arrival(), other.draw().prompt_tokens) for _ in range(50)]


@pytest.mark.parametrize("make, message", [
    (lambda: LengthDist("zipf"), "unknown length distribution 'zipf'"),
    (lambda: LengthDist.uniform(10, 5), "low > high"),
    (lambda: TrafficStream(rate=1.0, clients=4), "set exactly one of rate (open loop) or clients"),
    (lambda: TrafficStream(), "set exactly one of rate (open loop) or clients"),
    (lambda: TrafficStream(rate=1.0, prefix_share=1.5), "prefix_share must be in [0, 1]"),
])
def test_bad_workloads_are_refused_with_a_reason(make, message) -> None:
    with pytest.raises(ValueError) as excinfo:
        make()
    assert message in str(excinfo.value)
