"""The physics: step times, floors, and the regimes they produce, checked offline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.core.hardware import GPUS, MODELS, GiB
from app.emulator.engine import EngineConfig
from app.emulator.physics import Deployment
from app.emulator.readout import Page
from app.emulator.scenarios import get
from app.emulator.simulation import TOKENIZE_BASE_S, TOKENIZE_PER_TOKEN_S, Simulation
from app.emulator.workload import LengthDist, TrafficStream
from tests.emulator.helpers import custom, single_stream, window, with_engine


def test_presets_carry_datasheet_numbers():
    a100, h100 = GPUS["A100-80G"], GPUS["H100-SXM"]
    assert (a100.hbm_bandwidth, a100.bf16_flops) == (2.039e12, 312e12)
    assert (h100.hbm_bandwidth, h100.bf16_flops) == (3.35e12, 989e12)
    assert (GPUS["L40S"].hbm_bandwidth, GPUS["RTX-4090"].hbm_bandwidth) == (0.864e12, 1.008e12)
    # KV bytes per token: 2 x layers x kv_heads x head_dim x 2 bytes
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert MODELS["llama-3.1-70b"].kv_bytes_per_token() == 327680
    d = Deployment.of("A100-80G", "llama-3.1-8b")
    assert d.weight_bytes == pytest.approx(16.06e9)
    assert d.weight_read_floor_s == pytest.approx(16.06e9 / 2.039e12)  # 7.88 ms
    assert Deployment.of("L40S", "llama-3.1-70b", weight_dtype="int4").weight_read_floor_s == pytest.approx(
        70.6e9 * 0.5 / 0.864e12)
    # fp8 weights use the fp8 tensor rate where the card has one, not on A100
    assert Deployment.of("H100-SXM", "llama-3.1-8b", weight_dtype="fp8").peak_flops == 1979e12
    assert Deployment.of("A100-80G", "llama-3.1-8b", weight_dtype="fp8").peak_flops == 312e12
    with pytest.raises(ValueError, match="unknown GPU"):
        Deployment.of("TPU", "llama-3.1-8b")


def test_roofline_step_time():
    d = Deployment.of("A100-80G", "llama-3.1-8b", compute_efficiency=0.5, memory_efficiency=0.8, step_overhead_s=0.001)
    # decode of one token: memory-bound, weights + KV of 1000 tokens
    c = d.step_cost(1, 1001, 1001)
    assert c.bound == "memory"
    assert c.seconds == pytest.approx((16.06e9 + 131072 * 1001) / (2.039e12 * 0.8) + 0.001)
    # a 4096-token prefill chunk: compute-bound
    pairs = 4096 * 4097 / 2
    c = d.step_cost(4096, 4096, pairs)
    assert c.bound == "compute"
    flops = 2 * 8.03e9 * 4096 + 4 * 32 * 4096 * pairs
    assert c.flops == pytest.approx(flops)
    assert c.seconds == pytest.approx(flops / (312e12 * 0.5) + 0.001)
    # the ridge point: matmul time of this many tokens equals the weight read time
    r = d.ridge_tokens
    assert 2 * 8.03e9 * r / (312e12 * 0.5) == pytest.approx(16.06e9 / (2.039e12 * 0.8))
    # offload adds the PCIe transfer of the offloaded bytes to every step
    off = Deployment.of("RTX-4090", "llama-3.1-8b", cpu_offload_gb=4)
    assert off.offload_s == pytest.approx(4 * GiB / 25e9)
    assert off.decode_floor_s() > 10 * off.weight_read_floor_s


def test_kv_capacity_from_memory():
    d = Deployment.of("A100-80G", "llama-3.1-8b")
    blocks = d.kv_capacity_blocks(0.9, 16)
    expected = (80 * GiB * 0.9 - 16.06e9 - 2 * GiB) // (16 * 131072)
    assert blocks == expected
    assert 25_000 < blocks < 30_000  # ~450k tokens of KV
    with pytest.raises(ValueError, match="cannot hold one max_model_len"):
        Simulation(custom(engine=EngineConfig(num_gpu_blocks_override=100, max_model_len=4096)))


def test_single_stream_itl_sits_on_the_weight_read_floor():
    """One request at a time: every decode step reads all weights; ITL = bytes / bandwidth."""
    sc = single_stream(LengthDist.fixed(32), 200, memory_efficiency=1.0, step_overhead_s=0.0)
    sim = Simulation(sc, record_itl=True)
    st = sim.run_for(60)
    d = sc.deployment
    floor = d.weight_bytes / d.hbm_bandwidth
    assert st.itl_quantile(0.5) == pytest.approx(floor, rel=0.01)
    assert st.itl_mean == pytest.approx(floor, rel=0.01)
    # the same from the served histogram (mean = sum / count)
    h = Page(sim.render_metrics()).hist("vllm:inter_token_latency_seconds")
    assert h.mean == pytest.approx(floor, rel=0.01)
    # with the default efficiency and overhead: floor / 0.85 + 2 ms, within a few %
    sc2 = single_stream(LengthDist.fixed(32), 200)
    st2 = Simulation(sc2, record_itl=True).run_for(60)
    expected = sc2.deployment.gpu_weight_bytes / (sc2.deployment.hbm_bandwidth * 0.85) + 0.002
    assert st2.itl_mean == pytest.approx(expected, rel=0.02)
    assert st2.itl_mean == pytest.approx(sc2.deployment.decode_floor_s(130), rel=0.01)


def test_ttft_grows_linearly_with_prompt_length():
    """A lone request's TTFT is its prefill: ~2 x params x tokens / effective FLOP/s."""
    sc = single_stream(LengthDist.uniform(256, 8192), 4, think=0.5)
    sim = Simulation(sc)
    st = sim.run_for(200)
    recs = st.records
    assert len(recs) > 40
    x = np.array([r.prompt_tokens for r in recs], dtype=float)
    y = np.array([r.ttft for r in recs])
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - np.sum((y - (slope * x + intercept)) ** 2) / np.sum((y - y.mean()) ** 2)
    assert r2 > 0.995
    d = sc.deployment
    linear = 2 * d.model.params / (d.peak_flops * d.compute_efficiency)  # s per prompt token
    assert linear == pytest.approx(8.58e-5, rel=0.01)
    # causal attention adds a quadratic term (2 x layers x hidden x n^2 FLOPs), which steepens a
    # straight-line fit over 256..8192 tokens by ~15 %; the per-chunk overhead adds ~1 %
    assert linear < slope < linear * 1.25
    a2, a1, _ = np.polyfit(x, y, 2)
    quad = 2 * d.model.layers * d.model.hidden / (d.peak_flops * d.compute_efficiency)
    assert a2 == pytest.approx(quad, rel=0.05)
    assert a1 == pytest.approx(linear + d.step_overhead_s / 2048, rel=0.03)
    for r in recs:  # and exactly: tokenization + chunked prefill from the roofline, nothing waits
        assert r.queue_time == 0
        expect = TOKENIZE_BASE_S + TOKENIZE_PER_TOKEN_S * r.prompt_tokens + d.prefill_s(r.prompt_tokens, 2048)
        assert r.ttft == pytest.approx(expect, rel=1e-9)


def _open_loop(rate: float) -> object:
    stream = TrafficStream(name="open", rate=rate, prompt=LengthDist.fixed(200), output=LengthDist.fixed(200),
                           max_tokens=200)
    return custom("open", engine=EngineConfig(max_num_seqs=4), streams=(stream,))


def test_queue_grows_without_bound_above_service_rate_and_stays_small_below():
    # service rate with 4 slots: 4 / (200 steps x ~11.6 ms + prefill) ~ 1.7 req/s
    over = Simulation(_open_loop(2.5))
    marks = []
    for _ in range(4):
        over.run_for(100)
        page = Page(over.render_metrics())
        marks.append((page.hist("vllm:request_queue_time_seconds"), over.engine.waiting))
    means = []
    prev = None
    for h, _ in marks:
        d = h.minus(prev)
        means.append(d.mean)
        prev = h
    assert all(b > a for a, b in zip(means, means[1:])), means  # queue time keeps growing
    assert means[-1] > 60
    assert len(over.engine.waiting) > 150
    under = Simulation(_open_loop(1.0))  # utilisation ~0.6: some waiting (M/D/4), bounded
    windows = [window(under, 0, 100) for _ in range(4)]
    assert all(w["queue_mean"] < 0.5 for w in windows), windows
    assert max(w["waiting"] for w in windows) < 10
    assert means[-1] > 100 * max(w["queue_mean"] for w in windows)


def test_chunked_prefill_off_makes_itl_jumpy():
    sc = get("prefill_interference")  # chunked prefill off
    off = window(Simulation(sc), 30, 200)
    on = window(Simulation(with_engine(sc, enable_chunked_prefill=True)), 30, 200)
    on512 = window(Simulation(with_engine(sc, enable_chunked_prefill=True, max_num_batched_tokens=512)), 30, 200)
    assert off["itl_p50"] == pytest.approx(on["itl_p50"], rel=0.2)  # steady decode is the same
    assert off["itl_p99_p50"] > 3 * on512["itl_p99_p50"]
    assert off["itl_p99"] > 1.5 * on["itl_p99"] > on512["itl_p99"]
    assert off["itl_p99_p50"] > 10
    # with chunked prefill a step never exceeds the budget; without, whole prompts run
    assert Simulation(with_engine(sc, enable_chunked_prefill=True)).run_for(60).max_step_tokens <= 2048
    assert Simulation(sc).run_for(60).max_step_tokens > 4000


def test_kv_pressure_preempts_and_recomputes():
    sim = Simulation("kv_cache_pressure")
    sig = window(sim, 60, 240)
    assert sig["kv_usage"] >= 0.9
    assert sig["preemptions_per_s"] > 0.5
    st = sim.stats()
    assert 0 < sim.engine.kv.usage <= 1.0
    assert st.preemptions == Page(sim.render_metrics()).value("vllm:num_preemptions_total")
    assert any(r.preemptions > 0 for r in st.records)
    # preempted requests were recomputed: computed prefill tokens exceed the prompts served
    assert st.prefill_tokens > sum(r.prompt_tokens for r in st.records)
    # the same traffic with the full A100 cache: no preemption, low usage
    roomy = Simulation(with_engine(get("kv_cache_pressure"), num_gpu_blocks_override=None))
    sig2 = window(roomy, 60, 120)
    assert sig2["preemptions"] == 0 and sig2["kv_usage"] < 0.3


def test_prefix_caching_skips_shared_tokens():
    sc = get("healthy")  # 80 % of requests start with one of 4 shared 256-token prefixes
    sim = Simulation(sc)
    sim.run_for(120)
    page = Page(sim.render_metrics())
    hits = page.value("vllm:prefix_cache_hits_total")
    queries = page.value("vllm:prefix_cache_queries_total")
    assert 0.25 < hits / queries < 0.5
    assert hits % 16 == 0  # whole blocks
    cache_hit = page.value("vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    local = page.value("vllm:prompt_tokens_by_source_total", source="local_compute")
    assert cache_hit + local == page.value("vllm:prompt_tokens_total")
    assert cache_hit > 0
    off = Simulation(with_engine(sc, enable_prefix_caching=False))
    off.run_for(120)
    off_page = Page(off.render_metrics())
    assert off_page.value("vllm:prefix_cache_queries_total") == 0
    # cached tokens skip compute: the cached run computed fewer prefill tokens for the same traffic
    assert sim.stats().prefill_tokens < 0.8 * off.stats().prefill_tokens


def test_weights_offloaded_itl_far_above_the_floor():
    sim = Simulation("weights_offloaded", record_itl=True)
    st = sim.run_for(120)
    d = sim.engine.deployment
    assert st.itl_quantile(0.5) > 8 * d.weight_read_floor_s
    # and it is the PCIe term: floor + offload, within 10 % (small batches)
    assert st.itl_quantile(0.5) == pytest.approx(d.decode_floor_s(400), rel=0.1)


def test_deterministic_with_a_seed():
    def page(seed: int) -> list[str]:
        sim = Simulation("healthy_bursty", seed=seed)
        sim.run_for(90)
        return [line for line in sim.render_metrics().decode().splitlines() if "_created" not in line]

    a, b, c = page(3), page(3), page(4)
    assert a == b
    assert a != c
    assert len(a) > 300


def test_time_advances_only_as_asked():
    sim = Simulation("healthy")
    sim.advance(10.0)
    assert sim.clock == 10.0
    st = sim.stats()
    assert math.isclose(st.sim_seconds, 10.0)
    steps = st.steps
    sim.advance(5.0)  # the past: nothing happens
    assert sim.stats().steps == steps and sim.clock == 10.0
    nxt = sim.next_event_time()
    assert nxt is not None and nxt > 10.0
