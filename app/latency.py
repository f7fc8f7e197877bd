"""Latency answers from a window, whichever backend read it: each signal's summary (TGI's TTFT
derived from queue and prefill), the JSON of the latency answer, a point of a quantile series,
and a worker's part in prefill/decode disaggregation."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core import human, quantiles
from app.core.quantiles import LatencySummary, WindowHistogram
from app.sources.base import HISTOGRAM_SIGNALS
from app.sources.tgi import TTFT_DERIVATION
from app.window import ModelWindow, TargetWindow


def _bucket_json(bucket: tuple[float, float]) -> list[float | None]:
    """A bucket as JSON: ``[lower, upper]``, an infinite end as null (JSON has no Infinity)."""
    return [b if math.isfinite(b) else None for b in bucket]


@dataclass(frozen=True, slots=True)
class WindowSummary(LatencySummary):
    """One signal's summary in a latency answer. ``derivation`` is set when the engine has no
    histogram of the signal and it is computed from others (TGI's TTFT from queue and
    prefill): then the quantiles are None and ``bounds`` holds, per quantile, the interval
    the true quantile must lie in (:func:`derived_ttft`)."""

    derivation: str | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, summary: LatencySummary, derivation: str | None = None) -> WindowSummary:
        return cls(summary.p50, summary.p90, summary.p95, summary.p99, summary.mean, summary.count,
                   dict(summary.intervals), summary.count_estimate, derivation)

    @property
    def derived(self) -> bool:
        return self.derivation is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the quantiles, the bucket interval of each (``intervals``), whether the
        count is an extrapolated estimate, plus ``derived``/``derivation``/``bounds`` for a
        derived signal."""
        out: dict[str, Any] = {
            "p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99, "mean": self.mean,
            "count": self.count}
        if self.intervals:
            out["intervals"] = {key: _bucket_json(b) for key, b in self.intervals.items()}
        if self.count_estimate:
            out["count_estimate"] = True
        if self.derivation is not None:
            out["derived"] = True
            out["derivation"] = self.derivation
            out["bounds"] = {key: _bucket_json(b) for key, b in self.bounds.items()}
        return out


def derived_ttft(queue: WindowHistogram, prefill: WindowHistogram) -> WindowSummary:
    """TGI's TTFT from its queue and prefill histograms: the mean exactly, each quantile as a bound.

    Per request TTFT = Q + P (queue wait, then prefill), both >= 0. Means add:
    ``mean(T) = mean(Q) + mean(P)``, each from its own ``_sum/_count``. Quantiles do not: the
    sum of the two p99 is neither the p99 of the sum nor a bound of it in general. What holds
    for any dependence between Q and P:

    * lower: T >= Q and T >= P for every request, so ``q_T(a) >= max(q_Q(a), q_P(a))``;
    * upper: ``P(Q + P > x + y) <= P(Q > x) + P(P > y)``; with x = ``q_Q(b)``, y = ``q_P(b)``,
      ``b = (1 + a) / 2`` each tail is at most ``(1 - a) / 2``, so ``q_T(a) <= q_Q(b) + q_P(b)``
      (p99 needs the p99.5 of each part).

    The histograms only know which bucket holds each quantile, so the lower bound takes the
    buckets' lower edges and the upper bound their upper edges (:func:`quantiles.histogram_quantile_interval`);
    an upper edge of +Inf leaves the bound open. TGI's prefill histogram counts prefill *batches*,
    so where a batch holds several requests the bound is on the batch time a request waits.
    """
    queue_s, prefill_s = quantiles.summarize(queue), quantiles.summarize(prefill)
    bounds: dict[str, tuple[float, float]] = {}
    for key, q in quantiles.QUANTILES:
        lower_q = quantiles.histogram_quantile_interval(q, queue.bounds, queue.increases)
        lower_p = quantiles.histogram_quantile_interval(q, prefill.bounds, prefill.increases)
        upper_q = quantiles.histogram_quantile_interval((1 + q) / 2, queue.bounds, queue.increases)
        upper_p = quantiles.histogram_quantile_interval((1 + q) / 2, prefill.bounds, prefill.increases)
        if None in (lower_q, lower_p, upper_q, upper_p):
            continue
        assert lower_q and lower_p and upper_q and upper_p
        bounds[key] = (max(lower_q[0], lower_p[0], 0.0), upper_q[1] + upper_p[1])
    mean = None if queue_s.mean is None or prefill_s.mean is None else queue_s.mean + prefill_s.mean
    return WindowSummary(None, None, None, None, mean, queue_s.count, {}, queue_s.count_estimate,
                         TTFT_DERIVATION, bounds)


def summarize_histograms(histograms: dict[str, WindowHistogram | None]) -> dict[str, WindowSummary]:
    """The latency answer's per-signal summaries: every histogram signal with data in the
    window, plus TGI's TTFT derived from queue and prefill when the engine has no TTFT."""
    out: dict[str, WindowSummary] = {}
    for signal in HISTOGRAM_SIGNALS:
        merged = histograms.get(signal)
        if merged is not None:
            out[signal] = WindowSummary.of(quantiles.summarize(merged))
    queue, prefill = histograms.get("queue_time"), histograms.get("prefill_time")
    if "ttft" not in out and queue is not None and prefill is not None:
        out["ttft"] = derived_ttft(queue, prefill)
    return out


def summaries_dict(summaries: dict[str, WindowSummary]) -> dict[str, dict[str, Any]]:
    """Per-signal summaries in their JSON form."""
    return {signal: summary.to_dict() for signal, summary in summaries.items()}


def _scalars(window: ModelWindow) -> dict:
    """Counters as per-second rates (Prometheus rate()); gauges as last/mean/max over the window."""
    rate_out = {f"{signal.removesuffix('_total')}_per_second": value for signal, value in window.rates.items()}
    queries, hits = window.rates.get("prefix_cache_queries_total"), window.rates.get("prefix_cache_hits_total")
    if queries:
        rate_out["prefix_cache_hit_rate"] = (hits or 0.0) / queries
    gauges = {signal: {"last": g.last, "mean": g.mean, "max": g.max} for signal, g in window.gauges.items()}
    return {"rates": rate_out, "gauges": gauges}


def model_report(window: ModelWindow, seconds: float) -> dict:
    """One model's (or all models') numbers over a window of ``seconds`` in the latency answer's
    shape: ``window_seconds``, each signal's summary, ``rates`` and ``gauges``."""
    return {"window_seconds": seconds, **summaries_dict(summarize_histograms(window.histograms)), **_scalars(window)}


def report_from_window(window: TargetWindow, per_model: bool = True) -> dict:
    """The body of ``GET /api/v1/targets/{name}/latency`` (and the fleet variant)."""
    report: dict = {"start": window.start, "end": window.end, **model_report(window.overall, window.seconds)}
    if per_model:
        report["models"] = {model: {**summaries_dict(summarize_histograms(m.histograms)), **_scalars(m)}
                            for model, m in window.models.items() if m.histograms}
    if window.dropped:
        report["dropped_series"] = [{"signal": signal, "reason": reason, "series": n}
                                    for (signal, reason), n in window.dropped.items()]
    return report


#: A part of a request's latency and the whole it is part of, each with the requests its histogram
#: counts in a window: a part's quantile above the whole's says the two came from different requests.
PART_OF = (("queue_time", "ttft"), ("prefill_time", "ttft"), ("ttft", "e2e"))
REQUEST_SETS = {"queue_time": ("queue time", "the requests that left the queue in the window"),
                "prefill_time": ("prefill time", "those whose prefill ended in it"),
                "ttft": ("TTFT", "those that got their first token in it"),
                "e2e": ("end-to-end latency", "those that finished in it")}


def request_set_notes(report: Mapping[str, Any], keys: Sequence[str] = ("p50", "p90", "p99")) -> list[str]:
    """A note for each part whose quantile is above the same quantile of its whole (queue p50 above
    TTFT p50), none otherwise: per request the part is never longer, but each histogram counts a
    request when that part ends, so over one window the two hold different requests (a request that
    left the queue near the window's end gets its first token in the next), and each quantile is
    interpolated inside its own buckets."""
    notes = []
    for part, whole in PART_OF:
        a, b = report.get(part) or {}, report.get(whole) or {}
        above = [key for key in keys if isinstance(a.get(key), (int, float)) and isinstance(b.get(key), (int, float))
                 and a[key] > b[key]]
        if not above:
            continue
        (part_name, part_set), (whole_name, whole_set) = REQUEST_SETS[part], REQUEST_SETS[whole]
        pairs = "; ".join(f"{part_name} {key} {human.summary_quantile(a, key)} > {whole_name} {key} "
                          f"{human.summary_quantile(b, key)}" for key in above)
        notes.append(f"{pairs}: a request's {part_name} is part of its {whole_name}, but these percentiles are over "
                     f"different requests. Each histogram counts a request when that part ends: {part_name} "
                     f"{part_set}, {whole_name} {whole_set}; and each percentile is interpolated inside its own "
                     "buckets.")
    return notes


def series_point(t: float, merged: WindowHistogram | None, q: float | None) -> dict:
    """One point of a quantile series: ``histogram_quantile(q, …)`` of the window histogram
    ending at ``t`` (``q=None``: the mean), None where Prometheus would return nothing."""
    value = None
    if merged is not None:
        if q is None:
            value = merged.sum / merged.count if merged.count > 0 else None
        else:
            result = quantiles.histogram_quantile(q, merged.bounds, merged.increases)
            value = None if math.isnan(result) else result
    return {"ts": t, "value": value, "count": None if merged is None else merged.count}


PD_PREFILL_LABEL = "llm_latency_prefill_target"  # on a decode worker's target: the name of its prefill worker


PD_ROLES = ("prefill", "decode", "both")


KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}  # vLLM's KVTransferConfig.kv_role


LABELLED_ROLE_INFO = "pd_role_label"    # a Prometheus source's ``pd_role_label`` on the target, kept as an info


@dataclass(frozen=True, slots=True)
class PdRole:
    """A worker's part in prefill/decode disaggregation and what said so."""

    role: str    # one of PD_ROLES
    source: str  # e.g. "engine configuration: SGLang engine_type=decode"

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "source": self.source}


def pd_role(infos: Iterable[Any], present: Collection[str], engine: str, model: str | None = None
            ) -> PdRole | None:
    """The worker's P/D role, from the most direct statement there is.

    1. The engine's configuration: a ``kv_role`` label on an info metric (vLLM's
       ``--kv-transfer-config``: kv_producer / kv_consumer / kv_both; no vLLM release through
       0.34 exports it, it is read where an info metric carries it) or SGLang's ``engine_type``
       label (``prefill`` / ``decode``; ``unified`` is a worker that is not disaggregated).
    2. The target's own label (a Prometheus source's ``pd_role_label``, e.g. llm-d's
       ``llm-d.ai/role``), for engines whose configuration says nothing (vLLM).
    3. The metrics: a vLLM or TRT-LLM worker that records KV transfers (``present`` holds
       ``kv_transfer_time`` or ``kv_transfers_total``) reads them in, so it decodes.

    ``infos`` are :class:`app.sources.base.CanonicalInfo` or stored ``TargetInfo`` rows (name,
    model, labels); ``model`` keeps those of one model (and the model-less ones)."""
    relevant = [i for i in infos if model is None or i.model in (model, "")]
    for info in relevant:
        kv_role = info.labels.get("kv_role")
        if kv_role in KV_ROLES:
            return PdRole(KV_ROLES[kv_role], f"engine configuration: kv_role={kv_role} ({info.name})")
    for info in relevant:
        mode = info.labels.get("disaggregation_mode")
        if mode:
            if mode in ("prefill", "decode"):
                return PdRole(mode, f"engine configuration: SGLang engine_type={mode}")
            return None  # unified (or null): the engine says it is not disaggregated
    for info in relevant:
        if info.name == LABELLED_ROLE_INFO and info.labels.get("pd_role") in PD_ROLES:
            label, value = info.labels.get("label", ""), info.labels["pd_role"]
            return PdRole(value, f"target label {label}={value} (the engine's metrics do not say)")
    if engine != "sglang" and ("kv_transfer_time" in present or "kv_transfers_total" in present):
        return PdRole("decode", "metrics: it records KV-cache transfers, which are timed where they are read "
                                "(the decode side); its configuration does not say")
    return None


PD_NOTE = ("means over the window, each from the requests its stage finished in it (the prefill and decode "
           "workers see the same requests at different times); means add, quantiles do not")
#: The terms of a disaggregated request's TTFT, in the order a request passes them (``decode_prealloc``: SGLang's
#: handshake and KV-memory reservation on the decode worker, before the prefill starts; null elsewhere).
PD_TERMS = ("decode_prealloc", "prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_step")
LITTLE = "mean {gauge} / first tokens per second (Little's law; no histogram times it)"


def _report_mean(report: dict, signal: str) -> float | None:
    return (report.get(signal) or {}).get("mean")


def _little(report: dict, gauge: str) -> float | None:
    """Mean time in a queue by Little's law: requests in it on average / requests leaving it per
    second (those that got their first token in the window)."""
    waiting = ((report.get("gauges") or {}).get(gauge) or {}).get("mean")
    firsts, seconds = (report.get("ttft") or {}).get("count"), report.get("window_seconds")
    rate = firsts / seconds if firsts and seconds else 0.0  # a subnormal count over the window: 0
    if waiting is None or not rate:
        return None
    return waiting / rate


def _timed(report: dict, worker: str, signal: str, what: str, gauge: str | None) -> tuple[float | None, str]:
    """A worker's mean time in a stage: its histogram's mean, else Little's law on the gauge of
    the queue it waits in; and what said so."""
    mean = _report_mean(report, signal)
    if mean is not None:
        return mean, f"{worker} worker: {what}"
    estimate = _little(report, gauge) if gauge else None
    if estimate is not None:
        return estimate, f"{worker} worker: " + LITTLE.format(gauge=gauge)
    return None, f"{worker} worker: not exported"


def pd_terms(decode: dict, prefill: dict | None) -> dict:
    """The terms of a disaggregated request's TTFT (:data:`PD_TERMS`) from the latency answers
    (:func:`report_from_window` shape) of its decode worker and, when paired, its prefill side;
    ``sources`` names what each came from, ``kv_wait`` is the decode worker's own wait for the KV.

    The transfer: the decode worker's transfer histogram (vLLM NIXL, TensorRT-LLM: timed where the
    KV is read), else the prefill side's (SGLang observes ``kv_transfer_latency_ms`` where it is
    sent), else the decode worker's KV wait less the prefill side's queue and prefill (SGLang's
    decode worker reserves the memory first; the prefill worker queues and prefills only then, so
    the wait spans both and the transfer). Unpaired, that wait bounds the transfer from above only."""
    out: dict = {}
    sources: dict[str, str] = {}
    out["decode_prealloc"], sources["decode_prealloc"] = _timed(
        decode, "decode", "prealloc_time", "handshake and KV-memory reservation (SGLang stage decode_bootstrap)",
        "prealloc_queue")
    if prefill is not None:
        out["prefill_queue"], sources["prefill_queue"] = _timed(prefill, "prefill", "queue_time",
                                                                "queue-time histogram", "waiting")
        out["prefill"], sources["prefill"] = _timed(prefill, "prefill", "prefill_time", "prefill-time histogram",
                                                    None)
    else:
        out["prefill_queue"] = out["prefill"] = None
        sources["prefill_queue"] = sources["prefill"] = "no prefill worker paired with this decode worker"
    kv_wait, sources["kv_wait"] = _timed(decode, "decode", "kv_wait_time",
                                         "waiting for the KV (SGLang stage decode_transferred)", "transfer_queue")
    transfer = _report_mean(decode, "kv_transfer_time")
    if transfer is not None:
        sources["kv_transfer"] = "decode worker: its transfer-time histogram"
    elif prefill is not None and _report_mean(prefill, "kv_transfer_time") is not None:
        transfer = _report_mean(prefill, "kv_transfer_time")
        sources["kv_transfer"] = ("prefill worker: its transfer-time histogram (SGLang times a transfer where it "
                                  "is sent)")
    elif kv_wait is not None and out["prefill_queue"] is not None and out["prefill"] is not None:
        transfer = max(0.0, kv_wait - out["prefill_queue"] - out["prefill"])
        sources["kv_transfer"] = "decode worker's KV wait less the prefill worker's queue and prefill"
    else:
        sources["kv_transfer"] = ("not separable: the decode worker's KV wait also holds the prefill side's queue "
                                  "and prefill; pair it with its prefill worker") if kv_wait is not None else \
            "no transfer time on either worker"
    out["kv_transfer"] = transfer
    out["decode_queue"], sources["decode_queue"] = _timed(decode, "decode", "queue_time", "queue-time histogram",
                                                          "waiting")
    out["first_step"], sources["first_step"] = _timed(decode, "decode", "prefill_time",
                                                      "first scheduled -> first token", None)
    needed = [out[term] for term in PD_TERMS if term != "decode_prealloc"]
    total = None if any(v is None for v in needed) else sum(v for v in needed if v is not None) \
        + (out["decode_prealloc"] or 0.0)
    return {**{term: out[term] for term in PD_TERMS}, "kv_wait": kv_wait, "ttft_mean": total, "sources": sources}


def pd_split(decode: dict, prefill: dict, prefill_targets: Sequence[str]) -> dict:
    """A disaggregated request's TTFT assembled from the latency answers of its decode and prefill
    workers (:func:`pd_terms`): decode-side prealloc (SGLang) + prefill queue + prefill (prefill
    worker) + KV transfer + decode queue + first step (decode worker). Means, which add; a stage
    without data is null and so is the total (the prealloc counts where the engine has one).
    ``prefill`` may be several prefill replicas summed (a source's deployment)."""
    return {"prefill_target": ", ".join(prefill_targets), "prefill_targets": list(prefill_targets),
            **pd_terms(decode, prefill), "note": PD_NOTE}
