"""What the exported PromQL knows of each engine's exposition, and the scope of an export
(the engines a Prometheus scrapes itself, or a source's series)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.config import FileConfig
from app.promql.text import (
    format_matchers,
    parse_selector,
)
from app.promsource.config import PrometheusSourceConfig

PREFIX = "llm_latency"
STANDARD_WINDOW = 300.0  # dashboards' window: every signal is also recorded over 5m
STANDARD_QUANTILES = (0.5, 0.9, 0.99)

#: vLLM's ``inter_token_latency_seconds`` buckets (vllm/v1/metrics/buckets.py, 0.8 -> 0.34;
#: the real 0.32 page in tests/fixtures/exposition has exactly these). The stall share
#: needs them as literals; a test checks them against that page.
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)


# ----------------------------------------------------------------------------- scope


@dataclass(frozen=True)
class Scope:
    """Which engine series the rules read and which labels make one target.

    Without a source: the engines the rule-evaluating Prometheus scrapes itself, one target
    per ``job, instance``. For a Prometheus source: the series its ``selector`` matches, one
    target per value set of its ``target_labels`` -- what the service itself discovers there,
    so the rules see the replicas (pods), not the URLs of the targets YAML.
    """

    source: PrometheusSourceConfig | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return ("instance",) if self.source is None else tuple(self.source.target_labels)

    @property
    def matchers(self) -> str:
        return "" if self.source is None else format_matchers(parse_selector(self.source.selector))


def scope_of(config: FileConfig, source: str | None = None) -> Scope:
    """The scope of an export: the named source, the only source, or none when the config has none."""
    names = [s.name for s in config.sources]
    if source is not None:
        if source not in names:
            have = f"its sources are {', '.join(map(repr, names))}" if names else "it has no sources"
            raise ValueError(f"--source {source!r}: no such source in the config ({have})")
        return Scope(config.sources[names.index(source)])
    if len(names) > 1:
        raise ValueError(f"the config has {len(names)} sources ({', '.join(map(repr, names))}): the rules are "
                         "evaluated by one Prometheus, choose its source with --source NAME")
    return Scope(config.sources[0] if names else None)


# ----------------------------------------------------------------------------- engines


@dataclass(frozen=True)
class EngineExposition:
    """What the exported PromQL needs to know about one engine's exposition."""

    name: str  # "vllm" | "tgi" | "sglang" | "trtllm"
    title: str  # for humans
    by: tuple[str, ...]  # aggregation labels (DP ranks summed away)
    histograms: dict[str, tuple[str, str]]  # signal -> (metric family, label selector)
    stems: dict[str, str]  # signal -> recorded-name stem
    running: str
    waiting: str
    preemptions: str | None  # counter, or None when the engine exports none
    shown: tuple[str, ...] = ("instance",)  # the labels that name a target in alert texts
    matchers: str = ""  # a source's selector, added to every engine series the rules read
    kv_usage: str | None = None  # a KV-usage gauge (0..1); None: TGI's used/capacity gauges
    itl_buckets: tuple[float, ...] = ()  # default ITL bucket bounds (the stall share's literals)
    rank_label: str | None = None  # the data-parallel rank's label on the gauges (None: one rank per server)
    token_imbalance: str | None = None  # the engine's own token imbalance gauge between its DP ranks
    #: the prompt-token counter and the finished-request counter(s, first found) whose rates give the
    #: mean prompt length where the page has no prompt-length histogram (``signals._token_means``)
    prompt_counters: tuple[str, tuple[str, ...]] | None = None
    #: P/D KV-transfer time histograms, first present wins: (family, label selector, unit divisor to
    #: seconds: SGLang's ``kv_transfer_latency_ms`` is in milliseconds, the adapter divides by 1000)
    kv_transfer: tuple[tuple[str, str, float], ...] = ()
    kv_transfers: str | None = None  # completed-transfer counter; None: the time histogram's count
    kv_failed: str | None = None  # failed-transfer counter
    #: speculative-decoding counters: (verification steps with a draft or None, draft tokens, accepted tokens)
    spec_counters: tuple[str | None, str, str] | None = None
    #: the engine's own acceptance gauges (rate, mean tokens per verification step), read where the
    #: counters do not give the number; ``spec_zero_is_off``: a length of 0 means speculation is off
    #: (SGLang writes both gauges as 0 then; the adapter drops those series)
    spec_gauges: tuple[str | None, str | None] = (None, None)
    spec_zero_is_off: bool = False
    generation_tokens: str | None = None  # generated-token counter (verification steps estimated from it)
    render: str | None = None  # front-end render time histogram (vLLM 0.34)
    #: P/D decode worker (SGLang): its wait for the KV (histogram family, selector) and its transfer queue gauge
    #: (Little's law where the histogram is absent); the prealloc queue gauge and the memory-wait histogram
    #: (family, selector, unit divisor to seconds) that tell a full decode KV pool from a slow link
    kv_wait: tuple[str, str] | None = None
    transfer_queue: str | None = None
    prealloc_queue: str | None = None
    kv_alloc: tuple[str, str, float] | None = None
    #: the scheduler's own time (SGLang 0.5.20+), counters in seconds: (loop wall time, its idle part,
    #: the process's CPU time, the GPU's forward-pass time), as ``signals._scheduler_time`` reads them
    scheduler: tuple[str, str, str, str] | None = None

    @property
    def labels(self) -> str:
        return ", ".join(self.by)

    @property
    def target_by(self) -> str:
        """The labels of one target (``by`` without the model)."""
        return ", ".join(label for label in self.by if label != "model_name")

    def select(self, metric: str, selector: str = "") -> str:
        """``metric{selector}`` with the source's matchers added."""
        if not self.matchers:
            return f"{metric}{selector}"
        if not selector:
            return f"{metric}{{{self.matchers}}}"
        return f"{metric}{selector[:-1]},{self.matchers}}}"

    def scoped(self, scope: Scope) -> EngineExposition:
        """This engine read through ``scope`` (the defaults: the engine's own ``by``)."""
        if scope.source is None:
            return self
        model = ("model_name",) if "model_name" in self.by else ()
        return replace(self, by=(*scope.labels, *model), shown=scope.labels, matchers=scope.matchers)

    def who(self) -> str:
        model = " {{ $labels.model_name }}" if "model_name" in self.by else ""
        return f"{self.title}{model} on " + "/".join(f"{{{{ $labels.{label} }}}}" for label in self.shown)

    def supports(self, signal: str) -> bool:
        return signal in self.histograms or (signal == "ttft" and self.name == "tgi")


VLLM = EngineExposition(
    "vllm", "vLLM", ("job", "instance", "model_name"),
    histograms={
        "ttft": ("vllm:time_to_first_token_seconds", ""),
        "itl": ("vllm:inter_token_latency_seconds", ""),
        "tpot": ("vllm:request_time_per_output_token_seconds", ""),
        "e2e": ("vllm:e2e_request_latency_seconds", ""),
        "queue_time": ("vllm:request_queue_time_seconds", ""),
        "prefill_time": ("vllm:request_prefill_time_seconds", ""),
        "decode_time": ("vllm:request_decode_time_seconds", ""),
        "prompt_tokens": ("vllm:request_prompt_tokens", ""),
    },
    stems={"ttft": "ttft_seconds", "itl": "itl_seconds", "tpot": "tpot_seconds", "e2e": "e2e_seconds",
           "queue_time": "queue_time_seconds", "prefill_time": "prefill_time_seconds",
           "decode_time": "decode_time_seconds", "prompt_tokens": "prompt_tokens"},
    running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
    preemptions="vllm:num_preemptions_total", kv_usage="vllm:kv_cache_usage_perc", itl_buckets=VLLM_ITL_BUCKETS,
    rank_label="engine",
    kv_transfer=(("vllm:nixl_xfer_time_seconds", "", 1.0),), kv_failed="vllm:nixl_num_failed_transfers_total",
    spec_counters=("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                   "vllm:spec_decode_num_accepted_tokens_total"),
    render="vllm:request_render_duration_seconds",
)

TGI = EngineExposition(
    "tgi", "TGI", ("job", "instance"),
    histograms={
        "itl": ("tgi_batch_inference_duration", '{method="decode"}'),
        "tpot": ("tgi_request_mean_time_per_token_duration", ""),
        "e2e": ("tgi_request_duration", ""),
        "queue_time": ("tgi_request_queue_duration", ""),
        "prefill_time": ("tgi_batch_inference_duration", '{method="prefill"}'),
        "prompt_tokens": ("tgi_request_input_length", ""),
    },
    stems={"ttft": "ttft_seconds", "itl": "itl_seconds", "tpot": "tpot_seconds", "e2e": "e2e_seconds",
           "queue_time": "queue_time_seconds", "prefill_time": "prefill_batch_seconds",
           "prompt_tokens": "prompt_tokens"},
    running="tgi_batch_current_size", waiting="tgi_queue_size", preemptions=None,
)

SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)  # SGLang 0.5 defaults

SGLANG = EngineExposition(
    "sglang", "SGLang", ("job", "instance", "model_name"),
    histograms={
        "ttft": ("sglang:time_to_first_token_seconds", ""),
        "itl": ("sglang:inter_token_latency_seconds", ""),
        "tpot": ("sglang:request_time_per_output_token_seconds", ""),
        "e2e": ("sglang:e2e_request_latency_seconds", ""),
        "queue_time": ("sglang:queue_time_seconds", ""),
        # a decode worker prefills nothing: its first step is the stage fake_output (never both on one worker)
        "prefill_time": ("sglang:per_stage_req_latency_seconds", '{stage=~"prefill_forward|fake_output"}'),
        "prompt_tokens": ("sglang:prompt_tokens_histogram", ""),
    },
    stems={"ttft": "ttft_seconds", "itl": "itl_seconds", "tpot": "tpot_seconds", "e2e": "e2e_seconds",
           "queue_time": "queue_time_seconds", "prefill_time": "prefill_time_seconds",
           "prompt_tokens": "prompt_tokens"},
    running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
    preemptions="sglang:num_retracted_requests_total", kv_usage="sglang:token_usage", itl_buckets=SGLANG_ITL_BUCKETS,
    rank_label="dp_rank", token_imbalance="sglang:dp_attention_token_imbalance_ratio",
    prompt_counters=("sglang:prompt_tokens_total", ("sglang:num_requests_total", "sglang:request_success_total")),
    kv_transfer=(("sglang:kv_transfer_latency_ms", "", 1000.0),
                 ("sglang:per_stage_req_latency_seconds", '{stage="prefill_transfer_kv_cache"}', 1.0)),
    kv_failed="sglang:num_transfer_failed_reqs_total",
    spec_gauges=("sglang:spec_accept_rate", "sglang:spec_accept_length"), spec_zero_is_off=True,
    kv_wait=("sglang:per_stage_req_latency_seconds", '{stage="decode_transferred"}'),
    transfer_queue="sglang:num_decode_transfer_queue_reqs", prealloc_queue="sglang:num_decode_prealloc_queue_reqs",
    kv_alloc=("sglang:kv_transfer_alloc_ms", "", 1000.0),
    scheduler=("sglang:scheduler_stage_seconds_total", "sglang:scheduler_idle_seconds_total",
               "sglang:scheduler_process_cpu_seconds_total", "sglang:forward_execution_seconds_total"),
)

#: trtllm-serve: no per-step ITL, so the regimes that read it (prefill_interference,
#: bandwidth_bound, weights_offloaded) have no alerts for it (the built-in diagnosis lists them as
#: not judged). It has no prompt-length histogram either: prefill_compute reads the mean prompt
#: length from the prompt-token and finished-request counters, as the built-in rule does.
TRTLLM = EngineExposition(
    "trtllm", "TensorRT-LLM", ("job", "instance", "model_name"),
    histograms={
        "ttft": ("trtllm_time_to_first_token_seconds", ""),
        "tpot": ("trtllm_time_per_output_token_seconds", ""),
        "e2e": ("trtllm_e2e_request_latency_seconds", ""),
        "queue_time": ("trtllm_request_queue_time_seconds", ""),
        "prefill_time": ("trtllm_request_prefill_time_seconds", ""),
        "decode_time": ("trtllm_request_decode_time_seconds", ""),
    },
    stems={"ttft": "ttft_seconds", "tpot": "tpot_seconds", "e2e": "e2e_seconds", "queue_time": "queue_time_seconds",
           "prefill_time": "prefill_time_seconds", "decode_time": "decode_time_seconds"},
    running="trtllm_num_requests_running", waiting="trtllm_num_requests_waiting", preemptions=None,
    kv_usage="trtllm_kv_cache_utilization",
    prompt_counters=("trtllm_prompt_tokens_total", ("trtllm_request_success_total",)),
    kv_transfer=(("trtllm_kv_transfer_latency_seconds", "", 1.0),), kv_transfers="trtllm_kv_transfer_success_total",
    kv_failed="trtllm_kv_transfer_failure_total",
    spec_counters=(None, "trtllm_spec_decode_num_draft_tokens_total", "trtllm_spec_decode_num_accepted_tokens_total"),
    spec_gauges=(None, "trtllm_spec_decode_acceptance_length"), generation_tokens="trtllm_generation_tokens_total",
)

ENGINES = (VLLM, TGI, SGLANG, TRTLLM)
SLO_WORDS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E latency", "queue_time": "queue time",
             "prefill_time": "prefill time", "decode_time": "decode time"}
