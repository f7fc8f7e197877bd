"""The PromQL a Prometheus source runs: one query per signal for every target of the source.

Each query groups ``by`` the source's target labels (plus the engines' model label and, for
histograms, ``le``), so the number of queries in a round does not grow with the number of
targets. Engines and releases name the same signal differently (the adapters' tables in
:mod:`app.sources`); every candidate family of every engine goes into the same query, each
branch tagged with ``llm_latency_family="<index>"`` by ``label_replace``, and the reader keeps,
per target, the first candidate present - the same "newest name wins" rule the scraper's
adapters apply to a page, so a vLLM 0.11 target exporting both ITL names is not counted twice.

A histogram's ``_sum`` and ``_count`` ride in the same answer as its buckets, tagged
``le="sum"`` and ``le="count"``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from app.promql.text import format_matchers, millis_duration, union
from app.sources import sglang, tgi, trtllm, vllm
from app.sources.base import COUNTER_SIGNALS, DISAGGREGATION_INFO, GAUGE_SIGNALS
from app.window import AVERAGED_GAUGES, RANK_GAUGES, RANK_MEANS

FAMILY_LABEL = "llm_latency_family"
JOB_LABEL = "llm_latency_query"  # which query of a combined request a series answers
STAT_LABEL = "llm_latency_stat"
MODEL_LABEL = "model_name"  # vLLM, SGLang 0.4+ and trtllm-serve; TGI serves one unnamed model (SGLang 0.3: ``name``)
ENGINE_PREFIXES = {"vllm": "vllm:", "sglang": "sglang:", "tgi": "tgi_", "trtllm": "trtllm_"}


@dataclass(frozen=True, slots=True)
class Family:
    """One engine's metric family for a signal, with the matchers that select it. ``scale``
    divides a histogram's bounds and sum into seconds (SGLang's ``kv_transfer_latency_ms``: 1000).
    ``positive``: a gauge family whose series count only while this one stayed above 0 over the
    window (SGLang writes its speculation gauges as 0 with speculation off; its adapter drops them)."""

    engine: str
    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()
    scale: float = 1.0
    positive: str = ""


#: The engines whose adapters are plain tables (name candidates per signal, newest first).
_TABLES = (("vllm", vllm), ("sglang", sglang), ("trtllm", trtllm))


def _families(signal: str, kind: str) -> list[Family]:
    return [Family(engine, name) for engine, module in _TABLES for name in getattr(module, kind).get(signal, ())]


def _histogram_families() -> dict[str, list[Family]]:
    out: dict[str, list[Family]] = {}
    signals = {*vllm.HISTOGRAMS, *sglang.HISTOGRAMS, *sglang.TABLE, *trtllm.HISTOGRAMS, *tgi.HISTOGRAMS}
    for signal in sorted(signals):
        families = _families(signal, "HISTOGRAMS")
        families += [Family("sglang", name, tuple((k, "=", v) for k, v in (label_filter or {}).items()), scale)
                     for name, scale, label_filter in sglang.TABLE.get(signal, ())]
        if signal in tgi.HISTOGRAMS:
            name, label_filter = tgi.HISTOGRAMS[signal]
            families.append(Family("tgi", name, tuple((k, "=", v) for k, v in (label_filter or {}).items())))
        out[signal] = families
    return out


def _gauge_families() -> dict[str, list[Family]]:
    """Every gauge signal (an empty list where no engine exports it: no query is run)."""
    out: dict[str, list[Family]] = {}
    for signal in GAUGE_SIGNALS:
        out[signal] = _families(signal, "GAUGES")
        if signal in sglang.SPEC_GAUGES:
            out[signal] = [Family(f.engine, f.name, positive=sglang.GAUGES["spec_accept_length"][0])
                           if f.engine == "sglang" else f for f in out[signal]]
        if signal in tgi.GAUGES:
            out[signal].append(Family("tgi", tgi.GAUGES[signal]))
    return out


def _counter_families() -> dict[str, list[Family]]:
    out: dict[str, list[Family]] = {signal: _families(signal, "COUNTERS") for signal in COUNTER_SIGNALS}
    out["requests_total"] += [Family("tgi", name) for name in tgi.REQUESTS]
    out.setdefault("kv_transfers_total", []).append(Family("vllm", vllm.KV_TRANSFERS_FROM + "_count"))
    for signal, histogram in tgi.TOKEN_COUNTERS.items():  # TGI counts tokens in its length histograms
        out[signal].append(Family("tgi", f"{histogram}_sum"))
    return out


HISTOGRAM_FAMILIES = _histogram_families()
GAUGE_FAMILIES = _gauge_families()
COUNTER_FAMILIES = _counter_families()
# One always-present gauge per engine: a target is an engine whose running-requests gauge exists.
PRESENCE_FAMILIES = GAUGE_FAMILIES["running"]
#: a histogram's own name -> its signals: a series under that name is a native histogram (Prometheus 3's
#: ``convert_classic_histograms_to_nhcb`` stores a classic one so), which the queries (``_bucket``,
#: ``_sum``, ``_count``) do not read
NATIVE_NAMES: dict[str, frozenset[str]] = {
    name: frozenset(s for s, families in HISTOGRAM_FAMILIES.items() if any(f.name == name for f in families))
    for name in sorted({f.name for families in HISTOGRAM_FAMILIES.values() for f in families})}
# (canonical name, metric); SGLang's P/D role is the ``engine_type`` label of a scheduler family
INFO_FAMILIES = (*vllm.INFOS.items(), (DISAGGREGATION_INFO, sglang.ROLE_FAMILY))


def prom_duration(seconds: float) -> str:
    """A range for PromQL, rounded to the millisecond Prometheus resolves time to (an API
    window such as ``end - start`` is any float)."""
    return millis_duration(max(0, round(seconds * 1000)))


def _selector(name: str, matchers: tuple[tuple[str, str, str], ...], source_matchers: list[tuple[str, str, str]]
              ) -> str:
    inner = format_matchers([*matchers, *source_matchers])
    return f"{name}{{{inner}}}" if inner else name


def _tag(expr: str, label: str, value: str) -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


def _by(*labels: str) -> str:
    return ", ".join(dict.fromkeys(labels))


@dataclass(frozen=True, slots=True)
class SourceQueries:
    """PromQL text for one source: its target labels and selector fixed, window given per call."""

    target_labels: tuple[str, ...]
    matchers: tuple[tuple[str, str, str], ...] = ()
    service_labels: tuple[str, ...] = ()

    def histogram(self, signal: str, window: float, buckets: bool = True, les: Mapping[int, str] | None = None,
                  skip_les: Mapping[int, str] | None = None, families: Collection[int] | None = None) -> str:
        """:meth:`histogram_branches` joined in one query."""
        return union(self.histogram_branches(signal, window, buckets, les, skip_les, families))

    def histogram_branches(self, signal: str, window: float, buckets: bool = True,
                           les: Mapping[int, str] | None = None, skip_les: Mapping[int, str] | None = None,
                           families: Collection[int] | None = None) -> list[str]:
        """Per target and model, the ``increase`` of every bucket (``buckets``: else none, the
        means-first read: a bucket query touches ~20 series per target, ``_sum``/``_count`` 2),
        of ``_sum`` and of ``_count`` over ``window``. ``les``: per candidate family, a regex of
        the ``le`` values to read; ``skip_les``: of those not to read (the others' buckets all).
        ``families``: the candidate families asked (None: all; each branch costs the server even
        where it matches nothing)."""
        w = prom_duration(window)
        parts = []
        for i, f in enumerate(HISTOGRAM_FAMILIES[signal]):
            if families is not None and i not in families:
                continue
            sel = list(self.matchers)
            by = _by(*self.target_labels, MODEL_LABEL)
            total = _tag(f"sum by ({by}) (increase({_selector(f.name + '_sum', f.matchers, sel)}[{w}]))", "le", "sum")
            count = _tag(f"sum by ({by}) (increase({_selector(f.name + '_count', f.matchers, sel)}[{w}]))",
                         "le", "count")
            if buckets:
                only: tuple[tuple[str, str, str], ...] = (("le", "=~", les[i]),) if les and i in les else ()
                only += (("le", "!~", skip_les[i]),) if skip_les and i in skip_les else ()
                bucket = _selector(f.name + "_bucket", (*f.matchers, *only), sel)
                parts.append(_tag(f"sum by ({by}, le) (increase({bucket}[{w}]))", FAMILY_LABEL, str(i)))
            parts += [_tag(e, FAMILY_LABEL, str(i)) for e in (total, count)]
        return parts

    def first_seen(self, signal: str, span: float, step: float) -> str:
        """Per target, the timestamp of its first ``signal`` histogram sample in the ``span``
        before the evaluation time, seen every ``step`` (a subquery: later than the true first
        sample by at most one step). Tells how much of a long SLO period the server still holds."""
        by = _by(*self.target_labels)
        window = f"{prom_duration(span)}:{prom_duration(step)}"
        counts = [_selector(f.name + "_count", f.matchers, list(self.matchers)) for f in HISTOGRAM_FAMILIES[signal]]
        # `or timestamp(...)`: a replica younger than the last step boundary is seen by no step
        return union([
            _tag(f"min by ({by}) (min_over_time(timestamp({count})[{window}]) or timestamp({count}))", FAMILY_LABEL,
                 str(i)) for i, count in enumerate(counts)])

    def gauge(self, signal: str, window: float) -> str:
        w = prom_duration(window)
        combine = "avg" if signal in AVERAGED_GAUGES else "sum"
        parts = []
        for i, f in enumerate(GAUGE_FAMILIES[signal]):
            sel = _selector(f.name, f.matchers, list(self.matchers))
            by = _by(*self.target_labels, MODEL_LABEL)
            for stat in ("last", "avg", "max"):
                over = f"{stat}_over_time({sel}[{w}])"
                if f.positive:
                    positive = _selector(f.positive, (), list(self.matchers))
                    over = f"({over} and (min_over_time({positive}[{w}]) > 0))"
                expr = f"{combine} by ({by}) ({over})"
                parts.append(_tag(_tag(expr, STAT_LABEL, stat), FAMILY_LABEL, str(i)))
        return union(parts)

    def counter(self, signal: str, window: float) -> str:
        w = prom_duration(window)
        by = _by(*self.target_labels, MODEL_LABEL)
        return union([
            _tag(f"sum by ({by}) (rate({_selector(f.name, f.matchers, list(self.matchers))}[{w}]))", FAMILY_LABEL,
                 str(i))
            for i, f in enumerate(COUNTER_FAMILIES[signal])])

    def presence(self) -> str:
        """Which targets run which engine now: one series per target and engine metric name, with
        the service labels that group replicas into a service; and which histograms a target has
        as native histograms (:data:`NATIVE_NAMES`: none in a classic setup, at no cost then)."""
        names = "|".join([*(f.name for f in PRESENCE_FAMILIES), *NATIVE_NAMES])
        inner = format_matchers([("__name__", "=~", names), *self.matchers])
        return f"group by ({_by(*self.target_labels, *self.service_labels, '__name__')}) ({{{inner}}})"

    def up(self) -> str:
        inner = format_matchers(list(self.matchers))
        return f"max by ({_by(*self.target_labels)}) (up{{{inner}}})" if inner else \
            f"max by ({_by(*self.target_labels)}) (up)"

    def scrapes(self, window: float) -> str:
        """Successful scrapes per target in the window (``up`` is 1 for each)."""
        inner = format_matchers(list(self.matchers))
        sel = f"up{{{inner}}}" if inner else "up"
        return f"sum by ({_by(*self.target_labels)}) (sum_over_time({sel}[{prom_duration(window)}]))"

    def restarts(self, window: float) -> str:
        """Per target, the most resets one of its counter series shows in the window: engine
        restarts (a restart sets every counter of the process back to zero; ranks and models reset
        together). Each family is its own branch, tagged: ``resets()`` drops the metric name, so
        families with the same labels would collide in one vector; the outer ``max`` answers one
        series a target, not one per family."""
        by = _by(*self.target_labels)
        names = sorted({f.name for families in COUNTER_FAMILIES.values() for f in families if not f.matchers})
        return f"max by ({by}) (" + union([
            _tag(f"max by ({by}) (resets({_selector(name, (), list(self.matchers))}[{prom_duration(window)}]))",
                 FAMILY_LABEL, str(i)) for i, name in enumerate(names)]) + ")"

    def infos(self) -> str:
        names = "|".join(metric for _, metric in INFO_FAMILIES)
        return "{" + format_matchers([("__name__", "=~", names), *self.matchers]) + "}"

    def itl_intervals(self, step: float) -> str:
        """For a range query at ``step``: per target, model and rank, the ITL time and steps added in
        each step and the mean running batch - the "ITL by batch size" split."""
        w = prom_duration(step)
        parts = []
        for i, f in enumerate(HISTOGRAM_FAMILIES["itl"]):
            if f.engine == "tgi":
                continue  # TGI's decode histogram is per batch step already judged by the rules' means
            rank = "engine" if f.engine == "vllm" else "dp_rank"
            by = _by(*self.target_labels, MODEL_LABEL, rank)
            sel = list(self.matchers)
            for stat, metric in (("sum", f.name + "_sum"), ("count", f.name + "_count")):
                expr = f"sum by ({by}) (increase({_selector(metric, f.matchers, sel)}[{w}]))"
                parts.append(_tag(_tag(expr, STAT_LABEL, stat), FAMILY_LABEL, str(i)))
            running = next(g for g in GAUGE_FAMILIES["running"] if g.engine == f.engine)
            expr = f"sum by ({by}) (avg_over_time({_selector(running.name, running.matchers, sel)}[{w}]))"
            parts.append(_tag(_tag(expr, STAT_LABEL, "running"), FAMILY_LABEL, str(i)))
        return union(parts)

    def rank_gauges(self, window: float) -> str:
        """Per target, model and data-parallel rank (vLLM ``engine``, SGLang ``dp_rank``): the mean
        of each gauge :data:`app.window.RANK_GAUGES` over the window, for the comparison between
        the ranks of one engine (one query for all of them)."""
        w = prom_duration(window)
        parts = []
        for signal in RANK_GAUGES:
            for i, f in enumerate(GAUGE_FAMILIES.get(signal, [])):
                if f.engine == "tgi":
                    continue  # TGI has no data-parallel ranks
                rank = "engine" if f.engine == "vllm" else "dp_rank"
                by = _by(*self.target_labels, MODEL_LABEL, rank)
                expr = f"sum by ({by}) (avg_over_time({_selector(f.name, f.matchers, list(self.matchers))}[{w}]))"
                parts.append(_tag(_tag(expr, STAT_LABEL, signal), FAMILY_LABEL, str(i)))
        for signal in RANK_MEANS:  # a histogram's mean per rank: increase(_sum) / increase(_count)
            for i, h in enumerate(HISTOGRAM_FAMILIES.get(signal, [])):
                if h.engine == "tgi":
                    continue
                rank = "engine" if h.engine == "vllm" else "dp_rank"
                by = _by(*self.target_labels, MODEL_LABEL, rank)
                sel = list(self.matchers)
                expr = " / ".join(f"sum by ({by}) (increase({_selector(h.name + part, h.matchers, sel)}[{w}]))"
                                  for part in ("_sum", "_count"))
                parts.append(_tag(_tag(f"({expr})", STAT_LABEL, signal), FAMILY_LABEL, str(i)))
        return union(parts)

    def tgi_kv_samples(self, window: float) -> str:
        """TGI has no KV-usage gauge: its raw used/capacity samples, divided sample by sample
        as the scraper's adapter does (no PromQL function averages a ratio of two series)."""
        names = f"{tgi.KV_USED}|{tgi.KV_CAPACITY}"
        inner = format_matchers([("__name__", "=~", names), *self.matchers])
        return f"{{{inner}}}[{prom_duration(window)}]"
