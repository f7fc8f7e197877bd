"""P/D transfer, speculative decoding and data-parallel ranks on the SGLang and trtllm-serve pages:
the families those engines write, read back by the monitor's own adapters.

The same scenario and seed drive the same engine whatever page it writes, so the vLLM page of a
run is the reference for the others: transfers, failures, draft and accepted tokens must agree
exactly (up to the unit of each family)."""

from __future__ import annotations

import pytest

from app.emulator.simulation import Simulation
from app.exposition.parser import ParsedPage, parse_page
from app.sources.sglang import SglangAdapter
from app.sources.trtllm import TrtllmAdapter

SPEC_EXPECTED = 0.1 + 0.1 ** 2 + 0.1 ** 3 + 0.1 ** 4 + 0.1 ** 5  # 5 drafts, 10 % per position


def page_of(scenario: str, engine: str, seconds: float = 60.0) -> ParsedPage:
    sim = Simulation(scenario, engine=engine, seed=4)
    sim.run_for(seconds)
    page = parse_page(sim.render_metrics())
    assert page.malformed == 0, page.errors
    return page


def value(page: ParsedPage, sample: str, **labels: str) -> float:
    family = sample.removesuffix("_sum").removesuffix("_count")
    found = [s.value for s in page.families[family].samples
             if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (sample, labels, found)
    return found[0]


def labels_of(page: ParsedPage, family: str) -> list[dict[str, str]]:
    return [s.labels for s in page.families[family].samples]


def test_kv_transfer_families_agree_with_the_vllm_page_of_the_same_run():
    vllm, trtllm = (page_of("kv_transfer", e) for e in ("vllm", "trtllm"))
    transfers = value(vllm, "vllm:nixl_xfer_time_seconds_count")
    seconds = value(vllm, "vllm:nixl_xfer_time_seconds_sum")
    failed = value(vllm, "vllm:nixl_num_failed_transfers_total")
    assert transfers > 100 and failed >= 1

    # SGLang 0.5.23: the transfer is timed on the *prefill* worker (a histogram in milliseconds, buckets
    # 1 ... 5000 ms); the decode worker records its wait for the KV (prefill + transfer) and both count
    # failures. Its decode side reserves memory and waits for the prefill first, so fewer transfers have
    # ended by the same time than on vLLM's decode worker, each as long.
    sim = Simulation("kv_transfer", engine="sglang", seed=4)
    sim.run_for(60.0)
    sglang, prefill = parse_page(sim.render_metrics()), parse_page(sim.render_prefill_metrics())
    assert sglang.malformed == prefill.malformed == 0
    assert "sglang:kv_transfer_latency_ms" not in sglang.families
    sent = value(prefill, "sglang:kv_transfer_latency_ms_count")
    assert sent == value(sglang, "sglang:per_stage_req_latency_seconds_count", stage="decode_transferred")
    assert 0.9 * transfers <= sent <= transfers
    mean_ms = value(prefill, "sglang:kv_transfer_latency_ms_sum") / sent
    assert mean_ms == pytest.approx(seconds / transfers * 1000, rel=0.05)
    wait = value(sglang, "sglang:per_stage_req_latency_seconds_sum", stage="decode_transferred") / sent
    forward = value(prefill, "sglang:per_stage_req_latency_seconds_sum", stage="prefill_forward") \
        / value(prefill, "sglang:per_stage_req_latency_seconds_count", stage="prefill_forward")
    assert wait == pytest.approx(mean_ms / 1000 + forward, rel=0.05)  # the KV wait = prefill + transfer
    assert value(sglang, "sglang:num_transfer_failed_reqs_total") == value(
        prefill, "sglang:num_transfer_failed_reqs_total") >= 1
    les = [s.labels["le"] for s in prefill.families["sglang:kv_transfer_latency_ms"].samples
           if s.name.endswith("_bucket")]
    assert les == ["1.0", "2.0", "5.0", "10.0", "25.0", "50.0", "100.0", "250.0", "500.0", "1000.0", "2500.0",
                   "5000.0", "+Inf"]
    assert {lb["engine_type"] for lb in labels_of(sglang, "sglang:num_running_reqs")} == {"decode"}
    assert {lb["engine_type"] for lb in labels_of(prefill, "sglang:num_running_reqs")} == {"prefill"}
    canonical = SglangAdapter().to_canonical(prefill)
    (h,) = [h for h in canonical.histograms if h.signal == "kv_transfer_time"]
    assert h.bounds[:3] == (0.001, 0.002, 0.005) and h.bounds[-2] == 5.0
    assert h.count == sent and h.sum == pytest.approx(mean_ms * sent / 1000, rel=1e-9)
    decode = SglangAdapter().to_canonical(sglang)
    assert {h.signal for h in decode.histograms} >= {"kv_wait_time", "prealloc_time", "kv_alloc_time"}
    assert not [h for h in decode.histograms if h.signal == "kv_transfer_time"]

    # trtllm: Dynamo's TensorRT-LLM worker families, in seconds, with successes and failures counted
    assert value(trtllm, "trtllm_kv_transfer_latency_seconds_count") == transfers
    assert value(trtllm, "trtllm_kv_transfer_latency_seconds_sum") == pytest.approx(seconds, rel=1e-9)
    assert value(trtllm, "trtllm_kv_transfer_success_total") == transfers
    assert value(trtllm, "trtllm_kv_transfer_failure_total") == failed
    assert labels_of(trtllm, "trtllm_kv_transfer_success_total")[0] == {
        "model_name": "meta-llama/Llama-3.1-8B-Instruct", "disaggregation_mode": "decode", "engine_type": "trtllm"}
    canonical = TrtllmAdapter().to_canonical(trtllm)
    scalars = {s.signal: s.value for s in canonical.scalars}
    assert scalars["kv_transfers_total"] == transfers and scalars["kv_transfer_failures_total"] == failed
    (h,) = [h for h in canonical.histograms if h.signal == "kv_transfer_time"]
    assert h.bounds[0] == 0.001 and h.bounds[-2] == 10.0 and h.count == transfers


def test_no_transfer_families_without_disaggregation():
    for engine, family in (("sglang", "sglang:kv_transfer_latency_ms"),
                           ("trtllm", "trtllm_kv_transfer_latency_seconds")):
        page = page_of("healthy", engine, 30)
        assert family not in page.families
    assert {lb["engine_type"] for lb in labels_of(page_of("healthy", "sglang", 30), "sglang:num_running_reqs")} \
        == {"unified"}


def test_speculative_decoding_on_sglang_and_trtllm_pages():
    vllm, sglang, trtllm = (page_of("speculation_ineffective", e) for e in ("vllm", "sglang", "trtllm"))
    # SGLang: the scheduler's gauges, accepted / proposed drafts and 1 + accepted per verification step
    assert value(sglang, "sglang:spec_accept_rate") == pytest.approx(SPEC_EXPECTED / 5, rel=1e-12)
    assert value(sglang, "sglang:spec_accept_length") == pytest.approx(1 + SPEC_EXPECTED, rel=1e-12)
    scalars = {s.signal: s.value for s in SglangAdapter().to_canonical(sglang).scalars}
    assert scalars["spec_accept_rate"] == pytest.approx(0.022222) and scalars["spec_accept_length"] == 1.11111
    # trtllm-serve: the iteration counters count what vLLM's counters count; its gauge the mean length
    drafts = value(vllm, "vllm:spec_decode_num_draft_tokens_total")
    accepted = value(vllm, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 10_000 and accepted == pytest.approx(drafts / 5 * SPEC_EXPECTED, abs=1)
    assert value(trtllm, "trtllm_spec_decode_num_draft_tokens_total") == drafts
    assert value(trtllm, "trtllm_spec_decode_num_accepted_tokens_total") == accepted
    assert value(trtllm, "trtllm_spec_decode_acceptance_length") == pytest.approx(1 + SPEC_EXPECTED, rel=1e-12)
    scalars = {s.signal: s.value for s in TrtllmAdapter().to_canonical(trtllm).scalars}
    assert scalars["spec_draft_tokens_total"] == drafts and scalars["spec_accepted_tokens_total"] == accepted
    assert scalars["spec_accept_length"] == pytest.approx(1.11111)


def test_sglang_without_speculation_writes_zero_gauges_that_are_not_read_as_speculation():
    page = page_of("healthy", "sglang", 30)
    assert value(page, "sglang:spec_accept_rate") == 0.0 and value(page, "sglang:spec_accept_length") == 0.0
    signals = {s.signal for s in SglangAdapter().to_canonical(page).scalars}
    assert "spec_accept_rate" not in signals and "spec_accept_length" not in signals and "running" in signals
    assert not any(name.startswith("trtllm_spec") for name in page_of("healthy", "trtllm", 30).families)


def test_sglang_data_parallel_ranks_carry_dp_rank():
    page = page_of("dp_imbalance", "sglang")
    running = {lb["dp_rank"]: lb["tp_rank"] for lb in labels_of(page, "sglang:num_running_reqs")}
    assert running == {"0": "0", "1": "1"}  # DP attention: each rank reports from its first attention-TP rank
    assert value(page, "sglang:num_running_reqs", dp_rank="0") == 8.0
    assert value(page, "sglang:num_queue_reqs", dp_rank="0") >= 20
    assert value(page, "sglang:num_queue_reqs", dp_rank="1") == 0.0
    assert value(page, "sglang:queue_time_seconds_count", dp_rank="0") > 0  # scheduler histograms: rank 0 serves
    assert "dp_rank" not in labels_of(page, "sglang:time_to_first_token_seconds")[0]  # tokenizer families
    canonical = SglangAdapter().to_canonical(page)
    ranks = {(s.signal, s.rank): s.value for s in canonical.scalars if s.signal in ("running", "waiting")}
    assert ranks[("running", "0")] == 8.0 and ranks[("running", "1")] == 0.0 and ranks[("waiting", "1")] == 0.0


def test_sglang_restarts_when_its_launch_changes():
    """A phase that turns on DP ranks restarts the server: new label set, counters from zero."""
    sim = Simulation("healthy->dp_imbalance@30", engine="sglang", seed=4)
    sim.run_for(29)
    before = parse_page(sim.render_metrics())
    assert "dp_rank" not in labels_of(before, "sglang:num_running_reqs")[0]
    requests_before = value(before, "sglang:num_requests_total")
    sim.run_for(2)
    after = parse_page(sim.render_metrics())
    assert {lb["dp_rank"] for lb in labels_of(after, "sglang:num_running_reqs")} == {"0", "1"}
    assert requests_before > 50 and value(after, "sglang:num_requests_total") < requests_before


def test_lora_pages_say_which_adapters_are_in_demand_as_each_release_does():
    """The same run's engine state as vLLM 0.34 writes it (both lists every adapter in flight), as 0.8
    writes it (running and waiting apart), and as SGLang's pool gauges count it."""
    from app.emulator.exposition import LORA_EPOCH

    pages = {}
    for engine in ("vllm", "vllm-legacy", "sglang"):
        sim = Simulation("lora_adapter_slots", engine=engine, seed=4)
        sim.run_for(60)
        state = sim.engine
        running = sorted({r.adapter for r in state.running})
        in_flight = sorted({r.adapter for r in state.running} | {r.adapter for r in state.waiting})
        pages[engine] = parse_page(sim.render_metrics())
    assert len(running) == 2 and len(in_flight) == 6  # 2 slots full, 6 of the 8 adapters in demand at t = 60 s
    newest = max(pages["vllm"].families["vllm:lora_requests_info"].samples, key=lambda s: s.value)
    assert newest.value == LORA_EPOCH + 60.0
    assert newest.labels == {"max_lora": "2", "running_lora_adapters": ",".join(in_flight),
                             "waiting_lora_adapters": ",".join(in_flight)}
    legacy = max(pages["vllm-legacy"].families["vllm:lora_requests_info"].samples, key=lambda s: s.value)
    assert legacy.labels["running_lora_adapters"] == ",".join(running)
    assert set(legacy.labels["waiting_lora_adapters"].split(",")) | set(running) == set(in_flight)
    waiting = value(pages["vllm"], "vllm:num_requests_waiting", engine="0")
    deferred = value(pages["vllm"], "vllm:num_requests_waiting_by_reason", reason="deferred")
    assert deferred > 0 and deferred + value(pages["vllm"], "vllm:num_requests_waiting_by_reason",
                                             reason="capacity") == waiting
    sglang = pages["sglang"]
    assert value(sglang, "sglang:lora_pool_slots_used") == 2.0 and value(sglang, "sglang:lora_pool_slots_total") == 2.0
    assert value(sglang, "sglang:lora_pool_utilization") == 1.0
