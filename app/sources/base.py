"""Canonical signals: the engine-independent vocabulary the rest of the product speaks.

Engines name the same thing differently (vLLM's ``vllm:time_to_first_token_seconds``,
SGLang's ``sglang:time_to_first_token_seconds``, TGI exports none and it must be
derived), and rename things between versions. Adapters translate a parsed page into
these canonical series once, right after parsing, so storage, percentiles, diagnosis
and alerts never see an engine-specific name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol, TypeVar

from app.exposition.parser import MetricFamily, ParsedPage
from app.vectors import any_decrease

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
    "kv_transfer_time",   # P/D disaggregation: one KV-cache transfer between prefill and decode workers
    "kv_wait_time",       # ... a decode worker waiting for a request's KV to arrive (SGLang: the prefill side's
                          #     queue and prefill and the transfer, from the decode worker's side)
    "prealloc_time",      # ... a decode worker's handshake and KV-memory reservation before the transfer (SGLang)
    "kv_alloc_time",      # ... the part of it spent waiting for free KV memory (SGLang kv_transfer_alloc_ms)
    "render_time",        # front end: chat template, tokenization, multimodal preprocessing of a request
)
GAUGE_SIGNALS = (
    "running", "waiting", "kv_usage",
    "spec_accept_rate",          # speculative decoding: accepted / proposed draft tokens (0..1), engine-computed
    "spec_accept_length",        # ... mean tokens emitted per verification step (accepted + 1)
    "dp_token_imbalance_ratio",  # data-parallel attention: the engine's own token imbalance between ranks
    "transfer_queue",            # P/D decode worker: requests whose KV is on its way (SGLang transfer queue)
    "prealloc_queue",            # ... requests waiting for the handshake and KV memory (SGLang prealloc queue)
    "lora_max_adapters",         # LoRA: adapters the engine runs at once (vLLM's max_lora)
    "lora_adapters_in_demand",   # ... adapters with requests in flight (running or waiting)
    "lora_slot_wait",            # ... 1 while more adapters are in demand than there are slots, else 0
)
COUNTER_SIGNALS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "requests_total",
    "kv_transfer_failures_total",  # KV-cache transfers that failed
    "kv_transfers_total",          # KV-cache transfers that completed (vLLM: the transfer histogram's count)
    "spec_drafts_total",           # speculative decoding: verification steps with a draft
    "spec_draft_tokens_total",     # ... draft tokens proposed
    "spec_accepted_tokens_total",  # ... draft tokens accepted
    "scheduler_loop_seconds_total",  # the scheduler loop's wall time (SGLang: every stage summed)
    "scheduler_idle_seconds_total",  # ... of it with no runnable or queued work
    "scheduler_cpu_seconds_total",   # CPU time of the scheduler process (all its threads)
    "gpu_busy_seconds_total",        # GPU time executing forward passes (SGLang's device timer)
)
TIME_SIGNALS = ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time", "inference_time",
                "kv_transfer_time", "kv_wait_time", "prealloc_time", "kv_alloc_time", "render_time")


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


DISAGGREGATION_INFO = "disaggregation"  # SGLang's ``engine_type`` label (its P/D mode), kept as an info


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

    # Read-only members, so an adapter's plain class attributes satisfy them.
    @property
    def name(self) -> str: ...

    @property
    def family_prefixes(self) -> tuple[str, ...]: ...

    @property
    def families(self) -> frozenset[str]:
        """Every family the adapter reads: the parser keeps only these."""
        ...

    def detect(self, page: ParsedPage) -> bool: ...

    def to_canonical(self, page: ParsedPage) -> Canonical: ...


_T = TypeVar("_T")
_LE_CACHE: dict[str, float] = {}


def _parse_le(text: str) -> float:
    """``le`` label -> bound. Cached: a page repeats the same few dozen bounds thousands of
    times per scrape."""
    bound = _LE_CACHE.get(text)
    if bound is None:
        bound = math.inf if text in ("+Inf", "Inf", "+inf", "inf") else float(text)
        if len(_LE_CACHE) < 10_000:
            _LE_CACHE[text] = bound
    return bound


def _total(values: list[float], indices: tuple[int, ...]) -> float:
    """``0.0 + v[i0] + v[i1] + ...`` in page order, as Prometheus' ``sum`` adds. The hot
    callers add a single position inline (``0.0 + v[i]``: the same number, no call)."""
    total = 0.0
    for i in indices:
        total += values[i]
    return total


def _gather(indices: tuple[int, ...]) -> Callable[[list[float]], tuple[float, ...]]:
    """itemgetter that always returns a tuple."""
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i],)
    return itemgetter(*indices)


@dataclass(slots=True)
class _HistogramLayout:
    """Where one output series of :func:`histogram_series` finds its numbers in the
    family's sample list: one tuple of sample positions per bucket bound (several
    when the grouping sums series), and the positions of its ``_sum`` and ``_count``."""

    key: tuple[str, ...]
    bounds: tuple[float, ...]
    where: str  # for problem messages
    buckets: tuple[tuple[int, ...], ...]
    gather: Callable[[list[float]], tuple[float, ...]] | None  # set when every bucket has one sample
    sums: tuple[int, ...]
    counts: tuple[int, ...]

    def read(self, values: list[float]) -> tuple[tuple[float, ...], float, float | None]:
        """(cumulative counts, sum, count or None when the page has no ``_count``)."""
        if self.gather is not None:
            cumulative = self.gather(values)
        else:
            cumulative = tuple(_total(values, positions) for positions in self.buckets)
        sums, counts = self.sums, self.counts  # one position each unless the grouping sums series
        total = (0.0 + values[sums[0]]) if len(sums) == 1 else _total(values, sums) if sums else math.nan
        count = (0.0 + values[counts[0]]) if len(counts) == 1 else _total(values, counts) if counts else None
        return cumulative, total, count


def _histogram_layout(family: MetricFamily, group_labels: tuple[str, ...],
                      label_filter: dict[str, str] | None) -> tuple[list[_HistogramLayout], list[str]]:
    """Group a histogram family's samples by ``group_labels`` (labels not in the key,
    other than ``le``, are summed over: Prometheus' ``sum by (...)``). Depends only on
    sample names and labels, so it is computed once per page shape (``family.memo``).
    Returns the layouts and the problems that do not depend on values (bad ``le``,
    series without ``+Inf``)."""
    buckets: dict[tuple[str, ...], dict[float, list[int]]] = {}
    sums: dict[tuple[str, ...], list[int]] = {}
    counts: dict[tuple[str, ...], list[int]] = {}
    problems: list[str] = []
    bucket_name, sum_name, count_name = family.name + "_bucket", family.name + "_sum", family.name + "_count"
    two = len(group_labels) == 2  # (model, rank): the common case, without a generator per sample
    g0, g1 = (group_labels + ("", ""))[:2]
    for position, sample in enumerate(family.samples):
        labels = sample.labels
        if label_filter and any(labels.get(k) != v for k, v in label_filter.items()):
            continue
        key = (labels.get(g0, ""), labels.get(g1, "")) if two else tuple(labels.get(n, "") for n in group_labels)
        name = sample.name
        if name == bucket_name:
            le = labels.get("le")
            if le is None:
                continue
            try:
                bound = _parse_le(le)
            except ValueError:
                problems.append(f"{family.name}: bucket with a non-numeric le label")
                continue
            per = buckets.get(key)
            if per is None:
                per = buckets[key] = {}
            at = per.get(bound)
            if at is None:
                per[bound] = [position]
            else:
                at.append(position)
        elif name == sum_name:
            sums.setdefault(key, []).append(position)
        elif name == count_name:
            counts.setdefault(key, []).append(position)
    layouts = []
    for key, per in buckets.items():
        bounds = tuple(sorted(per))
        where = f"{family.name}{dict(zip(group_labels, key))}"
        if bounds[-1] != math.inf:
            problems.append(f"{where}: no +Inf bucket; series dropped")
            continue
        positions = tuple(map(tuple, map(per.__getitem__, bounds)))
        single = max(map(len, positions)) == 1
        layouts.append(_HistogramLayout(key, bounds, where, positions,
                                        _gather(tuple(p[0] for p in positions)) if single else None,
                                        tuple(sums.get(key, ())), tuple(counts.get(key, ()))))
    return layouts, problems


def memoized(owner: MetricFamily | ParsedPage, key: Hashable, build: Callable[[], _T]) -> _T:
    """``build()`` once per page shape: kept in the family's (or the whole page's) ``memo``
    when the parser has a plan."""
    memo = owner.memo
    if memo is None:
        return build()
    found: _T | None = memo.get(key)
    if found is None:
        found = memo[key] = build()
    return found


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

    The grouping is computed once per page shape and reused while the page keeps it;
    only the values are read each scrape (grouping every scrape would cost several times
    the rest of the adapter; the first page of a new shape pays for building the layouts).
    """
    layouts, fixed_problems = _histogram_layouts(family, group_labels, label_filter)
    values = family.values
    if problems is not None:
        problems.extend(fixed_problems)
    result = {}
    for layout in layouts:
        cumulative, total, count = layout.read(values)
        if problems is not None:
            _value_problems(layout, cumulative, count, problems)
        result[layout.key] = (layout.bounds, cumulative, total, cumulative[-1] if count is None else count)
    return result


def _histogram_layouts(family: MetricFamily, group_labels: tuple[str, ...], label_filter: dict[str, str] | None = None,
                       ) -> tuple[list[_HistogramLayout], list[str]]:
    filter_key = tuple(sorted(label_filter.items())) if label_filter else ()
    return memoized(family, ("histogram", group_labels, filter_key),
                    lambda: _histogram_layout(family, group_labels, label_filter))


def _value_problems(layout: _HistogramLayout, cumulative: tuple[float, ...], count: float | None,
                    problems: list[str]) -> None:
    """What is wrong with one scrape's numbers of a histogram series (kept all the same)."""
    if any_decrease(cumulative):
        problems.append(f"{layout.where}: bucket counts decrease (kept; quantiles apply Prometheus' "
                        "monotonicity fix)")
    if count is not None and count != cumulative[-1]:
        problems.append(f"{layout.where}: _count {count:g} != +Inf bucket {cumulative[-1]:g}")


def _scalar_layout(family: MetricFamily, group_labels: tuple[str, ...],
                   label_filter: dict[str, str] | None) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """(key, sample positions) per output series of :func:`scalar_series`; names and labels only."""
    out: dict[tuple[str, ...], list[int]] = {}
    for position, sample in enumerate(family.samples):
        if sample.name.endswith("_created"):
            continue
        if label_filter and any(sample.labels.get(k) != v for k, v in label_filter.items()):
            continue
        out.setdefault(tuple(sample.labels.get(name, "") for name in group_labels), []).append(position)
    return [(key, tuple(positions)) for key, positions in out.items()]


def scalar_series(
    family: MetricFamily, group_labels: tuple[str, ...], label_filter: dict[str, str] | None = None,
) -> dict[tuple[str, ...], float]:
    """Sum a gauge/counter family's value samples by ``group_labels`` (e.g. over ``finished_reason``).

    ``_created`` samples (prometheus_client exposes them next to counters) are not values.
    Like :func:`histogram_series`, the grouping is computed once per page shape.
    """
    values = family.values
    return {key: _total(values, positions) for key, positions in _scalar_layouts(family, group_labels, label_filter)}


def _scalar_layouts(family: MetricFamily, group_labels: tuple[str, ...], label_filter: dict[str, str] | None = None,
                    ) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    filter_key = tuple(sorted(label_filter.items())) if label_filter else ()
    return memoized(family, ("scalar", group_labels, filter_key),
                    lambda: _scalar_layout(family, group_labels, label_filter))


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
    candidate family present (newest name first) and add one series per ``group`` key
    (two labels: the model and the data-parallel rank, an empty rank stored as "0").

    Which family each signal reads and where its series' numbers are depend on the page's
    names and labels only, so they are worked out once per page shape (``page.memo``; the
    tables are module constants, keyed by identity) and a scrape only reads values (the
    same canonical signals and problems either way, ``tests/sources/test_adapters.py``)."""
    program = memoized(page, ("map_families", group, id(histograms), id(gauges), id(counters)),
                       lambda: _families_program(page, group, histograms, gauges, counters))
    families, problems = page.families, out.problems
    add_histogram, add_scalar = out.histograms.append, out.scalars.append
    for name, fixed_problems, series in program[0]:
        values = families[name].values
        problems.extend(fixed_problems)
        for signal, model, rank, layout in series:
            cumulative, total, count = layout.read(values)
            _value_problems(layout, cumulative, count, problems)
            add_histogram(CanonicalHistogram(signal, model, rank, layout.bounds, cumulative, total,
                                             cumulative[-1] if count is None else count))
    for name, steps in program[1]:
        values = families[name].values
        for signal, kind, model, rank, positions in steps:
            value = (0.0 + values[positions[0]]) if len(positions) == 1 else _total(values, positions)
            add_scalar(CanonicalScalar(signal, kind, model, rank, value))


_HistogramStep = tuple[str, tuple[str, ...], tuple[tuple[str, str, str, _HistogramLayout], ...]]
_ScalarStep = tuple[str, tuple[tuple[str, str, str, str, tuple[int, ...]], ...]]
_Program = tuple[tuple[_HistogramStep, ...], tuple[_ScalarStep, ...]]


def _families_program(page: ParsedPage, group: tuple[str, ...], histograms: dict[str, tuple[str, ...]],
                      gauges: dict[str, tuple[str, ...]], counters: dict[str, tuple[str, ...]],
                      ) -> _Program:
    """:func:`map_families`' steps for a page shape: per histogram signal its family's name,
    the problems that do not depend on values and (signal, model, rank, layout) per series;
    per gauge or counter signal its family's name and (signal, kind, model, rank, positions)."""
    histogram_steps: list[_HistogramStep] = []
    for signal, candidates in histograms.items():
        family = first_family(page, candidates)
        if family is None or family.type not in ("histogram", "untyped"):
            continue
        layouts, fixed_problems = _histogram_layouts(family, group)
        histogram_steps.append((family.name, tuple(fixed_problems), tuple(
            (signal, layout.key[0], layout.key[1] or "0", layout) for layout in layouts)))
    scalar_steps: list[_ScalarStep] = []
    for kind, table in (("gauge", gauges), ("counter", counters)):
        for signal, candidates in table.items():
            family = first_family(page, candidates)
            if family is None:
                continue
            scalar_steps.append((family.name, tuple((signal, kind, key[0], key[1] or "0", positions)
                                                    for key, positions in _scalar_layouts(family, group))))
    return tuple(histogram_steps), tuple(scalar_steps)
