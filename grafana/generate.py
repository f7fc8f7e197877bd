#!/usr/bin/env python3
"""Generates the Grafana dashboards in ``grafana/dashboards/`` -- the one source of truth.

    python3 grafana/generate.py            # (re)write grafana/dashboards/*.json
    python3 grafana/generate.py --check    # exit 1 when the committed JSON is stale (CI)
    python3 grafana/generate.py --config targets.yaml --out DIR   # for a Prometheus source

Three dashboards, built from the same query builders below:

* ``llm-latency-fleet.json`` (uid ``llm-latency-fleet``): every target at once -- regimes,
  SLO attainment, latency, the "why" panels, findings, alerts, scrape health;
* ``llm-latency-target.json`` (uid ``llm-latency-target``, the ``alerts.dashboard_url`` the
  service links to with ``?var-target=<name>``): one target in depth, the service's
  quantiles next to the engine's own buckets;
* ``llm-latency-slo.json`` (uid ``llm-latency-slo``): the ``slos:`` section's error budgets,
  SLIs and burn rates per window (``llm_latency_slo_*``), and the capacity signal
  (``llm_latency_capacity_*``: replicas the load needs, and whether replicas help).

The datasource is a Prometheus that scrapes the engines *and* this service's ``/metrics``
(no Grafana plugin). Engine series and service series join on the ``target`` label:
the Prometheus scrape config gives every engine a ``target`` label equal to the monitor's
target name (``deploy/compose/prometheus.yml`` shows it); the service's own series carry
``target`` already. Engine-specific expressions are joined with ``or`` so one query covers
vLLM (current metric names) and TGI; see ``Q`` below and ``grafana/README.md``.
For a config with a Prometheus source the engine series are selected and grouped by the
source's target labels instead (:class:`EngineLabels`); no ``target`` relabeling is needed.

What is read from the application rather than written here: the regime ids and colours
(the state timeline's value mapping and the annotation), and the default SLO objectives (the initial
objective of the SLO panels). The SLO objective choices are bucket bounds of vLLM's TTFT/ITL
histograms so the engine-side "requests under the objective" fraction is exact, not
interpolated (``tests/grafana`` checks them against a real vLLM page).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python3 grafana/generate.py` from a checkout
    sys.path.insert(0, str(ROOT))

from app.alerts.config import default_slos  # noqa: E402
from app.diagnosis.findings import NON_REGIME_VERDICTS  # noqa: E402
from app.diagnosis.rules import RULES  # noqa: E402

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
SCHEMA_VERSION = 41  # Grafana 11.6
TAGS = ["llm-latency"]
DS = {"type": "prometheus", "uid": "${datasource}"}
FLEET_UID = "llm-latency-fleet"
TARGET_UID = "llm-latency-target"
SLO_UID = "llm-latency-slo"

# ----------------------------------------------------------------------------- regimes

#: Verdicts the service exports in ``llm_latency_diagnosis_verdict{verdict}``: the non-regime
#: verdicts, then every regime rule in the order the engine evaluates them.
VERDICTS: tuple[str, ...] = (*NON_REGIME_VERDICTS, *(rule.regime for rule in RULES))
#: Each regime's colour is declared in its rule module (``Rule.colour``); ``not_judged`` is not
#: healthy, so not green.
VERDICT_COLORS = {"healthy": "green", "insufficient_data": "text", "not_judged": "super-light-yellow",
                  **{rule.regime: rule.colour for rule in RULES}}

# ----------------------------------------------------------------------------- SLO choices

#: Objective choices (seconds), each a bucket bound of vLLM's histogram written as
#: prometheus_client renders it (``le="1.0"``), so ``le="$ttft_slo"`` selects one bucket.
TTFT_OBJECTIVES = ("0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0")
ITL_OBJECTIVES = ("0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5")


def slo_threshold(signal: str) -> float:
    """The threshold of the service's default SLO for ``signal`` (seconds)."""
    return next(slo.threshold for slo in default_slos() if slo.signal == signal)


def default_objective(signal: str, choices: tuple[str, ...]) -> str:
    """The smallest choice at or above the service's default SLO threshold for ``signal``."""
    return next((c for c in choices if float(c) >= slo_threshold(signal)), choices[-1])


# ----------------------------------------------------------------------------- queries

# Label selectors. ``$target``/``$model`` are multi-value with All = ".*" (matches a
# missing label too, e.g. TGI's series have no model label at all).
SVC = 'target=~"$target", model=~"$model"'      # service series per target and model
SVC_T = 'target=~"$target"'                     # service series per target
VLLM = 'target=~"$target", model_name=~"$model"'
TGI = 'target=~"$target"'                       # TGI exports no model label


@dataclass(frozen=True)
class EngineLabels:
    """How the engine panels select and name a target's series.

    Scrape mode (the committed dashboards): by the ``target`` label the Prometheus scrape
    config gives every engine. For a Prometheus source (``--config`` with ``sources:``): by
    the source's ``target_labels`` -- one dashboard variable each, read from the engine series
    its ``selector`` matches -- so no ``target`` relabeling is needed; the monitor's own series
    keep their ``target`` name, which a hidden ``target`` variable derives from the chosen
    label values (the monitor names a discovered target ``<source>.<value>.<value>``). A
    source with ``service_labels`` has a variable for each of those too, and its services
    (``<source>.svc.<value>.<value>``, where ``replica_imbalance`` and the capacity signal of
    the service live) are among the targets: in the drill-down, "All" of the labels that name
    a replica (``pod``) chooses the service of the chosen service label values.
    """

    vllm: str = VLLM
    tgi: str = TGI
    labels: tuple[str, ...] = ("target",)
    source: str = ""        # the source's name, "" in scrape mode
    matchers: str = ""      # the source's selector (PromQL matchers, no braces)
    service_labels: tuple[str, ...] = ()  # the source's service_labels: its services are targets too

    @property
    def by(self) -> str:
        return ", ".join(self.labels)

    @property
    def variables(self) -> tuple[str, ...]:
        """The label variables, in the order each filters the next: the labels a service and a
        replica share, the service's own, then the replica's own (a pod is chosen last)."""
        shared = [label for label in self.labels if label in self.service_labels]
        return (*shared, *(label for label in self.service_labels if label not in shared),
                *(label for label in self.labels if label not in shared))

    @property
    def replica_only(self) -> tuple[str, ...]:
        """The target labels that are not service labels: "All" of them means the service."""
        return tuple(label for label in self.labels if label not in self.service_labels) \
            if self.service_labels else ()

    @property
    def legend(self) -> str:
        return "/".join(f"{{{{{label}}}}}" for label in self.labels)

    @property
    def up(self) -> str:
        """Prometheus' own ``up`` of the selected targets."""
        if not self.source:
            return f"up{{{SVC_T}}}"
        return f"max by ({self.by}) (up{{{self.tgi}}})"

    def with_labels(self, expr: str) -> str:
        """The monitor's series with the target labels parsed back out of its target names, so a
        link can carry them (``var-pod=...``). A service's name gives its service labels, and
        ``$__all`` (Grafana's "All" in a link) for the others; a replica's ``$__all`` for the
        service labels it is not named by. Scrape mode: ``expr`` unchanged."""
        if not self.source:
            return expr
        expr = self._parsed(expr, self.labels, self.source)
        if not self.service_labels:
            return expr
        for label in self.variables:
            if label not in self.labels:  # a replica's name does not hold it
                expr = f'label_replace({expr}, "{label}", "$$__all", "target", ".*")'
        expr = self._parsed(expr, self.service_labels, f"{self.source}\\\\.svc")
        for label in self.replica_only:
            expr = f'label_replace({expr}, "{label}", "$$__all", "target", "{self.source}\\\\.svc\\\\..*")'
        return expr

    @staticmethod
    def _parsed(expr: str, labels: tuple[str, ...], prefix: str) -> str:
        """``labels`` set from the dot-separated values of the names ``<prefix>.<value>.<value>``."""
        for i, label in enumerate(labels):
            before = "[^.]*\\\\." * i
            value = "(.*)" if i == len(labels) - 1 else "([^.]*)\\\\..*"
            expr = f'label_replace({expr}, "{label}", "$1", "target", "{prefix}\\\\.{before}{value}")'
        return expr

    def link_vars(self, template: str) -> str:
        """``var-<label>=<value>`` for a drill-down link; ``template`` formats one label's value."""
        return "&".join(f"var-{label}={template.format(label)}" for label in self.variables)


#: One always-present gauge per engine: a target label's values are read from these series.
PRESENCE_METRICS = ("vllm:num_requests_running", "tgi_batch_current_size", "sglang:num_running_reqs",
                    "trtllm_num_requests_running")

#: The engine labels of the dashboards being rendered (:func:`render` sets them).
ENGINE = EngineLabels()


def engine_labels(config_file: Path | None, source: str | None) -> EngineLabels:
    """Scrape mode, or the labels of the config's Prometheus source (see ``rules export``)."""
    if config_file is None:
        return EngineLabels()
    from app.config import load_config
    from app.rules_export import scope_of

    scope = scope_of(load_config(config_file), source)
    if scope.source is None:
        return EngineLabels()
    shape = EngineLabels(labels=tuple(scope.labels), service_labels=tuple(scope.source.service_labels))
    chosen = ", ".join(f'{label}=~"${label}"' for label in shape.variables)
    base = f"{scope.matchers}, {chosen}" if scope.matchers else chosen
    return EngineLabels(vllm=f'{base}, model_name=~"$model"', tgi=base, labels=shape.labels,
                        source=scope.source.name, matchers=scope.matchers, service_labels=shape.service_labels)


def either(*alternatives: str) -> str:
    """One expression for several engines: each alternative yields series only for the
    targets of its engine, and they share the same output labels, so ``or`` unions them."""
    return " or ".join(f"({a})" if " or " in a else a for a in alternatives)


class Q:
    """Every PromQL expression of the dashboards. ``by`` is the grouping of engine series."""

    # --- service gauges (computed by the monitor over LLM_LATENCY_LATENCY_WINDOW)
    @staticmethod
    def quantile(signal: str, q: str) -> str:
        return f'llm_latency_quantile_seconds{{{SVC}, signal="{signal}", quantile="{q}"}}'

    @staticmethod
    def mean(signal: str) -> str:
        return f'llm_latency_mean_seconds{{{SVC}, signal="{signal}"}}'

    @staticmethod
    def itl_ratio() -> str:
        return f"{Q.quantile('itl', '0.99')} / ignoring (quantile) {Q.quantile('itl', '0.5')}"

    @staticmethod
    def queue_share() -> str:
        return f"{Q.mean('queue_time')} / ignoring (signal) {Q.mean('ttft')}"

    @staticmethod
    def verdict_code(agg: str = "sum by (target, model)", selector: str = SVC) -> str:
        """The verdict as a number per (target, model): the state timeline maps it back to
        the regime name and colour (``VERDICTS`` order). Only the current verdict's series
        exists, so the sum is that verdict's code."""
        parts = [f'llm_latency_diagnosis_verdict{{{selector}, verdict="{v}"}} * {i}' for i, v in enumerate(VERDICTS)]
        return f"{agg} (\n    " + "\n  or ".join(parts) + "\n)"

    @staticmethod
    def regime_changes() -> str:
        """Annotation: where a target's verdict code changed; the result carries the new
        verdict. Per target, not per model, and so not filtered by ``$model``: a target
        without data yet is diagnosed ``insufficient_data`` with no model, so its first
        regime arrives on a new series, which a model filter would hide."""
        return (f"(changes(({Q.verdict_code('max by (target)', SVC_T)})[2m:]) > 0)\n"
                f"* on (target) group_right llm_latency_diagnosis_verdict{{{SVC_T}}}")

    @staticmethod
    def mean_change(signal: str) -> str:
        """The monitor's mean of ``signal`` now less the same ``$change_baseline`` earlier (docs/changes.md:
        means add, so the components' changes add up to TTFT's)."""
        return f"{Q.mean(signal)} - {Q.mean(signal)} offset $change_baseline"

    @staticmethod
    def relative_change(expr: str) -> str:
        """``expr`` now over the same ``$change_baseline`` earlier, less 1 (a driver's change)."""
        return f"({expr}) / last_over_time(({expr})[5m:] offset $change_baseline) - 1"

    @staticmethod
    def absolute_change(expr: str) -> str:
        """``expr`` now less the same ``$change_baseline`` earlier (a share's change, in points)."""
        return f"({expr}) - last_over_time(({expr})[5m:] offset $change_baseline)"

    @staticmethod
    def change_events() -> str:
        """Annotation: a target's newest change event of a kind moved, or its first one appeared
        (app/attribution)."""
        last = f"llm_latency_change_event_last_timestamp_seconds{{{SVC_T}}}"
        return f"(changes({last}[2m]) > 0) or ({last} unless {last} offset 2m)"

    @staticmethod
    def engine_restarts() -> str:
        """Annotation from the engines' metrics alone: their request counter went back to zero."""
        e = ENGINE
        return either(*(f"max by ({e.by}) (resets({m}{{{e.vllm}}}[2m])) > 0"
                        for m in ("vllm:request_success_total", "sglang:num_requests_total",
                                  "trtllm_request_success_total")),
                      f"max by ({e.by}) (resets(tgi_request_success{{{e.tgi}}}[2m])) > 0")

    @staticmethod
    def config_changes() -> str:
        """Annotation from the engines' metrics alone: two vLLM ``cache_config_info`` series of one
        engine within two minutes (a label changed; the old series goes stale)."""
        return f"count by ({ENGINE.by}) (count_over_time(vllm:cache_config_info{{{ENGINE.tgi}}}[2m])) > 1"

    @staticmethod
    def time_attainment(signal: str, var: str) -> str:
        """Share of the dashboard range in which the monitor's p99 met the objective."""
        return (f"avg by (target) (avg_over_time(({Q.quantile(signal, '0.99')} <= bool ${var})"
                f"[$__range:]))")

    @staticmethod
    def rows(metric: str, labels: str, selector: str = SVC) -> str:
        """A table query: one row per label set. Aggregating drops ``__name__``, ``job`` and
        ``instance``, so the tables' merge transformation joins frames of different metrics
        on the labels they share (target, model, regime, ...)."""
        return f"max by ({labels}) ({metric}{{{selector}}})"

    # --- engine series
    @staticmethod
    def vllm_rate(metric: str, by: str = "", extra: str = "", w: str = "$__rate_interval") -> str:
        return f"sum by ({by or ENGINE.by}) (rate({metric}{{{ENGINE.vllm}{extra}}}[{w}]))"

    @staticmethod
    def tgi_rate(metric: str, by: str = "", extra: str = "", w: str = "$__rate_interval") -> str:
        return f"sum by ({by or ENGINE.by}) (rate({metric}{{{ENGINE.tgi}{extra}}}[{w}]))"

    @staticmethod
    def vllm_quantile(q: str, family: str, extra: str = "") -> str:
        """Also SGLang's and trtllm-serve's families: they carry ``model_name`` as vLLM does."""
        return f"histogram_quantile({q}, {Q.vllm_rate(family + '_bucket', f'le, {ENGINE.by}', extra)})"

    @staticmethod
    def tgi_quantile(q: str, family: str, extra: str = "") -> str:
        return f"histogram_quantile({q}, {Q.tgi_rate(family + '_bucket', f'le, {ENGINE.by}', extra)})"

    @staticmethod
    def vllm_mean(family: str, extra: str = "") -> str:
        return f"{Q.vllm_rate(family + '_sum', extra=extra)} / {Q.vllm_rate(family + '_count', extra=extra)}"

    @staticmethod
    def tgi_mean(family: str, extra: str = "") -> str:
        return f"{Q.tgi_rate(family + '_sum', extra=extra)} / {Q.tgi_rate(family + '_count', extra=extra)}"

    @staticmethod
    def engine_ttft_quantile(q: str) -> str:
        """vLLM's TTFT histogram; TGI has none: queue + prefill-batch quantiles, as TGI's own
        dashboard and the monitor's latency API (``derived: true``) do."""
        prefill = Q.tgi_quantile(q, "tgi_batch_inference_duration", extra=', method="prefill"')
        tgi = f"{Q.tgi_quantile(q, 'tgi_request_queue_duration')}\n+ {prefill}"
        return either(Q.vllm_quantile(q, "vllm:time_to_first_token_seconds"),
                      Q.vllm_quantile(q, "sglang:time_to_first_token_seconds"),
                      Q.vllm_quantile(q, "trtllm_time_to_first_token_seconds"), tgi)

    @staticmethod
    def engine_itl_quantile(q: str) -> str:
        """vLLM's ITL histogram (one observation per engine step), SGLang's (per token); TGI:
        decode step time. trtllm-serve has no ITL histogram."""
        return either(Q.vllm_quantile(q, "vllm:inter_token_latency_seconds"),
                      Q.vllm_quantile(q, "sglang:inter_token_latency_seconds"),
                      Q.tgi_quantile(q, "tgi_batch_inference_duration", extra=', method="decode"'))

    @staticmethod
    def engine_queue_mean() -> str:
        return either(Q.vllm_mean("vllm:request_queue_time_seconds"), Q.vllm_mean("sglang:queue_time_seconds"),
                      Q.vllm_mean("trtllm_request_queue_time_seconds"), Q.tgi_mean("tgi_request_queue_duration"))

    @staticmethod
    def engine_prefill_mean() -> str:
        """vLLM: first scheduled -> first token; TGI: mean prefill batch time (what every
        request of the batch waits)."""
        return either(Q.vllm_mean("vllm:request_prefill_time_seconds"),
                      Q.vllm_mean("sglang:per_stage_req_latency_seconds",
                                  extra=', stage=~"prefill_forward|fake_output"'),
                      Q.vllm_mean("trtllm_request_prefill_time_seconds"),
                      Q.tgi_mean("tgi_batch_inference_duration", extra=', method="prefill"'))

    @staticmethod
    def pd_decode_terms() -> list[tuple[str, str]]:
        """A P/D decode worker's own TTFT terms (``app.latency.pd_terms``), from its engine series: SGLang's
        handshake and memory reservation, its wait for the KV (the prefill worker's queue and prefill and the
        transfer: SGLang times the transfer alone on the prefill worker), TensorRT-LLM's transfer, the
        decode-side queue and the first step. (vLLM's NIXL transfer time is the monitor's: its latency API and
        status page.)"""
        stage = "sglang:per_stage_req_latency_seconds"
        return [
            ("decode prealloc", Q.vllm_mean(stage, extra=', stage="decode_bootstrap"')),
            ("KV wait / transfer", either(Q.vllm_mean(stage, extra=', stage="decode_transferred"'),
                                          Q.vllm_mean("trtllm_kv_transfer_latency_seconds"))),
            ("decode queue", either(Q.vllm_mean("vllm:request_queue_time_seconds"),
                                    Q.vllm_mean(stage, extra=', stage="decode_waiting"'),
                                    Q.vllm_mean("trtllm_request_queue_time_seconds"))),
            ("first step", either(Q.vllm_mean(stage, extra=', stage="fake_output"'),
                                  Q.vllm_mean("vllm:request_prefill_time_seconds"),
                                  Q.vllm_mean("trtllm_request_prefill_time_seconds"))),
        ]

    @staticmethod
    def step_tokens(q: str) -> str:
        """Tokens per vLLM engine step; its top reveals the batched-token budget (a long
        prompt's prefill in one step = no chunked prefill)."""
        return Q.vllm_quantile(q, "vllm:iteration_tokens_total")

    @staticmethod
    def running() -> str:
        return either(*(f"sum by ({ENGINE.by}) ({m}{{{ENGINE.vllm}}})"
                        for m in ("vllm:num_requests_running", "sglang:num_running_reqs",
                                  "trtllm_num_requests_running")),
                      f"sum by ({ENGINE.by}) (tgi_batch_current_size{{{ENGINE.tgi}}})")

    @staticmethod
    def waiting() -> str:
        return either(*(f"sum by ({ENGINE.by}) ({m}{{{ENGINE.vllm}}})"
                        for m in ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_num_requests_waiting")),
                      f"sum by ({ENGINE.by}) (tgi_queue_size{{{ENGINE.tgi}}})")

    @staticmethod
    def kv_usage() -> str:
        """Averaged over vLLM's data-parallel engines (a usage fraction must not be summed);
        TGI: tokens reserved by the running batch / the KV capacity in tokens."""
        e = ENGINE
        tgi = f"tgi_batch_current_max_tokens{{{e.tgi}}} / tgi_batch_max_total_tokens{{{e.tgi}}}"
        return either(*(f"avg by ({e.by}) ({m}{{{e.vllm}}})"
                        for m in ("vllm:kv_cache_usage_perc", "sglang:token_usage", "trtllm_kv_cache_utilization")),
                      f"avg by ({e.by}) ({tgi})")

    @staticmethod
    def preemptions() -> str:
        return either(Q.vllm_rate("vllm:num_preemptions_total"), Q.vllm_rate("sglang:num_retracted_requests_total"))

    @staticmethod
    def prefix_hit_rate() -> str:
        return f"{Q.vllm_rate('vllm:prefix_cache_hits_total')} / {Q.vllm_rate('vllm:prefix_cache_queries_total')}"

    @staticmethod
    def requests() -> str:
        return either(Q.vllm_rate("vllm:request_success_total"), Q.vllm_rate("sglang:num_requests_total"),
                      Q.vllm_rate("trtllm_request_success_total"), Q.tgi_rate("tgi_request_success"))

    @staticmethod
    def prompt_tokens() -> str:
        return either(Q.vllm_rate("vllm:prompt_tokens_total"), Q.vllm_rate("sglang:prompt_tokens_total"),
                      Q.vllm_rate("trtllm_prompt_tokens_total"), Q.tgi_rate("tgi_request_input_length_sum"))

    @staticmethod
    def generation_tokens() -> str:
        return either(Q.vllm_rate("vllm:generation_tokens_total"), Q.vllm_rate("sglang:generation_tokens_total"),
                      Q.vllm_rate("trtllm_generation_tokens_total"), Q.tgi_rate("tgi_request_generated_tokens_sum"))

    @staticmethod
    def tgi_prefill_merges() -> str:
        """TGI pauses decoding while a new prefill batch runs; merges/s show how often."""
        return Q.tgi_rate("tgi_batch_concat", by=f"{ENGINE.by}, reason")

    @staticmethod
    def request_attainment(family: str, var: str) -> str:
        """Share of observations at or below the objective, exact from vLLM's buckets."""
        e = ENGINE
        return (f'sum by ({e.by}) (increase({family}_bucket{{{e.vllm}, le="${var}"}}[$__range]))\n'
                f"/ sum by ({e.by}) (increase({family}_count{{{e.vllm}}}[$__range]))")


# ----------------------------------------------------------------------------- panel model


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False

    def json(self, ref: str) -> dict:
        out = {"datasource": DS, "refId": ref, "expr": self.expr, "editorMode": "code",
               "range": not self.instant, "instant": self.instant}
        if self.legend:
            out["legendFormat"] = self.legend
        if self.table:
            out["format"] = "table"
        return out


@dataclass
class Panel:
    kind: str
    title: str
    description: str
    targets: list[Target]
    width: int = 12
    height: int = 8
    unit: str = ""
    options: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    custom: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    transformations: list = field(default_factory=list)

    def json(self, panel_id: int, x: int, y: int) -> dict:
        defaults = dict(self.defaults)
        if self.unit:
            defaults["unit"] = self.unit
        if self.custom:
            defaults["custom"] = self.custom
        out = {
            "type": self.kind, "id": panel_id, "title": self.title, "description": self.description,
            "datasource": DS, "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": [t.json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
            "fieldConfig": {"defaults": defaults, "overrides": self.overrides},
            "options": self.options,
        }
        if self.transformations:
            out["transformations"] = self.transformations
        return out


LEGEND = {"showLegend": True, "displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}
TOOLTIP = {"mode": "multi", "sort": "desc"}


def timeseries(title: str, description: str, targets: list[Target], unit: str, *, width: int = 12,
               stack: bool = False, overrides: list | None = None, minimum: float | None = 0,
               maximum: float | None = None) -> Panel:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 60 if stack else 10,
              "showPoints": "never", "spanNulls": False, "axisPlacement": "auto",
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    defaults: dict = {"color": {"mode": "palette-classic"}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return Panel("timeseries", title, description, targets, width=width, unit=unit, defaults=defaults,
                 custom=custom, overrides=overrides or [], options={"legend": LEGEND, "tooltip": TOOLTIP})


def stat(title: str, description: str, targets: list[Target], unit: str, *, width: int = 4, height: int = 4,
         thresholds: list | None = None, mappings: list | None = None, text_mode: str = "auto") -> Panel:
    defaults: dict = {"color": {"mode": "thresholds"},
                      "thresholds": {"mode": "absolute", "steps": thresholds or [{"color": "green", "value": None}]}}
    if mappings:
        defaults["mappings"] = mappings
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "colorMode": "value", "graphMode": "none", "justifyMode": "auto", "orientation": "auto",
               "textMode": text_mode, "wideLayout": True, "showPercentChange": False}
    return Panel("stat", title, description, targets, width=width, height=height, unit=unit,
                 defaults=defaults, options=options)


def bargauge(title: str, description: str, targets: list[Target], *, width: int = 12) -> Panel:
    """Attainment shares: red below 95 %, yellow below 99 %, green above."""
    defaults = {"min": 0, "max": 1, "decimals": 2, "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                             {"color": "yellow", "value": 0.95},
                                                             {"color": "green", "value": 0.99}]}}
    options = {"orientation": "horizontal", "displayMode": "gradient", "valueMode": "color",
               "namePlacement": "auto", "showUnfilled": True, "sizing": "auto", "minVizWidth": 8,
               "minVizHeight": 16, "maxVizHeight": 300,
               "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []}}
    return Panel("bargauge", title, description, targets, width=width, unit="percentunit",
                 defaults=defaults, options=options)


def state_timeline(title: str, description: str, targets: list[Target], mappings: list, *, width: int = 24,
                   height: int = 8, links: list | None = None) -> Panel:
    defaults: dict = {"color": {"mode": "thresholds"}, "mappings": mappings,
                      "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": None}]}}
    if links:
        defaults["links"] = links
    options = {"showValue": "auto", "mergeValues": True, "alignValue": "left", "rowHeight": 0.85,
               "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
               "tooltip": {"mode": "single", "sort": "none"}}
    return Panel("state-timeline", title, description, targets, width=width, height=height,
                 defaults=defaults, custom={"fillOpacity": 80, "lineWidth": 0}, options=options)


def table(title: str, description: str, targets: list[Target], transformations: list, *, width: int = 12,
          height: int = 8, overrides: list | None = None, sort_by: str = "target") -> Panel:
    options = {"showHeader": True, "cellHeight": "sm", "sortBy": [{"displayName": sort_by, "desc": False}],
               "footer": {"show": False, "reducer": ["sum"], "countRows": False, "fields": ""}}
    return Panel("table", title, description, targets, width=width, height=height,
                 custom={"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False, "filterable": True},
                 defaults={"color": {"mode": "thresholds"},
                           "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": None}]}},
                 overrides=overrides or [], transformations=transformations, options=options)


def organize(exclude: list[str], rename: dict[str, str], order: list[str]) -> dict:
    return {"id": "organize", "options": {"excludeByName": {name: True for name in exclude},
                                          "renameByName": rename,
                                          "indexByName": {name: i for i, name in enumerate(order)}}}


MERGE = {"id": "merge", "options": {}}


def by_ref(ref: str, properties: list[dict]) -> dict:
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": properties}


def by_name(name: str, properties: list[dict]) -> dict:
    return {"matcher": {"id": "byName", "options": name}, "properties": properties}


DASHED = {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}


def right_axis(unit: str, label: str) -> list[dict]:
    return [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": "right"},
            {"id": "custom.axisLabel", "value": label}, DASHED]


def verdict_mappings() -> list[dict]:
    return [{"type": "value", "options": {
        str(i): {"text": v.replace("_", " "), "color": VERDICT_COLORS[v], "index": i}
        for i, v in enumerate(VERDICTS)}}]


UP_MAPPINGS = [{"type": "value", "options": {"0": {"text": "down", "color": "red", "index": 0},
                                             "1": {"text": "up", "color": "green", "index": 1}}}]


def drill_down_link() -> list[dict]:
    chosen = ENGINE.link_vars("${{__field.labels.{}}}") if ENGINE.source else "var-target=${__field.labels.target}"
    return [{"title": "Drill down: ${__field.labels.target}",
             "url": f"/d/{TARGET_UID}?{chosen}&${{datasource:queryparam}}&${{__url_time_range}}"}]


# ----------------------------------------------------------------------------- shared panels


QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))


def latency_quantiles(signal: str, legend_prefix: str) -> list[Target]:
    return [Target(Q.quantile(signal, q), f"{legend_prefix}{label}") for q, label in QUANTILES]


def slo_time_panel(width: int) -> Panel:
    return bargauge(
        "SLO attainment: share of time p99 met the objective",
        "Fraction of the dashboard time range in which the monitor's p99 (over its latency window) was at or "
        "below the objective chosen above ($ttft_slo s TTFT, $itl_slo s ITL). TGI has ITL only: its TTFT, "
        "derived from queue and prefill, has no p99 value, only a bound.",
        [Target(Q.time_attainment("ttft", "ttft_slo"), "{{target}} TTFT", instant=True),
         Target(Q.time_attainment("itl", "itl_slo"), "{{target}} ITL", instant=True)], width=width)


def slo_request_panel(width: int) -> Panel:
    return bargauge(
        "SLO attainment: requests / steps under the objective (vLLM buckets)",
        "Share of requests with TTFT <= $ttft_slo s and of decode steps with ITL <= $itl_slo s over the time "
        "range, read exactly from vLLM's histogram buckets (the objective choices are bucket bounds). TGI "
        "exports no TTFT histogram, so TGI targets appear only in the time-based panel.",
        [Target(Q.request_attainment("vllm:time_to_first_token_seconds", "ttft_slo"), f"{ENGINE.legend} TTFT",
                instant=True),
         Target(Q.request_attainment("vllm:inter_token_latency_seconds", "itl_slo"), f"{ENGINE.legend} ITL",
                instant=True)], width=width)


def regime_timeline(height: int) -> Panel:
    return state_timeline(
        "Diagnosed regime",
        "The monitor's verdict per target and model after every diagnosis round "
        "(llm_latency_diagnosis_verdict): healthy, insufficient data, or the primary regime. "
        "Runbooks: $monitor_url/runbooks/<regime>.",
        [Target(ENGINE.with_labels(Q.verdict_code()), "{{target}} · {{model}}")], verdict_mappings(), height=height,
        links=drill_down_link())


def findings_table(width: int) -> Panel:
    return table(
        "Findings and remedies",
        "Pending and active findings (llm_latency_finding_confidence) joined with their remedies in order "
        "(llm_latency_finding_remedy_info). The regime column links to its runbook.",
        [Target(Q.rows("llm_latency_finding_confidence", "target, model, regime, state, severity, primary"),
                instant=True, table=True),
         Target(Q.rows("llm_latency_finding_remedy_info", "target, model, regime, rank, remedy"),
                instant=True, table=True)],
        [MERGE, organize(["Time", "Value #B"], {"Value #A": "confidence"},
                         ["target", "model", "regime", "state", "severity", "primary", "confidence", "rank",
                          "remedy"])],
        width=width, height=10,
        overrides=[by_name("confidence", [{"id": "unit", "value": "percentunit"}]),
                   by_name("remedy", [{"id": "custom.width", "value": 520}]),
                   by_name("regime", [{"id": "links", "value": [
                       {"title": "Runbook", "url": "${monitor_url}/runbooks/${__value.raw}", "targetBlank": True}]}])])


def evidence_table(width: int) -> Panel:
    return table(
        "Finding evidence vs. thresholds",
        "The numbers behind each finding (llm_latency_finding_evidence) next to the threshold they were "
        "compared with (llm_latency_finding_threshold), over the diagnosis window.",
        [Target(Q.rows("llm_latency_finding_evidence", "target, model, regime, evidence"), instant=True, table=True),
         Target(Q.rows("llm_latency_finding_threshold", "target, model, regime, evidence"), instant=True,
                table=True)],
        [MERGE, organize(["Time"], {"Value #A": "value", "Value #B": "threshold"},
                         ["target", "model", "regime", "evidence", "value", "threshold"])],
        width=width, height=10,
        overrides=[by_name("value", [{"id": "decimals", "value": 3}]),
                   by_name("threshold", [{"id": "decimals", "value": 3}])])


def alerts_table(width: int) -> Panel:
    return table(
        "Open alerts",
        "Pending and firing alerts of the monitor's own alerting (llm_latency_alert_state).",
        [Target(Q.rows("llm_latency_alert_state", "alertname, target, severity, state", SVC_T), instant=True,
                table=True)],
        [organize(["Time", "Value"], {}, ["alertname", "target", "severity", "state"])],
        width=width, height=10, sort_by="alertname",
        overrides=[by_name("state", [{"id": "mappings", "value": [{"type": "value", "options": {
            "firing": {"color": "red", "index": 0}, "pending": {"color": "orange", "index": 1}}}]},
            {"id": "custom.cellOptions", "value": {"type": "color-text"}}])])


def why_panels(per_target: bool) -> list[Panel]:
    by = "" if per_target else "{{target}} "
    eby = "" if per_target else f"{ENGINE.legend} "  # engine series
    if per_target:
        ttft_monitor = timeseries(
            "TTFT decomposition: queue vs. prefill (monitor)",
            "Mean queue time and mean prefill time over the monitor's latency window, stacked; the dashed line "
            "is mean TTFT. A queue share above half means requests wait for the scheduler (regime 'queueing'); "
            "a large prefill with no queue means long prompts (regime 'prefill_compute').",
            [Target(Q.mean("queue_time"), "queue"), Target(Q.mean("prefill_time"), "prefill"),
             Target(Q.mean("ttft"), "TTFT (mean)")], "s", stack=True,
            overrides=[by_ref("C", [{"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                                    {"id": "custom.fillOpacity", "value": 0}, DASHED])])
    else:
        ttft_monitor = timeseries(
            "Queue share of TTFT (monitor)",
            "Mean queue time / mean TTFT over the monitor's latency window. At or above 50 % with a TTFT worth "
            "worrying about, the diagnosis says 'queueing'.",
            [Target(Q.queue_share(), "{{target}} {{model}}")], "percentunit", maximum=1)
    ttft_engine = timeseries(
        "TTFT decomposition: queue vs. prefill (engine counters)",
        "Mean queue and prefill time from the engines' own histograms over the rate interval: vLLM "
        "request_queue_time_seconds / request_prefill_time_seconds; TGI request_queue_duration / prefill "
        "batch_inference_duration.",
        [Target(Q.engine_queue_mean(), f"{eby}queue"), Target(Q.engine_prefill_mean(), f"{eby}prefill")], "s",
        stack=per_target)
    itl = timeseries(
        "ITL p99/p50 and engine step size",
        "Left: ITL p99 / p50 (monitor). A ratio jumping above ~4 while long prompts arrive means decodes stall "
        "behind prefills ('prefill_interference'). Right (dashed): tokens per vLLM engine step; steps far above "
        "the batched-token budget mean a whole prompt was prefilled in one step (chunked prefill off).",
        [Target(Q.itl_ratio(), f"{by}ITL p99/p50"), Target(Q.step_tokens("0.99"), f"{eby}step tokens p99"),
         Target(Q.step_tokens("0.5"), f"{eby}step tokens p50")], "suffix:×",
        overrides=[by_ref("B", right_axis("none", "tokens / step")),
                   by_ref("C", right_axis("none", "tokens / step"))])
    running = timeseries(
        "Running and waiting requests",
        "Requests in the running batch and waiting for the scheduler (vLLM num_requests_running/waiting summed "
        "over data-parallel engines; TGI batch_current_size / queue_size). Waiting that grows while running is "
        "flat: the scheduler is full.",
        [Target(Q.running(), f"{eby}running"), Target(Q.waiting(), f"{eby}waiting")], "short",
        overrides=[by_ref("B", [DASHED])])
    kv = timeseries(
        "KV-cache usage and preemptions",
        "KV-cache usage, averaged (not summed) over vLLM's data-parallel engines; TGI: tokens reserved by the "
        "running batch / max_batch_total_tokens. Right (dashed): vLLM preemptions per second. Usage near 100 % "
        "with preemptions = 'kv_cache_pressure'.",
        [Target(Q.kv_usage(), f"{eby}KV usage"), Target(Q.preemptions(), f"{eby}preemptions/s")], "percentunit",
        maximum=None, overrides=[by_ref("B", right_axis("short", "preemptions / s"))])
    prefix = timeseries(
        "Prefix-cache hit rate (vLLM)",
        "Prompt tokens served from the prefix cache / prompt tokens looked up (vLLM prefix_cache_hits_total / "
        "prefix_cache_queries_total). Low with long shared prompts: check --enable-prefix-caching.",
        [Target(Q.prefix_hit_rate(), f"{eby}hit rate")], "percentunit", maximum=1)
    pd = timeseries(
        "P/D decode worker: TTFT terms (engine counters)",
        "A disaggregated decode worker's own terms of TTFT, stacked: SGLang's handshake and KV-memory reservation "
        "(stage decode_bootstrap: long when its KV pool is full, 'kv_cache_pressure'), its wait for the KV (stage "
        "decode_transferred: the prefill worker's queue and prefill and the transfer; TensorRT-LLM "
        "kv_transfer_latency: the transfer alone), the decode-side queue and the first step. "
        "'kv_transfer' fires on the transfer term only; a long decode queue is 'queueing'. The prefill side's "
        "queue, prefill and (SGLang) transfer time are on the prefill worker's series; the monitor's latency API "
        "and status page put both workers' terms together.",
        [Target(expr, f"{eby}{name}") for name, expr in Q.pd_decode_terms()], "s", stack=per_target)
    return [ttft_monitor, ttft_engine, itl, running, kv, prefix, pd]


def probe_panels(per_target: bool) -> list[Panel]:
    """What clients see: the latest client-side probe or canary run per target (app/probe),
    TTFT and every inter-token gap as measured by a streaming client, per concurrency
    level. Slow alone (concurrency 1) points at prefill or the decode roofline; slow only
    under load at queueing or interference; a client TTFT far above the engine's is time
    lost outside the engine."""
    by = "" if per_target else "{{target}} "
    level = f"{by}{{{{kind}}}} c={{{{concurrency}}}}"

    def probe(metric: str, q: str) -> str:
        return f'llm_latency_probe_{metric}_seconds{{{SVC_T}, quantile="{q}"}}'

    return [
        timeseries(
            "Client-side TTFT and ITL (latest probe)",
            "From streamed requests the monitor sends itself (scheduled canaries and probes started with POST "
            "/api/v1/probes): p50 and p99 of time to first token and of every inter-token gap, per probe kind and "
            "concurrency. Includes network, tokenization and the API server, which the engine's histograms miss.",
            [Target(probe("ttft", "0.5"), f"{level} TTFT p50"), Target(probe("ttft", "0.99"), f"{level} TTFT p99"),
             Target(probe("itl", "0.5"), f"{level} ITL p50"), Target(probe("itl", "0.99"), f"{level} ITL p99")],
            "s", overrides=[by_ref(r, [DASHED]) for r in "CD"]),
        timeseries(
            "Probe requests, failures and output rate",
            "Requests of the latest probe run per level, the failed ones (GET /api/v1/probes/{id} says why), and "
            "the tokens per second all streams of the level received (dashed, right axis).",
            [Target(f"llm_latency_probe_requests{{{SVC_T}}}", f"{level} requests"),
             Target(f"llm_latency_probe_failed_requests{{{SVC_T}}}", f"{level} failed"),
             Target(f"llm_latency_probe_output_tokens_per_second{{{SVC_T}}}", f"{level} tokens/s")], "short",
            overrides=[by_ref("C", right_axis("short", "tokens / s"))]),
    ]


def scrape_panels(per_target: bool) -> list[Panel]:
    by = "" if per_target else "{{target}} "
    panels = [
        state_timeline(
            "Target up",
            "Whether the monitor's last scrape of each target succeeded (llm_latency_target_up), and whether "
            "Prometheus' own scrape of the engine did (up, joined by the target label).",
            [Target(f"llm_latency_target_up{{{SVC_T}}}", "{{target}} (monitor)"),
             Target(ENGINE.up, f"{ENGINE.legend} (Prometheus)")], UP_MAPPINGS, width=12),
        timeseries(
            "Scrapes by result",
            "Scrape attempts per second by result: ok or the error class (timeout, connect, http_5xx, "
            "too_large, parse, ...).",
            [Target(f"sum by (target, result) (rate(llm_latency_scrapes_total{{{SVC_T}}}[$__rate_interval]))",
                    f"{by}{{{{result}}}}")], "reqps"),
        timeseries(
            "Seconds since the last scrape attempt",
            "Age of the monitor's last scrape of each target; far above the scrape interval = the scheduler is "
            "stuck or the target was removed.",
            [Target(f"time() - llm_latency_target_last_scrape_timestamp_seconds{{{SVC_T}}}", f"{by}age")], "s"),
        timeseries(
            "Scrape duration (fetch + parse, all targets)",
            "Quantiles of the monitor's scrape duration over every target "
            "(llm_latency_scrape_duration_seconds).",
            [Target("histogram_quantile(0.5, sum by (le) (rate(llm_latency_scrape_duration_seconds_bucket"
                    "[$__rate_interval])))", "p50"),
             Target("histogram_quantile(0.99, sum by (le) (rate(llm_latency_scrape_duration_seconds_bucket"
                    "[$__rate_interval])))", "p99")], "s"),
    ]
    if per_target:
        panels.append(timeseries(
            "Page size, samples kept, malformed lines",
            "Size of the last /metrics page, samples the monitor kept from it, and malformed lines (right).",
            [Target(f"llm_latency_target_scrape_bytes{{{SVC_T}}}", "page bytes"),
             Target(f"llm_latency_target_samples_kept{{{SVC_T}}}", "samples kept"),
             Target(f"llm_latency_target_malformed_lines{{{SVC_T}}}", "malformed lines")], "bytes",
            overrides=[by_ref("B", right_axis("short", "samples / lines")),
                       by_ref("C", right_axis("short", "samples / lines"))]))
    else:
        panels.append(timeseries(
            "Monitor internals: write queue, storage writes, notifications",
            "Scrapes waiting to be written, storage writes per second by result, notifications written to the "
            "outbox and delivery attempts by receiver and result (right).",
            [Target("llm_latency_write_queue_scrapes", "write queue"),
             Target("sum by (result) (rate(llm_latency_storage_writes_total[$__rate_interval]))",
                    "writes {{result}}"),
             Target("rate(llm_latency_alert_notifications_total[$__rate_interval])", "notifications"),
             Target("sum by (receiver, result) (rate(llm_latency_deliveries_total[$__rate_interval]))",
                    "deliveries {{receiver}} {{result}}")], "short",
            overrides=[by_ref(r, right_axis("reqps", "per second")) for r in "BCD"]))
    return panels


# ----------------------------------------------------------------------------- layout


def layout(sections: list[tuple[str, list[Panel]]]) -> list[dict]:
    """Rows of panels, left to right, wrapping at 24 grid units."""
    out: list[dict] = []
    y = 0
    next_id = 1
    for title, panels in sections:
        out.append({"type": "row", "id": next_id, "title": title, "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x, row_height = 0, 0
        for panel in panels:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            out.append(panel.json(next_id, x, y))
            next_id += 1
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height
    return out


# ----------------------------------------------------------------------------- variables


def datasource_variable() -> dict:
    return {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def query_variable(name: str, label: str, query: str, *, multi: bool, description: str) -> dict:
    variable = {"type": "query", "name": name, "label": label, "description": description, "datasource": DS,
                "query": {"query": query, "refId": f"{name}-variable"},
                "refresh": 2, "sort": 1, "regex": "", "hide": 0, "multi": multi, "includeAll": multi,
                "options": [], "skipUrlSync": False}
    if multi:
        variable["allValue"] = ".*"
        variable["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    else:
        variable["current"] = {}
    return variable


def custom_variable(name: str, label: str, choices: tuple[str, ...], default: str, description: str) -> dict:
    return {"type": "custom", "name": name, "label": label, "description": description,
            "query": ",".join(choices), "current": {"selected": True, "text": default, "value": default},
            "options": [{"selected": c == default, "text": c, "value": c} for c in choices],
            "hide": 0, "multi": False, "includeAll": False, "skipUrlSync": False}


def monitor_url_variable() -> dict:
    return {"type": "textbox", "name": "monitor_url", "label": "Monitor URL",
            "description": "Base URL of the LLM Latency Monitor (runbook links).",
            "query": "http://localhost:8000", "current": {"text": "http://localhost:8000",
                                                          "value": "http://localhost:8000"},
            "options": [{"selected": True, "text": "http://localhost:8000", "value": "http://localhost:8000"}],
            "hide": 2, "skipUrlSync": False}


def target_variables(multi_target: bool) -> list[dict]:
    """Scrape mode: the monitor's target names. A Prometheus source: one variable per target
    label (and service label) from the engine series (each filtered by the ones before), and
    ``target`` hidden, derived from them: the monitor's names of the chosen targets."""
    if not ENGINE.source:
        return [query_variable("target", "Target", "label_values(llm_latency_target_up, target)", multi=multi_target,
                               description="The monitor's target name; engines carry it as the 'target' label too.")]
    presence = "|".join(PRESENCE_METRICS)
    out = []
    chosen: list[str] = [f'__name__=~"{presence}"'] + ([ENGINE.matchers] if ENGINE.matchers else [])
    for label in ENGINE.variables:
        # in the drill-down, "All" of a replica's own label chooses the service; of a service's own
        # label, every replica whatever its service (those without the label among them)
        every = multi_target or label not in ENGINE.labels or label in ENGINE.replica_only
        what = "its service" if label in ENGINE.replica_only and not multi_target else \
            "replicas of any service" if label not in ENGINE.labels and not multi_target else ""
        variable = query_variable(label, label.capitalize(), f"label_values({{{', '.join(chosen)}}}, {label})",
                                  multi=multi_target, description=f"The engines' {label} label (source "
                                                                  f"{ENGINE.source}: one target per "
                                                                  f"{', '.join(ENGINE.labels)}"
                                                                  + (f"; All: {what}" if what else "") + ").")
        if every and not multi_target:
            variable.update(includeAll=True, allValue=".*")
        out.append(variable)
        chosen.append(f'{label}=~"${label}"')
    replicas = f"{ENGINE.source}\\\\." + "\\\\.".join(f"${label}" for label in ENGINE.labels)
    services = f"{ENGINE.source}\\\\.svc\\\\." + "\\\\.".join(f"${label}" for label in ENGINE.service_labels)
    names = f"{ENGINE.source}.<{'>.<'.join(ENGINE.labels)}>" + \
        (f" and {ENGINE.source}.svc.<{'>.<'.join(ENGINE.service_labels)}>" if ENGINE.service_labels else "")
    # every target the monitor diagnoses has a verdict series (discovered ones have no scrape gauges)
    if ENGINE.service_labels and not multi_target:
        query = drill_down_target(replicas, services)
    elif ENGINE.service_labels:
        query = f'label_values(llm_latency_diagnosis_verdict{{target=~"{replicas}|{services}"}}, target)'
    else:
        query = f'label_values(llm_latency_diagnosis_verdict{{target=~"{replicas}"}}, target)'
    target = query_variable("target", "Target", query, multi=multi_target,
                            description=f"Hidden: the monitor's names of the chosen targets ({names}).")
    if query.startswith("query_result("):
        target["regex"] = '/target="([^"]+)"/'
    target["hide"] = 2
    target.pop("allValue", None)  # All = every name the chosen labels give, not every target
    return [*out, target]


def drill_down_target(replicas: str, services: str) -> str:
    """The drill-down's one target: the replica the labels name, or, when every label of the
    replica's own is "All" (Grafana's text of the choice), the service the service labels name.
    PromQL decides (``query_result``): the service's verdict series only where the texts all equal
    "All", a value no replica's label has (Kubernetes names are lower case)."""
    replica = replicas
    for label in ENGINE.replica_only:
        replica = replica.replace(f"${label}", f"${{{label}:text}}")
    texts = "vector(1)"
    alls = "vector(1)"
    for label in ENGINE.replica_only:
        texts = f'label_replace({texts}, "{label}", "${{{label}:text}}", "", "")'
        alls = f'label_replace({alls}, "{label}", "All", "", "")'
    every_all = f"{texts} and on({', '.join(ENGINE.replica_only)}) {alls}"
    return (f'query_result(llm_latency_diagnosis_verdict{{target=~"{replica}"}} or '
            f'(llm_latency_diagnosis_verdict{{target=~"{services}"}} and on() ({every_all})))')


def variables(multi_target: bool) -> list[dict]:
    return [
        datasource_variable(),
        *target_variables(multi_target),
        query_variable("model", "Model", 'label_values(llm_latency_observations{target=~"$target"}, model)',
                       multi=True, description="Served model (vLLM model_name). TGI exports no model label: "
                                               "its engine panels ignore this filter."),
        custom_variable("ttft_slo", "TTFT objective (s)", TTFT_OBJECTIVES,
                        default_objective("ttft", TTFT_OBJECTIVES),
                        "Objective of the TTFT SLO panels; choices are vLLM TTFT bucket bounds."),
        custom_variable("itl_slo", "ITL objective (s)", ITL_OBJECTIVES, default_objective("itl", ITL_OBJECTIVES),
                        "Objective of the ITL SLO panels; choices are vLLM ITL bucket bounds."),
        monitor_url_variable(),
    ]


def annotations(engine: bool = True) -> dict:
    """The dashboards' annotations; ``engine``: with the two read from the engines' own metrics
    (the SLO dashboard reads only the monitor's series)."""
    # titleFormat/textFormat/tagKeys/step are Grafana's Prometheus annotation options; the
    # Foundation SDK's AnnotationQuery model does not carry them (tests/grafana allows
    # exactly these keys there).
    engine_tags = ENGINE.by.replace(" ", "")
    from_engines = [
        {"name": "Engine restarts (engine metrics)", "datasource": DS, "enable": False, "hide": False,
         "iconColor": "dark-red", "expr": Q.engine_restarts(), "step": "30s",
         "titleFormat": f"{ENGINE.legend}: restart", "textFormat": "The engine's request counter went back to zero",
         "tagKeys": engine_tags},
        {"name": "Configuration changes (engine metrics)", "datasource": DS, "enable": False, "hide": False,
         "iconColor": "dark-orange", "expr": Q.config_changes(), "step": "30s",
         "titleFormat": f"{ENGINE.legend}: configuration", "textFormat": "A vllm:cache_config_info label changed",
         "tagKeys": engine_tags},
    ]
    return {"list": [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "Regime changes", "datasource": DS, "enable": True, "hide": False, "iconColor": "orange",
         "expr": Q.regime_changes(), "step": "30s", "titleFormat": "{{target}}: {{verdict}}",
         "textFormat": "Diagnosis of {{target}} ({{model}}) changed to {{verdict}}",
         "tagKeys": "target,verdict"},
        {"name": "Change events", "datasource": DS, "enable": True, "hide": False, "iconColor": "purple",
         "expr": Q.change_events(), "step": "30s", "titleFormat": "{{target}}: {{kind}}",
         "textFormat": "A {{kind}} change event on {{target}}: GET /api/v1/targets/{{target}}/events says what "
                       "changed, /changes what it did to the latency", "tagKeys": "target,kind"},
        *(from_engines if engine else []),
        {"name": "Firing alerts", "datasource": DS, "enable": False, "hide": False, "iconColor": "red",
         "expr": f'llm_latency_alert_state{{{SVC_T}, state="firing"}}', "step": "30s",
         "titleFormat": "{{alertname}}", "textFormat": "{{alertname}} firing for {{target}} ({{severity}})",
         "tagKeys": "alertname,target,severity"},
    ]}


def dashboard(uid: str, title: str, description: str, sections: list[tuple[str, list[Panel]]],
              multi_target: bool, extra_variables: list[dict] | None = None, engine_annotations: bool = True) -> dict:
    if ENGINE.source:
        description += (f" Engine panels: Prometheus source {ENGINE.source!r}, one target per "
                        f"{', '.join(ENGINE.labels)}.")
    return {
        "uid": uid, "title": title, "description": description, "tags": TAGS, "editable": True,
        "graphTooltip": 1, "timezone": "browser", "refresh": "30s", "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-1h", "to": "now"}, "fiscalYearStartMonth": 0, "liveNow": False,
        "links": [{"title": "LLM Latency dashboards", "type": "dashboards", "tags": TAGS, "asDropdown": True,
                   "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "annotations": annotations(engine_annotations),
        "templating": {"list": variables(multi_target) + (extra_variables or [])},
        "panels": layout(sections),
    }


# ----------------------------------------------------------------------------- dashboards


def fleet() -> dict:
    summary_link = ENGINE.link_vars("${{__data.fields.{}}}") if ENGINE.source else "var-target=${__value.raw}"
    status = [
        stat("Targets up", "Targets whose last scrape by the monitor succeeded.",
             [Target(f"sum(llm_latency_target_up{{{SVC_T}}})", instant=True)], "short"),
        stat("Targets down", "Targets whose last scrape by the monitor failed.",
             [Target(f"count(llm_latency_target_up{{{SVC_T}}} == 0) or vector(0)", instant=True)], "short",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
        stat("Firing alerts", "Alerts of the monitor in state firing.",
             [Target(f'count(llm_latency_alert_state{{{SVC_T}, state="firing"}}) or vector(0)', instant=True)],
             "short", thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
        stat("Active findings", "Findings that held for enough diagnosis rounds to become active.",
             [Target(f'count(llm_latency_finding_confidence{{{SVC}, state="active"}}) or vector(0)',
                     instant=True)],
             "short", thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]),
        stat("Requests / s", "Finished requests per second over all selected engines.",
             [Target(f"sum({Q.requests()})", instant=True)], "reqps"),
        stat("Generated tokens / s", "Output tokens per second over all selected engines.",
             [Target(f"sum({Q.generation_tokens()})", instant=True)], "short"),
    ]
    summary = table(
        "Fleet summary",
        "The diagnosed verdict and the latest p99 TTFT and ITL (monitor, latency window) per target and model. "
        "TGI exports no TTFT histogram and its derived TTFT has no p99 value, only a bound (latency API), so "
        "its TTFT cell stays empty.",
        # the verdict comes first: every diagnosed target and model is a row, the quantiles join into it
        # (a TGI row has no TTFT p99 to lead with)
        [Target(ENGINE.with_labels(Q.rows("llm_latency_diagnosis_verdict", "target, model, verdict")), instant=True,
                table=True),
         Target(ENGINE.with_labels(f"max by (target, model) ({Q.quantile('ttft', '0.99')})"), instant=True,
                table=True),
         Target(ENGINE.with_labels(f"max by (target, model) ({Q.quantile('itl', '0.99')})"), instant=True,
                table=True)],
        [MERGE, organize(["Time", "Value #A"], {"Value #B": "TTFT p99", "Value #C": "ITL p99"},
                         ["target", "model", "verdict", "TTFT p99", "ITL p99"])],
        width=12, height=10,
        overrides=[by_name("TTFT p99", [{"id": "unit", "value": "s"}]),
                   by_name("ITL p99", [{"id": "unit", "value": "s"}]),
                   by_name("target", [{"id": "links", "value": [
                       {"title": "Drill down", "url": f"/d/{TARGET_UID}?{summary_link}"
                                                       "&${datasource:queryparam}&${__url_time_range}"}]}])])
    latency = [
        timeseries("TTFT p50 / p90 / p99 (monitor)",
                   "Time to first token per target, from the monitor's exact histogram quantiles over its latency "
                   "window (llm_latency_quantile_seconds). None for TGI: its TTFT derived from queue and prefill "
                   "has a mean and a bound per quantile, not a quantile.",
                   latency_quantiles("ttft", "{{target}} "), "s"),
        timeseries("ITL p50 / p90 / p99 (monitor)",
                   "Inter-token latency per target (one observation per engine step), from the monitor's "
                   "quantiles over its latency window.",
                   latency_quantiles("itl", "{{target}} "), "s"),
        slo_time_panel(12), slo_request_panel(12),
    ]
    return dashboard(
        FLEET_UID, "LLM Latency / Fleet overview",
        "Every monitored inference engine: regimes, SLO attainment, TTFT/ITL, why it is slow, findings and "
        "scrape health. Generated by grafana/generate.py -- do not edit by hand.",
        [("Status", status),
         ("Diagnosis", [regime_timeline(9), summary, alerts_table(12)]),
         ("Latency and SLOs", latency),
         ("Why is it slow", why_panels(per_target=False)),
         ("Findings", [findings_table(12), evidence_table(12)]),
         ("Client-side probes", probe_panels(per_target=False)),
         ("Scrape health", scrape_panels(per_target=False))],
        multi_target=True)


def target() -> dict:
    status = [
        stat("Diagnosis", "The current verdict of the monitor for this target.",
             [Target(Q.verdict_code(), "{{model}}", instant=True)], "", width=6, mappings=verdict_mappings(),
             text_mode="value_and_name"),
        stat("TTFT p99", "Monitor, latency window.", [Target(Q.quantile("ttft", "0.99"), "{{model}}",
                                                             instant=True)], "s",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": slo_threshold("ttft")}]),
        stat("ITL p99", "Monitor, latency window.", [Target(Q.quantile("itl", "0.99"), "{{model}}",
                                                           instant=True)], "s",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": slo_threshold("itl")}]),
        stat("Requests / s", "Finished requests per second (engine counter).",
             [Target(Q.requests(), instant=True)], "reqps"),
        stat("Scrape", "Last scrape by the monitor.", [Target(f"llm_latency_target_up{{{SVC_T}}}", instant=True)],
             "", width=2, mappings=UP_MAPPINGS,
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}]),
        stat("Open alerts", "Pending or firing alerts for this target.",
             [Target(f"count(llm_latency_alert_state{{{SVC_T}}}) or vector(0)", instant=True)], "short", width=4,
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
    ]
    latency = [
        timeseries("TTFT quantiles: monitor vs. engine buckets",
                   "Solid: the monitor's p50/p90/p99 over its latency window. Dashed: Prometheus' "
                   "histogram_quantile over the rate interval from the engine's own buckets (vLLM "
                   "time_to_first_token_seconds; TGI: queue + prefill-batch quantiles).",
                   latency_quantiles("ttft", "{{model}} monitor ")
                   + [Target(Q.engine_ttft_quantile(q), f"engine {label}") for q, label in QUANTILES], "s",
                   overrides=[by_ref(r, [DASHED]) for r in "DEF"]),
        timeseries("ITL quantiles: monitor vs. engine buckets",
                   "Solid: the monitor's p50/p90/p99. Dashed: histogram_quantile over the engine's buckets (vLLM "
                   "inter_token_latency_seconds; TGI decode batch_inference_duration).",
                   latency_quantiles("itl", "{{model}} monitor ")
                   + [Target(Q.engine_itl_quantile(q), f"engine {label}") for q, label in QUANTILES], "s",
                   overrides=[by_ref(r, [DASHED]) for r in "DEF"]),
        slo_time_panel(12), slo_request_panel(12),
    ]
    changed = [
        timeseries("TTFT mean: change by component vs $change_baseline earlier",
                   "The monitor's mean TTFT over its latency window now less the same $change_baseline earlier, "
                   "split into its exact parts: queue, prefill and the rest (means add; docs/changes.md). "
                   "GET /api/v1/targets/{name}/changes names the drivers.",
                   [Target(Q.mean_change("queue_time"), "{{model}} queue"),
                    Target(Q.mean_change("prefill_time"), "{{model}} prefill"),
                    Target(f"({Q.mean_change('ttft')}) - ignoring (signal) ({Q.mean_change('queue_time')}) "
                           f"- ignoring (signal) ({Q.mean_change('prefill_time')})", "{{model}} rest"),
                    Target(Q.mean_change("ttft"), "{{model}} TTFT")], "s",
                   overrides=[by_ref("D", [DASHED])], minimum=None),
        timeseries("ITL, decode and end-to-end mean: change vs $change_baseline earlier",
                   "The monitor's means now less the same $change_baseline earlier: ITL (per step), the decode "
                   "time and end-to-end (= TTFT + decode + the rest).",
                   [Target(Q.mean_change("itl"), "{{model}} ITL"),
                    Target(Q.mean_change("decode_time"), "{{model}} decode"),
                    Target(Q.mean_change("e2e"), "{{model}} end-to-end")], "s", minimum=None),
        timeseries("Drivers: change vs $change_baseline earlier",
                   "Each driver now over the same $change_baseline earlier, less 1: the request rate, the mean "
                   "prompt and output length (token counters over finished requests), the running batch; the "
                   "prefix-cache hit rate now less then (points: a share of 0 has no ratio).",
                   [Target(Q.relative_change(Q.requests()), "request rate"),
                    Target(Q.relative_change(f"({Q.prompt_tokens()}) / ({Q.requests()})"), "prompt length"),
                    Target(Q.relative_change(f"({Q.generation_tokens()}) / ({Q.requests()})"), "output length"),
                    Target(Q.relative_change(Q.running()), "running batch"),
                    Target(Q.absolute_change(Q.prefix_hit_rate()), "prefix-cache hit rate (points)")], "percentunit",
                   width=24, minimum=None),
    ]
    throughput = [
        timeseries("Token throughput",
                   "Prompt and generated tokens per second (vLLM prompt/generation_tokens_total; TGI the sums of "
                   "its per-request input/generated length histograms).",
                   [Target(Q.prompt_tokens(), "prompt tokens/s"), Target(Q.generation_tokens(), "generated tokens/s")],
                   "short"),
        timeseries("TGI: prefill batches merged into the running batch",
                   "TGI pauses every running decode while a new prefill batch runs; merges per second by reason "
                   "(backpressure = KV budget, wait_exceeded, chunking). Empty for vLLM.",
                   [Target(Q.tgi_prefill_merges(), "{{reason}}")], "short"),
    ]
    return dashboard(
        TARGET_UID, "LLM Latency / Target drill-down",
        "One target in depth: the monitor's quantiles next to the engine's own buckets, what changed since a "
        "baseline, the TTFT split, batch and KV-cache state, findings with evidence and remedies, scrape health. "
        "Generated by grafana/generate.py -- do not edit by hand.",
        [("Now", status),
         ("Diagnosis", [regime_timeline(6), findings_table(12), evidence_table(12)]),
         ("Latency and SLOs", latency),
         ("What changed", changed),
         ("Why is it slow", why_panels(per_target=True) + throughput),
         ("Client-side probes", probe_panels(per_target=True)),
         ("Alerts and scrape health", [alerts_table(12)] + scrape_panels(per_target=True))],
        multi_target=False,
        extra_variables=[custom_variable("change_baseline", "Compare with", ("1h", "1d", "7d"), "1d",
                                         "The What changed row compares now with this long earlier.")])


SLO = 'slo=~"$slo"'  # the slos: section's series, per SLO
BURN_STEPS = [{"color": "green", "value": None}, {"color": "yellow", "value": 1}, {"color": "orange", "value": 6},
              {"color": "red", "value": 14.4}]  # the SRE workbook's burn-rate factors (defaults of burn_alerts)


def slos() -> dict:
    """The ``slos:`` section and the capacity signal, from the monitor's own gauges."""
    budget_steps = [{"color": "red", "value": None}, {"color": "orange", "value": 0},
                    {"color": "yellow", "value": 0.25}, {"color": "green", "value": 0.5}]
    budgets = [
        stat("Error budget left", "Share of each SLO's error budget not spent over its period "
             "(llm_latency_slo_error_budget_remaining; negative: overspent). Matched targets together.",
             [Target(f"llm_latency_slo_error_budget_remaining{{{SLO}}}", "{{slo}}", instant=True)], "percentunit",
             width=8, height=6, thresholds=budget_steps),
        stat("Burn rates now", "Burn rate over each window (1 = the budget lasts exactly the period); by default "
             "the page alerts fire above 14.4x over 1 h and 5 m, or 6x over 6 h and 30 m.",
             [Target(f"llm_latency_slo_burn_rate{{{SLO}}}", "{{slo}} {{window}}", instant=True)],
             "suffix:x", width=8, height=6, thresholds=BURN_STEPS),
        stat("Budget exhausted in", "At the current burn rate (absent when nothing burns).",
             [Target(f"llm_latency_slo_time_to_exhaustion_seconds{{{SLO}}}", "{{slo}}", instant=True)], "s",
             width=4, height=6, thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 86400},
                                            {"color": "green", "value": 7 * 86400}]),
        stat("Period covered", "Share of each SLO's period with data: below 100 % the SLI and budget are over what "
             "exists (a new service, or a period longer than the data kept).",
             [Target(f"llm_latency_slo_period_coverage{{{SLO}}}", "{{slo}}", instant=True)], "percentunit",
             width=4, height=6),
        timeseries("Error budget left over time", "llm_latency_slo_error_budget_remaining per SLO.",
                   [Target(f"llm_latency_slo_error_budget_remaining{{{SLO}}}", "{{slo}}")], "percentunit",
                   minimum=None),
        timeseries("SLI per window", "Share of requests at or under the SLO's threshold over each alert window and "
                   "the period (llm_latency_slo_sli), matched targets together.",
                   [Target(f"llm_latency_slo_sli{{{SLO}}}", "{{slo}} {{window}}")], "percentunit", minimum=None,
                   maximum=1),
    ]
    burn = [
        timeseries("Burn rate per window", "Error-budget burn rate over each alert window (llm_latency_slo_burn_rate);"
                   " an alert fires when both of its windows exceed its factor.",
                   [Target(f"llm_latency_slo_burn_rate{{{SLO}}}", "{{slo}} {{window}}")], "suffix:x"),
        timeseries("Burn rate per target", "Each matched target's burn rate over each window "
                   "(llm_latency_slo_target_burn_rate): which replica spends the budget.",
                   [Target(f"llm_latency_slo_target_burn_rate{{{SLO}, {SVC_T}}}", "{{slo}} {{target}} {{window}}")],
                   "suffix:x"),
        table("Burn-rate alerts", "Pending and firing LLMLatencySLOBurnRate alerts of the monitor.",
              [Target(f'llm_latency_alert_state{{alertname="LLMLatencySLOBurnRate", {SVC_T}}}', instant=True,
                      table=True)],
              [organize(["Time", "Value", "__name__", "instance", "job"], {}, ["alertname", "target", "severity",
                                                                              "state"])], width=12, height=6),
        table("Targets not evaluated", "Targets an SLO matches but cannot evaluate (no bucket at the threshold, no "
              "histogram of the signal, a failing source): llm_latency_slo_target_error == 1.",
              [Target(f"llm_latency_slo_target_error{{{SLO}, {SVC_T}}} == 1", instant=True, table=True)],
              [organize(["Time", "Value", "__name__", "instance", "job"], {}, ["slo", "target"])],
              width=12, height=6, sort_by="slo"),
    ]
    capacity = [
        timeseries("Replicas: desired vs. current", "llm_latency_capacity_desired_replicas (solid, the largest over "
                   "models) next to the replicas it was computed for (dashed): what an autoscaler would do "
                   "(deploy/autoscaling/).",
                   [Target(f"max by (target) (llm_latency_capacity_desired_replicas{{{SVC}}})", "{{target}} desired"),
                    Target(f"max by (target) (llm_latency_capacity_current_replicas{{{SVC}}})", "{{target}} current")],
                   "short", overrides=[by_ref("B", [DASHED])]),
        timeseries("Capacity utilization", "The largest load input (1 = exactly the current replicas): requests "
                   "in the engine over its batch, KV-cache usage over 0.8, arrivals over completions.",
                   [Target(f"llm_latency_capacity_utilization{{{SVC}}}", "{{target}} · {{model}}")], "percentunit"),
        table("Does scaling help?", "llm_latency_capacity_scaling_helps per target and model: 0 holds the replica "
              "count, and reason names the regime more replicas do not fix.",
              [Target(f"llm_latency_capacity_scaling_helps{{{SVC}}}", instant=True, table=True)],
              [organize(["Time", "__name__", "instance", "job"], {"Value": "scaling helps"},
                        ["target", "model", "reason", "scaling helps"])], width=12, height=6),
        regime_timeline(6),
    ]
    slo_variable = query_variable("slo", "SLO", "label_values(llm_latency_slo_objective, slo)", multi=True,
                                  description="An SLO of the slos: section of the targets YAML.")
    return dashboard(
        SLO_UID, "LLM Latency / SLOs and capacity",
        "Error budgets, SLIs and burn rates per window of the slos: section (the monitor's llm_latency_slo_* "
        "gauges), and the capacity signal an autoscaler acts on. Generated by grafana/generate.py -- do not edit "
        "by hand.",
        [("Error budgets", budgets), ("Burn rates", burn), ("Capacity", capacity)],
        multi_target=True, extra_variables=[slo_variable], engine_annotations=False)


DASHBOARDS = {"llm-latency-fleet.json": fleet, "llm-latency-target.json": target, "llm-latency-slo.json": slos}


def render(engine: EngineLabels | None = None) -> dict[str, str]:
    """File name -> JSON text of every dashboard (scrape mode, or ``engine``'s labels)."""
    global ENGINE
    previous, ENGINE = ENGINE, engine or EngineLabels()
    try:
        return {name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()}
    finally:
        ENGINE = previous


def check(directory: Path, engine: EngineLabels | None = None) -> list[str]:
    """Problems that make the committed dashboards differ from the generated ones."""
    problems = []
    wanted = render(engine)
    for name, text in wanted.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        current = path.read_text(encoding="utf-8")
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{path} (committed)",
                                             f"{path} (generated)", lineterm="", n=1))
            problems.append(f"{path}: stale\n" + "\n".join(diff[:30]) + ("\n..." if len(diff) > 30 else ""))
    for path in sorted(directory.glob("*.json")):
        if path.name not in wanted:
            problems.append(f"{path}: not generated by grafana/generate.py (remove it or add it to DASHBOARDS)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DASHBOARD_DIR, help="Dashboard directory.")
    parser.add_argument("--check", action="store_true", help="Exit 1 if the committed JSON is stale.")
    parser.add_argument("--config", type=Path, help="Targets YAML: with a Prometheus source, the engine panels use its "
                                                    "target labels and selector (needs --out).")
    parser.add_argument("--source", help="The source to generate for, when the config has several.")
    args = parser.parse_args(argv)
    try:
        engine = engine_labels(args.config, args.source)
    except ValueError as exc:  # ConfigError included: one line per problem, no traceback
        print(str(exc), file=sys.stderr)
        return 2
    if engine.source and args.out.resolve() == DASHBOARD_DIR.resolve():
        print(f"--config {args.config} has a Prometheus source: write its dashboards elsewhere with --out DIR "
              f"({DASHBOARD_DIR} holds the scrape-mode dashboards)", file=sys.stderr)
        return 2
    command = "python3 grafana/generate.py" + (f" --config {args.config} --out {args.out}" if engine.source else "")
    if args.check:
        problems = check(args.out, engine)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print(f"regenerate with: {command}", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render(engine).items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
