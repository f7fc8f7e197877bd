"""Probes against the emulator's streaming API: client numbers vs. the engine's ground truth.

The emulator streams each token at the simulated end of the engine step that produced it, so
a client's TTFT and ITL (times ``time_scale``) must agree with the engine's own histograms
and with the step time of its roofline. ``synthetic=False`` targets serve only the probe:
the numbers are clean.
"""

from __future__ import annotations

import asyncio

import pytest

from app.emulator import EmulatorFleet, TargetSpec
from app.emulator.readout import Page
from app.emulator.scenarios import get as get_scenario
from app.probe.runner import LevelPlan, ProbeSpec, run_probe
from app.probe.sweep import analyze, compare_load, format_analysis, sweep_plans

SCALES = {"solo": 1.0, "fast": 4.0, "queue": 10.0, "bw": 5.0, "prefill": 2.0, "load": 5.0}


@pytest.fixture(scope="module")
def fleet():
    specs = [TargetSpec("solo", "healthy", synthetic=False, time_scale=SCALES["solo"]),
             TargetSpec("fast", "healthy", synthetic=False, time_scale=SCALES["fast"]),
             TargetSpec("queue", "queueing", synthetic=False, time_scale=SCALES["queue"]),
             TargetSpec("bw", "bandwidth_bound", synthetic=False, time_scale=SCALES["bw"]),
             TargetSpec("prefill", "prefill_compute", synthetic=False, time_scale=SCALES["prefill"]),
             TargetSpec("load", "healthy", synthetic=False, time_scale=SCALES["load"])]
    with EmulatorFleet(specs) as f:
        yield f


def page(fleet, name: str) -> Page:
    return Page(fleet.metrics(name))


def hist_delta(before: Page, after: Page, family: str):
    return after.hist(family).minus(before.hist(family))


def test_client_ttft_and_itl_match_the_engine(fleet):
    """Single requests on an idle 8B/A100: ITL = one decode step (the roofline's floor at this
    context), TTFT = the engine's histogram over exactly the probe's requests."""
    state = fleet.state("solo")
    before_state, before = state, page(fleet, "solo")
    spec = ProbeSpec(fleet.urls["solo"], prompt_tokens=1024, max_tokens=32, concurrency=1, requests=3)
    result = asyncio.run(run_probe(spec))
    after, after_state = page(fleet, "solo"), fleet.state("solo")
    level = result.levels[0]
    assert result.ok and level.succeeded == 3 and result.preflight_requests == 1
    assert [r.prompt_tokens for r in level.requests] == [1024] * 3  # token-exact prompts
    assert all(r.tokens == 32 == r.completion_tokens and r.finish_reason == "length" for r in level.requests)
    assert after_state["counts"]["finished"] - before_state["counts"]["finished"] == 4  # 3 + the preflight

    ttft = hist_delta(before, after, "vllm:time_to_first_token_seconds")
    itl = hist_delta(before, after, "vllm:inter_token_latency_seconds")
    assert ttft.count == 4 and itl.count == 3 * 31  # the preflight has max_tokens=1: no gaps
    floor = state["decode_floor_seconds"]  # 11.3 ms: one decode step of the 8B on an A100
    assert level.itl.mean == pytest.approx(floor, rel=0.06)
    assert level.itl.mean == pytest.approx(itl.mean, rel=0.03)
    assert level.itl.p50 == pytest.approx(floor, rel=0.05)
    dep = get_scenario("healthy").deployment
    engine_ttft = dep.prefill_s(1024, 2048)  # one 1024-token prefill step, ~0.1 s
    assert level.ttft.mean == pytest.approx(engine_ttft, rel=0.15, abs=0.01)
    # the server's mean includes the tiny preflight (16 tokens); compare the probe's share of the sum
    preflight_ttft = dep.prefill_s(16, 2048)
    server_probe_mean = (ttft.sum - preflight_ttft) / 3
    assert level.ttft.mean == pytest.approx(server_probe_mean, rel=0.1, abs=0.006)
    assert level.ttft.mean >= server_probe_mean - 0.002  # the client never sees it earlier than the engine


def test_chat_prompts_are_calibrated_to_the_exact_length(fleet):
    spec = ProbeSpec(fleet.urls["solo"], prompt_tokens=700, max_tokens=8, chat=True, requests=2)
    result = asyncio.run(run_probe(spec))
    assert result.protocol["prompt_mode"] == "text" and result.protocol["calibrated"]
    assert result.protocol["overhead_tokens"] == 7.0  # 4 per message + 3 for the reply primer
    assert [r.prompt_tokens for r in result.levels[0].requests] == [700, 700]
    assert all(r.tokens == 8 for r in result.levels[0].requests) and result.preflight_requests == 3


def test_time_scale_converts_client_seconds_to_simulated_ones(fleet):
    before = page(fleet, "fast")
    spec = ProbeSpec(fleet.urls["fast"], prompt_tokens=2000, max_tokens=40, requests=2, preflight=False)
    result = asyncio.run(run_probe(spec))
    after = page(fleet, "fast")
    level, scale = result.levels[0], SCALES["fast"]
    ttft = hist_delta(before, after, "vllm:time_to_first_token_seconds")
    itl = hist_delta(before, after, "vllm:inter_token_latency_seconds")
    assert ttft.count == 2 and itl.count == 2 * 39
    assert level.itl.mean * scale == pytest.approx(itl.mean, rel=0.08)
    assert level.ttft.mean * scale == pytest.approx(ttft.mean, rel=0.1, abs=0.03)  # 4 x the client's jitter


def test_single_vs_concurrent_separates_queueing_from_bandwidth_bound(fleet):
    """queueing: fine alone, TTFT explodes at 32 users (8 slots); bandwidth_bound: every token
    already takes a full weight read alone, and more users barely change it."""
    q_state, b_state = fleet.state("queue"), fleet.state("bw")

    def ladder(name: str, levels: list[int]):
        spec = ProbeSpec(fleet.urls[name], prompt_tokens=256, max_tokens=64)
        plans = [LevelPlan(c, 256, 64, max(2 * c, 4)) for c in levels]
        result = asyncio.run(run_probe(spec, plans))
        assert result.ok
        return result.levels

    q1, q32 = ladder("queue", [1, 32])
    b1, b4 = ladder("bw", [1, 4])
    qs, bs = SCALES["queue"], SCALES["bw"]
    # queueing: single request fast on both clocks ...
    assert q1.ttft.p50 * qs < 0.1 and q1.itl.mean * qs == pytest.approx(q_state["decode_floor_seconds"], rel=0.1)
    # ... and TTFT at 32 concurrent is an order of magnitude worse (3 waves wait for 8 slots)
    assert q32.ttft.p50 * qs > 1.0 and q32.ttft.p50 / q1.ttft.p50 > 15
    assert q32.ttft.p90 * qs > 2.0
    # bandwidth_bound: single request ITL already ~50 ms, = the floor of a 35 GB weight read on 864 GB/s
    floor = b_state["decode_floor_seconds"]
    assert floor > 0.045 and b1.itl.mean * bs == pytest.approx(floor, rel=0.05)
    assert b4.itl.mean / b1.itl.mean < 1.2  # batching 4 decodes is nearly free
    q_split = compare_load(q1, q32, decode_floor=q_state["decode_floor_seconds"], time_scale=qs)
    b_split = compare_load(b1, b4, decode_floor=floor, time_scale=bs)
    assert q_split.slow_alone == () and q_split.slow_under_load == ("ttft",) and q_split.suggests == ("queueing",)
    assert b_split.slow_alone == ("itl",) and b_split.slow_under_load == () and b_split.suggests == ("bandwidth_bound",)
    assert b_split.itl_over_floor == pytest.approx(1.0, abs=0.05) and b_split.ttft_ratio < 5 < q_split.ttft_ratio


@pytest.mark.slow
def test_a_lone_request_on_a_busy_queueing_server_is_not_called_prefill_bound():
    """The queueing scenario with its own 48 users on 8 slots: every request waits ~16 s
    (simulated) in the queue, a lone probe's too, so single and loaded TTFT look alike and
    both are slow. Without the engine's queue time that reads as "slow alone" (prefill); with
    the engine's /metrics read around each level, the queue accounts for the whole TTFT."""
    scale = 20.0
    with EmulatorFleet([TargetSpec("busy", "queueing", time_scale=scale, warmup_s=120, seed=7)]) as busy:
        url = busy.urls["busy"]
        plans = sweep_plans([256], [1, 4], 16)

        def levels(metrics_url: str | None):
            result = asyncio.run(run_probe(ProbeSpec(url, prompt_tokens=256, max_tokens=16, metrics_url=metrics_url),
                                           plans))
            assert result.ok and [lv.issued for lv in result.levels] == [2, 8]
            return result

        blind = levels(None)
        aware = levels(url + "/metrics")
    single, loaded = blind.levels
    assert single.ttft.p50 * scale > 10.0 and single.server is None
    split = compare_load(single, loaded, time_scale=scale)
    assert split.ttft_ratio < 2.0 and split.single_queue_time is None and not split.busy
    assert split.slow_alone == ("ttft",) and split.suggests == ("prefill_compute",)
    assert "queue time over the single level is unknown (its /metrics was not read)" in split.notes[0]

    single, loaded = aware.levels
    server = single.server
    assert server["engine"] == "vllm" and server["error"] is None
    assert server["requests"] > 20  # the engine's own traffic, not just the probe's 2 requests
    # the engine's mean queue time over the level ~ the lone request's whole TTFT (simulated seconds)
    assert server["queue_time_mean"] == pytest.approx(single.ttft.p50 * scale, rel=0.2)
    assert server["ttft_mean"] == pytest.approx(server["queue_time_mean"], rel=0.05)
    split = compare_load(single, loaded, time_scale=scale)
    assert split.busy and split.single_queue_time == server["queue_time_mean"]
    assert split.single_ttft_without_queue < 0.2 * split.single_ttft_p50
    assert split.slow_alone == () and split.suggests == ("queueing",)
    assert split.notes[0].startswith(f"the single request waited {server['queue_time_mean']:.2f} s of its")
    assert analyze(aware)["load_split"]["single_queue_time"] == server["queue_time_mean"]  # CLI and API report it
    assert loaded.server["queue_time_mean"] > 10.0


def test_prompt_sweep_fits_the_prefill_cost(fleet):
    """prefill_compute deployment (8B on A100): TTFT grows linearly with the prompt at the
    roofline's prefill cost (~0.1 s per 1k tokens, 2048-token chunks)."""
    spec = ProbeSpec(fleet.urls["prefill"], max_tokens=4, concurrency=1)
    result = asyncio.run(run_probe(spec, sweep_plans([1000, 2000, 4000, 8000], [1], 4)))
    fit, scale = analyze(result)["ttft_vs_prompt"], SCALES["prefill"]
    assert result.ok and fit is not None and fit["n"] == 8
    dep = get_scenario("prefill_compute").deployment
    physics = (dep.prefill_s(8000, 2048) - dep.prefill_s(1000, 2048)) / 7.0  # seconds per 1k tokens
    assert 0.09 < physics < 0.11
    assert fit["slope_seconds_per_1k_tokens"] * scale == pytest.approx(physics, rel=0.05)
    assert fit["r2"] > 0.99
    assert abs(fit["intercept"] * scale) < 0.05
    assert [(lv.plan.prompt_tokens, lv.concurrency, lv.issued) for lv in result.levels] == \
        [(1000, 1, 2), (2000, 1, 2), (4000, 1, 2), (8000, 1, 2)]
    assert all(a.ttft.p50 < b.ttft.p50 for a, b in zip(result.levels, result.levels[1:]))
    assert format_analysis(analyze(result))[0].startswith(
        f"TTFT vs prompt length: {fit['slope_seconds_per_1k_tokens'] * 1000:.1f} ms per 1k tokens")


def test_concurrency_sweep_shows_itl_rising_with_load(fleet):
    """2k-token prompts on the 8B: more streams read more KV cache per step and new prompts'
    prefill chunks share steps with the decodes, so ITL climbs with concurrency."""
    spec = ProbeSpec(fleet.urls["load"], prompt_tokens=2048, max_tokens=64, concurrency=16)
    result = asyncio.run(run_probe(spec, sweep_plans([2048], [1, 4, 16], 64)))
    curve, scale = analyze(result)["itl_vs_concurrency"], SCALES["load"]
    assert result.ok and [p["concurrency"] for p in curve] == [1, 4, 16]
    itl = [p["itl_mean"] * scale for p in curve]
    assert itl[0] == pytest.approx(fleet.state("load")["decode_floor_seconds"], rel=0.1)
    assert itl[0] < itl[1] < itl[2] and itl[2] / itl[0] > 2.0
    tps = [p["output_tokens_per_second"] for p in curve]
    assert tps[2] > 2 * tps[0]  # throughput still grows: batching
    assert [lv.issued for lv in result.levels] == [2, 8, 32]
