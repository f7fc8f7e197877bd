"""``llm-latency rules export``: the built-in SLOs and regime rules as Prometheus rules.

Teams that already run Prometheus and Alertmanager can alert on the same conditions the
service diagnoses, computed by their own Prometheus from the engines' own metric names
(vLLM current names, TGI). One source of truth: every threshold is read from the config
objects (``diagnosis.thresholds``, ``diagnosis.window``/``interval``, ``alerts.slos``,
``alerts.target_down_for``), never written here; CI checks the committed file is fresh
(``--check``).

What each part mirrors
======================

Recording rules (``llm_latency:<engine>_<what>:<aggregation>_<window>``), per
``job, instance[, model_name]`` with data-parallel ranks (vLLM's ``engine`` label) summed
away, as :mod:`app.diagnosis.signals` does:

* quantiles: ``histogram_quantile(q, sum by (le, ...) (rate(x_bucket[w])))`` -- the
  service's quantile math is Prometheus' (``app/quantiles.py``), so these agree exactly;
* means ``rate(x_sum)/rate(x_count)``; queue and prefill *shares* are ratios of means;
* gauges: ``sum`` of per-rank ``avg_over_time`` (running, waiting), ``avg`` of per-rank
  ``max_over_time`` for KV usage (summing a usage fraction over ranks is wrong); for
  ``dp_imbalance`` the ranks are also kept apart (``<engine>_rank_load:avg``, the busiest and
  least busy rank's waiting, their load ratio, the rank count);
* the mean prompt length from ``rate(prompt tokens) / rate(finished requests)`` where the engine
  has no prompt-length histogram (trtllm-serve; SGLang where the histogram is absent);
* KV transfer (P/D) and speculative decoding per engine, as ``signals._disaggregation`` /
  ``_speculation`` read them: the transfer-time histogram's mean (SGLang's
  ``kv_transfer_latency_ms`` divided by 1000, as its adapter does; else its
  ``per_stage_req_latency_seconds{stage="prefill_transfer_kv_cache"}``), completed transfers
  from the engine's counter (TensorRT-LLM ``_success_total``) else the histogram's count, the
  failed share against completed + failed; acceptance from the draft/accepted token counters
  (vLLM, TensorRT-LLM) else the engine's gauges averaged over the window and the ranks (SGLang),
  tokens per verification step from vLLM's draft count else the gauge (SGLang, TensorRT-LLM), and
  the verification steps the rule needs from vLLM's draft count, SGLang's ITL observations or
  TensorRT-LLM's generated tokens / tokens per step. ``frontend_bound`` reads vLLM's render
  histogram, which no other engine exports;
* TGI has no TTFT histogram: TTFT quantile = queue quantile + prefill-batch quantile (what
  the latency API and TGI's own dashboard show), TTFT mean = mean queue time + prefill
  batch time per admitted request (``rate(prefill_sum)/rate(queue_count)``), ITL = decode
  batch duration, KV usage = ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``.

Alerting rules (names from :mod:`app.alerts.config`; labels ``severity``, ``engine`` and
``regime`` or ``slo``; annotations ``summary``, ``description`` with ``{{ $value }}`` and
the window, ``runbook_url``, and ``dashboard_url`` when configured):

* one per SLO and engine (``histogram_quantile > threshold`` for ``for``), limited to the
  SLO's ``targets`` by ``instance``; TGI has no decode-time histogram (skipped);
* one per regime and engine, written by the regime's own module (``RULE.promql`` in
  ``app/diagnosis/rules/<regime>.py``, with :class:`RegimeAlerts`), gated like
  ``engine.data_problems`` (``min_requests`` or ``min_decode_steps`` in the window), plus a
  ``critical`` twin where the built-in rule escalates severity (same alertname; the header
  suggests inhibit_rules);
* ``bandwidth_bound`` (warning) and ``weights_offloaded`` (critical) for every target
  with a ``hardware`` profile: its decode floor as a literal, matched on ``instance``
  (host:port of the target URL); for all other instances what the built-in rules say
  without a floor: ``bandwidth_bound`` at ``info``, and (vLLM) ``weights_offloaded``
  when the engine reports ``cpu_offload_gb > 0`` or the ``weights_offloaded`` sleep state;
* ``LLMLatencyTargetDown`` on ``up == 0`` for ``alerts.target_down_for`` (limited to the
  configured targets' instances when there are any).

For a Prometheus source (the config has ``sources:``; ``--source NAME`` when there are
several): the rules are for that source's Prometheus and see its replicas as the service
does. Every engine series carries the source's ``selector``; everything is grouped by its
``target_labels`` (plus ``model_name``) instead of ``job, instance``; alert texts, the
``dashboard_url`` variables and the suggested inhibit_rules name a target by those labels;
``LLMLatencyTargetDown`` is ``max by (<target labels>) (up{<selector>}) == 0`` (a pod whose
every scrape endpoint fails). Static targets of the file are not this Prometheus' series: their
hardware profiles and SLOs limited to them are left out (an SLO limited to discovered target
names is refused: narrow the selector instead).

Every alert links its runbook (``<external_url>/runbooks/<name>``, else
``docs/runbooks/<name>.md``; names from ``app.alerts.config.ALERT_RUNBOOKS``: the regime
for regime alerts, ``slo_<signal>`` for SLOs, ``target_down``).

Known differences from the built-in evaluation (the generated file's header points here):

* ``for:`` approximates the finding lifecycle: ``(activate_after - 1) x interval +
  alerts.diagnosis_for``; Prometheus evaluates every ``evaluation_interval``, not every
  ``diagnosis.interval``. Resolution is immediate (no ``resolve_after``).
* "ITL at small batch" (mean ITL over scrape intervals with <= 2 running requests) has
  no PromQL equivalent; the exported rules use the window's exact mean ITL (``_sum/_count``),
  which is what the built-in rules fall back to without enough small-batch intervals. Never an
  interpolated p50: inside a coarse bucket (25-50 ms) it can sit on the other side of
  ``slow_itl_seconds`` from the mean.
* Thresholds on quantiles (ITL p99/p50, ITL p99, prompt-length p90) compare the interpolated
  value; the built-in rules decide them on the bucket that holds the quantile and leave a
  regime "not judged" when the threshold lies inside it, or when "steady" rests on fewer than
  ``steady_min_scrapes`` scrapes. Prometheus has no bucket interval to compare.
* TGI KV usage max is a subquery over ``evaluation_interval`` steps, not over scrapes.
* ``dp_imbalance``: where two ranks tie for the busiest (or least busy) load, ``topk`` /
  ``bottomk`` may take the other rank's waiting count than the built-in rule's order does.
* Stall share (vLLM) weights each ITL bucket at or above the stall bound by its midpoint
  (the +Inf bucket by its lower bound), like ``signals._stall_share``; it needs the
  bucket layout as literals (:data:`VLLM_ITL_BUCKETS`), and negative per-bucket
  increases are clamped at 0 instead of the running-max repair.
* SGLang writes ``spec_accept_rate`` / ``spec_accept_length`` as 0 while speculation is off, and
  the built-in adapter drops each scrape whose length is 0; the exported gauges count a series only
  when its length stayed above 0 over the whole window (``min_over_time``), so a window that
  starts before the first speculative step stays quiet where the built-in rule averages the rest.
* ``kv_transfer``'s alert value is the mean transfer time, so a worker whose every transfer in
  the window failed (no transfer time recorded) raises no exported alert; the built-in rule
  still finds it from the failure counter.
* vLLM series use current names only (``inter_token_latency_seconds``,
  ``kv_cache_usage_perc``); 0.8-era names are not matched. SGLang series use 0.5 names
  (0.3's ``name=`` model label is not matched).
* The built-in ranking (a cause marks its symptoms ``caused_by``) has no rule-file
  equivalent; the suggested Alertmanager inhibit_rules approximate it.
* ``outside_engine`` (:data:`app.diagnosis.findings.PROBE_REGIMES`) compares client-side
  probe TTFT with the engine's; Prometheus sees only the engine's metrics, so it has no
  exported rule (the service's own alerts carry it as ``LLMLatencyOutsideEngine``).
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import yaml

from app.alerts.config import SLO_BURN, TARGET_DOWN, SloConfig, regime_alertname, runbook_url
from app.config import ConfigError, FileConfig, TargetConfig, load_config
from app.diagnosis.rules import RULES
from app.diagnosis.rules.base import Rule
from app.diagnosis.rules.replica_imbalance import IDLE_FLOOR
from app.diagnosis.signals import STALL_SECONDS
from app.promql import (
    and_on,
    format_matchers,
    human_seconds,
    instance_selector,
    le_matcher,
    num,
    parse_selector,
    prom_duration,
    quantile_name,
)
from app.promsource.config import PrometheusSourceConfig
from app.slo.rules import slo_rules
from app.thresholds import Thresholds

PREFIX = "llm_latency"
STANDARD_WINDOW = 300.0  # dashboards' window: every signal is also recorded over 5m
STANDARD_QUANTILES = (0.5, 0.9, 0.99)

#: vLLM's ``inter_token_latency_seconds`` buckets (vllm/v1/metrics/buckets.py, 0.8 -> 0.34;
#: the real 0.32 page in tests/fixtures/exposition has exactly these). The stall share
#: needs them as literals; a test checks them against that page.
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)

HEADER = """\
# GENERATED by `llm-latency rules export` (app/rules_export.py) -- DO NOT EDIT BY HAND.
# Change the targets YAML (diagnosis.thresholds, diagnosis.window/interval, alerts.slos,
# target hardware profiles) and regenerate; CI checks freshness with
#   llm-latency rules export [--config <targets.yaml>] --out <this file> --check
#
# Prometheus recording + alerting rules equivalent to the service's built-in SLO and regime
# thresholds, over the engines' own metrics (vLLM current names, TGI, SGLang 0.5, trtllm-serve).
# Regime window {window} (diagnosis.window); regime alerts hold for {hold}
# ((activate_after - 1) x diagnosis.interval + alerts.diagnosis_for).
# Differences from the built-in evaluation: see the docstring of app/rules_export.py.
#
# Suggested Alertmanager inhibit_rules (a cause silences its symptoms; critical silences
# the warning twin of the same alert):
{inhibit}
"""


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
class Engine:
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
    #: mean prompt length where the page has no prompt-length histogram (``signals._prompt_mean``)
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

    def scoped(self, scope: Scope) -> Engine:
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


VLLM = Engine(
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

TGI = Engine(
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

SGLANG = Engine(
    "sglang", "SGLang", ("job", "instance", "model_name"),
    histograms={
        "ttft": ("sglang:time_to_first_token_seconds", ""),
        "itl": ("sglang:inter_token_latency_seconds", ""),
        "tpot": ("sglang:request_time_per_output_token_seconds", ""),
        "e2e": ("sglang:e2e_request_latency_seconds", ""),
        "queue_time": ("sglang:queue_time_seconds", ""),
        "prefill_time": ("sglang:per_stage_req_latency_seconds", '{stage="prefill_forward"}'),
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
    scheduler=("sglang:scheduler_stage_seconds_total", "sglang:scheduler_idle_seconds_total",
               "sglang:scheduler_process_cpu_seconds_total", "sglang:forward_execution_seconds_total"),
)

#: trtllm-serve: no per-step ITL, so the regimes that read it (prefill_interference,
#: bandwidth_bound, weights_offloaded) have no alerts for it (the built-in diagnosis lists them as
#: not judged). It has no prompt-length histogram either: prefill_compute reads the mean prompt
#: length from the prompt-token and finished-request counters, as the built-in rule does.
TRTLLM = Engine(
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


# ----------------------------------------------------------------------------- builder


@dataclass
class _Group:
    engine: Engine
    rules: list[dict[str, Any]] = field(default_factory=list)
    recorded: set[str] = field(default_factory=set)

    def record(self, name: str, expr: str) -> str:
        if name not in self.recorded:
            self.recorded.add(name)
            self.rules.append({"record": name, "expr": expr})
        return name

    # -- recorded signals ------------------------------------------------------------
    def rec(self, what: str, agg: str, w: str) -> str:
        return f"{PREFIX}:{self.engine.name}_{what}:{agg}_{w}"

    def sum_rate(self, metric: str, selector: str, w: str, fn: str = "rate") -> str:
        return f"sum by ({self.engine.labels}) ({fn}({self.engine.select(metric, selector)}[{w}]))"

    def quantile(self, signal: str, q: float, w: str) -> str:
        e = self.engine
        name = self.rec(e.stems[signal], quantile_name(q), w)
        if e.name == "tgi" and signal == "ttft":
            queue, prefill = self.quantile("queue_time", q, w), self.quantile("prefill_time", q, w)
            return self.record(name, f"{queue}\n+ {prefill}")
        metric, selector = e.histograms[signal]
        return self.record(name, f"histogram_quantile({num(q)}, sum by (le, {e.labels}) "
                                 f"(rate({e.select(metric + '_bucket', selector)}[{w}])))")

    def mean(self, signal: str, w: str) -> str:
        e = self.engine
        if e.name == "tgi" and signal == "ttft":
            return self.record(self.rec("ttft_seconds", "mean", w),
                               f"{self.mean('queue_time', w)}\n+ {self.prefill_per_request(w)}")
        metric, selector = e.histograms[signal]
        return self.record(self.rec(e.stems[signal], "mean", w),
                           f"{self.sum_rate(metric + '_sum', selector, w)}\n/\n"
                           f"{self.sum_rate(metric + '_count', selector, w)}")

    def prompt_mean_counters(self, w: str, histogram_mean: str | None) -> str:
        """The mean prompt length from the token and request counters (``rate(tokens) /
        rate(requests)``, the same mean over the window's finished requests); where the engine
        also has the histogram, its ``_sum/_count`` first, the counters only where it is absent."""
        e = self.engine
        assert e.prompt_counters is not None
        tokens, requests = e.prompt_counters
        finished = "\n    or\n    ".join(self.sum_rate(name, "", w) for name in requests)
        counted = self.record(self.rec("prompt_tokens" if histogram_mean is None else "prompt_tokens_counters",
                                       "mean", w),
                              f"{self.sum_rate(tokens, '', w)}\n/\n(\n  (\n    {finished}\n  ) > 0\n)")
        if histogram_mean is None:
            return counted
        return self.record(self.rec("prompt_tokens_best", "mean", w), f"{histogram_mean}\nor\n{counted}")

    def prefill_per_request(self, w: str) -> str:
        """Prefill time a request waits for its first token (TGI: batch time per admitted request)."""
        if self.engine.name != "tgi":
            return self.mean("prefill_time", w)
        prefill, selector = TGI.histograms["prefill_time"]
        queue, _ = TGI.histograms["queue_time"]
        return self.record(self.rec("prefill_seconds_per_request", "mean", w),
                           f"{self.sum_rate(prefill + '_sum', selector, w)}\n/\n"
                           f"{self.sum_rate(queue + '_count', '', w)}")

    def share(self, what: str, numerator: str, w: str) -> str:
        """A mean over mean TTFT, bounded to [0, 1] like the built-in share (the two means count
        different requests of the window, so the raw ratio can exceed 1)."""
        return self.record(self.rec(f"{what}_share", "ratio", w),
                           f"clamp(\n{numerator}\n/\n({self.mean('ttft', w)} > 0), 0, 1)")

    def itl_ratio(self, w: str) -> str:
        return self.record(self.rec("itl_p99_over_p50", "ratio", w),
                           f"{self.quantile('itl', 0.99, w)}\n/\n({self.quantile('itl', 0.5, w)} > 0)")

    def stall_share(self, w: str) -> str:
        e = self.engine
        name = self.rec("decode_stall_share", "ratio", w)
        if e.name == "tgi":
            prefill, p_sel = TGI.histograms["prefill_time"]
            decode, d_sel = TGI.histograms["itl"]
            p = self.sum_rate(prefill + "_sum", p_sel, w)
            return self.record(name, f"{p}\n/\n({p}\n + ({self.sum_rate(decode + '_sum', d_sel, w)} > 0))")
        metric, _ = e.histograms["itl"]
        terms = []
        bounds = (*e.itl_buckets, math.inf)
        for lower, upper in zip(bounds, bounds[1:]):
            if lower < STALL_SECONDS:
                continue
            weight = lower if math.isinf(upper) else (lower + upper) / 2
            hi = self.sum_rate(f"{metric}_bucket", "{" + le_matcher(upper) + "}", w)
            lo = self.sum_rate(f"{metric}_bucket", "{" + le_matcher(lower) + "}", w)
            terms.append(f"clamp_min({hi} - {lo}, 0) * {num(weight)}")
        total = self.sum_rate(f"{metric}_sum", "", w)
        body = "\n    + ".join(terms)
        return self.record(name, f"clamp_max(\n  (\n    {body}\n  )\n  /\n  ({total} > 0),\n  1\n)")

    def gauge_avg(self, what: str, metric: str, w: str) -> str:
        return self.record(self.rec(what, "avg", w), self.sum_rate(metric, "", w, "avg_over_time"))

    def kv_max(self, w: str) -> str:
        e = self.engine
        name = self.rec("kv_cache_usage", "max", w)
        if e.kv_usage is not None:
            return self.record(name, f"avg by ({e.labels}) "
                                     f"(max_over_time({e.select(e.kv_usage)}[{w}]))")
        usage = (f"clamp_max(\n    sum by ({e.labels}) ({e.select('tgi_batch_current_max_tokens')})\n    /\n"
                 f"    (sum by ({e.labels}) ({e.select('tgi_batch_max_total_tokens')}) > 0),\n    1\n  )")
        return self.record(name, f"max_over_time(\n  {usage}[{w}:]\n)")

    def preemption_rate(self, w: str) -> str | None:
        if self.engine.preemptions is None:
            return None
        return self.record(self.rec("preemptions", "rate", w), self.sum_rate(self.engine.preemptions, "", w))

    def requests(self, w: str) -> str:
        metric, selector = self.engine.histograms["queue_time" if self.engine.name == "tgi" else "ttft"]
        return self.record(self.rec("requests", "increase", w),
                           self.sum_rate(metric + "_count", selector, w, "increase"))

    def decode_steps(self, w: str) -> str:
        metric, selector = self.engine.histograms["itl"]
        return self.record(self.rec("decode_steps", "increase", w),
                           self.sum_rate(metric + "_count", selector, w, "increase"))

    def all_signals(self, w: str) -> dict[str, str | None]:
        """Every number a regime rule reads, recorded over ``w``. A number the engine does not
        export is absent (a twin reading it raises ``KeyError`` and exports no alert for the
        engine); ``preemptions`` is None where no preemption counter exists."""
        e = self.engine
        out: dict[str, str | None] = {}
        for signal in ("ttft", "itl"):
            if e.supports(signal):
                for q in STANDARD_QUANTILES:
                    out[f"{signal}_{quantile_name(q)}"] = self.quantile(signal, q, w)
                out[f"{signal}_mean"] = self.mean(signal, w)
        out["queue_mean"] = queue_mean = self.mean("queue_time", w)
        out["prefill_mean"] = prefill_mean = self.prefill_per_request(w)
        out["queue_share"] = self.share("queue", queue_mean, w)
        out["prefill_share"] = self.share("prefill", prefill_mean, w)
        if e.supports("prompt_tokens"):
            out["prompt_mean"] = self.mean("prompt_tokens", w)
            out["prompt_p90"] = self.quantile("prompt_tokens", 0.9, w)
        if e.prompt_counters is not None:
            out["prompt_mean"] = self.prompt_mean_counters(w, out.get("prompt_mean"))
        if e.supports("itl"):
            out["itl_ratio"] = self.itl_ratio(w)
            out["stall_share"] = self.stall_share(w)
        out["running"] = self.gauge_avg("num_requests_running", e.running, w)
        out["waiting"] = self.gauge_avg("num_requests_waiting", e.waiting, w)
        out["kv_max"] = self.kv_max(w)
        out["preemptions"] = self.preemption_rate(w)
        out["requests"] = self.requests(w)
        if e.supports("itl"):
            out["steps"] = self.decode_steps(w)
        out.update(self.transfer_and_speculation(w, out.get("steps")))
        if e.scheduler is not None:
            out.update(self.scheduler_time(w))
        if e.rank_label is not None:
            out.update(self.ranks(w))
        return out

    def ranks(self, w: str) -> dict[str, str | None]:
        """The data-parallel ranks of one engine compared as ``dp_imbalance`` compares them
        (:func:`app.diagnosis.rules.replica_imbalance.compare_loads`): each rank's load (mean
        running + mean waiting, a rank without a waiting gauge waits 0), the busiest and the least
        busy rank's mean waiting, the load ratio between them (the least busy counted as at least
        ``IDLE_FLOOR``), how many ranks report; and the engine's own token imbalance where it has one."""
        e = self.engine
        by, rank = e.labels, f"{e.labels}, {e.rank_label}"

        def per_rank(metric: str) -> str:
            return f"sum by ({rank}) (avg_over_time({e.select(metric)}[{w}]))"

        running = self.record(self.rec("rank_num_requests_running", "avg", w), per_rank(e.running))
        waiting = self.record(self.rec("rank_num_requests_waiting", "avg", w),
                              f"{per_rank(e.waiting)}\nor\n{running} * 0")
        load = self.record(self.rec("rank_load", "avg", w), f"{running}\n+ on({rank})\n{waiting}")
        out: dict[str, str | None] = {
            "rank_count": self.record(self.rec("ranks", "count", w), f"count by ({by}) ({load})"),
            "rank_busiest_waiting": self.record(
                self.rec("rank_busiest_waiting", "avg", w),
                f"max by ({by}) (\n  {waiting}\n  and on({rank})\n  topk by ({by}) (1, {load})\n)"),
            "rank_idlest_waiting": self.record(
                self.rec("rank_idlest_waiting", "avg", w),
                f"max by ({by}) (\n  {waiting}\n  and on({rank})\n  bottomk by ({by}) (1, {load})\n)"),
            "rank_load_ratio": self.record(
                self.rec("rank_load", "ratio", w),
                f"max by ({by}) ({load})\n/\nclamp_min(min by ({by}) ({load}), {num(IDLE_FLOOR)})"),
        }
        if e.token_imbalance is not None:
            out["dp_token_imbalance"] = self.record(
                self.rec("dp_token_imbalance", "avg", w),
                f"avg by ({by}) (avg_over_time({e.select(e.token_imbalance)}[{w}]))")
        return out

    def scheduler_time(self, w: str) -> dict[str, str | None]:
        """The shares of the scheduler loop's time ``scheduler_cpu_bound`` reads, as
        ``signals._scheduler_time`` computes them (every rate summed over the same ranks)."""
        assert self.engine.scheduler is not None
        loop, idle, cpu, gpu = (self.sum_rate(metric, "", w) for metric in self.engine.scheduler)
        return {
            "scheduler_cpu_share": self.record(self.rec("scheduler_cpu_share", "ratio", w),
                                               f"{cpu}\n/\n({loop} > 0)"),
            "scheduler_busy_share": self.record(self.rec("scheduler_busy_share", "ratio", w),
                                                f"1 - {idle}\n/\n({loop} > 0)"),
            "gpu_idle_share": self.record(self.rec("gpu_idle_share", "ratio", w),
                                          f"clamp_min(\n  1 - {gpu}\n  /\n  (({loop} - {idle}) > 0),\n  0\n)"),
        }

    def ratio_of_rates(self, what: str, numerator: str, denominator: str, w: str) -> str:
        return self.record(self.rec(what, "ratio", w), f"{self.sum_rate(numerator, '', w)}\n/\n"
                                                       f"({self.sum_rate(denominator, '', w)} > 0)")

    def transfer_histogram(self, part: str, w: str, fn: str = "rate") -> str:
        """``sum by (...) (fn(<transfer histogram>_<part>))``, the engine's first present transfer
        histogram (``or``); ``_sum`` divided to seconds where the family counts another unit."""
        terms = []
        for family, selector, divisor in self.engine.kv_transfer:
            term = self.sum_rate(f"{family}_{part}", selector, w, fn)
            terms.append(f"({term} / {num(divisor)})" if part == "sum" and divisor != 1.0 else term)
        return "\nor\n".join(terms)

    def spec_gauge(self, what: str, gauge: str, w: str) -> str:
        """An acceptance gauge's mean over the window, averaged over the ranks (``AVERAGED_GAUGES``);
        where a length of 0 means speculation is off, only series whose length stayed above 0."""
        e = self.engine
        mean = f"avg_over_time({e.select(gauge)}[{w}])"
        _, length = e.spec_gauges
        if e.spec_zero_is_off and length is not None:
            mean = f"{mean}\n  and\n  (min_over_time({e.select(length)}[{w}]) > 0)"
        return self.record(self.rec(what, "mean" if what == "spec_accept_length" else "ratio", w),
                           f"avg by ({e.labels}) (\n  {mean}\n)")

    def transfer_and_speculation(self, w: str, steps: str | None) -> dict[str, str | None]:
        """The KV-transfer (P/D), speculative-decoding and front-end numbers ``kv_transfer``,
        ``speculation_ineffective`` and ``frontend_bound`` read, from the families this engine
        exports them in, as ``signals._disaggregation`` / ``_speculation`` read them (each family
        exists only when the feature is on)."""
        e = self.engine
        out: dict[str, str | None] = {}
        if e.kv_transfer:
            out["kv_transfer_mean"] = mean = self.record(
                self.rec("kv_transfer_seconds_mean", "ratio", w),
                f"(\n{self.transfer_histogram('sum', w)}\n)\n/\n((\n{self.transfer_histogram('count', w)}\n) > 0)"
                if len(e.kv_transfer) > 1 or e.kv_transfer[0][2] != 1.0 else
                f"{self.transfer_histogram('sum', w)}\n/\n({self.transfer_histogram('count', w)} > 0)")
            out["kv_transfer_share"] = self.share("kv_transfer", mean, w)
            # completed transfers: the engine's counter where it has one, else the histogram's count
            done = self.sum_rate(e.kv_transfers, "", w) if e.kv_transfers else self.transfer_histogram("count", w)
            done_increase = (self.sum_rate(e.kv_transfers, "", w, "increase") if e.kv_transfers
                             else self.transfer_histogram("count", w, "increase"))
            out["kv_transfers"] = done_count = self.record(self.rec("kv_transfers", "increase", w), done_increase)
            out["kv_transfer_attempts"] = done_count
            if e.kv_failed is not None:
                failed = self.sum_rate(e.kv_failed, "", w)
                out["kv_transfer_failure_share"] = self.record(
                    self.rec("kv_transfer_failure_share", "ratio", w),
                    f"{failed}\n/\n(({failed} + ({done})) > 0)")
                # the rule's gate counts completed and failed transfers (a counter may be absent: 0)
                out["kv_transfer_attempts"] = self.record(
                    self.rec("kv_transfer_attempts", "increase", w),
                    f"{done_count}\n+\n({self.sum_rate(e.kv_failed, '', w, 'increase')} or {done_count} * 0)")
        drafts, proposed, accepted = e.spec_counters or (None, None, None)
        rate_gauge, length_gauge = e.spec_gauges
        if proposed is not None and accepted is not None:
            out["spec_accept_rate"] = self.ratio_of_rates("spec_accept_rate", accepted, proposed, w)
        elif rate_gauge is not None:
            out["spec_accept_rate"] = self.spec_gauge("spec_accept_rate", rate_gauge, w)
        if drafts is not None and accepted is not None:
            out["spec_accept_length"] = length = self.record(
                self.rec("spec_accept_length", "mean", w),
                f"1 + {self.sum_rate(accepted, '', w)}\n/\n({self.sum_rate(drafts, '', w)} > 0)")
        elif length_gauge is not None:
            out["spec_accept_length"] = length = self.spec_gauge("spec_accept_length", length_gauge, w)
        if "spec_accept_rate" in out or "spec_accept_length" in out:
            # verification steps with a draft, as speculation_ineffective.verification_steps counts them
            if drafts is not None:
                out["spec_drafts"] = self.record(self.rec("spec_drafts", "increase", w),
                                                 self.sum_rate(drafts, "", w, "increase"))
            elif steps is not None:
                out["spec_drafts"] = steps  # SGLang: its ITL observations (at least one per step)
            elif e.generation_tokens is not None and "spec_accept_length" in out:
                out["spec_drafts"] = self.record(
                    self.rec("spec_drafts", "estimate", w),
                    f"{self.sum_rate(e.generation_tokens, '', w, 'increase')}\n/\n({length} > 0)")
        if e.render is not None:
            out["render_mean"] = render_mean = self.ratio_of_rates("render_seconds_mean", e.render + "_sum",
                                                                   e.render + "_count", w)
            out["render_share"] = self.share("render", render_mean, w)
        return out


# ----------------------------------------------------------------------------- alerts


@dataclass(frozen=True)
class _Links:
    external_url: str
    dashboard_url: str
    labels: tuple[str, ...] = ("instance",)  # the dashboards' variables that name a target

    def annotations(self, alertname: str, summary: str, description: str) -> dict[str, str]:
        out = {"summary": summary, "description": description,
               "runbook_url": runbook_url(self.external_url, alertname)}
        if self.dashboard_url:
            sep = "&" if "?" in self.dashboard_url else "?"
            values = "&".join(f"var-{label}={{{{ $labels.{label} }}}}" for label in self.labels)
            out["dashboard_url"] = f"{self.dashboard_url}{sep}{values}"
        return out


def _alert(name: str, expr: str, hold: float, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": prom_duration(hold), "labels": labels, "annotations": annotations}


@dataclass
class RegimeAlerts:
    """What one regime's PromQL twin (``Rule.promql`` / ``promql_profiled`` in its module)
    writes its alerts with, for one engine: the recorded series over the regime window
    (``recorded``, keys of :meth:`_Group.all_signals`), the thresholds, the data gate every
    regime alert shares, and :meth:`add`."""

    regime: str
    engine: Engine
    recorded: dict[str, str | None]
    t: Thresholds
    w: str  # the regime window as a Prometheus duration
    hold: float
    links: _Links
    hardware: list[TargetConfig]  # the targets with a hardware profile (decode floor)
    alerts: list[dict[str, Any]]  # where add() appends

    @property
    def gate(self) -> str:
        """Enough engine traffic in the window, like ``engine.data_problems``."""
        r, t = self.recorded, self.t
        if "steps" not in r:  # no per-step ITL: requests only
            return f"({r['requests']} >= {num(t.min_requests)})"
        return f"({r['requests']} >= {num(t.min_requests)}) or ({r['steps']} >= {num(t.min_decode_steps)})"

    def and_(self, *parts: str) -> str:
        """Every condition on the same series (the engine's aggregation labels)."""
        return and_on(*parts, on=self.engine.labels)

    def add(self, severity: str, expr: str, summary: str, description: str,
            extra: dict[str, str] | None = None) -> None:
        labels = {"severity": severity, "regime": self.regime, "engine": self.engine.name, **(extra or {})}
        name = regime_alertname(self.regime)
        self.alerts.append(_alert(name, expr, self.hold, labels, self.links.annotations(name, summary, description)))


def _regime_alerts(g: _Group, recorded: dict[str, str | None], t: Thresholds, w: str, hold: float, links: _Links,
                   hardware: list[TargetConfig]) -> list[dict[str, Any]]:
    """Every regime's twin alerts for one engine, listed from symptom to cause (reverse
    precedence): first the regimes that need no hardware profile, then per profiled target
    the alerts against its decode floor, then what those regimes say without a floor."""
    exported = [rule for rule in reversed(RULES) if rule.promql is not None]
    out: list[dict[str, Any]] = []

    def write(rule: Rule, twin: Callable[..., None], *args: Any) -> None:
        """The twin's alerts for this engine, or none when it reads a number the engine does not
        export (the built-in diagnosis lists that regime as not judged)."""
        alerts: list[dict[str, Any]] = []
        try:
            twin(RegimeAlerts(rule.regime, g.engine, recorded, t, w, hold, links, hardware, alerts), *args)
        except KeyError:
            return
        out.extend(alerts)

    plain = [(rule, rule.promql) for rule in exported if rule.promql and rule.promql_profiled is None]
    profiled = [(rule, rule.promql, rule.promql_profiled) for rule in exported if rule.promql and rule.promql_profiled]
    for rule, twin in plain:
        write(rule, twin)
    for target in hardware:
        for rule, _, twin_with_floor in profiled:
            write(rule, twin_with_floor, target)
    for rule, twin, _ in profiled:
        write(rule, twin)
    return out


def _slo_alerts(g: _Group, config: FileConfig, links: _Links, scope: Scope) -> list[dict[str, Any]]:
    e = g.engine
    alerts = []
    for index, slo in enumerate(config.alerts.slos):
        if not e.supports(slo.signal):
            continue
        targets = _slo_targets(config, slo, index, scope)
        if targets is None:
            continue
        selector = instance_selector(targets)
        w = prom_duration(slo.window)
        series = g.quantile(slo.signal, slo.quantile, w)
        what = f"{SLO_WORDS[slo.signal]} {quantile_name(slo.quantile)}"
        derived = ""
        if e.name == "tgi" and slo.signal == "ttft":
            derived = " (queue + prefill-batch quantiles: TGI exports no TTFT)"
        alerts.append(_alert(
            slo.alertname, f"{series}{selector} > {num(slo.threshold)}", slo.for_,
            {"severity": slo.severity, "slo": slo.name, "engine": e.name},
            links.annotations(
                slo.alertname, f"{what} above {human_seconds(slo.threshold)} on {e.title} (SLO {slo.name})",
                f"{e.who()}: {what}{derived} over the last {w} is {{{{ $value | humanizeDuration }}}}, above the "
                f"{human_seconds(slo.threshold)} objective"
                + (f" for at least {prom_duration(slo.for_)}." if slo.for_ else "."))))
    return alerts


def _slo_targets(config: FileConfig, slo: SloConfig, index: int, scope: Scope) -> list[TargetConfig] | None:
    """The scraped targets an SLO is limited to ([] = all); None when it concerns no target of a source."""
    if slo.targets is None:
        return []
    by_name = {t.name: t for t in config.targets}
    if scope.source is not None:
        # Targets of a source are named after label values the export cannot know; an SLO
        # limited to the static targets of the file is not about this Prometheus' series.
        others = [name for name in slo.targets if name not in by_name]
        if others:
            raise ValueError(f"alerts.slos[{index}].targets: rules for source {scope.source.name!r} group by its "
                             f"target_labels and cannot be limited to named targets ({', '.join(map(repr, others))});"
                             " leave targets out or narrow the source's selector")
        return None
    unknown = [name for name in slo.targets if name not in by_name]
    if unknown:
        raise ValueError(f"alerts.slos[{index}].targets: unknown target(s) {', '.join(map(repr, unknown))}")
    return [by_name[name] for name in slo.targets]


def _target_down(config: FileConfig, links: _Links, scope: Scope) -> dict[str, Any]:
    hold = prom_duration(config.alerts.target_down_for)
    if scope.source is not None:
        by = ", ".join(scope.labels)
        who = "/".join(f"{{{{ $labels.{label} }}}}" for label in scope.labels)
        up = f"up{{{scope.matchers}}}" if scope.matchers else "up"
        return _alert(
            TARGET_DOWN, f"max by ({by}) ({up}) == 0", config.alerts.target_down_for, {"severity": "warning"},
            links.annotations(
                TARGET_DOWN, f"Prometheus cannot scrape {who}",
                f"Prometheus has failed to scrape {who} for at least {hold}: latency and regime alerts for it "
                f"see no data."))
    selector = instance_selector(config.targets)
    return _alert(
        TARGET_DOWN, f"up{selector} == 0", config.alerts.target_down_for, {"severity": "warning"},
        links.annotations(
            TARGET_DOWN, "Prometheus cannot scrape {{ $labels.instance }}",
            f"Job {{{{ $labels.job }}}} has failed to scrape {{{{ $labels.instance }}}} for at least {hold}: latency "
            f"and regime alerts for it see no data."))


def inhibit_rules(scope: Scope | None = None) -> list[dict[str, Any]]:
    """Alertmanager inhibit_rules from the regime rules' ``causes`` (+ critical over warning), for
    the regimes these rules export (a regime without a PromQL twin raises no exported alert)."""
    labels = list((scope or Scope()).labels)
    out = []
    for rule in RULES:
        if rule.causes and rule.promql is not None:
            out.append({"source_matchers": [f'alertname="{regime_alertname(rule.regime)}"'],
                        "target_matchers": ['alertname=~"' + "|".join(regime_alertname(c) for c in rule.causes) + '"'],
                        "equal": list(labels)})
    out.append({"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
                "equal": ["alertname", *labels]})
    return out


def build_rules(config: FileConfig, source: str | None = None) -> dict[str, Any]:
    """The Prometheus rule-file document (``{"groups": [...]}``) for ``config`` (and the
    Prometheus of ``source``, see :func:`scope_of`)."""
    scope = scope_of(config, source)
    t = config.diagnosis.thresholds
    regime_window = prom_duration(config.diagnosis.window)
    hold = (t.activate_after - 1) * config.diagnosis.interval + config.alerts.diagnosis_for
    links = _Links(config.alerts.external_url.rstrip("/"), config.alerts.dashboard_url, scope.labels)
    windows = sorted({STANDARD_WINDOW, config.diagnosis.window})
    groups = []
    for engine in (e.scoped(scope) for e in ENGINES):
        g = _Group(engine)
        signals = {}
        for seconds in windows:
            w = prom_duration(seconds)
            signals[w] = g.all_signals(w)
        # a decode floor belongs to a scraped target's instance; a source's replicas have none
        hardware = [target for target in config.targets if scope.source is None
                    and target.hardware is not None and target.engine in ("auto", engine.name)]
        alerts = _slo_alerts(g, config, links, scope)
        alerts += _regime_alerts(g, signals[regime_window], t, regime_window, hold, links, hardware)
        groups.append({"name": f"llm-latency-{engine.name}", "rules": g.rules + alerts})
    groups.append({"name": "llm-latency-targets", "rules": [_target_down(config, links, scope)]})
    if config.slos:  # the slos: section: SLI ratios per window and burn-rate alerts (app/slo/rules.py)
        groups.append({"name": "llm-latency-slos", "rules": slo_rules(
            config.slos, config.targets, scope.labels, scope.matchers, runbook_url(links.external_url, SLO_BURN),
            scoped=scope.source is not None)})
    return {"groups": groups}


# ----------------------------------------------------------------------------- rendering


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_rules(config: FileConfig, source: str | None = None) -> str:
    """The rule file as YAML text with the generated-file header."""
    scope = scope_of(config, source)
    t = config.diagnosis.thresholds
    hold = (t.activate_after - 1) * config.diagnosis.interval + config.alerts.diagnosis_for
    inhibit = yaml.dump({"inhibit_rules": inhibit_rules(scope)}, Dumper=_Dumper, sort_keys=False, width=1000)
    header = HEADER.format(window=prom_duration(config.diagnosis.window), hold=prom_duration(hold),
                           inhibit="\n".join(f"#   {line}" for line in inhibit.rstrip("\n").splitlines()))
    if scope.source is not None:
        selector = f"the series matching {scope.matchers}" if scope.matchers else "every engine series"
        header += (f"#\n# For the Prometheus of source {scope.source.name!r}: {selector},\n"
                   f"# one target per ({', '.join(scope.labels)}) as the service discovers them there.\n")
    body = yaml.dump(build_rules(config, source), Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return header + body


# ----------------------------------------------------------------------------- CLI


@click.group()
def rules() -> None:
    """Prometheus rules equivalent to the built-in SLOs and regime thresholds."""


@rules.command("export")
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Targets YAML (thresholds, SLOs, hardware profiles); defaults when omitted.")
@click.option("--out", "out_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the rule file here (default: stdout).")
@click.option("--source", "source", metavar="NAME",
              help="With sources in the config: the source whose Prometheus evaluates the rules (needed when "
                   "there are several).")
@click.option("--check", is_flag=True, help="Do not write: exit 1 if --out differs from what would be generated.")
def export(config_file: Path | None, out_file: Path | None, source: str | None, check: bool) -> None:
    """Write Prometheus recording + alerting rules (vLLM, TGI, SGLang and TensorRT-LLM metric names).

    For a config with a Prometheus source, the rules read that source's series (its
    selector) and name a target by its target_labels instead of job/instance."""
    try:
        config = load_config(config_file) if config_file is not None else FileConfig()
        text = render_rules(config, source)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if check:
        if out_file is None:
            raise click.UsageError("--check needs --out FILE (the committed rule file)")
        try:
            current = out_file.read_text(encoding="utf-8")
        except OSError as exc:
            click.echo(f"{out_file}: cannot read: {exc.strerror}", err=True)
            sys.exit(1)
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{out_file} (committed)",
                                             f"{out_file} (generated)", lineterm="", n=1))
            click.echo(f"{out_file} is stale: regenerate it with `llm-latency rules export"
                       f"{f' --config {config_file}' if config_file else ''}"
                       f"{f' --source {source}' if source else ''} --out {out_file}`", err=True)
            click.echo("\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else ""), err=True)
            sys.exit(1)
        click.echo(f"{out_file}: up to date")
        return
    if out_file is None:
        click.echo(text, nl=False)
        return
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(text, encoding="utf-8")
    click.echo(f"wrote {out_file}", err=True)
