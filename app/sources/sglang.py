"""SGLang adapter (``sglang:`` prefix, needs ``--enable-metrics``), 0.4 through 0.5.

SGLang's ITL is observed per *token* (a step interval divided by the tokens it
emitted), vLLM's per engine step; both are stored as ``itl``. 0.4.3 named it
``time_per_output_token_seconds``. Only TP rank 0 reports scheduler metrics by default,
so the data-parallel rank (``dp_rank``, absent = "0") is the rank kept.
"""

from __future__ import annotations

from app.exposition.parser import ParsedPage
from app.sources.base import Canonical, map_families

GROUP = ("model_name", "dp_rank")
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "tpot": ("sglang:request_time_per_output_token_seconds",),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "queue_time": ("sglang:queue_time_seconds",),
    "prompt_tokens": ("sglang:prompt_tokens_histogram",),
    "generation_tokens": ("sglang:generation_tokens_histogram",),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_usage": ("sglang:token_usage",),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens_total": ("sglang:prompt_tokens_total",),
    "generation_tokens_total": ("sglang:generation_tokens_total",),
    "preemptions_total": ("sglang:num_retracted_requests_total",),
    "requests_total": ("sglang:num_requests_total",),
}
FAMILIES = frozenset(n for table in (HISTOGRAMS, GAUGES, COUNTERS) for names in table.values() for n in names)


class SglangAdapter:
    name = "sglang"
    family_prefixes = ("sglang:",)
    families = FAMILIES

    def detect(self, page: ParsedPage) -> bool:
        return any(name.startswith("sglang:") for name in page.families)

    def to_canonical(self, page: ParsedPage) -> Canonical:
        out = Canonical(engine=self.name)
        map_families(page, out, GROUP, HISTOGRAMS, GAUGES, COUNTERS)
        return out
