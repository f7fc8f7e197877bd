"""The P/D role of a worker: the engine's configuration first, then a target label, then its metrics."""

from __future__ import annotations

from app.latency import LABELLED_ROLE_INFO, pd_role
from app.sources.base import DISAGGREGATION_INFO, CanonicalInfo
from tests.sources.test_adapters import canonical

TRANSFERS = {"kv_transfer_time", "ttft"}


def test_vllm_kv_role_in_an_info_metric_wins_over_the_transfer_metrics() -> None:
    infos = [CanonicalInfo("cache_config", "m", "0", {"kv_role": "kv_producer", "block_size": "16"})]
    role = pd_role(infos, TRANSFERS, "vllm")
    assert role is not None and role.role == "prefill"
    assert role.source == "engine configuration: kv_role=kv_producer (cache_config)"
    both = pd_role([CanonicalInfo("kv_connector", "", "0", {"kv_role": "kv_both"})], set(), "vllm")
    assert both is not None and both.role == "both"


def test_sglang_engine_type_of_the_recorded_page() -> None:
    c = canonical("sglang-0.5-pd-constructed.prom")
    assert [(i.model, i.rank, i.labels) for i in c.infos if i.name == DISAGGREGATION_INFO] == [
        ("Qwen/Qwen3-8B", "0", {"disaggregation_mode": "prefill"}),
        ("Qwen/Qwen3-8B", "1", {"disaggregation_mode": "prefill"})]
    # the page records KV transfers too; the engine's own mode says prefill, not the metrics' guess
    role = pd_role(c.infos, {h.signal for h in c.histograms}, "sglang", "Qwen/Qwen3-8B")
    assert role is not None and (role.role, role.source) == ("prefill", "engine configuration: SGLang "
                                                                         "engine_type=prefill")
    assert pd_role(c.infos, set(), "sglang", "another-model") is None  # the infos of its model only


def test_sglang_unified_is_not_disaggregated_even_with_transfer_families() -> None:
    infos = [CanonicalInfo(DISAGGREGATION_INFO, "m", "0", {"disaggregation_mode": "unified"}),
             CanonicalInfo(LABELLED_ROLE_INFO, "", "0", {"pd_role": "decode", "label": "role"})]
    assert pd_role(infos, TRANSFERS, "sglang") is None


def test_a_target_label_says_what_the_engine_does_not() -> None:
    labelled = [CanonicalInfo(LABELLED_ROLE_INFO, "", "0", {"pd_role": "prefill", "label": "llm_d_ai_role"})]
    role = pd_role(labelled, TRANSFERS, "vllm")
    assert role is not None and role.role == "prefill"
    assert role.source == "target label llm_d_ai_role=prefill (the engine's metrics do not say)"
    odd = [CanonicalInfo(LABELLED_ROLE_INFO, "", "0", {"pd_role": "router", "label": "llm_d_ai_role"})]
    fallback = pd_role(odd, TRANSFERS, "vllm")  # not a role: the metrics decide
    assert fallback is not None and fallback.role == "decode" and fallback.source.startswith("metrics: ")
    assert pd_role([], {"ttft"}, "vllm") is None
    assert pd_role([], TRANSFERS, "sglang") is None  # SGLang states its mode; no guess from its transfers
