"""Probes against the emulator's streaming API: client numbers vs. the engine's ground truth.

The emulator streams each token at the simulated end of the engine step that produced it, so
a client's TTFT and ITL (times ``time_scale``) agree with the engine's own histograms and
with the step time of its roofline. ``synthetic=False`` targets serve only the probe: the
engine's numbers are the roofline's exactly, and the client's are judged against them
one-sided, with the wall-clock lag a busy machine adds (tests/support/emulated_timing.py).
Time scales stay low where client numbers feed a verdict, so that lag stays small in
simulated seconds.
"""

from __future__ import annotations

import asyncio

import pytest

from app.emulator import EmulatorFleet, TargetSpec
from app.emulator.readout import Page
from app.emulator.scenarios import get as get_scenario
from app.probe.runner import LevelPlan, ProbeSpec, run_probe
from app.probe.sweep import analyze, compare_load, fit_line, format_analysis, sweep_plans
from tests.support.emulated_timing import (
    CLIENT_LAG_S,
    check_lag,
    check_token_times,
    lone_token_times,
    lone_ttft,
)

SCALES = {"solo": 1.0, "fast": 4.0, "queue": 1.0, "bw": 5.0, "prefill": 0.5, "load": 2.0}
CHUNK = 2048  # the token budget of every scenario used here (chunked prefill on)


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
    """Single requests on an idle 8B/A100: the engine's histograms hold exactly the roofline's
    prefill and decode steps of the probe's requests, ITL = one decode step (the floor at this
    context), and every token reaches the client after the engine emitted it, within the lag
    allowance (64 tokens span 0.72 s simulated: a client ITL off by 2x would be seen)."""
    state = fleet.state("solo")
    before_state, before = state, page(fleet, "solo")
    spec = ProbeSpec(fleet.urls["solo"], prompt_tokens=1024, max_tokens=64, concurrency=1, requests=3)
    result = asyncio.run(run_probe(spec))
    after, after_state = page(fleet, "solo"), fleet.state("solo")
    level = result.levels[0]
    assert result.ok and level.succeeded == 3 and result.preflight_requests == 1
    assert [r.prompt_tokens for r in level.requests] == [1024] * 3  # token-exact prompts
    assert all(r.tokens == 64 == r.completion_tokens and r.finish_reason == "length" for r in level.requests)
    assert after_state["counts"]["finished"] - before_state["counts"]["finished"] == 4  # 3 + the preflight

    ttft = hist_delta(before, after, "vllm:time_to_first_token_seconds")
    itl = hist_delta(before, after, "vllm:inter_token_latency_seconds")
    assert ttft.count == 4 and itl.count == 3 * 63  # the preflight has max_tokens=1: no gaps
    dep = get_scenario("healthy").deployment
    engine = lone_token_times(dep, 1024, 64, CHUNK)  # ~0.09 s prefill, then 63 decode steps
    # the engine's sums are the roofline's, to float precision (the preflight: a 16-token prompt)
    assert ttft.sum == pytest.approx(3 * engine[0] + lone_ttft(dep, 16, CHUNK), rel=1e-9)
    assert itl.sum == pytest.approx(3 * (engine[-1] - engine[0]), rel=1e-9)
    floor = state["decode_floor_seconds"]  # 11.3 ms: one decode step of the 8B on an A100
    assert itl.mean == pytest.approx(floor, rel=0.06)  # KV reads at 1k context add < 6 %
    for r in level.requests:  # the client never sees a token before the engine emitted it
        check_token_times(r, engine, SCALES["solo"])
    check_lag(level.ttft.mean, engine[0], SCALES["solo"], "TTFT mean")
    check_lag(level.e2e.mean, engine[-1], SCALES["solo"], "end-to-end mean")


def test_chat_prompts_are_calibrated_to_the_exact_length(fleet):
    spec = ProbeSpec(fleet.urls["solo"], prompt_tokens=700, max_tokens=8, chat=True, requests=2)
    result = asyncio.run(run_probe(spec))
    assert result.protocol["prompt_mode"] == "text" and result.protocol["calibrated"]
    assert result.protocol["overhead_tokens"] == 7.0  # 4 per message + 3 for the reply primer
    assert [r.prompt_tokens for r in result.levels[0].requests] == [700, 700]
    assert all(r.tokens == 8 for r in result.levels[0].requests) and result.preflight_requests == 3


def test_time_scale_converts_client_seconds_to_simulated_ones(fleet):
    """At time_scale 4 the histograms record simulated seconds and a client sees them in a
    quarter of the wall time: client x 4 lies within the lag allowance (2 s simulated) of the
    engine's times. 200 tokens span 2.5 s simulated, so a target running at half the pace
    (client x 4 = 2 x the engine's) or not scaled at all (4 x) is seen."""
    before = page(fleet, "fast")
    spec = ProbeSpec(fleet.urls["fast"], prompt_tokens=2000, max_tokens=200, requests=2, preflight=False)
    result = asyncio.run(run_probe(spec))
    after = page(fleet, "fast")
    level, scale = result.levels[0], SCALES["fast"]
    ttft = hist_delta(before, after, "vllm:time_to_first_token_seconds")
    itl = hist_delta(before, after, "vllm:inter_token_latency_seconds")
    assert ttft.count == 2 and itl.count == 2 * 199
    engine = lone_token_times(get_scenario("healthy").deployment, 2000, 200, CHUNK)
    assert ttft.mean == pytest.approx(engine[0], rel=1e-9) and itl.sum == pytest.approx(2 * (engine[-1] - engine[0]),
                                                                                         rel=1e-9)
    assert engine[-1] - engine[0] > CLIENT_LAG_S * scale  # 2.3 s > 2 s: the pace is checked
    for r in level.requests:
        check_token_times(r, engine, scale)


def test_single_vs_concurrent_separates_queueing_from_bandwidth_bound(fleet):
    """queueing: fine alone, TTFT explodes at 32 users (8 slots); bandwidth_bound: every token
    already takes a full weight read alone, and more users barely change it. The engine's
    numbers over each level show the physics; the client's lone requests keep to the engine's
    token times and the split of the client's levels names the regime."""
    def level(name: str, concurrency: int, requests: int):
        """One level as its own probe, with the engine's ITL histogram read around it. No
        preflight: after a request on the pool, httpx hands one idle keep-alive connection to
        several queued requests at once, and 32 concurrent requests then reach the engine
        over seconds instead of together (the engine would see no queue)."""
        url = fleet.urls[name]
        spec = ProbeSpec(url, prompt_tokens=256, max_tokens=64, metrics_url=url + "/metrics", preflight=False)
        before = page(fleet, name)
        result = asyncio.run(run_probe(spec, [LevelPlan(concurrency, 256, 64, requests)]))
        assert result.ok and result.levels[0].succeeded == requests
        return result.levels[0], hist_delta(before, page(fleet, name), "vllm:inter_token_latency_seconds")

    (q1, _), (q32, _) = level("queue", 1, 2), level("queue", 32, 32)
    (b1, b1_itl), (b4, b4_itl) = level("bw", 1, 2), level("bw", 4, 4)
    q_state, b_state = fleet.state("queue"), fleet.state("bw")
    qs, bs = SCALES["queue"], SCALES["bw"]
    # queueing, alone: no queue at all, the engine's TTFT is one 256-token prefill, ITL the floor ...
    q_dep, b_dep = get_scenario("queueing").deployment, get_scenario("bandwidth_bound").deployment
    q_alone = lone_token_times(q_dep, 256, 64, CHUNK)
    assert q1.server["queue_time_mean"] == 0.0 and q1.server["requests"] == 2
    assert q1.server["ttft_mean"] == pytest.approx(q_alone[0], rel=1e-9) and q_alone[0] < 0.05
    assert (q_alone[-1] - q_alone[0]) / 63 == pytest.approx(q_state["decode_floor_seconds"], rel=0.05)
    for r in q1.requests:  # ... and the client sees exactly that, plus its lag
        check_token_times(r, q_alone, qs)
    # ... and 32 concurrent requests queue for 8 slots: 3 waves of 8 wait 0.8, 1.6 and 2.4 s (each
    # request decodes 64 tokens; at time scale 1 a wave lasts longer than the client takes to send
    # all 32 even on a busy machine), so the engine's TTFT is over 15 x the lone one, nearly all queue
    assert q32.server["requests"] == 32 and q32.server["queue_time_mean"] > 0.5
    assert q32.server["ttft_mean"] > 15 * q1.server["ttft_mean"]
    assert q32.server["queue_time_mean"] > 0.9 * q32.server["ttft_mean"]
    # the client waits at least that long (and more: opening 32 connections takes seconds on a busy machine)
    assert q32.ttft.mean * qs >= q32.server["ttft_mean"]
    # bandwidth_bound: a lone request's ITL already ~50 ms = the floor of a 35 GB weight read on 864 GB/s
    floor = b_state["decode_floor_seconds"]
    b_alone = lone_token_times(b_dep, 256, 64, CHUNK)
    assert floor > 0.045 and b1_itl.count == 2 * 63 and b1_itl.mean == pytest.approx(floor, rel=0.05)
    assert b1_itl.sum == pytest.approx(2 * (b_alone[-1] - b_alone[0]), rel=1e-9)
    for r in b1.requests:
        check_token_times(r, b_alone, bs)
    assert b4_itl.count == 4 * 63 and b4_itl.mean / b1_itl.mean < 1.2  # batching 4 decodes is nearly free
    # a request's client gaps add up to the engine's but for the lags of its first and last
    # token (0 .. the allowance each): the level's mean ITL is the engine's within allowance / 63
    assert abs(b4.itl.mean * bs - b4_itl.mean) <= CLIENT_LAG_S * bs / 63

    q_split = compare_load(q1, q32, decode_floor=q_state["decode_floor_seconds"], time_scale=qs)
    b_split = compare_load(b1, b4, decode_floor=floor, time_scale=bs)
    assert q_split.slow_alone == () and q_split.slow_under_load == ("ttft",) and q_split.suggests == ("queueing",)
    assert b_split.slow_alone == ("itl",) and b_split.slow_under_load == () and b_split.suggests == ("bandwidth_bound",)
    assert b_split.itl_over_floor == pytest.approx(b1.itl.mean * bs / floor, rel=1e-12)  # simulated seconds
    assert b_split.ttft_ratio < 5 < q_split.ttft_ratio


@pytest.mark.slow
def test_a_lone_request_on_a_busy_queueing_server_is_not_called_prefill_bound():
    """The queueing scenario with its own 48 users on 8 slots: every request waits ~16 s
    (simulated) in the queue, a lone probe's too, so single and loaded TTFT look alike and
    both are slow. Without the engine's queue time that reads as "slow alone" (prefill); with
    the engine's /metrics read around each level, the queue accounts for the whole TTFT. The
    probe's own requests are read back from the emulator's records (simulated seconds)."""
    scale = 5.0  # the emulator simulates 48 users: faster, a busy machine delays its tokens by seconds
    with EmulatorFleet([TargetSpec("busy", "queueing", time_scale=scale, warmup_s=120, seed=7)]) as busy:
        url = busy.urls["busy"]
        plans = sweep_plans([256], [1, 4], 64)  # 63 gaps: a token's late delivery barely moves the mean ITL

        def levels(metrics_url: str | None):
            seen = {r.rid for r in busy.call("busy", lambda t: list(t.sim.records))}
            result = asyncio.run(run_probe(ProbeSpec(url, prompt_tokens=256, max_tokens=64, metrics_url=metrics_url),
                                           plans))
            assert result.ok and [lv.issued for lv in result.levels] == [2, 8]
            ours = sorted((r for r in busy.call("busy", lambda t: list(t.sim.records)) if r.http and r.rid not in seen),
                          key=lambda r: r.arrival)
            assert [r.prompt_tokens for r in ours] == [16] + [256] * 10  # the preflight, then the two levels
            return result, ours[1:3]  # the engine's view of the single level's two requests

        blind, _ = levels(None)
        aware, engine_single = levels(url + "/metrics")
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
    # the lone requests waited like everyone else: their TTFT ~ the engine's mean queue time over the level
    engine_ttft = sorted(r.ttft for r in engine_single)
    assert server["queue_time_mean"] == pytest.approx(sum(engine_ttft) / 2, rel=0.2)
    assert server["ttft_mean"] == pytest.approx(server["queue_time_mean"], rel=0.05)
    for r, ttft in zip(sorted(single.requests, key=lambda r: r.started_at), (r.ttft for r in engine_single)):
        assert r.ttft * scale >= ttft  # the client never sees its first token before the engine sent it
    split = compare_load(single, loaded, time_scale=scale)
    assert split.busy and split.single_queue_time == server["queue_time_mean"]
    assert split.single_ttft_p50 == pytest.approx(single.ttft.p50 * scale, rel=1e-12)  # simulated seconds
    assert split.single_ttft_without_queue == max(0.0, split.single_ttft_p50 - server["queue_time_mean"])
    assert sum(engine_ttft) / 2 - server["queue_time_mean"] < 0.2 * sum(engine_ttft) / 2  # the queue is the TTFT
    assert split.slow_alone == () and split.suggests == ("queueing",)
    assert split.notes[0].startswith(f"the single request waited {server['queue_time_mean']:.2f} s of its")
    assert analyze(aware)["load_split"]["single_queue_time"] == server["queue_time_mean"]  # CLI and API report it
    assert loaded.server["queue_time_mean"] > 10.0


def test_prompt_sweep_fits_the_prefill_cost(fleet):
    """prefill_compute deployment (8B on A100): TTFT grows linearly with the prompt at the
    roofline's prefill cost (~0.1 s per 1k tokens, 2048-token chunks). The engine's TTFT of
    each level, read by the probe from /metrics, is the roofline's exactly; the client's fit
    has the same slope within 10 %: at time scale 0.5 a client lag of L wall seconds moves
    the slope by at most 0.5 x L x 0.16 s per 1k tokens (the top level's least-squares weight
    over this ladder), so 10 % takes L > 0.13 s, and a slope off by 2x still fails."""
    url, scale = fleet.urls["prefill"], SCALES["prefill"]
    spec = ProbeSpec(url, max_tokens=4, concurrency=1, metrics_url=url + "/metrics")
    ladder = [1000, 2000, 4000, 8000]
    result = asyncio.run(run_probe(spec, sweep_plans(ladder, [1], 4)))
    fit = analyze(result)["ttft_vs_prompt"]
    assert result.ok and fit is not None and fit["n"] == 8
    assert [(lv.plan.prompt_tokens, lv.concurrency, lv.issued) for lv in result.levels] == \
        [(1000, 1, 2), (2000, 1, 2), (4000, 1, 2), (8000, 1, 2)]
    dep = get_scenario("prefill_compute").deployment
    engine = [lone_ttft(dep, p, CHUNK) for p in ladder]
    assert [lv.server["requests"] for lv in result.levels] == [2.0] * 4
    assert [lv.server["ttft_mean"] for lv in result.levels] == pytest.approx(engine, rel=1e-9)
    physics = fit_line(ladder, engine)  # the roofline's prefill cost, tokenization included
    assert 0.09 < physics.slope_per_1k < 0.11 and physics.r2 > 0.999
    for lv, ttft in zip(result.levels, engine):
        for r in lv.requests:
            check_lag(r.ttft * scale, ttft, scale, f"{lv.plan.prompt_tokens}-token TTFT")
    assert fit["slope_seconds_per_1k_tokens"] * scale == pytest.approx(physics.slope_per_1k, rel=0.1)
    assert fit["r2"] > 0.99
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
    alone = lone_token_times(get_scenario("healthy").deployment, 2048, 64, CHUNK)
    for r in result.levels[0].requests:  # concurrency 1: the engine's lone timeline, ITL ~ the floor
        check_token_times(r, alone, scale)
    assert (alone[-1] - alone[0]) / 63 == pytest.approx(fleet.state("load")["decode_floor_seconds"], rel=0.1)
    assert itl[0] < itl[1] < itl[2] and itl[2] / itl[0] > 2.0
    tps = [p["output_tokens_per_second"] for p in curve]
    assert tps[2] > 2 * tps[0]  # throughput still grows: batching
    assert [lv.issued for lv in result.levels] == [2, 8, 32]
