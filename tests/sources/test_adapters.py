"""Engine adapters on recorded and constructed pages of each supported engine version."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from app.core import quantiles
from app.exposition.parser import parse_page
from app.scrape.jobs import PageProcessor
from app.sources import ADAPTERS, detect_engine
from app.sources.base import Canonical

EXPOSITION = Path(__file__).parents[1] / "fixtures" / "exposition"
ALL_TIME_SIGNALS = {"ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time", "inference_time"}


def canonical(filename: str, engine: str = "auto") -> Canonical:
    page, result, error = PageProcessor(engine).process((EXPOSITION / filename).read_bytes())
    assert error is None, (error, page.errors)
    assert result is not None
    return result


def hist(c: Canonical, signal: str, rank: str = "0"):
    matches = [h for h in c.histograms if h.signal == signal and h.rank == rank]
    assert len(matches) == 1, (signal, rank, matches)
    return matches[0]


def scalar(c: Canonical, signal: str, rank: str = "0") -> float:
    matches = [s.value for s in c.scalars if s.signal == signal and s.rank == rank]
    assert len(matches) == 1, (signal, rank, matches)
    return matches[0]


def test_real_vllm_032_page_maps_every_signal() -> None:
    c = canonical("vllm-0.32-cpu-real.prom")
    assert c.engine == "vllm"
    assert {h.signal for h in c.histograms} == ALL_TIME_SIGNALS | {"prompt_tokens", "generation_tokens",
                                                                   "iteration_tokens"}
    assert {(h.model, h.rank) for h in c.histograms} == {("tiny", "0")}
    ttft = hist(c, "ttft")
    assert len(ttft.bounds) == 23 and ttft.bounds[0] == 0.001 and ttft.bounds[-2] == 2560.0
    assert ttft.bounds[-1] == math.inf
    assert (ttft.count, ttft.sum) == (47.0, 42.11752414703369)
    assert hist(c, "itl").count == 3537.0
    assert hist(c, "iteration_tokens").count == 701.0
    assert len(hist(c, "itl").bounds) == 20
    assert scalar(c, "prompt_tokens_total") == 15647.0
    assert scalar(c, "generation_tokens_total") == 3584.0
    assert scalar(c, "requests_total") == 47.0  # summed over finished_reason
    assert scalar(c, "kv_usage") == 0.0 and scalar(c, "running") == 0.0
    config = next(i for i in c.infos if i.name == "cache_config")
    assert config.labels["enable_prefix_caching"] == "False" and config.labels["block_size"] == "128"
    assert "engine" not in config.labels and "model_name" not in config.labels
    assert next(i for i in c.infos if i.name == "sleep_state").labels == {"sleep_state": "awake"}
    assert c.problems == []


def test_vllm_v0_06_legacy_names() -> None:
    c = canonical("vllm-0.6-v0-constructed.prom")
    assert c.engine == "vllm"
    itl = hist(c, "itl")  # from time_per_output_token_seconds
    assert itl.count == 400.0 and itl.bounds[-2] == 2.5
    assert hist(c, "ttft").bounds[-2] == 10.0
    assert scalar(c, "kv_usage") == 0.62  # gpu_cache_usage_perc
    assert scalar(c, "preemptions_total") == 4.0
    assert scalar(c, "requests_total") == 20.0
    assert {h.rank for h in c.histograms} == {"0"}  # V0 had no engine label
    assert next(i for i in c.infos if i.name == "cache_config").labels["cpu_offload_gb"] == "0"


def test_vllm_0102_prefers_new_names_and_keeps_data_parallel_ranks() -> None:
    c = canonical("vllm-0.10.2-dp2-constructed.prom")
    # both inter_token_latency_seconds and the deprecated time_per_output_token_seconds
    # are on the page: exactly one itl series per rank, not two
    assert sorted(h.rank for h in c.histograms if h.signal == "itl") == ["0", "1"]
    assert hist(c, "itl", "1").count == 400.0
    assert [scalar(c, "kv_usage", r) for r in ("0", "1")] == [0.25, 0.75]
    assert [scalar(c, "prefix_cache_hits_total", r) for r in ("0", "1")] == [400.0, 400.0]
    iteration = hist(c, "iteration_tokens")
    assert (iteration.counts[iteration.bounds.index(2048.0)] == 5.0
            and iteration.counts[iteration.bounds.index(256.0)] == 3.0)


def test_tgi_page() -> None:
    c = canonical("tgi-3.3-constructed.prom")
    assert c.engine == "tgi"
    assert {h.signal for h in c.histograms} == {"queue_time", "prefill_time", "itl", "e2e", "prompt_tokens",
                                                "generation_tokens"}
    assert "ttft" not in {h.signal for h in c.histograms}
    # the derivation is stated: the mean adds, each quantile is only bounded (quantiles do not add)
    (derivation,) = [n for n in c.notes if n.startswith("TTFT derived from queue_time and prefill_time")]
    assert "means add" in derivation and "quantiles are not added" in derivation and "bound" in derivation
    itl = hist(c, "itl")
    assert itl.count == 400.0 and len(itl.bounds) == 36
    assert hist(c, "prefill_time").count == 20.0
    assert scalar(c, "running") == 12.0 and scalar(c, "waiting") == 3.0
    assert scalar(c, "kv_usage") == pytest.approx(40960 / 163840)
    assert scalar(c, "requests_total") == 20.0
    assert scalar(c, "prompt_tokens_total") == 256.0 * 20
    assert {h.model for h in c.histograms} == {""}


def test_sglang_04_page() -> None:
    c = canonical("sglang-v0.4-docs-production_metrics.prom")
    assert c.engine == "sglang"
    assert hist(c, "ttft").count == 11008.0
    assert hist(c, "itl").count == 7.400757e06  # old time_per_output_token_seconds name
    assert scalar(c, "running") == 162.0 and scalar(c, "kv_usage") == 0.28


def test_doc_excerpt_with_elisions_keeps_what_is_usable() -> None:
    page, c, error = PageProcessor().process((EXPOSITION / "vllm-v1-docs-design-metrics.prom").read_bytes())
    assert error is None and c is not None
    assert page.malformed == 3  # the three literal '...' lines
    # the TTFT histogram lost its +Inf bucket to an elision: dropped and reported
    assert "ttft" not in {h.signal for h in c.histograms}
    assert any("no +Inf bucket" in p for p in c.problems)
    assert scalar(c, "running") == 8.0 and scalar(c, "requests_total") == 132.0


def test_non_engine_pages_are_recognised_as_such() -> None:
    page, c, error = PageProcessor().process((EXPOSITION / "triton-trtllm-23.11-readme.prom").read_bytes())
    assert (c, error) == (None, "no_engine_metrics")
    assert detect_engine(parse_page((EXPOSITION / "triton-trtllm-23.11-readme.prom").read_bytes())) is None


def test_forced_engine_ignores_detection() -> None:
    page, c, error = PageProcessor("tgi").process((EXPOSITION / "vllm-0.32-cpu-real.prom").read_bytes())
    assert (c, error) == (None, "no_engine_metrics")  # a vLLM page has no tgi_ families


def test_quantiles_from_a_constructed_page_match_the_observations() -> None:
    """From zero to the page = the increase; p50 of the 20 TTFTs is in (0.1, 0.25]."""
    ttft = hist(canonical("vllm-0.10.2-dp2-constructed.prom"), "ttft")
    # rank 10 of 20: 5 below 0.1, then 10 at 0.2 -> 0.1 + 0.15 * (10 - 5) / 10
    assert quantiles.histogram_quantile(0.5, ttft.bounds, ttft.counts) == pytest.approx(0.175)


def test_adapters_declare_their_families() -> None:
    assert "vllm:time_to_first_token_seconds" in ADAPTERS["vllm"].families
    assert "tgi_batch_inference_duration" in ADAPTERS["tgi"].families
    assert all(name.startswith("sglang:") for name in ADAPTERS["sglang"].families)


def _revalued(text: str, seed: int) -> str:
    """The same page shape with other values: every sample line gets a random value, so
    buckets decrease and ``_count`` disagrees with ``+Inf`` (the problems must follow)."""
    rng = random.Random(seed)
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            identity, _, _ = line.rpartition(" ")
            line = f"{identity} {rng.randint(0, 50)}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("filename", ["vllm-0.32-cpu-real.prom", "vllm-0.10.2-dp2-constructed.prom",
                                      "tgi-3.3-constructed.prom", "sglang-v0.4-docs-production_metrics.prom"])
def test_series_layouts_reused_across_scrapes_give_what_a_fresh_grouping_gives(filename: str) -> None:
    """The adapters group samples into series once per page shape (``MetricFamily.memo``)
    and only read values afterwards; every later scrape must equal a from-scratch
    grouping of the same page, problems included."""
    text = (EXPOSITION / filename).read_text()
    processor = PageProcessor("auto")
    first, _, _ = processor.process(_revalued(text, 0))
    engine = processor.engine
    adapter = ADAPTERS[engine]
    memos = {name: family.memo for name, family in first.families.items()}
    assert all(memo is not None for memo in memos.values())
    problems_seen = 0
    for seed in range(1, 6):
        page_text = _revalued(text, seed)
        page, result, _ = processor.process(page_text)
        # the plan verified the shape: the same memo dicts, now holding the layouts
        assert page.families.keys() == memos.keys()
        assert all(family.memo is memos[name] for name, family in page.families.items())
        assert page.memo is first.memo is not None  # the page's own memo (map_families' steps) too
        assert result.histograms and any(key[0] == "histogram" for memo in memos.values() for key in memo)
        fresh_page = parse_page(page_text, keep=adapter.families.__contains__)
        assert fresh_page.memo is None and all(family.memo is None for family in fresh_page.families.values())
        fresh = adapter.to_canonical(fresh_page)
        assert result == fresh
        problems_seen += len(result.problems)
    assert problems_seen > 0  # random values break histograms; the check ran every scrape
    # A changed shape (a _count line gone) gets new layouts, not the old ones.
    lines = _revalued(text, 9).splitlines()
    drop = next(i for i, line in enumerate(lines) if "_count" in line and not line.startswith("#"))
    changed = "\n".join(lines[:drop] + lines[drop + 1:]) + "\n"
    page, result, _ = processor.process(changed)
    assert any(family.memo is not memos.get(name) for name, family in page.families.items())
    assert result == adapter.to_canonical(parse_page(changed, keep=adapter.families.__contains__))


def test_vllm_034_serving_features_map_to_their_canonical_signals() -> None:
    """An emulated vLLM 0.34 page (names, labels and buckets of vLLM's own definitions) of a P/D decode
    worker with speculative decoding and two data-parallel ranks."""
    from dataclasses import replace

    from app.emulator import scenarios
    from app.emulator.engine import EngineConfig
    from app.emulator.simulation import Simulation

    base = scenarios.get("healthy")
    sc = replace(base, engine=EngineConfig(kv_transfer_gbps=5.0, kv_transfer_failure_rate=0.05,
                                           num_speculative_tokens=3, spec_acceptance=0.5, render_seconds=0.05,
                                           data_parallel_size=2))
    sim = Simulation(sc, seed=3)
    sim.run_for(60)
    page, c, error = PageProcessor("auto").process(sim.render_metrics())
    assert error is None and c is not None and c.engine == "vllm"
    xfer = hist(c, "kv_transfer_time")
    assert xfer.bounds[:3] == (0.005, 0.01, 0.025) and xfer.bounds[-2:] == (5.0, math.inf)
    assert scalar(c, "kv_transfers_total") == xfer.count > 100  # completed transfers = the histogram's count
    failed = scalar(c, "kv_transfer_failures_total")
    assert 0.01 < failed / (failed + xfer.count) < 0.1
    drafts, proposed = scalar(c, "spec_drafts_total"), scalar(c, "spec_draft_tokens_total")
    accepted = scalar(c, "spec_accepted_tokens_total")
    assert proposed == 3 * drafts
    assert accepted / drafts == pytest.approx(0.5 + 0.25 + 0.125, abs=0.01)  # E[accepted] of 3 at 0.5 each
    render = hist(c, "render_time")  # no engine label on the page: rank "0"
    assert render.sum / render.count == pytest.approx(0.05 + 0.0003, abs=0.002)
    assert scalar(c, "running", rank="1") == 0.0 and scalar(c, "waiting", rank="1") == 0.0
    assert scalar(c, "running", rank="0") > 0
