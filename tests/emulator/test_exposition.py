"""The /metrics pages: parseable, and shaped like the real engines' pages."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, Histogram

from app.emulator.engine import EngineConfig
from app.emulator.exposition import CONTENT_TYPE, TGI_DURATION_BUCKETS, build_1_2_5_buckets, observe_n
from app.emulator.readout import Page, signature
from app.emulator.scenarios import get
from app.emulator.simulation import Simulation
from app.emulator.workload import LengthDist, TrafficStream
from app.exposition import parser as scrape_parser
from tests.conftest import FIXTURES
from tests.emulator.helpers import custom

REAL = FIXTURES / "exposition" / "vllm-0.32-cpu-real.prom"


def _small_context_sim(engine: str = "vllm") -> Simulation:
    """max_model_len 2048 like the real page's server, so token buckets are comparable."""
    stream = TrafficStream(name="t", rate=4.0, prompt=LengthDist.lognormal(200, 0.8, 4, 1800),
                           output=LengthDist.lognormal(60, 0.8, 1, 200), max_tokens=200)
    sim = Simulation(custom(engine=EngineConfig(max_model_len=2048), streams=(stream,)), engine=engine,
                     model_name="tiny")
    sim.run_for(30)
    return sim


def test_vllm_page_matches_the_real_vllm_032_page():
    real = Page(REAL.read_text())
    mine = Page(_small_context_sim().render_metrics())
    real_fams = {n: t for n, t in real.types.items() if n.startswith("vllm:")}
    mine_fams = {n: t for n, t in mine.types.items() if n.startswith("vllm:")}
    # the emulator is 0.34: the 0.32 families plus the front end's render histogram (registered on the
    # first request, labels model_name and request_type, buckets of vllm/renderers/metrics.py)
    since_034 = {"vllm:request_render_duration_seconds": "histogram",
                 "vllm:request_render_duration_seconds_created": "gauge"}
    assert {n: t for n, t in mine_fams.items() if n in since_034} == since_034
    assert mine.labelnames.get("vllm:request_render_duration_seconds") == {"model_name", "request_type"}
    mine_fams = {n: t for n, t in mine_fams.items() if n not in since_034}
    assert mine_fams == real_fams  # same families with the same types (incl. the _created gauges)
    assert len(real_fams) > 70
    for fam in real_fams:
        assert mine.labelnames.get(fam) == real.labelnames.get(fam), fam
        assert mine.bucket_les.get(fam) == real.bucket_les.get(fam), fam
    # every series the real page has, ours has too (same label values except model/config numbers)
    def shapes(page: Page) -> set:
        volatile = {"model_name", "le", "block_size", "effective_attention_block_size", "num_gpu_blocks",
                    "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
                    "enable_prefix_caching", "gpu_memory_utilization"}
        return {(n, tuple((k, v) for k, v in lb if k not in volatile)) for n, lb in page.samples
                if n.startswith("vllm:")}
    assert {s for s in shapes(mine) if not s[0].startswith("vllm:request_render_duration")} == shapes(real)


def test_vllm_page_values_are_consistent():
    sim = _small_context_sim()
    page = Page(sim.render_metrics())
    st = sim.stats()
    assert page.value("vllm:generation_tokens_total") == st.generated_tokens
    assert page.value("vllm:request_success_total") == st.finished
    ttft = page.hist("vllm:time_to_first_token_seconds")
    e2e = page.hist("vllm:e2e_request_latency_seconds")
    assert e2e.count == st.finished and ttft.count >= e2e.count
    # as on the real page: iteration tokens = prompt tokens (at first token) + generated tokens
    it = page.hist("vllm:iteration_tokens_total")
    assert it.sum == page.value("vllm:prompt_tokens_total") + page.value("vllm:generation_tokens_total")
    # ITL: one observation per emitted non-first token
    itl = page.hist("vllm:inter_token_latency_seconds")
    assert itl.count == st.generated_tokens - ttft.count
    assert page.value("vllm:num_requests_running") == st.running
    assert page.value("vllm:engine_sleep_state", sleep_state="awake") == 1
    info = [lb for (n, lb) in page.samples if n == "vllm:cache_config_info"]
    assert len(info) == 1 and dict(info[0])["num_gpu_blocks"] == str(sim.engine.num_gpu_blocks)
    assert "model_name" not in dict(info[0])
    # histograms record simulated seconds: decode steps of an 8B model on an A100 are ~12 ms
    assert 0.009 < itl.mean < 0.03


def test_legacy_vllm_names():
    page = Page(_small_context_sim("vllm-legacy").render_metrics())
    fams = set(page.types)
    for old in ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds",
                "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"):
        assert old in fams
    for new in ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds",
                "vllm:request_time_per_output_token_seconds", "vllm:prefix_cache_queries"):
        assert new not in fams
    info = dict(next(lb for (n, lb) in page.samples if n == "vllm:cache_config_info"))
    assert info["cpu_offload_gb"] == "0"
    assert {r for (n, lb) in page.samples if n == "vllm:request_success_total"
            for k, r in lb if k == "finished_reason"} == {"stop", "length", "abort"}
    assert page.hist("vllm:time_per_output_token_seconds").count > 100
    # the 0.8.x buckets of the reference (engine metrics reference 1.3: "inter_token_latency",
    # also used by the old time_per_output_token_seconds), and the current page's label names
    itl_buckets = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0]
    assert sorted(float(x) for x in page.bucket_les["vllm:time_per_output_token_seconds"] if x != "+Inf") \
        == itl_buckets
    current = Page(_small_context_sim().render_metrics())
    for old, new in (("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
                     ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"),
                     ("vllm:gpu_prefix_cache_queries", "vllm:prefix_cache_queries"),
                     ("vllm:gpu_prefix_cache_hits", "vllm:prefix_cache_hits")):
        assert page.types[old] == current.types[new] and page.labelnames[old] == current.labelnames[new], old
    sig = signature(page)
    assert sig["itl_p50"] > 0 and not math.isnan(sig["kv_usage"])


def test_legacy_cache_config_shows_weight_offload():
    sim = Simulation("weights_offloaded", engine="vllm-legacy")
    info = dict(next(lb for (n, lb) in Page(sim.render_metrics()).samples if n == "vllm:cache_config_info"))
    assert info["cpu_offload_gb"] == "4.0"
    current = Page(Simulation("weights_offloaded").render_metrics())
    info = dict(next(lb for (n, lb) in current.samples if n == "vllm:cache_config_info"))
    assert "cpu_offload_gb" not in info  # moved out of CacheConfig in vLLM >= 0.20


def test_tgi_page():
    sim = _small_context_sim("tgi")
    text = sim.render_metrics().decode()
    page = Page(text)
    assert "model_name" not in text and "# HELP" not in text
    assert not any("time_to_first_token" in n for n in page.types)
    expected = {"tgi_request_count", "tgi_request_success", "tgi_request_duration", "tgi_request_queue_duration",
                "tgi_request_validation_duration", "tgi_request_inference_duration",
                "tgi_request_mean_time_per_token_duration", "tgi_request_input_length",
                "tgi_request_generated_tokens", "tgi_request_max_new_tokens", "tgi_queue_size",
                "tgi_batch_current_size", "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens",
                "tgi_batch_inference_count", "tgi_batch_inference_success", "tgi_batch_inference_duration",
                "tgi_batch_forward_duration", "tgi_batch_next_size", "tgi_batch_concat"}
    assert expected <= set(page.types)
    # Rust exporter style: counters without _total, integer values without ".0"
    assert re.search(r"^tgi_request_count \d+$", text, re.M)
    assert re.search(r'^tgi_batch_inference_count\{method="prefill"\} \d+$', text, re.M)
    assert re.search(r'^tgi_batch_inference_count\{method="decode"\} \d+$', text, re.M)
    # duration buckets: 0.0001 * 1.5^k, k = 1..35
    les = sorted(float(x) for x in page.bucket_les["tgi_request_duration"] if x != "+Inf")
    assert len(les) == 35
    for k, le in enumerate(les, start=1):
        assert le == pytest.approx(0.0001 * 1.5**k, rel=1e-12)
    assert les == TGI_DURATION_BUCKETS
    # token-length buckets: 100 linear buckets of max_input_tokens / 100
    inp = sorted(float(x) for x in page.bucket_les["tgi_request_input_length"] if x != "+Inf")
    assert len(inp) == 100 and inp[-1] == pytest.approx(2047)
    assert len(page.bucket_les["tgi_batch_next_size"]) == 1025
    assert page.value("tgi_batch_max_total_tokens") == sim.engine.num_gpu_blocks * 16
    sig = signature(page, engine="tgi")
    assert sig["requests"] > 50
    assert 0.009 < sig["decode_forward_p50"] < 0.03


@pytest.mark.parametrize("engine", ["vllm", "vllm-legacy", "tgi"])
def test_pages_parse_with_the_monitors_parser_too(engine):
    text = _small_context_sim(engine).render_metrics()
    parsed = scrape_parser.parse_page(text)
    assert parsed.malformed == 0, parsed.errors
    ours = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in parsed.families.values() for s in fam.samples}
    ref = Page(text).samples
    assert ours == ref


def test_observe_n_equals_repeated_observe():
    reg = CollectorRegistry()
    a = Histogram("a", "a", buckets=[0.01, 0.1, 1.0], registry=reg)
    b = Histogram("b", "b", buckets=[0.01, 0.1, 1.0], registry=reg)
    for v, n in ((0.005, 3), (0.05, 7), (0.5, 1), (5.0, 2), (0.1, 4)):
        for _ in range(n):
            a.observe(v)
        observe_n(b, v, n)
    pa, pb = Page(_only(reg, "a")), Page(_only(reg, "b"))
    assert pa.hist("a").buckets == pb.hist("b").buckets
    assert pa.hist("a").sum == pytest.approx(pb.hist("b").sum)


def _only(reg: CollectorRegistry, name: str) -> str:
    from prometheus_client import generate_latest

    lines = generate_latest(reg).decode().splitlines()
    return "\n".join(line for line in lines if re.match(rf"^(# (HELP|TYPE) )?{name}(_|\s)", line)) + "\n"


def test_token_buckets_and_content_type():
    assert build_1_2_5_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert build_1_2_5_buckets(32768)[-1] == 20000
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert Simulation(get("healthy")).content_type == CONTENT_TYPE


TGI_REFERENCE = FIXTURES / "tgi-router-metrics.md"


def _tgi_reference_table() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) from the TGI table of the engine metrics reference,
    which was read off TGI's router source; the emulator is compared with it, not with
    pages the project built itself."""
    table = {}
    for line in TGI_REFERENCE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]  # "\|" inside a cell is not a column
        if len(cells) != 4 or not cells[0].startswith("`tgi_"):
            continue
        names = re.findall(r"`(tgi_\w+)`", cells[0])
        type_ = cells[1].split()[0]
        labels = set(re.findall(r"`(\w+)`(?: =|$)", cells[2]))
        for name in names:
            table[name] = (type_, labels)
    return table


def test_tgi_page_has_the_types_and_labels_of_the_tgi_router():
    reference = _tgi_reference_table()
    assert len(reference) >= 25 and reference["tgi_batch_concat"] == ("counter", {"reason"})
    assert reference["tgi_request_queue_duration"] == ("histogram", set())
    page = Page(_small_context_sim("tgi").render_metrics())
    # A Rust `metrics` counter is exposed once first incremented: nothing fails in the
    # emulator, so the failure counters are absent, as on a healthy TGI. skipped_tokens
    # counts speculative tokens, which the emulator does not model.
    not_emitted = {"tgi_request_failure", "tgi_batch_inference_failure", "tgi_request_skipped_tokens"}
    assert set(reference) - set(page.types) == not_emitted
    for name, (type_, labels) in reference.items():
        if name in not_emitted:
            continue
        assert page.types[name] == type_, name
        assert page.labelnames.get(name, set()) == labels, name
    # buckets the reference gives: every *_duration geometric (checked above), batch_next_size 1..1024 step 1,
    # generated/max_new tokens 100 linear buckets
    next_size = sorted(float(x) for x in page.bucket_les["tgi_batch_next_size"] if x != "+Inf")
    assert next_size == [float(k) for k in range(1, 1025)]
    for name in ("tgi_request_generated_tokens", "tgi_request_max_new_tokens", "tgi_request_input_length"):
        les = sorted(float(x) for x in page.bucket_les[name] if x != "+Inf")
        assert len(les) == 100 and les == pytest.approx([les[0] * k for k in range(1, 101)]), name
