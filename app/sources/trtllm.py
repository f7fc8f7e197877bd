"""TensorRT-LLM adapter: ``trtllm-serve``'s own Prometheus metrics (``trtllm_`` prefix).

Names, types and buckets are those of ``tensorrt_llm/metrics/collector.py``
(``MetricsCollector``, TensorRT-LLM 1.x), which copies vLLM's per-request histograms:

* ``trtllm_time_per_output_token_seconds`` is observed once per *finished request* (its mean
  time per output token), like vLLM's ``request_time_per_output_token_seconds``: it is ``tpot``,
  not ``itl``. trtllm-serve has no per-step inter-token histogram, so the rules that read the
  ITL distribution (its tail, its stalls) say they could not be judged on this engine.
* Gauges and iteration stats need ``enable_iter_perf_stats``; per-request histograms need
  ``return_perf_metrics`` (the engine's own notes). A page without them has families missing,
  and the diagnosis lists what it could not judge.
* Labels: ``model_name`` and ``engine_type``; no data-parallel rank (one series per server).
* KV transfer (disaggregated serving, published by the Dynamo TensorRT-LLM worker):
  ``trtllm_kv_transfer_latency_seconds`` (histogram, seconds), ``trtllm_kv_transfer_success_total``
  and, where the worker counts them, ``trtllm_kv_transfer_failure_total``.
* Speculative decoding: the iteration counters ``trtllm_spec_decode_num_draft_tokens_total`` /
  ``_num_accepted_tokens_total`` (acceptance rate, exact over the window) and the
  ``trtllm_spec_decode_acceptance_length`` gauge (the last iteration's mean tokens per verification
  step); no count of verification steps.
* Under Dynamo the same names may carry a ``trtllm:`` prefix instead of ``trtllm_``; both are
  recognised.

The Triton TensorRT-LLM backend (``nv_trt_llm_*``) exports gauges only, without a latency
histogram; it is not an engine page this adapter reads.
"""

from __future__ import annotations

from app.exposition.parser import ParsedPage
from app.sources.base import Canonical, map_families

GROUP = ("model_name", "dp_rank")  # no rank label: every series is rank "0"


def _both(name: str) -> tuple[str, ...]:
    """trtllm-serve's name and the ``trtllm:`` spelling Dynamo re-exports it under."""
    return (f"trtllm_{name}", f"trtllm:{name}")


HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": _both("time_to_first_token_seconds"),
    "tpot": _both("time_per_output_token_seconds"),
    "e2e": _both("e2e_request_latency_seconds"),
    "queue_time": _both("request_queue_time_seconds"),
    "prefill_time": _both("request_prefill_time_seconds"),
    "decode_time": _both("request_decode_time_seconds"),
    "inference_time": _both("request_inference_time_seconds"),
    "kv_transfer_time": _both("kv_transfer_latency_seconds"),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": _both("num_requests_running"),
    "waiting": _both("num_requests_waiting"),
    "kv_usage": _both("kv_cache_utilization"),
    "spec_accept_length": _both("spec_decode_acceptance_length"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens_total": _both("prompt_tokens_total"),
    "generation_tokens_total": _both("generation_tokens_total"),
    "requests_total": _both("request_success_total"),
    "kv_transfers_total": _both("kv_transfer_success_total"),
    "kv_transfer_failures_total": _both("kv_transfer_failure_total"),
    "spec_draft_tokens_total": _both("spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens_total": _both("spec_decode_num_accepted_tokens_total"),
}
FAMILIES = frozenset(n for table in (HISTOGRAMS, GAUGES, COUNTERS) for names in table.values() for n in names)
#: Families only trtllm-serve writes (``trtllm_kv_cache_hit_rate`` etc. share the prefix, but
#: these mark an engine page: a running-requests gauge or a TTFT histogram).
MARKERS = frozenset(GAUGES["running"] + HISTOGRAMS["ttft"])


class TrtllmAdapter:
    name = "trtllm"
    family_prefixes = ("trtllm_", "trtllm:")
    families = FAMILIES

    def detect(self, page: ParsedPage) -> bool:
        return any(name in MARKERS for name in page.families)

    def to_canonical(self, page: ParsedPage) -> Canonical:
        out = Canonical(engine=self.name)
        map_families(page, out, GROUP, HISTOGRAMS, GAUGES, COUNTERS)
        return out
