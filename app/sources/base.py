"""Canonical signals: the engine-independent vocabulary the rest of the product speaks.

Engines name the same thing differently (vLLM's ``vllm:time_to_first_token_seconds``,
SGLang's ``sglang:time_to_first_token_seconds``, TGI exports none and it must be
derived), and rename things between versions. Adapters translate a parsed page into
these canonical series once, right after parsing, so storage, percentiles, diagnosis
and alerts never see an engine-specific name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from app.scrape.parser import MetricFamily, ParsedPage

# Histogram signals (seconds unless the name says tokens).
HISTOGRAM_SIGNALS = (
    "ttft",               # time to first token: queue + prefill (+ tokenization)
    "itl",                # inter-token latency, one observation per engine step
    "tpot",               # per-request mean time per output token
    "e2e",                # request arrival -> last token
    "queue_time",         # waiting for the scheduler
    "prefill_time",       # first scheduled -> first token
    "decode_time",        # first token -> last token
    "inference_time",     # first scheduled -> last token
    "prompt_tokens",      # prompt length per request (tokens)
    "generation_tokens",  # output length per request (tokens)
    "iteration_tokens",   # tokens per engine step (reveals the batched-token budget)
)
GAUGE_SIGNALS = ("running", "waiting", "kv_usage")
COUNTER_SIGNALS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "requests_total",
)
TIME_SIGNALS = ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time", "inference_time")


@dataclass(slots=True)
class CanonicalHistogram:
    signal: str
    model: str
    rank: str
    bounds: tuple[float, ...]  # ascending; last is +inf
    counts: tuple[float, ...]  # cumulative, aligned with bounds
    sum: float
    count: float


@dataclass(slots=True)
class CanonicalScalar:
    signal: str
    kind: str  # "gauge" | "counter"
    model: str
    rank: str
    value: float


@dataclass(slots=True)
class CanonicalInfo:
    name: str  # e.g. "cache_config"
    model: str
    rank: str
    labels: dict[str, str]


@dataclass(slots=True)
class Canonical:
    """Everything one scrape contributed, in canonical form."""

    engine: str
    histograms: list[CanonicalHistogram] = field(default_factory=list)
    scalars: list[CanonicalScalar] = field(default_factory=list)
    infos: list[CanonicalInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "ttft derived from queue + prefill"
    problems: list[str] = field(default_factory=list)  # inconsistent histograms etc., reported as scrape errors


class Adapter(Protocol):
    """A pure function from a parsed page to canonical signals, plus how to recognise its engine."""

    name: str
    family_prefixes: tuple[str, ...]

    def detect(self, page: ParsedPage) -> bool: ...

    def to_canonical(self, page: ParsedPage) -> Canonical: ...


_LE_CACHE: dict[str, float] = {}


def _parse_le(text: str) -> float:
    """``le`` label -> bound. Cached: a page repeats the same few dozen bounds thousands of
    times per scrape (measured ~5 % of ingest CPU before the cache)."""
    bound = _LE_CACHE.get(text)
    if bound is None:
        bound = math.inf if text in ("+Inf", "Inf", "+inf", "inf") else float(text)
        if len(_LE_CACHE) < 10_000:
            _LE_CACHE[text] = bound
    return bound


def histogram_series(
    family: MetricFamily, group_labels: tuple[str, ...], problems: list[str] | None = None,
    label_filter: dict[str, str] | None = None,
) -> dict[tuple[str, ...], tuple[tuple[float, ...], tuple[float, ...], float, float]]:
    """Group a histogram family's samples into per-series (bounds, cumulative counts, sum, count).

    Series are keyed by the values of ``group_labels``; labels not in the key (other
    than ``le``) are summed over, which is Prometheus' ``sum by (...)``. A series with
    no ``+Inf`` bucket is dropped (no quantile exists without it); decreasing counts or a
    ``_count`` that disagrees with ``+Inf`` are kept, as Prometheus keeps them, but
    reported (vLLM issues #6337/#8819 show broken histograms occur in the wild).
    """
    buckets: dict[tuple[str, ...], dict[float, float]] = {}
    sums: dict[tuple[str, ...], float] = {}
    counts: dict[tuple[str, ...], float] = {}
    n_group = len(group_labels)
    g0, g1 = (group_labels + ("", ""))[:2]
    bucket_name = family.name + "_bucket"
    sum_name = family.name + "_sum"
    count_name = family.name + "_count"
    for sample in family.samples:
        labels = sample.labels
        if label_filter and any(labels.get(k) != v for k, v in label_filter.items()):
            continue
        if n_group == 2:
            key = (labels.get(g0, ""), labels.get(g1, ""))
        else:
            key = tuple(labels.get(name, "") for name in group_labels)
        name = sample.name
        if name == bucket_name:
            le = labels.get("le")
            if le is None:
                continue
            try:
                bound = _parse_le(le)
            except ValueError:
                if problems is not None:
                    problems.append(f"{family.name}: bad le={le!r}")
                continue
            per = buckets.setdefault(key, {})
            per[bound] = per.get(bound, 0.0) + sample.value
        elif name == sum_name:
            sums[key] = sums.get(key, 0.0) + sample.value
        elif name == count_name:
            counts[key] = counts.get(key, 0.0) + sample.value
    result = {}
    for key, per in buckets.items():
        bounds = tuple(sorted(per))
        cumulative = tuple(per[b] for b in bounds)
        where = f"{family.name}{dict(zip(group_labels, key))}"
        if bounds[-1] != math.inf:
            if problems is not None:
                problems.append(f"{where}: no +Inf bucket; series dropped")
            continue
        if problems is not None:
            if any(b < a for a, b in zip(cumulative, cumulative[1:])):
                problems.append(f"{where}: bucket counts decrease (kept; quantiles apply Prometheus' monotonicity fix)")
            if key in counts and counts[key] != cumulative[-1]:
                problems.append(f"{where}: _count {counts[key]:g} != +Inf bucket {cumulative[-1]:g}")
        result[key] = (bounds, cumulative, sums.get(key, math.nan), counts.get(key, cumulative[-1]))
    return result


def scalar_series(
    family: MetricFamily, group_labels: tuple[str, ...], label_filter: dict[str, str] | None = None,
) -> dict[tuple[str, ...], float]:
    """Sum a gauge/counter family's value samples by ``group_labels`` (e.g. over ``finished_reason``).

    ``_created`` samples (prometheus_client exposes them next to counters) are not values.
    """
    out: dict[tuple[str, ...], float] = {}
    for sample in family.samples:
        if sample.name.endswith("_created"):
            continue
        if label_filter and any(sample.labels.get(k) != v for k, v in label_filter.items()):
            continue
        key = tuple(sample.labels.get(name, "") for name in group_labels)
        out[key] = out.get(key, 0.0) + sample.value
    return out


def first_family(page: ParsedPage, candidates: tuple[str, ...]) -> MetricFamily | None:
    """The first of ``candidates`` present on the page (newest name first)."""
    for name in candidates:
        family = page.families.get(name)
        if family is not None:
            return family
    return None


def map_families(page: ParsedPage, out: Canonical, group: tuple[str, ...], histograms: dict[str, tuple[str, ...]],
                 gauges: dict[str, tuple[str, ...]], counters: dict[str, tuple[str, ...]]) -> None:
    """The table-driven part of an adapter: for each canonical signal take the first
    candidate family present (newest name first) and add one series per ``group`` key;
    an empty second group label (the data-parallel rank) is stored as "0"."""
    for signal, candidates in histograms.items():
        family = first_family(page, candidates)
        if family is None or family.type not in ("histogram", "untyped"):
            continue
        for (model, rank), (bounds, counts, total, count) in histogram_series(family, group, out.problems).items():
            out.histograms.append(CanonicalHistogram(signal, model, rank or "0", bounds, counts, total, count))
    for kind, table in (("gauge", gauges), ("counter", counters)):
        for signal, candidates in table.items():
            family = first_family(page, candidates)
            if family is None:
                continue
            for (model, rank), value in scalar_series(family, group).items():
                out.scalars.append(CanonicalScalar(signal, kind, model, rank or "0", value))
