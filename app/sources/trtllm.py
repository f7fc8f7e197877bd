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

Where the page is: trtllm-serve serves this Prometheus page at ``/prometheus/metrics``, mounted
only when it runs with ``return_perf_metrics: true`` (``OpenAIServer.mount_metrics`` in
``tensorrt_llm/serve/openai_server.py``); its ``/metrics`` answers a JSON array of the iteration
statistics queued since the last read (``get_iteration_stats``: ``[]`` when none). A target URL
answering that array is recognised (:func:`is_iteration_stats`) and its scrape says where the page
is (:data:`WRONG_ENDPOINT`). Reading ``/metrics`` also drains the queue the Prometheus gauges are
computed from, so only ``/prometheus/metrics`` should be scraped.

The Triton TensorRT-LLM backend (``nv_trt_llm_*``) exports gauges only, without a latency
histogram; it is not an engine page this adapter reads.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

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
#: these mark an engine page: a running-requests gauge or a TTFT histogram, or the cached-prompt
#: counter ``MetricsCollector.__init__`` creates before the first request, so an idle server's page
#: is recognised too).
MARKERS = frozenset(GAUGES["running"] + HISTOGRAMS["ttft"] + _both("prompt_cached_tokens_total"))

#: trtllm-serve's Prometheus page (``OpenAIServer.mount_metrics``, with ``return_perf_metrics: true``).
PROMETHEUS_PATH = "/prometheus/metrics"
#: What a scrape of trtllm-serve's JSON ``/metrics`` says, and ``check-config`` with it. No URL:
#: scrape errors are shown to every reader of the API, and a URL may carry a password.
WRONG_ENDPOINT = ("the URL answers a JSON array of iteration statistics (trtllm-serve's /metrics), not a "
                  "Prometheus page: scrape /prometheus/metrics on the same host and port instead, which "
                  "trtllm-serve serves when started with return_perf_metrics: true in its "
                  "--extra_llm_api_options YAML (its running/waiting-request and KV-cache gauges also need "
                  "enable_iter_perf_stats: true)")
#: What a scrape says of a trtllm-serve page without any family the adapter reads.
NOTHING_YET = ("trtllm-serve's page has none of the families the diagnosis reads yet: the per-request "
               "histograms appear after the first finished request (they need return_perf_metrics: true), the "
               "running/waiting-request and KV-cache gauges need enable_iter_perf_stats: true")
#: Bytes of an answer looked at to recognise the iteration statistics: one iteration's object is about
#: 1 kB (2-3 kB with ``kvCacheIterationStats``), so the first element decodes well within it.
SNIFF_BYTES = 16384
#: Keys every serialized ``IterationStats`` has (``cpp/tensorrt_llm/executor/jsonSerialization.cpp``).
ITERATION_KEYS = frozenset({"iter", "iterLatencyMS", "numActiveRequests"})


def is_iteration_stats(body: bytes | str) -> bool:
    """Whether ``body`` is trtllm-serve's ``/metrics`` answer: a JSON array whose first element is an
    iteration-statistics object, or ``[]`` (no iteration since the last read). Bounded: only the first
    :data:`SNIFF_BYTES` are read and only the first element is decoded, never the whole array."""
    if body[:64].lstrip()[:1] not in (b"[", "["):  # a Prometheus page starts with "#" or a metric name
        return False
    cut = body[:SNIFF_BYTES + 1]
    text = cut if isinstance(cut, str) else cut.decode("utf-8", "replace")
    whole = len(cut) <= SNIFF_BYTES
    head = text.lstrip()[1:].lstrip()
    if head.startswith("]"):
        return whole and not head[1:].strip()
    if not head.startswith("{"):
        return False
    try:
        first, _ = json.JSONDecoder().raw_decode(head)
    except (ValueError, RecursionError):  # not JSON, cut inside the first element, or nested absurdly deep
        return False
    return isinstance(first, dict) and ITERATION_KEYS <= first.keys()


def prometheus_url(url: str) -> str:
    """``url`` pointed at trtllm-serve's Prometheus page: same scheme, host and port (for
    ``llm-latency diagnose``'s hint, shown to the user who typed the URL)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, PROMETHEUS_PATH, "", ""))


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
