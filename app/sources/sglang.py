"""SGLang adapter (``sglang:`` prefix, needs ``--enable-metrics``), 0.3 through 0.5.

Releases name things differently, and the tables below list every name, newest first:

* 0.3 labels its series ``name="<model>"`` instead of ``model_name``, calls the gauges
  ``num_requests_running`` / ``num_requests_waiting``, the queue-time histogram
  ``waiting_request_latency_seconds``, the per-request token histograms
  ``request_prompt_tokens`` / ``request_generation_tokens`` and counts finished requests in
  ``request_success_total{finished_reason}``; ``decode_request_latency_seconds`` is the decode time.
* 0.4.0-0.4.3 has no queue-time histogram at all (only the ``num_queue_reqs`` gauge: the
  queueing rule then reads the gauges, see :mod:`app.diagnosis.rules.queueing`) and names
  the ITL ``time_per_output_token_seconds``.
* 0.4.6+ and 0.5 have ``queue_time_seconds``, ``inter_token_latency_seconds``, the token
  histograms ``prompt_tokens_histogram`` / ``generation_tokens_histogram``, and for P/D
  disaggregation, speculative decoding and DP attention the families below.

0.5's ``per_stage_req_latency_seconds{stage=...}`` (seconds) is read for the stages no histogram of
their own times (:data:`TABLE`): ``prefill_forward`` (first scheduled -> first token) as ``prefill_time``,
so the prefill rules can be judged on SGLang too; on a P/D decode worker, where nothing is prefilled,
``fake_output`` (its first step: the prebuilt batch that emits the prefill worker's first token) instead.

P/D disaggregation (0.5.23, ``python/sglang/srt/observability/req_time_stats.py`` and
``disaggregation/``): a request goes to both workers at once. The decode worker handshakes with the
prefill worker and reserves KV memory for it (the prealloc queue, stage ``decode_bootstrap``; its
memory wait alone is ``kv_transfer_alloc_ms``), then waits for the KV (the transfer queue, stage
``decode_transferred``: the prefill worker's queue and prefill, which start only once the memory is
reserved, and the transfer itself), then queues for its first step (``queue_time_seconds``, stage
``decode_waiting``). ``kv_transfer_latency_ms`` (the transfer alone, in **milliseconds**, buckets
1 ... 5000; bounds and sum divided by 1000 so ``kv_transfer_time`` is in seconds like every other time
signal; else the stage ``prefill_transfer_kv_cache``), ``kv_transfer_speed_gb_s`` and
``kv_transfer_total_mb`` are observed on the **prefill** worker only: a decode worker's page has no
sample of them. Both sides count ``num_transfer_failed_reqs_total``; the decode worker exports the
queues as gauges (``num_decode_prealloc_queue_reqs``, ``num_decode_transfer_queue_reqs``) and the
share of its KV pool held for pending transfers (``prealloc_full_token_usage``).
0.4.x exported ``kv_transfer_latency_ms`` as a gauge (the last transfer only): not a distribution, so
not read.
The P/D role: 0.4.4+ label the scheduler metrics ``engine_type`` (``unified`` | ``prefill`` |
``decode``), the engine's own ``--disaggregation-mode``; it is kept as the info
``disaggregation`` (``disaggregation_mode``) per model and rank, read from ``num_running_reqs``
(:func:`app.latency.pd_role`).
Speculative decoding: the scheduler logs ``spec_accept_rate`` / ``spec_accept_length`` at every
stats interval whether or not speculation is on, 0 when it is off (its stats' defaults); a
speculating engine's accept length is at least 1 (the bonus token), so series whose
``spec_accept_length`` is 0 are not read as speculation (else every SGLang page would show a 0 %
acceptance rate).
``dp_attention_token_imbalance_ratio`` is read where it is a gauge; releases that export it as a
histogram are compared rank by rank from the running/waiting gauges instead (a note says so).
Scheduler time (0.5.20+, ``metrics_reporter.py``'s time accounting, flushed about every second):
``scheduler_stage_seconds_total{category, forward_overlap}`` is the loop's wall time split into
exclusive stages, so its sum over both labels is the loop's wall time (``scheduler_loop_seconds_total``);
``scheduler_idle_seconds_total`` the part with no runnable or queued work;
``scheduler_process_cpu_seconds_total`` the process's CPU time (``time.process_time``, every thread);
``forward_execution_seconds_total{category}`` the GPU's forward-pass time, measured only with
``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`` (``gpu_busy_seconds_total``).
"""

from __future__ import annotations

from app.exposition.parser import MetricFamily, ParsedPage
from app.sources.base import (
    DISAGGREGATION_INFO,
    Canonical,
    CanonicalHistogram,
    CanonicalInfo,
    CanonicalScalar,
    first_family,
    histogram_series,
    scalar_series,
)

GROUP = ("model_name", "dp_rank")
GROUP_03 = ("name", "dp_rank")  # SGLang 0.3 named the model label ``name``
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "tpot": ("sglang:request_time_per_output_token_seconds",),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "queue_time": ("sglang:queue_time_seconds", "sglang:waiting_request_latency_seconds"),
    "decode_time": ("sglang:decode_request_latency_seconds",),
    "prompt_tokens": ("sglang:prompt_tokens_histogram", "sglang:request_prompt_tokens"),
    "generation_tokens": ("sglang:generation_tokens_histogram", "sglang:request_generation_tokens"),
}
STAGE_FAMILY = "sglang:per_stage_req_latency_seconds"
#: Histograms read with a unit scale to seconds or a label filter: signal -> (family, scale, label filter),
#: first present wins (the milliseconds histograms are 0.5's P/D families).
TABLE: dict[str, tuple[tuple[str, float, dict[str, str] | None], ...]] = {
    "prefill_time": ((STAGE_FAMILY, 1.0, {"stage": "prefill_forward"}), (STAGE_FAMILY, 1.0, {"stage": "fake_output"})),
    "kv_transfer_time": (("sglang:kv_transfer_latency_ms", 1000.0, None),
                         (STAGE_FAMILY, 1.0, {"stage": "prefill_transfer_kv_cache"})),
    "kv_wait_time": ((STAGE_FAMILY, 1.0, {"stage": "decode_transferred"}),),
    "prealloc_time": ((STAGE_FAMILY, 1.0, {"stage": "decode_bootstrap"}),),
    "kv_alloc_time": (("sglang:kv_transfer_alloc_ms", 1000.0, None),),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs", "sglang:num_requests_running"),
    "waiting": ("sglang:num_queue_reqs", "sglang:num_requests_waiting", "sglang:queue_req"),
    "kv_usage": ("sglang:token_usage",),
    "spec_accept_rate": ("sglang:spec_accept_rate",),
    "spec_accept_length": ("sglang:spec_accept_length",),
    "dp_token_imbalance_ratio": ("sglang:dp_attention_token_imbalance_ratio",),
    "transfer_queue": ("sglang:num_decode_transfer_queue_reqs",),
    "prealloc_queue": ("sglang:num_decode_prealloc_queue_reqs",),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens_total": ("sglang:prompt_tokens_total",),
    "generation_tokens_total": ("sglang:generation_tokens_total",),
    "preemptions_total": ("sglang:num_retracted_requests_total",),
    "requests_total": ("sglang:num_requests_total", "sglang:request_success_total"),
    "kv_transfer_failures_total": ("sglang:num_transfer_failed_reqs_total",),
    "scheduler_loop_seconds_total": ("sglang:scheduler_stage_seconds_total",),
    "scheduler_idle_seconds_total": ("sglang:scheduler_idle_seconds_total",),
    "scheduler_cpu_seconds_total": ("sglang:scheduler_process_cpu_seconds_total",),
    "gpu_busy_seconds_total": ("sglang:forward_execution_seconds_total",),
}
#: The family whose ``engine_type`` label says the worker's P/D role (every scheduler family carries it).
ROLE_FAMILY = "sglang:num_running_reqs"
#: ``spec_num_draft_tokens`` is a configured value (drafts per step), kept as configuration.
SPEC_CONFIG = "sglang:spec_num_draft_tokens"
FAMILIES = frozenset({n for table in (HISTOGRAMS, GAUGES, COUNTERS) for names in table.values() for n in names}
                     | {name for candidates in TABLE.values() for name, _, _ in candidates} | {SPEC_CONFIG})


def group_of(family: MetricFamily) -> tuple[str, str]:
    """``(model label, rank label)`` of a family: ``name`` on 0.3 pages, else ``model_name``."""
    for sample in family.samples:
        if "model_name" in sample.labels:
            return GROUP
        if "name" in sample.labels:
            return GROUP_03
    return GROUP


SPEC_GAUGES = ("spec_accept_rate", "spec_accept_length")


def _speculating(page: ParsedPage) -> set[tuple[str, ...]]:
    """The (model, rank) series whose engine speculates: an accept length above 0 (see the module notes)."""
    family = page.families.get("sglang:spec_accept_length")
    if family is None:
        return set()
    return {key for key, value in scalar_series(family, group_of(family)).items() if value > 0}


def _scaled(bounds: tuple[float, ...], counts: tuple[float, ...], total: float, scale: float
            ) -> tuple[tuple[float, ...], float]:
    if scale == 1.0:
        return bounds, total
    # division, not multiplication by 0.001: 5 / 1000 is the double nearest 0.005, 5 * 0.001 is not
    return tuple(b / scale for b in bounds), total / scale


def roles(family: MetricFamily | None) -> list[CanonicalInfo]:
    """The ``engine_type`` of each (model, rank) of a scheduler family, as ``disaggregation`` infos."""
    if family is None:
        return []
    model_label, rank_label = group_of(family)
    found = {(sample.labels.get(model_label, ""), sample.labels.get(rank_label) or "0"): sample.labels["engine_type"]
             for sample in family.samples if sample.labels.get("engine_type")}
    return [CanonicalInfo(DISAGGREGATION_INFO, model, rank, {"disaggregation_mode": mode})
            for (model, rank), mode in sorted(found.items())]


class SglangAdapter:
    name = "sglang"
    family_prefixes = ("sglang:",)
    families = FAMILIES

    def detect(self, page: ParsedPage) -> bool:
        return any(name.startswith("sglang:") for name in page.families)

    def to_canonical(self, page: ParsedPage) -> Canonical:
        out = Canonical(engine=self.name)
        for signal, candidates in HISTOGRAMS.items():
            family = first_family(page, candidates)
            if family is not None and family.type in ("histogram", "untyped"):
                self._histogram(out, signal, family, group_of(family))
        for signal, tabled in TABLE.items():
            for name, scale, label_filter in tabled:
                family = page.families.get(name)
                if family is not None and family.type in ("histogram", "untyped") \
                        and self._histogram(out, signal, family, group_of(family), scale, label_filter):
                    break
        speculating = _speculating(page)
        for kind, table in (("gauge", GAUGES), ("counter", COUNTERS)):
            for signal, candidates in table.items():
                family = first_family(page, candidates)
                if family is None:
                    continue
                if signal == "dp_token_imbalance_ratio" and family.type != "gauge":
                    out.notes.append("sglang:dp_attention_token_imbalance_ratio is a histogram on this page: "
                                     "ranks are compared by their running and waiting requests")
                    continue
                for (model, rank), value in scalar_series(family, group_of(family)).items():
                    if signal in SPEC_GAUGES and (model, rank) not in speculating:
                        continue
                    out.scalars.append(CanonicalScalar(signal, kind, model, rank or "0", value))
        spec = page.families.get(SPEC_CONFIG)
        if spec is not None:
            for (model, rank), value in scalar_series(spec, group_of(spec)).items():
                out.infos.append(CanonicalInfo("speculative_config", model, rank or "0",
                                               {"num_draft_tokens": f"{value:g}"}))
        out.infos += roles(page.families.get(ROLE_FAMILY))
        return out

    @staticmethod
    def _histogram(out: Canonical, signal: str, family: MetricFamily, group: tuple[str, str], scale: float = 1.0,
                   label_filter: dict[str, str] | None = None) -> bool:
        series = histogram_series(family, group, out.problems, label_filter)
        for (model, rank), (bounds, counts, total, count) in series.items():
            bounds, total = _scaled(bounds, counts, total, scale)
            out.histograms.append(CanonicalHistogram(signal, model, rank or "0", bounds, counts, total, count))
        return bool(series)
