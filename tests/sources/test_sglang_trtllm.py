"""SGLang 0.3-0.5 and trtllm-serve pages: the families each release writes, in canonical form."""

from __future__ import annotations

import math

import pytest

from app.exposition.parser import parse_page
from app.scrape.jobs import PageProcessor
from app.sources import ADAPTERS, detect_engine
from tests.sources.test_adapters import EXPOSITION, canonical, hist, scalar


def test_sglang_03_page_with_the_name_label() -> None:
    c = canonical("sglang-0.3-name-label-constructed.prom")
    assert c.engine == "sglang"
    assert {h.signal for h in c.histograms} == {"ttft", "itl", "e2e", "queue_time", "decode_time", "prompt_tokens",
                                                "generation_tokens"}
    # the model comes from the ``name`` label, not lost to ""
    assert {h.model for h in c.histograms} == {"google/gemma-2-9b-it"}
    assert {s.model for s in c.scalars} == {"google/gemma-2-9b-it"}
    queue = hist(c, "queue_time")  # waiting_request_latency_seconds
    assert queue.count == 20.0 and queue.sum == pytest.approx(8 * sum([0.03] * 5 + [0.2] * 10 + [0.7] * 4 + [3.0]))
    assert queue.bounds[:4] == (1.0, 2.0, 5.0, 10.0)
    assert hist(c, "itl").count == 400.0  # time_per_output_token_seconds
    assert hist(c, "prompt_tokens").sum == 256.0 * 20
    assert scalar(c, "running") == 12.0 and scalar(c, "waiting") == 30.0  # num_requests_running / _waiting
    assert scalar(c, "kv_usage") == 0.45
    assert scalar(c, "requests_total") == 20.0  # request_success_total, summed over finished_reason
    assert scalar(c, "prompt_tokens_total") == 5120.0 and scalar(c, "generation_tokens_total") == 400.0
    assert c.problems == []


def test_sglang_04_loaded_page_families() -> None:
    c = canonical("sglang-v0.4-docs-production_metrics.prom")
    assert {h.signal for h in c.histograms} == {"ttft", "itl", "e2e"}  # no queue-time histogram in 0.4.0-0.4.3
    assert scalar(c, "waiting") == 2826.0 and scalar(c, "running") == 162.0
    ttft = hist(c, "ttft")
    assert ttft.sum / ttft.count == pytest.approx(213.65, abs=0.01)


def test_sglang_05_pd_page_converts_milliseconds_and_keeps_ranks() -> None:
    c = canonical("sglang-0.5-pd-constructed.prom")
    assert {h.rank for h in c.histograms if h.signal == "queue_time"} == {"0", "1"}
    transfer = hist(c, "kv_transfer_time", "1")
    # buckets 1 ... 5000 ms -> 0.001 ... 5 s, exactly (division, not * 0.001)
    assert transfer.bounds[:4] == (0.001, 0.002, 0.005, 0.01) and transfer.bounds[-2] == 5.0
    assert transfer.bounds[-1] == math.inf
    assert transfer.count == 20.0
    assert transfer.sum == pytest.approx((10 * 3.0 + 8 * 40.0 + 2 * 700.0) / 1000)  # 1.75 s over 20 transfers
    assert transfer.counts[transfer.bounds.index(0.005)] == 10.0  # the 3 ms transfers
    assert scalar(c, "kv_transfer_failures_total", "0") == 2.0 and scalar(c, "kv_transfer_failures_total", "1") == 0.0
    assert scalar(c, "spec_accept_rate", "0") == 0.35 and scalar(c, "spec_accept_length", "1") == 1.4
    assert [scalar(c, "waiting", r) for r in ("0", "1")] == [25.0, 0.0]
    assert [scalar(c, "kv_usage", r) for r in ("0", "1")] == [0.93, 0.2]
    assert scalar(c, "preemptions_total", "0") == 3.0
    assert scalar(c, "requests_total") == 40.0
    assert hist(c, "prompt_tokens").sum == 2048.0 * 40
    assert hist(c, "itl").count == 400.0 and hist(c, "ttft").count == 40.0
    # the imbalance ratio is a histogram on this release: not a gauge, and the notes say so
    assert not any(s.signal == "dp_token_imbalance_ratio" for s in c.scalars)
    assert any("dp_attention_token_imbalance_ratio is a histogram" in n for n in c.notes)
    spec = [i for i in c.infos if i.name == "speculative_config"]
    assert {i.labels["num_draft_tokens"] for i in spec} == {"4"}
    assert c.problems == []


def test_sglang_per_stage_transfer_when_no_millisecond_histogram() -> None:
    text = (EXPOSITION / "sglang-0.5-pd-constructed.prom").read_text()
    without_ms = "\n".join(line for line in text.splitlines() if "kv_transfer_latency_ms" not in line) + "\n"
    c = ADAPTERS["sglang"].to_canonical(parse_page(without_ms, keep=ADAPTERS["sglang"].families.__contains__))
    transfer = hist(c, "kv_transfer_time", "0")
    # stage="prefill_transfer_kv_cache" only: TTFT/8 per request, not the prefill_forward stage
    assert transfer.count == 20.0
    assert transfer.sum == pytest.approx(sum([0.03] * 5 + [0.2] * 10 + [0.7] * 4 + [3.0]) / 8)


def test_sglang_imbalance_ratio_as_a_gauge() -> None:
    page = ("# TYPE sglang:dp_attention_token_imbalance_ratio gauge\n"
            'sglang:dp_attention_token_imbalance_ratio{model_name="m"} 2.5\n'
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{model_name="m"} 3\n')
    c = ADAPTERS["sglang"].to_canonical(parse_page(page))
    assert scalar(c, "dp_token_imbalance_ratio") == 2.5 and c.notes == []


def test_trtllm_serve_page() -> None:
    c = canonical("trtllm-serve-constructed.prom")
    assert c.engine == "trtllm"
    assert {h.signal for h in c.histograms} == {"ttft", "tpot", "e2e", "queue_time", "prefill_time", "decode_time",
                                                "inference_time", "kv_transfer_time"}
    assert "itl" not in {h.signal for h in c.histograms}  # per-request TPOT is not a per-step ITL
    ttft = hist(c, "ttft")
    assert ttft.count == 20.0 and len(ttft.bounds) == 23 and ttft.bounds[-2] == 2560.0
    assert hist(c, "prefill_time").bounds[:3] == (0.001, 0.005, 0.01)
    assert hist(c, "kv_transfer_time").sum == pytest.approx(ttft.sum / 8)
    assert {h.model for h in c.histograms} == {"nemotron-nano-3"}
    assert scalar(c, "running") == 16.0 and scalar(c, "waiting") == 4.0 and scalar(c, "kv_usage") == 0.62
    assert scalar(c, "requests_total") == 20.0 and scalar(c, "prompt_tokens_total") == 10240.0
    assert scalar(c, "kv_transfers_total") == 20.0
    assert scalar(c, "spec_draft_tokens_total") == 1200.0 and scalar(c, "spec_accepted_tokens_total") == 300.0
    assert scalar(c, "spec_accept_length") == 1.25
    assert c.problems == []


def test_trtllm_dynamo_prefix_is_recognised() -> None:
    text = (EXPOSITION / "trtllm-serve-constructed.prom").read_text().replace("trtllm_", "trtllm:")
    page, c, error = PageProcessor().process(text)
    assert error is None and c is not None and c.engine == "trtllm"
    assert scalar(c, "running") == 16.0 and hist(c, "ttft").count == 20.0


def test_triton_backend_page_is_not_a_trtllm_serve_page() -> None:
    page = parse_page((EXPOSITION / "triton-trtllm-23.11-readme.prom").read_bytes())
    assert detect_engine(page) is None
    assert not ADAPTERS["trtllm"].detect(page)


def test_sglang_0523_decode_worker_page_reads_its_own_pd_families() -> None:
    """A 0.5.23 decode worker: no transfer-time sample (the prefill worker observes it), its stages,
    its queues and its memory wait are read; every family the page has parses, none is a problem."""
    text = (EXPOSITION / "sglang-0.5.23-pd-decode-recorded-style.prom").read_text()
    assert "sglang:kv_transfer_latency_ms" not in text and "sglang:kv_transfer_speed_gb_s" not in text
    assert 'pid="2187"' in text and "_created" not in text  # MultiProcessCollector's rendering
    c = canonical("sglang-0.5.23-pd-decode-recorded-style.prom")
    assert not [h for h in c.histograms if h.signal == "kv_transfer_time"]
    wait, prealloc, alloc = hist(c, "kv_wait_time"), hist(c, "prealloc_time"), hist(c, "kv_alloc_time")
    # decode_transferred: prefill-side queue + prefill + transfer = 0.004 + 0.45 + 0.5025 s on average
    assert wait.count == 400.0 and wait.sum / wait.count == pytest.approx(0.9565, abs=1e-9)
    assert prealloc.sum / prealloc.count == pytest.approx(0.006)  # decode_bootstrap: 5-7 ms
    assert alloc.sum / alloc.count == pytest.approx(0.002)  # kv_transfer_alloc_ms: 2 ms, in seconds
    assert alloc.bounds[:3] == (0.001, 0.002, 0.005) and alloc.bounds[-2] == 2.5
    # the decode worker's own queue and first step (fake_output: nothing is prefilled here)
    assert hist(c, "queue_time").sum / 400 == pytest.approx(0.004)
    assert hist(c, "prefill_time").sum / 400 == pytest.approx(0.012)
    assert hist(c, "ttft").sum / 400 == pytest.approx(0.9809, abs=1e-4)
    assert scalar(c, "transfer_queue") == 3.2 and scalar(c, "prealloc_queue") == 0.0
    assert scalar(c, "kv_usage") == 0.41
    # the share of KV held for pending transfers is not read: a gauge query more per source round for evidence
    assert not [s for s in c.scalars if s.signal not in ("running", "waiting", "kv_usage", "transfer_queue",
                                                          "prealloc_queue", "preemptions_total", "requests_total",
                                                          "prompt_tokens_total", "generation_tokens_total",
                                                          "kv_transfer_failures_total", "scheduler_loop_seconds_total",
                                                          "scheduler_idle_seconds_total",
                                                          "scheduler_cpu_seconds_total")]
    assert scalar(c, "kv_transfer_failures_total") == 2.0 and scalar(c, "requests_total") == 400.0
    roles = [i.labels["disaggregation_mode"] for i in c.infos if i.name == "disaggregation"]
    assert roles == ["decode"]
    assert c.problems == []


def test_sglang_0523_prefill_worker_page_records_the_transfer() -> None:
    c = canonical("sglang-0.5.23-pd-prefill-recorded-style.prom")
    transfer = hist(c, "kv_transfer_time")  # kv_transfer_latency_ms / 1000
    assert transfer.count == 400.0 and transfer.sum / transfer.count == pytest.approx(0.5025)
    assert hist(c, "prefill_time").sum / 400 == pytest.approx(0.45)  # prefill_forward
    assert hist(c, "queue_time").sum / 400 == pytest.approx(0.004)
    assert not [h for h in c.histograms if h.signal in ("kv_wait_time", "prealloc_time")]
    assert [i.labels["disaggregation_mode"] for i in c.infos if i.name == "disaggregation"] == ["prefill"]
    assert c.problems == []


def test_sglang_scheduler_time_counters_sum_over_stages_and_ranks() -> None:
    """SGLang 0.5.20+ scheduler time, rendered by prometheus_client as SGLang's collector renders it (labels
    of 0.5.23; every stage pre-created at 0 with forward_overlap "none"): the loop's wall time is the sum over
    category and forward_overlap, the TP/PP ranks summed like every other scheduler family."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    r = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    stage = Counter("sglang:scheduler_stage_seconds_total", "Total scheduler-loop wall time exclusively attributed to "
                    "each stage.", labels + ["category", "forward_overlap"], registry=r)
    idle = Counter("sglang:scheduler_idle_seconds_total", "idle", labels, registry=r)
    cpu = Counter("sglang:scheduler_process_cpu_seconds_total", "cpu", labels, registry=r)
    forward = Counter("sglang:forward_execution_seconds_total", "forward", labels + ["category"], registry=r)
    for pp in ("0", "1"):
        ranks = ("m", "unified", "0", pp, "0")
        for category in ("other", "recv_requests", "run_batch", "process_batch_result", "idle"):
            stage.labels(*ranks, category, "none")
        stage.labels(*ranks, "run_batch", "full").inc(70.0)
        stage.labels(*ranks, "process_batch_result", "partial").inc(20.0)
        stage.labels(*ranks, "idle", "none").inc(10.0)
        idle.labels(*ranks).inc(10.0)
        cpu.labels(*ranks).inc(99.5)
        forward.labels(*ranks, "decode").inc(40.0)
        forward.labels(*ranks, "extend").inc(5.0)
    c = ADAPTERS["sglang"].to_canonical(parse_page(generate_latest(r), keep=ADAPTERS["sglang"].families.__contains__))
    assert scalar(c, "scheduler_loop_seconds_total") == 200.0  # 2 PP ranks x (70 + 20 + 10)
    assert scalar(c, "scheduler_idle_seconds_total") == 20.0
    assert scalar(c, "scheduler_cpu_seconds_total") == 199.0
    assert scalar(c, "gpu_busy_seconds_total") == 90.0  # _created samples are not values
    assert {s.model for s in c.scalars} == {"m"} and c.problems == []
