"""What one target served over a window, independent of where the samples live.

The built-in store (:func:`app.store.reads.store_window`) and a Prometheus source
(:mod:`app.promsource.reader`) each fill a :class:`TargetWindow`; everything downstream -
the latency report (:func:`app.latency.report_from_window`), the diagnosis signals
(:func:`app.diagnosis.signals.from_window`), the SLO conditions - reads only this type, so
a regime is judged by one computation whichever source the numbers came from.

Conventions shared by both producers:

* a histogram is ``sum by (le) (increase(x_bucket[w]))`` over the target's data-parallel
  ranks (plus ``_sum``/``_count``), per model and over all models;
* a gauge is the per-series mean/max/last over the window's samples, summed across ranks
  (averaged for :data:`AVERAGED_GAUGES`, a share such as KV usage);
* a counter is ``sum(rate(x[w]))`` across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.sources.base import CanonicalInfo

# Gauges that must be averaged, not summed, across ranks and targets: a KV usage of
# 0.5 on each of two engines is 0.5, not 1.0 (GoogleCloudPlatform dashboards PR #1188); so are the
# LoRA slot gauges, each replica's own comparison of its adapters with its slots.
AVERAGED_GAUGES = frozenset({"kv_usage", "spec_accept_rate", "spec_accept_length", "dp_token_imbalance_ratio",
                             "lora_max_adapters", "lora_adapters_in_demand", "lora_slot_wait"})
# Gauges also kept per data-parallel rank (only when a target has more than one), for the
# comparison between the ranks of one engine (``dp_imbalance``).
RANK_GAUGES = ("running", "waiting", "kv_usage")
# Histograms whose mean (``_sum / _count`` over the window) is also kept per rank: the time a
# request waits on the rank it was given (vLLM's ``engine`` and SGLang's ``dp_rank`` label the
# queue-time histogram too), evidence of which rank queues.
RANK_MEANS = ("queue_time",)


@dataclass(frozen=True, slots=True)
class GaugeStats:
    """A gauge over the window: last sample, sample mean and maximum (combined across ranks)."""

    last: float
    mean: float
    max: float


@dataclass(frozen=True, slots=True)
class TailProbe:
    """Buckets needed only if a tail may be there: read the histograms ``then`` of a target when
    its ``signal`` quantile ``q`` may be above ``threshold`` for one of ``limits`` ((q, threshold)
    pairs), which a few buckets a target decide (a source's means-first read,
    :meth:`app.promsource.reader.SourceReader.at_most`)."""

    signal: str
    limits: tuple[tuple[float, float], ...]
    then: frozenset[str]


@dataclass(frozen=True, slots=True)
class ItlInterval:
    """Decode steps between two consecutive samples and the running batch around them:
    the raw material of the "ITL by batch size" split (single request vs. under load)."""

    itl_sum: float    # seconds of inter-token time added in the interval
    itl_count: float  # decode steps (tokens) added in the interval
    running: float    # running requests, mean of the interval's two ends


@dataclass(slots=True)
class ModelWindow:
    """One model's (or all models') numbers over the window.

    ``histograms`` holds every signal whose series exist, mapped to its window histogram,
    or to None when the series exist but had fewer than two samples in the window (no
    ``increase``): a present-but-empty signal differs from an engine that never exports it.
    """

    histograms: dict[str, WindowHistogram | None] = field(default_factory=dict)
    gauges: dict[str, GaugeStats] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # counter signal -> per second
    itl_intervals: list[ItlInterval] = field(default_factory=list)
    ranks: dict[str, dict[str, float]] = field(default_factory=dict)  # rank -> RANK_GAUGES/RANK_MEANS signal -> mean


@dataclass(slots=True)
class TargetWindow:
    """One target (or a group of targets summed by ``le``) over ``[start, end]``."""

    start: float
    end: float
    overall: ModelWindow = field(default_factory=ModelWindow)
    models: dict[str, ModelWindow] = field(default_factory=dict)
    scrapes: int = 0  # successful scrapes in the window
    infos: list[CanonicalInfo] = field(default_factory=list)  # engine configuration (info metrics)
    replicas: dict[str, TargetWindow] = field(default_factory=dict)  # a service's replicas, by target name
    # series its source sent that could not be read, and why: (signal, reason) -> series
    # (app.promsource.answers.BAD_SERIES_REASONS); the numbers above are without them
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    # counter resets in the window (an engine restart sets every counter back to zero): the most any
    # one counter series of the target shows, summed over a service's replicas; None: not read (only a
    # diagnosis read counts them)
    restarts: int | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


def combine_gauges(signal: str, per_series: list[GaugeStats]) -> GaugeStats:
    """Ranks (or targets) of one gauge combined: summed, or averaged for a share."""
    n = len(per_series)
    if signal in AVERAGED_GAUGES:
        return GaugeStats(sum(g.last for g in per_series) / n, sum(g.mean for g in per_series) / n,
                          sum(g.max for g in per_series) / n)
    return GaugeStats(sum(g.last for g in per_series), sum(g.mean for g in per_series),
                      sum(g.max for g in per_series))


def _merge_models(models: list[ModelWindow]) -> ModelWindow:
    merged = ModelWindow()
    for signal in sorted({s for m in models for s in m.histograms}):
        merged.histograms[signal] = quantiles.merge(m.histograms.get(signal) for m in models)
    for signal in sorted({s for m in models for s in m.gauges}):
        merged.gauges[signal] = combine_gauges(signal, [m.gauges[signal] for m in models if signal in m.gauges])
    for signal in sorted({s for m in models for s in m.rates}):
        merged.rates[signal] = sum(m.rates[signal] for m in models if signal in m.rates)
    merged.itl_intervals = [i for m in models for i in m.itl_intervals]
    return merged


def shared_infos(windows: Sequence[TargetWindow]) -> list[CanonicalInfo]:
    """The configuration all of ``windows`` report: per info series (name, model, rank) every
    one has, the labels whose values they all share. A service is judged on what holds for all
    its replicas (``cpu_offload_gb="0"`` everywhere: no weights offloaded); a label they differ
    in (``num_gpu_blocks``) says nothing of the service."""
    out = []
    for info in windows[0].infos if windows else ():
        same = [next((o for o in w.infos if (o.name, o.model, o.rank) == (info.name, info.model, info.rank)), None)
                for w in windows[1:]]
        if any(o is None for o in same):
            continue
        labels = {k: v for k, v in info.labels.items() if all(o is not None and o.labels.get(k) == v for o in same)}
        if labels:
            out.append(CanonicalInfo(info.name, info.model, info.rank, labels))
    return out


def merge_windows(replicas: dict[str, TargetWindow], start: float, end: float) -> TargetWindow:
    """A service: its replicas summed by ``le`` (gauges summed, KV usage averaged, rates
    summed), with the configuration they all share, keeping each replica's own window for the
    comparison between them."""
    names = sorted(replicas)
    windows = [replicas[n] for n in names]
    merged = TargetWindow(start, end, overall=_merge_models([w.overall for w in windows]),
                          scrapes=max((w.scrapes for w in windows), default=0), infos=shared_infos(windows),
                          replicas=dict(replicas))
    for model in sorted({m for w in windows for m in w.models}):
        merged.models[model] = _merge_models([w.models[model] for w in windows if model in w.models])
    counted = [w.restarts for w in windows if w.restarts is not None]
    merged.restarts = sum(counted) if counted else None
    for window in windows:
        for what, count in window.dropped.items():
            merged.dropped[what] = merged.dropped.get(what, 0) + count
    merged.dropped = dict(sorted(merged.dropped.items()))
    return merged
