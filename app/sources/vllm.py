"""vLLM adapter, 0.6 (V0) through current V1 releases.

Renames handled (see the engine metrics reference, section 1.5): for each canonical
signal the candidates are tried newest first, and the first family present wins, so a
0.10.2–0.11 page that carries both ``inter_token_latency_seconds`` and the deprecated
``time_per_output_token_seconds`` is not double counted.

Series keep ``model_name`` and ``engine`` (the data-parallel rank; absent before 0.8,
stored as "0"). Counters over ``finished_reason`` are summed.

P/D disaggregation (NIXL connector): ``kv_transfer_time`` is ``vllm:nixl_xfer_time_seconds``
(buckets 5 ms - 5 s), ``kv_transfers_total`` its ``_count`` (vLLM has no counter of completed
transfers), ``kv_transfer_failures_total`` ``vllm:nixl_num_failed_transfers``. Speculative
decoding: the three ``vllm:spec_decode_num_*`` counters (acceptance rate and length are
computed from their rates; vLLM exports no gauge).

LoRA (``--enable-lora``): ``vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}`` is set to the current time each step for that step's label values
(``PrometheusStatLogger.record``), and no series is ever removed, so the engine's state is the
series with the newest value. The two lists are comma-joined adapter names: those with running
requests and those with waiting ones (0.10-0.11, ``LoRARequestStates.update_iteration_stats``), or
both every adapter with a request in flight (0.34, ``update_scheduler_stats``: the two lists are
the same). Either way their union is the adapters in demand, and more of them than ``max_lora``
means the requests of at least one wait for a slot: vLLM schedules at most ``max_lora`` adapters at
once. Per scrape that is three gauges, attached to the page's model (the family has no model label):
``lora_max_adapters``, ``lora_adapters_in_demand`` and ``lora_slot_wait`` (1 when short of slots).
The names are user content: only counted (at most :data:`MAX_COUNTED_ADAPTERS` per list), never kept.
"""

from __future__ import annotations

from app.exposition.parser import MetricFamily, ParsedPage
from app.sources.base import Canonical, CanonicalInfo, CanonicalScalar, map_families, memoized

GROUP = ("model_name", "engine")

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
    "prefill_time": ("vllm:request_prefill_time_seconds",),
    "decode_time": ("vllm:request_decode_time_seconds",),
    "inference_time": ("vllm:request_inference_time_seconds",),
    "prompt_tokens": ("vllm:request_prompt_tokens",),
    "generation_tokens": ("vllm:request_generation_tokens",),
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    # NIXL KV connector (P/D disaggregation), recorded where the transfer is read (the decode side).
    "kv_transfer_time": ("vllm:nixl_xfer_time_seconds",),
    # 0.34+: chat template, tokenization and multimodal preprocessing; labels model_name,
    # request_type (summed over), no engine label (the API server, not an engine core).
    "render_time": ("vllm:request_render_duration_seconds",),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "requests_total": ("vllm:request_success_total",),
    "kv_transfer_failures_total": ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers"),
    "spec_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
}
# vLLM counts completed transfers only as the transfer-time histogram's _count (no counter).
KV_TRANSFERS_FROM = "vllm:nixl_xfer_time_seconds"
INFOS = {"cache_config": "vllm:cache_config_info", "sleep_state": "vllm:engine_sleep_state"}
LORA_INFO = "vllm:lora_requests_info"
#: Adapter names counted per list of ``lora_requests_info``; past this the count stops (names are user
#: content: a page's size is bounded, what is read of it is bounded here too).
MAX_COUNTED_ADAPTERS = 4096

FAMILIES = frozenset(
    name
    for table in (HISTOGRAMS, GAUGES, COUNTERS)
    for names in table.values()
    for name in names
) | frozenset(INFOS.values()) | {LORA_INFO}


class VllmAdapter:
    name = "vllm"
    family_prefixes = ("vllm:",)
    families = FAMILIES

    def detect(self, page: ParsedPage) -> bool:
        return any(name.startswith("vllm:") for name in page.families)

    def to_canonical(self, page: ParsedPage) -> Canonical:
        out = Canonical(engine=self.name)
        map_families(page, out, GROUP, HISTOGRAMS, GAUGES, COUNTERS)
        families = page.families
        for h in out.histograms:
            if h.signal == "kv_transfer_time":
                out.scalars.append(CanonicalScalar("kv_transfers_total", "counter", h.model, h.rank, h.count))
        config = families.get(INFOS["cache_config"])
        if config is not None:  # labels only: built once per page shape
            out.infos.extend(memoized(config, "cache_config", lambda: _cache_configs(config)))
        lora = families.get(LORA_INFO)
        if lora is not None and lora.type == "gauge":
            _lora_slots(lora, out)
        sleep = families.get(INFOS["sleep_state"])
        if sleep is not None:
            states = {}
            for (key, state), value in zip(memoized(sleep, "sleep_state", lambda: _sleep_states(sleep)), sleep.values):
                if value:
                    states[key] = state
            for (model, rank), state in states.items():
                out.infos.append(CanonicalInfo("sleep_state", model, rank, {"sleep_state": state}))
        return out


def _sleep_states(sleep: MetricFamily) -> tuple[tuple[tuple[str, str], str], ...]:
    """((model, rank), state) per sample of ``engine_sleep_state``: the labels, read once per
    page shape (the one whose value is 1 is the state)."""
    return tuple(((sample.labels.get("model_name", ""), sample.labels.get("engine", "0")),
                  sample.labels.get("sleep_state", "")) for sample in sleep.samples)


def _cache_configs(config: MetricFamily) -> tuple[CanonicalInfo, ...]:
    return tuple(CanonicalInfo("cache_config", sample.labels.get("model_name", ""), sample.labels.get("engine", "0"),
                               {k: v for k, v in sample.labels.items() if k not in GROUP})
                 for sample in config.samples)


def _adapters(names: str) -> set[str]:
    """The distinct adapter names of a comma-joined list, at most :data:`MAX_COUNTED_ADAPTERS` read."""
    return {name for name in map(str.strip, names.split(",", MAX_COUNTED_ADAPTERS)[:MAX_COUNTED_ADAPTERS]) if name}


def _lora_states(lora: MetricFamily) -> tuple[tuple[int, int] | None, ...]:
    """(max_lora, adapters in demand) per series of ``lora_requests_info`` (None: its max_lora is no
    positive integer). Labels only: worked out once per page shape."""
    states: list[tuple[int, int] | None] = []
    for sample in lora.samples:
        labels = sample.labels
        slots = labels.get("max_lora", "")
        if not slots.isdigit() or int(slots) < 1:
            states.append(None)
            continue
        demand = _adapters(labels.get("running_lora_adapters", "")) | _adapters(labels.get("waiting_lora_adapters", ""))
        states.append((int(slots), len(demand)))
    return tuple(states)


def _lora_slots(lora: MetricFamily, out: Canonical) -> None:
    """The engine's LoRA slots now (the series with the newest timestamp) as three gauges of the page's
    model; nothing when the page names no model or no series has a valid ``max_lora``."""
    model = next((s.model for s in out.scalars if s.signal == "running" and s.rank == "0"), None)
    states = memoized(lora, "lora_states", lambda: _lora_states(lora))
    values = lora.values
    valid = [i for i, state in enumerate(states) if state is not None]
    if len(valid) < len(states):
        out.problems.append(f"{LORA_INFO}: {len(states) - len(valid)} series with a max_lora that is no positive "
                            "integer (not read)")
    if model is None or not valid:
        return
    state = states[max(valid, key=values.__getitem__)]
    assert state is not None
    slots, demand = state
    for signal, value in (("lora_max_adapters", slots), ("lora_adapters_in_demand", demand),
                          ("lora_slot_wait", 1.0 if demand > slots else 0.0)):
        out.scalars.append(CanonicalScalar(signal, "gauge", model, "0", float(value)))
