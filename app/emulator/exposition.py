"""The ``/metrics`` page in the formats real engines write.

vLLM (current, as in 0.32-0.34, and ``vllm-legacy`` = the 0.8.x V1 names) is produced
with real ``prometheus_client`` Counter/Gauge/Histogram objects on a per-target
``CollectorRegistry`` - exactly what vLLM does - so family names, ``_total``/``_created``
samples, label order and ``le`` rendering come out as on a real server. HELP strings,
label names and default buckets are copied from a real vLLM 0.32 page
(``tests/fixtures/exposition/vllm-0.32-cpu-real.prom``) and the vLLM source
(``vllm/v1/metrics/loggers.py``, ``buckets.py``).

TGI is written by a small renderer imitating the Rust ``metrics-exporter-prometheus``
crate TGI uses: counters without a ``_total`` suffix (``tgi_request_count``), no
``model_name`` label, no HELP lines, series appearing once first touched, histograms
whose name ends in ``duration`` using TGI's geometric buckets 0.0001 x 1.5^k (k = 1..35,
computed by repeated multiplication as TGI's router does).

Semantics follow the engines (all values are SIMULATED seconds - with ``time_scale`` 10 a
TTFT of 1 s is seen by an HTTP client after 0.1 s):

* vLLM ``inter_token_latency_seconds``: one observation per request per engine step that
  emits a token; ``iteration_tokens_total``: per step, the full prompt length of every
  request whose first token the step produced plus the tokens generated (vLLM V1's
  ``IterationStats``: a chunked prefill shows up in the step that finishes it);
* queue time = engine queue entry -> first scheduled; prefill = first scheduled -> first
  token; decode = first -> last token; TTFT and e2e start at the frontend arrival, so they
  include the (small) tokenization delay;
* TGI: ``tgi_batch_inference_duration{method="prefill"}`` for steps that admit/prefill
  requests (decodes are paused during them), ``{method="decode"}`` otherwise;
  ``tgi_request_mean_time_per_token_duration`` = inference time / generated tokens
  (prefill included, as in TGI).

SGLang (0.5 names, labels and default buckets of ``metrics_collector.py``) and TensorRT-LLM's
``trtllm-serve`` (``tensorrt_llm/metrics/collector.py``) are written with prometheus_client as
those engines do:

* SGLang: scheduler families carry ``model_name, engine_type, tp_rank, pp_rank`` (TP rank 0
  reports; with ``--dp-size`` > 1 also ``dp_rank``, one series per rank), tokenizer families
  ``model_name, engine_type``; ``inter_token_latency_seconds`` is per token (one token per step
  here, so the same observations as vLLM's);
  ``per_stage_req_latency_seconds{stage="prefill_forward"}`` = first scheduled -> first token;
  no prefill/decode histograms otherwise, no iteration-token histogram; ``spec_accept_rate`` /
  ``spec_accept_length`` gauges (0 without speculation); a P/D decode worker (``engine_type="decode"``)
  follows SGLang 0.5.23's decode side: the stages ``decode_prepare``, ``decode_bootstrap`` (handshake +
  memory reservation), ``decode_transferred`` (the prefill worker's prefill and the transfer),
  ``decode_waiting`` and ``fake_output`` (its first step, instead of ``prefill_forward``),
  ``kv_transfer_bootstrap_ms`` / ``kv_transfer_alloc_ms``, the prealloc and transfer queue gauges,
  ``prealloc_full_token_usage`` and ``num_transfer_failed_reqs_total``; its paired prefill worker's page
  (``engine_type="prefill"``) has ``kv_transfer_latency_ms`` (observed where SGLang sends the KV),
  ``_speed_gb_s``, ``_total_mb``, ``prefill_forward``, ``prefill_transfer_kv_cache``;
* LoRA (``max_loras``): vLLM's ``lora_requests_info`` (one series per label combination, set to the
  current time; 0.34's identical lists, 0.8's running and waiting apart) and SGLang's pool gauges;
  TGI and trtllm-serve export nothing of it;
* trtllm-serve: per-request histograms observed when a request finishes (TTFT, queue,
  prefill, decode, inference, e2e, and ``time_per_output_token`` = the request's mean decode
  time per token - no per-step ITL exists), gauges and spec-decode counters from the iteration
  stats; on a disaggregated decode worker the KV-transfer families of Dynamo's TensorRT-LLM worker.

The P/D transfer time is written on the emulated (decode) worker's page for vLLM and TensorRT-LLM,
and on the paired prefill worker's page for SGLang (``Simulation.render_prefill_metrics``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from app.emulator.engine import EngineConfig, Request, StepPlan
from app.emulator.physics import Deployment

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# --- vLLM default buckets (vllm/v1/metrics/buckets.py, 0.8 -> 0.34) -------------------------
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
NUM_PREEMPTIONS_BUCKETS = [1, 2, 3, 4, 5, 10, 20]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's 1-2-5 series capped at ``max_value`` (max_model_len): 1, 2, 5, 10, 20, ..."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


def _tgi_duration_buckets() -> list[float]:
    out, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return out


TGI_DURATION_BUCKETS = _tgi_duration_buckets()


def observe_n(child, value: float, n: int) -> None:
    """``n`` observations of ``value`` on a prometheus_client Histogram child in O(buckets)
    (same result as calling ``observe(value)`` n times, up to float rounding of the sum)."""
    if n == 1:
        child.observe(value)
        return
    child._sum.inc(value * n)
    for i, bound in enumerate(child._upper_bounds):
        if value <= bound:
            child._buckets[i].inc(n)
            break


class SpecCounts:
    """Speculative decoding's accepted tokens, counted as the engines count them (whole tokens):
    ``k`` draft tokens per verification step, position ``i`` accepted with probability ``a^i``,
    so a step accepts ``E = a + a^2 + ... + a^k`` tokens on average; the fractions carry over."""

    def __init__(self) -> None:
        self._carry = 0.0  # fractional accepted tokens not yet counted

    @staticmethod
    def expected_accepted(config: EngineConfig) -> float:
        a = config.spec_acceptance
        return sum(a ** i for i in range(1, config.num_speculative_tokens + 1))

    def step(self, config: EngineConfig, drafts: int) -> tuple[int, int]:
        """(draft tokens proposed, tokens accepted) for ``drafts`` verification steps."""
        self._carry += drafts * self.expected_accepted(config)
        whole = int(self._carry)
        self._carry -= whole
        return drafts * config.num_speculative_tokens, whole


class FeatureFamilies(dict):
    """The families of a page's optional features (P/D transfers, speculation, render time), keyed by
    feature and created the first time the feature is configured: a page shows them only then, as the
    engines register them."""

    def get_or_make(self, key: str, make: Callable[[], Any]) -> Any:
        found = self.get(key)
        if found is None:
            found = self[key] = make()
        return found


class PromFamilies:
    """Families on one prometheus_client registry that share their label names and values - the
    shape of SGLang's and trtllm-serve's collectors, which both label every series of a family the
    same way. Each helper returns the labelled child; :meth:`histogram` takes the family's unit
    (``unit=1000`` for a family in milliseconds) and is observed in seconds."""

    def __init__(self, registry: CollectorRegistry, labelnames: list[str], labelvalues: tuple[str, ...]) -> None:
        self.registry, self.labelnames, self.labelvalues = registry, labelnames, labelvalues

    def histogram(self, name: str, doc: str, buckets: list, *, unit: float = 1.0, extra: dict[str, str] | None = None):
        extra = extra or {}
        child = Histogram(name, doc, self.labelnames + list(extra), buckets=buckets,
                          registry=self.registry).labels(*self.labelvalues, *extra.values())
        return child if unit == 1.0 else _InUnit(child, unit)

    def counter(self, name: str, doc: str):
        return Counter(name, doc, self.labelnames, registry=self.registry).labels(*self.labelvalues)

    def gauge(self, name: str, doc: str):
        return Gauge(name, doc, self.labelnames, registry=self.registry).labels(*self.labelvalues)

    def labelled_histogram(self, name: str, doc: str, buckets: list, label: str):
        """A histogram family with one more label (SGLang's ``stage``): ``value -> child``."""
        family = Histogram(name, doc, self.labelnames + [label], buckets=buckets, registry=self.registry)
        return lambda value: family.labels(*self.labelvalues, value)


class _InUnit:
    """A histogram child in another unit than seconds (SGLang's ``*_ms`` families)."""

    def __init__(self, child, unit: float) -> None:
        self.child, self.unit = child, unit

    def observe(self, seconds: float) -> None:
        self.child.observe(seconds * self.unit)


NIXL_XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]  # vLLM NixlPromMetrics
RENDER_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                  10]  # vllm/renderers/metrics.py (0.34)

HELP = {
    "vllm:estimated_flops_per_gpu": "Estimated number of floating point operations per GPU "
                                    "(for Model Flops Utilization calculations).",
    "vllm:estimated_read_bytes_per_gpu": "Estimated number of bytes read from memory per GPU "
                                         "(for Model Flops Utilization calculations).",
    "vllm:estimated_write_bytes_per_gpu": "Estimated number of bytes written to memory per GPU "
                                          "(for Model Flops Utilization calculations).",
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
                                           "for scheduling capacity; 'deferred' = deferred by transient constraints "
                                           "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
                                           "vllm:num_requests_waiting.",
    "vllm:engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
                               "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:gpu_prefix_cache_queries": "GPU prefix cache queries, in terms of number of queried tokens.",
    "vllm:gpu_prefix_cache_hits": "GPU prefix cache hits, in terms of number of cached tokens.",
    "vllm:external_prefix_cache_queries": "External prefix cache queries from KV connector cross-instance cache "
                                          "sharing, in terms of number of queried tokens.",
    "vllm:external_prefix_cache_hits": "External prefix cache hits from KV connector cross-instance cache sharing, "
                                       "in terms of number of cached tokens.",
    "vllm:mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "vllm:mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "vllm:prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device "
                                           "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from another "
                                           "vLLM instance) or external_unspecified. Counted at admission; sums to "
                                           "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "vllm:request_params_n": "Histogram of the n request parameter.",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "vllm:request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "vllm:request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "vllm:request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill "
                                               "(excluding cached tokens).",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
}

#: The wall clock an emulated engine's ``set_to_current_time`` gauges read: this epoch + simulated seconds.
LORA_EPOCH = 1_800_000_000.0

#: finished_reason values per flavor (0.34: + error, repetition).
FINISHED_REASONS = {"vllm": ("stop", "length", "abort", "error", "repetition"),
                    "vllm-legacy": ("stop", "length", "abort")}

ENGINES = ("vllm", "vllm-legacy", "tgi", "sglang", "trtllm")


def _fmt_float(v: float) -> str:
    return repr(float(v))


def cache_config_labels(flavor: str, deployment: Deployment, config: EngineConfig,
                        num_gpu_blocks: int) -> dict[str, str]:
    """``vllm:cache_config_info`` labels: every CacheConfig field, stringified. The current
    set is the one of the real 0.32 page; the legacy one is 0.8.x's (with ``cpu_offload_gb``,
    which later moved out of CacheConfig - so weight offload has no metric in 0.20+)."""
    bs = config.block_size
    kv_tokens = num_gpu_blocks * bs
    if flavor == "vllm-legacy":
        return {
            "block_size": str(bs),
            "cache_dtype": deployment.kv_cache_dtype,
            "calculate_kv_scales": "False",
            "cpu_offload_gb": _fmt_float(deployment.cpu_offload_gb) if deployment.cpu_offload_gb else "0",
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "is_attention_free": "False",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(num_gpu_blocks),
            "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
            "prefix_caching_hash_algo": "builtin",
            "sliding_window": "None",
            "swap_space": "4",
            "swap_space_bytes": str(4 * 1024**3),
        }
    return {
        "_block_size_resolved": "True",
        "block_size": str(bs),
        "cache_dtype": deployment.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(bs),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "engine": "0",
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": _fmt_float(kv_tokens / config.max_model_len),
        "kv_cache_memory_bytes": str(int(kv_tokens * deployment.kv_bytes_per_token)),
        "kv_cache_size_tokens": str(kv_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_gpu_blocks),
        "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class VllmExporter:
    """vLLM's PrometheusStatLogger, fed by simulation events."""

    content_type = CONTENT_TYPE

    def __init__(self, flavor: str, model_name: str, deployment: Deployment, config: EngineConfig,
                 num_gpu_blocks: int, *, process_metrics: bool = False, mfu_metrics: bool = True) -> None:
        if flavor not in ("vllm", "vllm-legacy"):
            raise ValueError(f"unknown vLLM flavor {flavor!r}")
        self.flavor = flavor
        legacy = flavor == "vllm-legacy"
        self.registry = reg = CollectorRegistry()
        if process_metrics:
            GCCollector(registry=reg)
            PlatformCollector(registry=reg)
            ProcessCollector(registry=reg)
        ln = ["model_name", "engine"]
        lv = (model_name, "0")
        self.model_name = model_name
        self.mfu = mfu_metrics and not legacy

        def counter(name, extra=None, labelnames=ln):
            return Counter(name, HELP[name], labelnames + (extra or []), registry=reg)

        self._gauges: dict[str, Gauge] = {}

        def gauge(name, extra=None):
            family = self._gauges[name] = Gauge(name, HELP[name], ln + (extra or []), registry=reg)
            return family

        def hist(name, buckets):
            return Histogram(name, HELP[name], ln, buckets=buckets, registry=reg).labels(*lv)

        self._tp = deployment.tensor_parallel
        if not legacy:
            self.flops = counter("vllm:estimated_flops_per_gpu").labels(*lv)
            self.read_bytes = counter("vllm:estimated_read_bytes_per_gpu").labels(*lv)
            self.write_bytes = counter("vllm:estimated_write_bytes_per_gpu").labels(*lv)
        self.running = gauge("vllm:num_requests_running").labels(*lv)
        self.waiting = gauge("vllm:num_requests_waiting").labels(*lv)
        if legacy:
            self.kv_usage = gauge("vllm:gpu_cache_usage_perc").labels(*lv)
            self.prefix_queries = counter("vllm:gpu_prefix_cache_queries").labels(*lv)
            self.prefix_hits = counter("vllm:gpu_prefix_cache_hits").labels(*lv)
        else:
            by_reason = gauge("vllm:num_requests_waiting_by_reason", ["reason"])
            self.waiting_capacity = by_reason.labels(*lv, "capacity")
            self.waiting_deferred = by_reason.labels(*lv, "deferred")
            self.waiting_deferred.set(0)
            sleep = gauge("vllm:engine_sleep_state", ["sleep_state"])
            sleep.labels(*lv, "awake").set(1)
            sleep.labels(*lv, "weights_offloaded").set(0)
            sleep.labels(*lv, "discard_all").set(0)
            self.kv_usage = gauge("vllm:kv_cache_usage_perc").labels(*lv)
            self.prefix_queries = counter("vllm:prefix_cache_queries").labels(*lv)
            self.prefix_hits = counter("vllm:prefix_cache_hits").labels(*lv)
            counter("vllm:external_prefix_cache_queries").labels(*lv)
            counter("vllm:external_prefix_cache_hits").labels(*lv)
            counter("vllm:mm_cache_queries").labels(*lv)
            counter("vllm:mm_cache_hits").labels(*lv)
        self.preemptions = counter("vllm:num_preemptions").labels(*lv)
        self.prompt_tokens = counter("vllm:prompt_tokens").labels(*lv)
        if not legacy:
            by_source = counter("vllm:prompt_tokens_by_source", ["source"])
            self.prompt_local = by_source.labels(*lv, "local_compute")
            self.prompt_cache_hit = by_source.labels(*lv, "local_cache_hit")
            by_source.labels(*lv, "external_kv_transfer")
            self.prompt_cached = counter("vllm:prompt_tokens_cached").labels(*lv)
            cached_by_source = counter("vllm:prompt_tokens_cached_by_source", ["source"])
            self.prompt_cached_device = cached_by_source.labels(*lv, "device")
            for s in ("host", "p2p", "disk", "external_unspecified"):
                cached_by_source.labels(*lv, s)
        self.generation_tokens = counter("vllm:generation_tokens").labels(*lv)
        success = counter("vllm:request_success", ["finished_reason"])
        self.success = {r: success.labels(*lv, r) for r in FINISHED_REASONS[flavor]}
        if not legacy:
            rej = Counter("vllm:admission_rejections", HELP["vllm:admission_rejections"],
                          ["model_name", "reason"], registry=reg)
            rej.labels(model_name, "max_num_queued_reqs")
            rej.labels(model_name, "max_num_queued_tokens")
        token_buckets = build_1_2_5_buckets(config.max_model_len)
        self.h_prompt = hist("vllm:request_prompt_tokens", token_buckets)
        self.h_generation = hist("vllm:request_generation_tokens", token_buckets)
        self.h_iteration = hist("vllm:iteration_tokens_total", ITERATION_TOKENS_BUCKETS)
        self.h_max_gen = hist("vllm:request_max_num_generation_tokens", token_buckets)
        self.h_n = hist("vllm:request_params_n", PARAMS_N_BUCKETS)
        self.h_max_tokens = hist("vllm:request_params_max_tokens", token_buckets)
        self.h_ttft = hist("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        if legacy:
            self.h_itl = hist("vllm:time_per_output_token_seconds", ITL_BUCKETS)
            self.h_tpot = None
        else:
            self.h_itl = hist("vllm:inter_token_latency_seconds", ITL_BUCKETS)
            self.h_tpot = hist("vllm:request_time_per_output_token_seconds", ITL_BUCKETS)
        self.h_e2e = hist("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS)
        self.h_queue = hist("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS)
        self.h_inference = hist("vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS)
        self.h_prefill = hist("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS)
        self.h_decode = hist("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS)
        if legacy:
            self.h_req_preempt = self.h_kv_computed = None
        else:
            self.h_req_preempt = hist("vllm:request_num_preemptions", NUM_PREEMPTIONS_BUCKETS)
            self.h_kv_computed = hist("vllm:request_prefill_kv_computed_tokens", token_buckets)
        self._cache_info_labels: dict[str, str] | None = None
        self._lv = lv
        self._features = FeatureFamilies()
        self._spec = SpecCounts()
        self.on_config(deployment, config, num_gpu_blocks)

    # ---- optional features (vLLM 0.34 names; each family appears once its feature is used) ---
    def _enable_features(self, config: EngineConfig) -> None:
        reg, lv, ln = self.registry, self._lv, ["model_name", "engine"]
        if self.flavor != "vllm":
            return
        if config.kv_transfer_gbps is not None:
            self._features.get_or_make("nixl", lambda: (
                Histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
                          ln, buckets=NIXL_XFER_BUCKETS, registry=reg).labels(*lv),
                Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", ln,
                        registry=reg).labels(*lv)))
        if config.num_speculative_tokens:
            def spec():
                names = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                         "vllm:spec_decode_num_accepted_tokens")
                return tuple(Counter(n, n.split(":")[1].replace("_", " "), ln, registry=reg).labels(*lv) for n in names)
            self._features.get_or_make("spec", spec)
        for rank in range(1, config.data_parallel_size):
            # idle data-parallel ranks: every request is served on rank 0
            def idle(rank=str(rank)):
                out = []
                for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
                    child = self._gauges[name].labels(self.model_name, rank)
                    child.set(0)
                    out.append(child)
                return out
            self._features.get_or_make(f"rank{rank}", idle)

    def _render_histogram(self):
        """``vllm:request_render_duration_seconds`` (0.34): labels model_name, request_type; registered
        lazily, on the first request, as vLLM does."""
        return self._features.get_or_make("render", lambda: Histogram(
            "vllm:request_render_duration_seconds",
            "Time spent rendering a request, including chat templating, tokenization, and multimodal preprocessing.",
            ["model_name", "request_type"], buckets=RENDER_BUCKETS, registry=self.registry).labels(self.model_name,
                                                                                                   "chat"))

    # ---- configuration -----------------------------------------------------------------
    def on_config(self, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int) -> None:
        self._config = config
        self._enable_features(config)
        labels = cache_config_labels(self.flavor, deployment, config, num_gpu_blocks)
        if not hasattr(self, "_cache_info"):
            self._cache_info = Gauge("vllm:cache_config_info", HELP["vllm:cache_config_info"],
                                     list(labels), registry=self.registry)
        if self._cache_info_labels is not None:
            self._cache_info.remove(*self._cache_info_labels.values())
        self._cache_info.labels(**labels).set(1)
        self._cache_info_labels = labels
        self._tp = deployment.tensor_parallel

    # ---- events ------------------------------------------------------------------------
    def on_arrival(self, req: Request, t: float) -> None:
        if self.flavor != "vllm":
            return
        self._render_histogram().observe(req.frontend_s)
        if req.kv_transfer_s and "nixl" in self._features:
            xfer, failed = self._features["nixl"]
            if req.kv_transfer_failed:
                failed.inc()
            else:
                xfer.observe(req.kv_transfer_s)

    def on_admit(self, req: Request, t: float, hit: int, first: bool, prefix_caching: bool) -> None:
        if prefix_caching:
            self.prefix_queries.inc(req.num_tokens)
            if hit:
                self.prefix_hits.inc(hit)
        if first and hit and self.flavor == "vllm":
            self.prompt_cached_device.inc(hit)

    def on_preempt(self, req: Request, t: float) -> None:
        self.preemptions.inc()

    def on_step(self, plan: StepPlan, t: float, itl_groups: dict, first_tokens: list, generated: int,
                deployment: Deployment) -> None:
        prompt_iter = 0
        for req in first_tokens:
            prompt_iter += req.prompt_len
            self.h_ttft.observe(t - req.arrival)
            self.prompt_tokens.inc(req.prompt_len)
            if self.flavor == "vllm":
                self.prompt_local.inc(req.prompt_len - req.cached_tokens)
                if req.cached_tokens:
                    self.prompt_cache_hit.inc(req.cached_tokens)
                    self.prompt_cached.inc(req.cached_tokens)
        for last, n in itl_groups.items():
            observe_n(self.h_itl, t - last, n)
        drafts = sum(itl_groups.values())  # decode steps of requests past their first token
        if drafts and "spec" in self._features:
            draft_tokens, accepted = self._spec.step(self._config, drafts)
            c_drafts, c_tokens, c_accepted = self._features["spec"]
            c_drafts.inc(drafts)
            c_tokens.inc(draft_tokens)
            if accepted:
                c_accepted.inc(accepted)
        if generated:
            self.generation_tokens.inc(generated)
            self.h_iteration.observe(prompt_iter + generated)
        if self.mfu:
            cost = deployment.step_cost(plan.tokens, plan.kv_tokens, plan.attention_pairs)
            tp = self._tp
            self.flops.inc(cost.flops / tp)
            self.read_bytes.inc(cost.bytes_read / tp)
            self.write_bytes.inc(cost.bytes_written / tp)

    def on_finish(self, req: Request, t: float) -> None:
        reason = req.finish_reason
        if reason in self.success:
            self.success[reason].inc()
        if reason in ("abort", "error") or req.first_token is None:
            return
        queued = req.first_scheduled - req.queued
        prefill = req.first_token - req.first_scheduled
        decode = t - req.first_token
        self.h_e2e.observe(t - req.arrival)
        self.h_queue.observe(queued)
        self.h_prefill.observe(prefill)
        self.h_decode.observe(decode)
        self.h_inference.observe(t - req.first_scheduled)
        self.h_prompt.observe(req.prompt_len)
        self.h_generation.observe(req.num_output)
        self.h_max_gen.observe(req.max_tokens)
        self.h_max_tokens.observe(req.max_tokens)
        self.h_n.observe(1)
        if self.h_tpot is not None:
            self.h_tpot.observe(decode / (req.num_output - 1) if req.num_output > 1 else 0.0)
        if self.h_req_preempt is not None:
            self.h_req_preempt.observe(req.num_preemptions)
            self.h_kv_computed.observe(req.prompt_len - req.cached_tokens)

    def set_state(self, running: int, waiting: int, kv_usage: float, kv_used_tokens: int, kv_total_tokens: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if self.flavor == "vllm":
            self.waiting_capacity.set(waiting)

    def set_lora(self, running: list[str], waiting: list[str], max_loras: int, t: float) -> None:
        """``vllm:lora_requests_info`` for the engine's state now (vLLM sets it every step; the series of a
        label combination keeps the time it was last set, and none is removed). 0.34 (``vllm``) lists every
        adapter with a request in flight in both labels; 0.8-0.11 (``vllm-legacy``) those with running
        requests and those with waiting ones apart. The waiting requests whose adapter cannot get a slot are
        ``deferred`` in ``num_requests_waiting_by_reason`` (0.33+)."""
        gauge = self._features.get_or_make("lora", lambda: Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=self.registry))
        loaded = sorted(set(running))
        if self.flavor == "vllm":
            both = ",".join(sorted(set(running) | set(waiting)))
            labels = (str(max_loras), both, both)
            deferred = sum(1 for a in waiting if a not in loaded and len(loaded) >= max_loras)
            self.waiting_deferred.set(deferred)
            self.waiting_capacity.set(len(waiting) - deferred)
        else:
            labels = (str(max_loras), ",".join(sorted(set(waiting))), ",".join(loaded))
        gauge.labels(*labels).set(LORA_EPOCH + t)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# ---- TGI ------------------------------------------------------------------------------------
class _Hist:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.sum += v * n
        self.count += n
        b = self.buckets
        lo, hi = 0, len(b)
        while lo < hi:  # first bucket with v <= bound
            mid = (lo + hi) // 2
            if v <= b[mid]:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(b):
            self.counts[lo] += n


def _num(v: float) -> str:
    """Rust ``{}`` formatting of an f64: integers without a fraction, else shortest repr."""
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(float(v))


class TgiExporter:
    """TGI's router metrics (text-generation-inference v3 backend)."""

    content_type = CONTENT_TYPE

    def __init__(self, model_name: str, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int,
                 **_: object) -> None:
        self.model_name = model_name
        self.max_input_tokens = config.max_model_len - 1
        self.max_total_tokens = config.max_model_len
        self.counters: dict[tuple, float] = {}
        self.gauges: dict[tuple, float] = {}
        self.hists: dict[tuple, _Hist] = {}
        self._input_buckets = [(self.max_input_tokens / 100.0) * (x + 1) for x in range(100)]
        self._total_buckets = [(self.max_total_tokens / 100.0) * (x + 1) for x in range(100)]
        self._batch_buckets = [float(x + 1) for x in range(1024)]
        self._steps_since_concat = 0
        self.on_config(deployment, config, num_gpu_blocks)

    def _buckets_for(self, name: str) -> list[float]:
        if name.endswith("duration"):
            return TGI_DURATION_BUCKETS
        if name == "tgi_request_input_length":
            return self._input_buckets
        if name in ("tgi_request_generated_tokens", "tgi_request_max_new_tokens"):
            return self._total_buckets
        if name == "tgi_batch_next_size":
            return self._batch_buckets
        raise KeyError(name)

    def _inc(self, name: str, v: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + v

    def _set(self, name: str, v: float, **labels: str) -> None:
        self.gauges[(name, tuple(sorted(labels.items())))] = v

    def _obs(self, name: str, v: float, n: int = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        h = self.hists.get(key)
        if h is None:
            h = self.hists[key] = _Hist(self._buckets_for(name))
        h.observe(v, n)

    def on_config(self, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int) -> None:
        self._overhead = deployment.step_overhead_s
        self._set("tgi_batch_max_total_tokens", num_gpu_blocks * config.block_size)
        self._chunking = config.enable_chunked_prefill

    def on_arrival(self, req: Request, t: float) -> None:
        self._inc("tgi_request_count")
        self._obs("tgi_request_validation_duration", req.queued - req.arrival)

    def on_admit(self, req: Request, t: float, hit: int, first: bool, prefix_caching: bool) -> None:
        if first:
            self._obs("tgi_request_queue_duration", t - req.queued)

    def on_preempt(self, req: Request, t: float) -> None:
        pass

    def on_step(self, plan: StepPlan, t: float, itl_groups: dict, first_tokens: list, generated: int,
                deployment: Deployment) -> None:
        method = "prefill" if plan.is_prefill else "decode"
        d = plan.seconds
        ov = min(self._overhead, d / 2)
        self._inc("tgi_batch_inference_count", method=method)
        self._inc("tgi_batch_inference_success", method=method)
        self._obs("tgi_batch_inference_duration", d, method=method)
        self._obs("tgi_batch_forward_duration", d - ov, method=method)
        # The step's fixed overhead (gRPC to the shards, detokenization, batch filtering) is
        # split among TGI's debug histograms in assumed shares (40 % detokenization, 20 %
        # filtering, 10 % concatenation); the roofline has no finer model of it, and nothing
        # in the monitor reads these three families: they are here so the page carries every
        # family TGI's router exports.
        self._obs("tgi_batch_decode_duration", ov * 0.4, method=method)
        self._obs("tgi_batch_filter_duration", ov * 0.2, method=method)
        if plan.admitted:
            self._obs("tgi_batch_next_size", len(plan.admitted))
            if plan.running_before > 0:
                if self._chunking:
                    reason = "chunking"
                elif self._steps_since_concat >= 20:
                    reason = "wait_exceeded"
                else:
                    reason = "backpressure"
                self._inc("tgi_batch_concat", reason=reason)
                self._obs("tgi_batch_concat_duration", ov * 0.1, method=method)
            self._steps_since_concat = 0
        else:
            self._steps_since_concat += 1

    def on_finish(self, req: Request, t: float) -> None:
        if req.finish_reason in ("abort", "error") or req.first_token is None:
            return
        self._inc("tgi_request_success")
        inference = t - req.first_scheduled
        self._obs("tgi_request_duration", t - req.arrival)
        self._obs("tgi_request_inference_duration", inference)
        self._obs("tgi_request_mean_time_per_token_duration", inference / max(1, req.num_output))
        self._obs("tgi_request_input_length", req.prompt_len)
        self._obs("tgi_request_generated_tokens", req.num_output)
        self._obs("tgi_request_max_new_tokens", req.max_tokens)

    def set_state(self, running: int, waiting: int, kv_usage: float, kv_used_tokens: int, kv_total_tokens: int) -> None:
        self._set("tgi_queue_size", waiting)
        self._set("tgi_batch_current_size", running)
        self._set("tgi_batch_current_max_tokens", kv_used_tokens)
        self._set("tgi_batch_max_total_tokens", kv_total_tokens)

    @staticmethod
    def _labelstr(labels: tuple, extra: tuple = ()) -> str:
        items = list(labels) + list(extra)
        if not items:
            return ""
        return "{" + ",".join(f'{k}="{v}"' for k, v in items) + "}"

    def set_lora(self, running: list[str], waiting: list[str], max_loras: int, t: float) -> None:
        """TGI exports no LoRA adapter metric."""

    def render(self) -> bytes:
        out: list[str] = []

        def families(store: dict) -> dict[str, list]:
            fam: dict[str, list] = {}
            for (name, labels), v in store.items():
                fam.setdefault(name, []).append((labels, v))
            return {k: sorted(fam[k], key=lambda x: x[0]) for k in sorted(fam)}

        for name, series in families(self.counters).items():
            out.append(f"# TYPE {name} counter")
            out.extend(f"{name}{self._labelstr(lb)} {_num(v)}" for lb, v in series)
            out.append("")
        for name, series in families(self.gauges).items():
            out.append(f"# TYPE {name} gauge")
            out.extend(f"{name}{self._labelstr(lb)} {_num(v)}" for lb, v in series)
            out.append("")
        for name, series in families(self.hists).items():
            out.append(f"# TYPE {name} histogram")
            for lb, h in series:
                cum = 0
                for bound, c in zip(h.buckets, h.counts):
                    cum += c
                    out.append(f"{name}_bucket{self._labelstr(lb, (('le', _num(bound)),))} {cum}")
                out.append(f"{name}_bucket{self._labelstr(lb, (('le', '+Inf'),))} {h.count}")
                out.append(f"{name}_sum{self._labelstr(lb)} {_num(h.sum)}")
                out.append(f"{name}_count{self._labelstr(lb)} {h.count}")
            out.append("")
        return ("\n".join(out) + "\n").encode()


# ---- SGLang ---------------------------------------------------------------------------------
SGLANG_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
SGLANG_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
                      2400]
SGLANG_QUEUE_BUCKETS = [0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80,
                        90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500,
                        3000]
SGLANG_STAGE_BUCKETS = [0.001 * 1.62 ** k for k in range(30)]
SGLANG_TOKEN_BUCKETS = [100, 300, 500, 1000, 1200, 1500, 1700, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 6000, 7000,
                        8000, 9000, 10000, 12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000,
                        132000, 300000, 600000, 900000, 1100000]


SGLANG_KV_TRANSFER_MS_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000]
SGLANG_BOOTSTRAP_MS_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500]
SGLANG_SPEED_BUCKETS = [0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400]
SGLANG_TOTAL_MB_BUCKETS = [1, 5, 10, 50, 100, 500, 1000, 5000, 10000]
STAGE_FAMILY = "sglang:per_stage_req_latency_seconds"
STAGE_DOC = "The latency of each stage of requests."
PREALLOC_USAGE_DOC = ("Share of the full-attention KV pool held by decode requests whose KV transfer is pending "
                      "(preallocated, not yet running); same capacity basis as sglang:full_token_usage.")
PD_PREPARE_S = 0.0002  # SGLang decode worker: scheduler receipt -> prealloc queue (stage decode_prepare)
PD_BOOTSTRAP_S = 0.005  # ... the handshake with the prefill worker before its memory is reserved
#: ``SCHEDULER_STAGE_CATEGORIES`` of ``sglang/srt/observability/scheduler_stage_metrics.py`` (0.5.23)
SGLANG_SCHEDULER_STAGES = ("other", "recv_requests", "process_input_requests", "get_next_batch_to_run",
                           "process_queue", "run_batch", "process_batch_result", "sanity_check_cache", "idle")


class SglangExporter:
    """SGLang 0.5's ``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector``.

    The label set is fixed when the server starts: ``engine_type`` is its ``--disaggregation-mode``
    (``decode`` for the emulated P/D worker, else ``unified``) and with ``--dp-size`` > 1 (DP
    attention) every scheduler family carries ``dp_rank``, each rank reporting from its first
    attention-TP process (``tp_rank`` = rank x attention TP size). A phase that changes either
    restarts the server, as it must be restarted for real: a new registry, counters from zero.
    Speculative decoding sets the scheduler's ``spec_accept_rate`` / ``spec_accept_length`` gauges
    each decode step (expected values, as :class:`SpecCounts`); P/D writes the transfer-latency
    histogram (milliseconds) and the failed-transfer counter.

    Scheduler time (0.5.20+ ``metrics_reporter``, with ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``), per
    step and the gap before it: the loop's wall time in ``scheduler_stage_seconds_total`` (the gap as
    ``idle``, the step's host CPU work as ``get_next_batch_to_run``, the rest of the step, waiting on the
    GPU, as ``process_batch_result`` with ``forward_overlap="full"``), the gap also in
    ``scheduler_idle_seconds_total``, all of it in ``scheduler_process_cpu_seconds_total`` (the loop polls
    without sleeping: one CPU-second per second), the step's forward pass in
    ``forward_execution_seconds_total{category="extend"|"decode"}``. The other DP ranks' loops idle.
    LoRA (``max_loras``): the pool gauges ``lora_pool_slots_used`` / ``_total`` / ``_utilization``."""

    content_type = CONTENT_TYPE

    def __init__(self, model_name: str, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int,
                 **_: object) -> None:
        self.model_name = model_name
        self._launch: tuple[str, int, int] | None = None
        self.on_config(deployment, config, num_gpu_blocks)

    def _start(self, engine_type: str, dp_size: int, attn_tp: int) -> None:
        self.registry = reg = CollectorRegistry()
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank"] + (["dp_rank"] if dp_size > 1 else [])
        ranks = [(self.model_name, engine_type, str(r * attn_tp), "0") + ((str(r),) if dp_size > 1 else ())
                 for r in range(dp_size)]
        s = PromFamilies(reg, sched, ranks[0])  # rank 0 serves every request
        self._sched, self._features = s, FeatureFamilies()
        tok = PromFamilies(reg, ["model_name", "engine_type"], (self.model_name, engine_type))

        def per_rank(name: str, doc: str) -> Gauge:
            family = Gauge(name, doc, sched, registry=reg)
            for values in ranks[1:]:
                family.labels(*values).set(0)  # the idle ranks
            return family.labels(*ranks[0])

        self.running = per_rank("sglang:num_running_reqs", "The number of running requests.")
        self.waiting = per_rank("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.kv_usage = per_rank("sglang:token_usage", "The token usage.")
        self.used_tokens = s.gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.retracted = s.counter("sglang:num_retracted_requests", "Total number of retracted requests.")
        self.prompt_tokens = tok.counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = tok.counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.requests = tok.counter("sglang:num_requests", "The number of processed requests.")
        self.h_ttft = tok.histogram("sglang:time_to_first_token_seconds",
                                    "Histogram of time to first token in seconds.", SGLANG_TTFT_BUCKETS)
        self.h_itl = tok.histogram("sglang:inter_token_latency_seconds",
                                   "Histogram of inter-token latency in seconds.", SGLANG_ITL_BUCKETS)
        self.h_tpot = tok.histogram("sglang:request_time_per_output_token_seconds",
                                    "Histogram of time per output token of each request in seconds.",
                                    SGLANG_ITL_BUCKETS)
        self.h_e2e = tok.histogram("sglang:e2e_request_latency_seconds",
                                   "Histogram of End-to-end request latency in seconds", SGLANG_E2E_BUCKETS)
        self.h_prompt = tok.histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.",
                                      SGLANG_TOKEN_BUCKETS)
        self.h_generation = tok.histogram("sglang:generation_tokens_histogram",
                                          "Histogram of generation token length.", SGLANG_TOKEN_BUCKETS)
        self.h_queue = s.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                                   SGLANG_QUEUE_BUCKETS)
        # logged every stats interval, 0 when speculation is off (SchedulerStats' defaults), as SGLang does
        self.spec_rate = s.gauge("sglang:spec_accept_rate",
                                 "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).")
        self.spec_length = s.gauge("sglang:spec_accept_length", "Mean acceptance length of speculative decoding "
                                   "(accepted drafts + bonus token per forward).")
        stage = Counter("sglang:scheduler_stage_seconds", "Total scheduler-loop wall time exclusively attributed to "
                        "each stage.", sched + ["category", "forward_overlap"], registry=reg)
        idle = Counter("sglang:scheduler_idle_seconds", "Total wall time while the scheduler has no runnable or "
                       "queued work.", sched, registry=reg)
        cpu = Counter("sglang:scheduler_process_cpu_seconds", "Total CPU time consumed by the scheduler process "
                      "across all threads.", sched, registry=reg)
        for values in ranks:
            for category in SGLANG_SCHEDULER_STAGES:
                stage.labels(*values, category, "none")
        self.stage = {key: stage.labels(*ranks[0], *key) for key in
                      (("idle", "none"), ("get_next_batch_to_run", "none"), ("process_batch_result", "full"))}
        self.idle_seconds, self.cpu_seconds = idle.labels(*ranks[0]), cpu.labels(*ranks[0])
        self.idle_ranks = [(stage.labels(*values, "idle", "none"), idle.labels(*values), cpu.labels(*values))
                           for values in ranks[1:]]
        forward = Counter("sglang:forward_execution_seconds", "Total time that GPU is busy executing model forward "
                          "passes. Refer to ForwardMode for category labels.", sched + ["category"], registry=reg)
        self.forward = {mode: forward.labels(*ranks[0], mode) for mode in ("extend", "decode")}
        self._accounted_to: float | None = None  # the scheduler time counted so far ends here
        self._disaggregated = engine_type == "decode"
        if self._disaggregated:  # SGLang 0.5.23's decode worker and its paired prefill worker
            self._decode_families(s, sched)
        else:
            self.h_prefill = s.histogram(STAGE_FAMILY, STAGE_DOC, SGLANG_STAGE_BUCKETS,
                                         extra={"stage": "prefill_forward"})

    def _decode_families(self, s: PromFamilies, sched: list[str]) -> None:
        stage = s.labelled_histogram(STAGE_FAMILY, STAGE_DOC, SGLANG_STAGE_BUCKETS, "stage")
        self.d_prepare, self.d_bootstrap, self.d_transferred, self.d_waiting = (
            stage("decode_prepare"), stage("decode_bootstrap"), stage("decode_transferred"), stage("decode_waiting"))
        self.h_prefill = stage("fake_output")  # its first step: nothing is prefilled on a decode worker
        self.bootstrap_ms = s.histogram("sglang:kv_transfer_bootstrap_ms", "Histogram of KV transfer bootstrap time "
                                        "in ms.", SGLANG_BOOTSTRAP_MS_BUCKETS, unit=1000.0)
        self.alloc_ms = s.histogram("sglang:kv_transfer_alloc_ms", "Histogram of KV transfer allocation waiting time "
                                    "in ms.", SGLANG_BOOTSTRAP_MS_BUCKETS, unit=1000.0)
        self.prealloc_queue = s.gauge("sglang:num_decode_prealloc_queue_reqs",
                                      "The number of requests in the decode prealloc queue.")
        self.transfer_queue = s.gauge("sglang:num_decode_transfer_queue_reqs",
                                      "The number of requests in the decode transfer queue.")
        self.prealloc_usage = s.gauge("sglang:prealloc_full_token_usage", PREALLOC_USAGE_DOC)
        self.transfer_failed = s.counter("sglang:num_transfer_failed_reqs", "The number of transfer failed requests.")
        # the prefill worker of the pair: its own registry and page (engine_type="prefill")
        self.prefill_registry = preg = CollectorRegistry()
        ranks = (self.model_name, "prefill", "0", "0")
        p = PromFamilies(preg, sched[:4], ranks)
        tok = PromFamilies(preg, ["model_name", "engine_type"], (self.model_name, "prefill"))
        self.p_running = p.gauge("sglang:num_running_reqs", "The number of running requests.")
        self.p_waiting = p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.p_inflight = p.gauge("sglang:num_prefill_inflight_queue_reqs",
                                  "The number of requests in the prefill inflight queue.")
        self.p_queue = p.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                                   SGLANG_QUEUE_BUCKETS)
        pstage = p.labelled_histogram(STAGE_FAMILY, STAGE_DOC, SGLANG_STAGE_BUCKETS, "stage")
        self.p_bootstrap, self.p_forward, self.p_send = (
            pstage("prefill_bootstrap"), pstage("prefill_forward"), pstage("prefill_transfer_kv_cache"))
        self.p_transfer = p.histogram("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.",
                                      SGLANG_KV_TRANSFER_MS_BUCKETS, unit=1000.0)
        self.p_speed = p.histogram("sglang:kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.",
                                   SGLANG_SPEED_BUCKETS)
        self.p_total_mb = p.histogram("sglang:kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.",
                                      SGLANG_TOTAL_MB_BUCKETS)
        self.p_bootstrap_ms = p.histogram("sglang:kv_transfer_bootstrap_ms", "Histogram of KV transfer bootstrap "
                                          "time in ms.", SGLANG_BOOTSTRAP_MS_BUCKETS, unit=1000.0)
        self.p_alloc_ms = p.histogram("sglang:kv_transfer_alloc_ms", "Histogram of KV transfer allocation waiting "
                                      "time in ms.", SGLANG_BOOTSTRAP_MS_BUCKETS, unit=1000.0)
        self.p_failed = p.counter("sglang:num_transfer_failed_reqs", "The number of transfer failed requests.")
        self.p_ttft = tok.histogram("sglang:time_to_first_token_seconds",
                                    "Histogram of time to first token in seconds.", SGLANG_TTFT_BUCKETS)
        self.p_prompt = tok.histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.",
                                      SGLANG_TOKEN_BUCKETS)
        self.p_prompt_tokens = tok.counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.p_requests = tok.counter("sglang:num_requests", "The number of processed requests.")

    def on_preallocated(self, req: Request, entry: float, alloc: float) -> None:
        """SGLang P/D: the decode worker reserved the request's memory at ``alloc`` (it entered its
        prealloc queue at ``entry``); the prefill worker's bootstrap ends at the same moment."""
        self.d_prepare.observe(PD_PREPARE_S)
        self.d_bootstrap.observe(alloc - entry)
        for bootstrap, alloc_wait in ((self.bootstrap_ms, self.alloc_ms), (self.p_bootstrap_ms, self.p_alloc_ms)):
            bootstrap.observe(PD_BOOTSTRAP_S)
            alloc_wait.observe(max(0.0, alloc - entry - PD_BOOTSTRAP_S))
        self.p_bootstrap.observe(alloc - entry)

    def on_kv_arrived(self, req: Request, alloc: float, arrived: float) -> None:
        """SGLang P/D: the KV reached the decode worker at ``arrived`` (or its transfer failed)."""
        prefill = arrived - alloc - req.kv_transfer_s
        self.p_queue.observe(0.0)
        self.p_forward.observe(prefill)
        self.p_prompt.observe(req.prompt_len)
        self.p_prompt_tokens.inc(req.prompt_len)
        self.p_requests.inc()
        if req.kv_transfer_failed:
            self.transfer_failed.inc()
            self.p_failed.inc()
            return
        self.d_transferred.observe(arrived - alloc)
        megabytes = req.prompt_len * self._kv_bytes_per_token / (1024 * 1024)
        self.p_send.observe(req.kv_transfer_s)
        self.p_transfer.observe(req.kv_transfer_s)
        self.p_total_mb.observe(megabytes)
        self.p_speed.observe(megabytes / 1024 / req.kv_transfer_s)
        self.p_ttft.observe(arrived - req.arrival)

    def set_pd_state(self, prealloc: int, transfer: int, prealloc_usage: float) -> None:
        self.prealloc_queue.set(prealloc)
        self.transfer_queue.set(transfer)
        self.prealloc_usage.set(prealloc_usage)

    def set_prefill_state(self, inflight: int) -> None:
        self.p_running.set(0)
        self.p_waiting.set(0)
        self.p_inflight.set(inflight)

    def render_prefill(self) -> bytes:
        return generate_latest(self.prefill_registry)

    def on_config(self, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int) -> None:
        self._config = config
        self._kv_bytes_per_token = deployment.kv_bytes_per_token
        launch = ("decode" if config.kv_transfer_gbps is not None else "unified", max(1, config.data_parallel_size),
                  deployment.tensor_parallel)
        if launch != self._launch:
            self._launch = launch
            self._start(*launch)

    def on_arrival(self, req: Request, t: float) -> None:
        pass

    def on_admit(self, req: Request, t: float, hit: int, first: bool, prefix_caching: bool) -> None:
        pass

    def on_preempt(self, req: Request, t: float) -> None:
        self.retracted.inc()

    def _scheduler_time(self, plan: StepPlan, t: float) -> None:
        """The loop's time from the end of the last step to the end of this one: the gap idle."""
        start = plan.start if self._accounted_to is None else min(self._accounted_to, plan.start)
        gap, step = plan.start - start, t - plan.start
        host = min(step, plan.host_seconds)
        if gap > 0:
            self.stage["idle", "none"].inc(gap)
            self.idle_seconds.inc(gap)
        if host > 0:
            self.stage["get_next_batch_to_run", "none"].inc(host)
        self.stage["process_batch_result", "full"].inc(step - host)
        self.cpu_seconds.inc(gap + step)
        self.forward["extend" if plan.is_prefill else "decode"].inc(plan.gpu_seconds)
        for rank_stage, rank_idle, rank_cpu in self.idle_ranks:
            for counter in (rank_stage, rank_idle, rank_cpu):
                counter.inc(gap + step)
        self._accounted_to = t

    def on_step(self, plan: StepPlan, t: float, itl_groups: dict, first_tokens: list, generated: int,
                deployment: Deployment) -> None:
        self._scheduler_time(plan, t)
        for req in first_tokens:
            self.h_ttft.observe(t - req.arrival)
            self.h_queue.observe(req.first_scheduled - req.queued)
            if self._disaggregated:
                self.d_waiting.observe(req.first_scheduled - req.queued)
            self.h_prefill.observe(t - req.first_scheduled)
            self.prompt_tokens.inc(req.prompt_len)
        for last, n in itl_groups.items():
            observe_n(self.h_itl, t - last, n)
        k = self._config.num_speculative_tokens
        if k and itl_groups:
            accepted = SpecCounts.expected_accepted(self._config)
            self.spec_rate.set(accepted / k)
            self.spec_length.set(1.0 + accepted)
        if generated:
            self.generation_tokens.inc(generated)

    def on_finish(self, req: Request, t: float) -> None:
        if req.finish_reason in ("abort", "error") or req.first_token is None:
            return
        self.requests.inc()
        self.h_e2e.observe(t - req.arrival)
        self.h_prompt.observe(req.prompt_len)
        self.h_generation.observe(req.num_output)
        decode = t - req.first_token
        self.h_tpot.observe(decode / (req.num_output - 1) if req.num_output > 1 else 0.0)

    def set_state(self, running: int, waiting: int, kv_usage: float, kv_used_tokens: int, kv_total_tokens: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        self.used_tokens.set(kv_used_tokens)

    def set_lora(self, running: list[str], waiting: list[str], max_loras: int, t: float) -> None:
        """SGLang's LoRA pool (``--enable-lora``, ``--max-loras-per-batch``): slots in use by the running
        batch's adapters and the pool's size. It says nothing of the adapters waiting requests need."""
        used, total, utilization = self._features.get_or_make("lora", lambda: (
            self._sched.gauge("sglang:lora_pool_slots_used",
                              "Number of LoRA adapter slots currently occupied in GPU memory."),
            self._sched.gauge("sglang:lora_pool_slots_total",
                              "Total number of LoRA adapter slots available (max_loras_per_batch)."),
            self._sched.gauge("sglang:lora_pool_utilization",
                              "LoRA pool utilization ratio (used/total). 1.0 means pool is full.")))
        slots_used = len(set(running))
        used.set(slots_used)
        total.set(max_loras)
        utilization.set(slots_used / max_loras)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# ---- TensorRT-LLM (trtllm-serve) -----------------------------------------------------------------
TRTLLM_PREFILL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                          160.0, 640.0, 2560.0]
#: Dynamo's TensorRT-LLM worker (``dynamo/trtllm/metrics.py``, ``KV_TRANSFER_LATENCY_BUCKETS``)
TRTLLM_KV_TRANSFER_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class TrtllmExporter:
    """trtllm-serve's ``MetricsCollector``: per-request histograms at finish, iteration gauges and
    counters per step. Speculative decoding: the iteration counters
    ``trtllm_spec_decode_num_draft_tokens_total`` / ``_num_accepted_tokens_total`` and the
    ``trtllm_spec_decode_acceptance_length`` gauge (the iteration's mean tokens per verification
    step); trtllm-serve counts no verification steps. Disaggregated serving (the emulated engine is
    the decode worker): the KV-transfer families of Dynamo's TensorRT-LLM worker -
    ``trtllm_kv_transfer_latency_seconds``, ``_success_total``, ``_failure_total`` - labelled
    ``model_name, disaggregation_mode, engine_type``. Feature families appear once their feature is
    configured (their series once first used, as prometheus_client does)."""

    content_type = CONTENT_TYPE

    def __init__(self, model_name: str, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int,
                 **_: object) -> None:
        self.registry = reg = CollectorRegistry()
        ln, lv = ["model_name", "engine_type"], (model_name, "trtllm")
        f = PromFamilies(reg, ln, lv)
        self.model_name = model_name
        self.success = Counter("trtllm_request_success", "Count of successfully processed requests.",
                               ln + ["finished_reason"], registry=reg)
        self.lv = lv
        self.h_e2e = f.histogram("trtllm_e2e_request_latency_seconds",
                                 "Histogram of end to end request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.h_ttft = f.histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                  TTFT_BUCKETS)
        self.h_tpot = f.histogram("trtllm_time_per_output_token_seconds",
                                  "Histogram of time per output token in seconds.", ITL_BUCKETS)
        self.h_queue = f.histogram("trtllm_request_queue_time_seconds",
                                   "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_prefill = f.histogram("trtllm_request_prefill_time_seconds", "Histogram of prefill (context) phase "
                                     "duration in seconds (first_token_time - first_scheduled_time).",
                                     TRTLLM_PREFILL_BUCKETS)
        self.h_decode = f.histogram("trtllm_request_decode_time_seconds", "Histogram of decode (generation) phase "
                                    "duration in seconds (last_token_time - first_token_time).",
                                    REQUEST_LATENCY_BUCKETS)
        self.h_inference = f.histogram("trtllm_request_inference_time_seconds", "Histogram of total inference "
                                       "duration in seconds (last_token_time - first_scheduled_time).",
                                       REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = f.counter("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.")
        self.generation_tokens = f.counter("trtllm_generation_tokens",
                                           "Cumulative number of generation (output) tokens produced.")
        self.running = f.gauge("trtllm_num_requests_running", "Number of active requests")
        self.waiting = f.gauge("trtllm_num_requests_waiting", "Number of queued requests")
        self.kv_usage = f.gauge("trtllm_kv_cache_utilization", "KV cache utilization")
        self.kv_max_blocks = f.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks")
        self.kv_used_blocks = f.gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks")
        self._families = f
        self._features = FeatureFamilies()
        self._spec = SpecCounts()
        self.on_config(deployment, config, num_gpu_blocks)

    def on_config(self, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int) -> None:
        self.block_size = config.block_size
        self._config = config
        f = self._families
        if config.num_speculative_tokens:
            self._features.get_or_make("spec", lambda: (
                f.counter("trtllm_spec_decode_num_draft_tokens",
                          "Total number of draft tokens in speculative decoding"),
                f.counter("trtllm_spec_decode_num_accepted_tokens",
                          "Total number of accepted tokens in speculative decoding"),
                f.gauge("trtllm_spec_decode_acceptance_length", "Acceptance length in speculative decoding")))
        if config.kv_transfer_gbps is not None:
            dynamo = PromFamilies(self.registry, ["model_name", "disaggregation_mode", "engine_type"],
                                  (self.model_name, "decode", "trtllm"))
            self._features.get_or_make("kv_transfer", lambda: (
                dynamo.histogram("trtllm_kv_transfer_latency_seconds",
                                 "KV cache transfer latency per request in seconds", TRTLLM_KV_TRANSFER_BUCKETS),
                dynamo.counter("trtllm_kv_transfer_success", "Total number of successful KV cache transfers"),
                dynamo.counter("trtllm_kv_transfer_failure", "Total number of failed KV cache transfers")))

    def on_arrival(self, req: Request, t: float) -> None:
        if req.kv_transfer_s and "kv_transfer" in self._features:
            latency, succeeded, failed = self._features["kv_transfer"]
            if req.kv_transfer_failed:
                failed.inc()
            else:
                latency.observe(req.kv_transfer_s)
                succeeded.inc()

    def on_admit(self, req: Request, t: float, hit: int, first: bool, prefix_caching: bool) -> None:
        pass

    def on_preempt(self, req: Request, t: float) -> None:
        pass

    def on_step(self, plan: StepPlan, t: float, itl_groups: dict, first_tokens: list, generated: int,
                deployment: Deployment) -> None:
        """Per-request latencies are logged at finish; per step only the iteration stats."""
        drafts = sum(itl_groups.values())  # requests verifying drafts in this iteration
        if drafts and self._config.num_speculative_tokens and "spec" in self._features:
            draft_tokens, accepted = self._spec.step(self._config, drafts)
            c_tokens, c_accepted, length = self._features["spec"]
            c_tokens.inc(draft_tokens)
            if accepted:
                c_accepted.inc(accepted)
            length.set(1.0 + SpecCounts.expected_accepted(self._config))

    def on_finish(self, req: Request, t: float) -> None:
        first_token, scheduled = req.first_token, req.first_scheduled
        if first_token is None or scheduled is None:
            return
        self.success.labels(*self.lv, req.finish_reason).inc()
        if req.finish_reason in ("abort", "error"):
            return
        decode = t - first_token
        self.h_e2e.observe(t - req.arrival)
        self.h_ttft.observe(first_token - req.arrival)
        if req.num_output > 1:
            self.h_tpot.observe(decode / (req.num_output - 1))
        self.h_queue.observe(scheduled - req.queued)
        self.h_prefill.observe(first_token - scheduled)
        if decode > 0:
            self.h_decode.observe(decode)
        self.h_inference.observe(t - scheduled)
        self.prompt_tokens.inc(req.prompt_len)
        self.generation_tokens.inc(req.num_output)

    def set_state(self, running: int, waiting: int, kv_usage: float, kv_used_tokens: int, kv_total_tokens: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        self.kv_max_blocks.set(kv_total_tokens // max(1, self.block_size))
        self.kv_used_blocks.set(kv_used_tokens // max(1, self.block_size))

    def set_lora(self, running: list[str], waiting: list[str], max_loras: int, t: float) -> None:
        """trtllm-serve's MetricsCollector exports no LoRA adapter metric."""

    def render(self) -> bytes:
        return generate_latest(self.registry)


def make_exporter(engine: str, model_name: str, deployment: Deployment, config: EngineConfig, num_gpu_blocks: int,
                  *, process_metrics: bool = False, mfu_metrics: bool = True):
    if engine == "tgi":
        return TgiExporter(model_name, deployment, config, num_gpu_blocks)
    if engine == "sglang":
        return SglangExporter(model_name, deployment, config, num_gpu_blocks)
    if engine == "trtllm":
        return TrtllmExporter(model_name, deployment, config, num_gpu_blocks)
    if engine in ("vllm", "vllm-legacy"):
        return VllmExporter(engine, model_name, deployment, config, num_gpu_blocks,
                            process_metrics=process_metrics, mfu_metrics=mfu_metrics)
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
