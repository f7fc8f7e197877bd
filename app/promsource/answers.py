"""How a source's answers read: bucket bounds, the family tag its queries set, histograms, and
the answers regrouped per target (and model, and rank).

The reader (:mod:`app.promsource.reader`) turns each answer's series into windows with these.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.promsource.queries import FAMILY_LABEL, INFO_FAMILIES, MODEL_LABEL, STAT_LABEL
from app.sources import tgi
from app.sources.base import DISAGGREGATION_INFO, CanonicalInfo
from app.window import GaugeStats, ItlInterval, ModelWindow, combine_gauges

TargetKey = tuple[str, ...]  # the values of the source's target labels, in their order
#: how a regrouping reports a series it drops: (target, signal, reason)
Drop = Callable[[TargetKey, str, str], None]
INFO_NAMES = {metric: name for name, metric in INFO_FAMILIES}


class AnswerSample(Protocol):
    labels: dict[str, str]
    value: float


class AnswerSeries(Protocol):
    labels: dict[str, str]
    points: list[tuple[float, float]]


def key_of(labels: dict[str, str], target_labels: Sequence[str]) -> TargetKey:
    """A series' target: its values of the target labels."""
    return tuple([labels.get(name, "") for name in target_labels])

#: Why a series of an answer was dropped (``llm_latency_source_bad_series_total{reason}``).
BAD_SERIES_REASONS = {
    "bad_bound": "a histogram bucket whose le label is not a number",
    "bad_count": "a count of scrapes or counter resets that is not a finite number >= 0",
    "bad_label": "a label the query sets itself that is not one it set",
}


def bound(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "+inf", "inf") else float(le)


def valid_le(le: str) -> bool:
    """A bucket's ``le`` (or the ``sum``/``count`` tag the query gives those series): a number, not NaN."""
    if le in ("sum", "count"):
        return True
    try:
        return not math.isnan(bound(le))
    except ValueError:
        return False


def family(labels: dict[str, str], families: int | None = None) -> int | None:
    """The candidate-family index the query tagged a series with; None when the label is not
    one it set (``families``: how many candidates the query had, when known)."""
    text = labels.get(FAMILY_LABEL, "0")
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        return None
    index = int(text)
    return index if families is None or index < families else None


def first_family(by_family: dict[int, Any]) -> Any:
    return by_family[min(by_family)]


def rescaled(buckets: dict[str, float], scale: float) -> dict[str, float]:
    """A histogram answer in another unit (SGLang's milliseconds) -> seconds: bounds and sum
    divided by ``scale`` (division, so 5 ms is the double nearest 0.005 s); counts unchanged."""
    if scale == 1.0:
        return buckets
    out = {}
    for le, value in buckets.items():
        if le == "sum":
            out[le] = value / scale
        elif le == "count" or bound(le) == math.inf:
            out[le] = value
        else:
            out[repr(bound(le) / scale)] = value
    return out


def histogram(buckets: dict[str, float], means_only: bool = False) -> WindowHistogram:
    """One answer's series of a target and model -> its window histogram (``means_only``: the
    query asked for ``_sum`` and ``_count`` alone)."""
    if means_only:
        return WindowHistogram((), (), buckets.get("sum", math.nan), buckets.get("count", math.nan), means_only=True)
    bounds = sorted((bound(le), v) for le, v in buckets.items() if le not in ("sum", "count"))
    count = buckets.get("count")
    if count is None:
        count = bounds[-1][1] if bounds and bounds[-1][0] == math.inf else math.nan
    return WindowHistogram(tuple(b for b, _ in bounds), tuple(v for _, v in bounds), buckets.get("sum", math.nan),
                           count)


@dataclass(frozen=True, slots=True)
class Around:
    """What a target's buckets around the thresholds tell (:meth:`app.promsource.reader.SourceReader._around`)."""

    above: bool  # one of its quantiles may be above its threshold
    histogram: WindowHistogram | None = None  # those buckets, where they tell every quantile exactly
    upward: bool = False  # its buckets L and U are the layout's and a quantile lies above U


def judge_around(h: WindowHistogram, total: float, limits: Sequence[tuple[float, float]],
                 around: list[tuple[float | None, float]]) -> Around:
    """:meth:`SourceReader._around` for one target: ``h`` holds its buckets ``L`` and ``U`` of each limit."""
    at = {bound: value for bound, value in zip(h.bounds, h.increases, strict=True)}
    if any((low is not None and low not in at) or up not in at for low, up in around):
        return Around(True)  # this target's layout differs: read its buckets
    above = False
    for (q, threshold), (low, up) in zip(limits, around, strict=True):
        rank = q * total
        if low is not None and at[low] >= rank:
            continue  # at or below L, at or below the threshold
        if up == math.inf:
            continue  # in +Inf: histogram_quantile gives L, at or below the threshold
        if at[up] < rank or low == up:
            return Around(True, upward=True)  # above U: its buckets from L up tell where
        above = above or quantiles.histogram_quantile(q, h.bounds, h.increases) > threshold
    return Around(above, h)


def judge_histogram(h: WindowHistogram | None, limits: Sequence[tuple[float, float]]) -> Around | None:
    """What one target's whole histogram tells: whether a quantile of ``limits`` lies above its
    threshold (``histogram_quantile``'s own answer); None without an observation in the window."""
    if h is None or not h.bounds or h.bounds[-1] != math.inf or not h.increases[-1] > 0:
        return None
    return Around(any(quantiles.histogram_quantile(q, h.bounds, h.increases) > threshold for q, threshold in limits), h)


def ranks(samples: Sequence[AnswerSample], target_labels: Sequence[str], drop: Drop
          ) -> dict[TargetKey, dict[str, dict[str, dict[str, float]]]]:
    """The per-rank loads' answer -> target -> model -> rank -> {gauge signal: mean}, from the first
    family per signal and target."""
    # target -> signal -> family -> model -> rank -> value
    grouped: dict[TargetKey, dict[str, dict[int, dict[str, dict[str, float]]]]] = defaultdict(dict)
    for sample in samples:
        index = family(sample.labels)
        signal = sample.labels.get(STAT_LABEL, "")
        if index is None:
            drop(key_of(sample.labels, target_labels), signal, "bad_label")
            continue
        rank = sample.labels.get("engine", sample.labels.get("dp_rank", "")) or "0"
        per_family = grouped[key_of(sample.labels, target_labels)].setdefault(signal, {})
        per_family.setdefault(index, {}).setdefault(sample.labels.get(MODEL_LABEL, ""), {})[rank] = sample.value
    out: dict[TargetKey, dict[str, dict[str, dict[str, float]]]] = {}
    for key, by_signal in grouped.items():
        per_model: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        for signal, by_family in by_signal.items():
            for model_name, by_rank in first_family(by_family).items():
                for rank, value in by_rank.items():
                    if not math.isnan(value):
                        per_model[model_name][rank][signal] = value
        out[key] = {m: dict(r) for m, r in per_model.items()}
    return out


def tgi_kv(series: Sequence[AnswerSeries], target_labels: Sequence[str]) -> dict[TargetKey, GaugeStats]:
    """TGI's used and capacity gauges' raw samples -> per target the KV usage's last, mean and max
    (their ratio sample by sample, as the scraper computes it)."""
    used: dict[TargetKey, dict[float, float]] = {}
    capacity: dict[TargetKey, dict[float, float]] = {}
    for s in series:
        side = used if s.labels.get("__name__") == tgi.KV_USED else capacity
        side.setdefault(key_of(s.labels, target_labels), {}).update(s.points)
    out = {}
    for key, used_points in used.items():
        cap = capacity.get(key, {})
        ratios = [min(u / cap[t], 1.0) for t, u in sorted(used_points.items()) if cap.get(t)]
        if ratios:
            out[key] = GaugeStats(ratios[-1], sum(ratios) / len(ratios), max(ratios))
    return out


def infos(samples: Sequence[AnswerSample], target_labels: Sequence[str]) -> dict[TargetKey, list[CanonicalInfo]]:
    """The configuration's info series -> per target its canonical infos."""
    out: dict[TargetKey, list[CanonicalInfo]] = defaultdict(list)
    skip = {"__name__", MODEL_LABEL, "engine", *target_labels}
    for sample in samples:
        name = INFO_NAMES.get(sample.labels.get("__name__", ""))
        if name is None:
            continue
        labels = {k: v for k, v in sample.labels.items() if k not in skip}
        if name == "sleep_state":
            if not sample.value:
                continue
            labels = {"sleep_state": sample.labels.get("sleep_state", "")}
        elif name == DISAGGREGATION_INFO:  # as the SGLang adapter keeps it (app.sources.sglang.roles)
            if not sample.labels.get("engine_type"):
                continue
            labels = {"disaggregation_mode": sample.labels["engine_type"]}
        out[key_of(sample.labels, target_labels)].append(
            CanonicalInfo(name, sample.labels.get(MODEL_LABEL, ""),
                          sample.labels.get("engine") or sample.labels.get("dp_rank") or "0", labels))
    return out


def itl_intervals(series: Sequence[AnswerSeries], target_labels: Sequence[str], drop: Drop
                  ) -> dict[TargetKey, dict[str, list[ItlInterval]]]:
    """The ITL-by-batch split's answer -> per target and model its steps (ITL sum, count, mean batch)."""
    # target -> family -> (model, rank) -> stat -> {t: value}
    grouped: dict[TargetKey, dict[int, dict[tuple[str, str], dict[str, dict[float, float]]]]] = \
        defaultdict(dict)
    for s in series:
        index = family(s.labels)
        if index is None:
            drop(key_of(s.labels, target_labels), "itl", "bad_label")
            continue
        rank = s.labels.get("engine", s.labels.get("dp_rank", ""))
        ranks = grouped[key_of(s.labels, target_labels)].setdefault(index, {})
        ranks.setdefault((s.labels.get(MODEL_LABEL, ""), rank), {})[s.labels.get(STAT_LABEL, "")] = \
            dict(s.points)
    out: dict[TargetKey, dict[str, list[ItlInterval]]] = {}
    for key, by_family in grouped.items():
        per_model: dict[str, list[ItlInterval]] = defaultdict(list)
        for (model_name, _), stats in sorted(first_family(by_family).items()):
            sums, counts, running = stats.get("sum", {}), stats.get("count", {}), stats.get("running", {})
            for t in sorted(counts):
                d_count, d_sum, batch = counts[t], sums.get(t), running.get(t)
                if d_count > 0 and d_sum is not None and d_sum >= 0 and batch is not None:
                    per_model[model_name].append(ItlInterval(d_sum, d_count, batch))
        out[key] = dict(per_model)
    return out


def overall(models: dict[str, ModelWindow]) -> ModelWindow:
    """All models of a target: histograms summed by ``le``, gauges combined, rates summed."""
    out = ModelWindow()
    names = sorted(models)
    for signal in sorted({s for m in models.values() for s in m.histograms}):
        out.histograms[signal] = quantiles.merge(models[n].histograms.get(signal) for n in names)
    for signal in sorted({s for m in models.values() for s in m.gauges}):
        out.gauges[signal] = combine_gauges(signal, [models[n].gauges[signal] for n in names
                                                     if signal in models[n].gauges])
    for signal in sorted({s for m in models.values() for s in m.rates}):
        out.rates[signal] = sum(models[n].rates[signal] for n in names if signal in models[n].rates)
    return out
