"""What a regime module declares (:class:`Rule`) and the helpers its rule is written with.

A regime is one module in this package ending in ``RULE = Rule(...)``: the rule the
engine runs, where it ranks, its PromQL twin for ``llm-latency rules export``, its colour
on the Grafana dashboards. Its thresholds are fields of
:class:`app.core.thresholds.Thresholds` (the rule reads them from ``t``; no number of
its own) and its runbook is ``docs/runbooks/<regime>.md``. :mod:`app.diagnosis.rules`
collects every module's ``RULE``; the regime list, the alert names, the exported rules
and the dashboards are derived from that collection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from app.core import human
from app.core.hardware import GPUS, WEIGHT_DTYPE_BYTES
from app.core.quantiles import LatencySummary
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Evidence, Finding
from app.diagnosis.profile import ProfiledTarget
from app.diagnosis.signals import Signals


class TwinEngine(Protocol):
    """One engine's exposition as a PromQL twin writes it (``app.rules_export.engines.EngineExposition``)."""

    @property
    def name(self) -> str: ...  # "vllm" | "tgi" | "sglang" | "trtllm"

    @property
    def title(self) -> str: ...

    @property
    def labels(self) -> str: ...  # the aggregation labels, comma-separated

    @property
    def target_by(self) -> str: ...  # the labels of one target

    @property
    def rank_label(self) -> str | None: ...

    def select(self, metric: str, selector: str = "") -> str: ...

    def who(self) -> str: ...


class Twin(Protocol):
    """What a regime's PromQL twin writes its alerts with, for one engine
    (``app.rules_export.alerting.RegimeAlerts``, which imports the regimes): the recorded series over the
    regime window, the thresholds, the data gate every regime alert shares, and :meth:`add`."""

    @property
    def regime(self) -> str: ...

    @property
    def engine(self) -> TwinEngine: ...

    @property
    def recorded(self) -> dict[str, str | None]: ...

    @property
    def t(self) -> Thresholds: ...

    @property
    def w(self) -> str: ...  # the regime window as a Prometheus duration

    @property
    def hardware(self) -> Sequence[ProfiledTarget]: ...  # the targets with a hardware profile

    @property
    def gate(self) -> str: ...

    def and_(self, *parts: str) -> str: ...

    def add(self, severity: str, expr: str, summary: str, description: str,
            extra: dict[str, str] | None = None) -> None: ...


@dataclass(frozen=True)
class Need:
    """What a rule reads, for "not judged" verdicts: the rule can be judged when any of
    ``signals`` (attributes of :class:`Signals`, alternatives) has a value in the window.
    ``what`` names it for people ("queue time", "the ITL histogram")."""

    what: str
    signals: tuple[str, ...]
    #: what to export or configure so the window has it (the remedy of ``unexplained``)
    how: str = ""

    def met(self, s: Signals) -> bool:
        return any(getattr(s, name) not in (None, {}, []) for name in self.signals)


#: the mean prompt length: the histogram's ``_sum/_count``, or the prompt-token counter over the
#: finished requests where the engine has no prompt-length histogram (``Signals.prompt_mean``)
PROMPT_MEAN = Need("mean prompt length (the prompt-length histogram, or the prompt-token and request counters)",
                   ("prompt_tokens", "prompt_mean_counters"),
                   "a prompt-length histogram (vLLM request_prompt_tokens; SGLang 0.4.6+ with "
                   "--collect-tokens-histogram: prompt_tokens_histogram; TGI tgi_request_input_length), or the "
                   "prompt-token counter with a finished-request count (a request counter or an e2e histogram)")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one rule concluded in an evaluation, for a rule judged from the others' outcomes
    (:attr:`Rule.residual`)."""

    regime: str
    #: ``fired``; ``quiet`` (its conditions were compared and not met); ``not_applicable`` (it
    #: compared nothing: the window has no trace of what it is about, e.g. no KV transfers);
    #: ``not_judged`` (its signals are absent, or the numbers cannot decide)
    state: str
    #: quiet: the conditions not met, as evidence text; not_judged: why
    detail: str = ""
    #: not_judged for absent signals: what to export or configure for each (:attr:`Need.how`)
    lacks: tuple[str, ...] = ()


#: the conditions the check helpers compared while a rule runs (:meth:`Rule.judge`): a quiet rule
#: returns only None, and the conditions say which of them failed
_CONDITIONS: ContextVar[list[Evidence] | None] = ContextVar("conditions", default=None)


def _compared(evidence: Evidence) -> Evidence:
    conditions = _CONDITIONS.get()
    if conditions is not None:
        conditions.append(evidence)
    return evidence


@dataclass(frozen=True)
class Rule:
    """One regime, declared once in its own module."""

    #: the regime id: the module's name, ``Finding.regime``, a diagnosis verdict, the runbook's name
    regime: str
    #: ``(Signals, Thresholds) -> Finding | None``, pure
    evaluate: Callable[[Signals, Thresholds], Finding | None]
    #: the engine's order when several fire and none explains the other (lower first): causes
    #: before symptoms. Unique; the registry sorts by it.
    precedence: int
    #: Grafana named colour of this verdict on the dashboards' state timeline (``grafana/generate.py``)
    colour: str
    #: the Prometheus alerts of ``llm-latency rules export`` that say what ``evaluate`` says,
    #: written with :class:`Twin` (``app.rules_export.alerting.RegimeAlerts``). For a regime that needs a
    #: target's hardware profile these are the alerts for the instances without one.
    promql: Callable[[Twin], None] | None
    #: why there is no ``promql`` (exactly one of the two is given)
    no_promql: str = ""
    #: alerts against the decode floor of one target with a hardware profile
    promql_profiled: Callable[[Twin, ProfiledTarget], None] | None = None
    #: regimes this one's condition produces as *symptoms* (a full KV cache makes requests
    #: wait): when both fire, the engine names this one as the primary finding
    causes: tuple[str, ...] = ()
    #: judged from client-side probes rather than the engine's metrics: runs even when the
    #: window has too little engine traffic for the others (``findings.PROBE_REGIMES``)
    from_probes: bool = False
    #: the signals ``evaluate`` reads: when one is absent from the window (the engine or its
    #: release does not export it), the rule is not run and the diagnosis lists the regime
    #: under ``not_judged`` with the reason - never "healthy" by omission
    needs: tuple[Need, ...] = ()
    #: the :class:`Thresholds` field holding how many scrapes the window must hold for this rule to
    #: be judged, where it needs more than every rule's ``min_scrapes`` (bandwidth_bound:
    #: ``steady_min_scrapes``): ``check-config`` and the status page name the rule when the
    #: diagnosis window at a target's scrape interval holds fewer (:mod:`app.diagnosis.sampling`)
    min_scrapes: str = ""

    def scrapes_needed(self, t: Thresholds) -> int:
        """Scrapes a window must hold before this rule is judged (at least ``t.min_scrapes``)."""
        return max(t.min_scrapes, int(getattr(t, self.min_scrapes))) if self.min_scrapes else t.min_scrapes

    def missing(self, s: Signals) -> list[Need]:
        """What this rule needs and the window does not have (empty: it can be judged)."""
        return [need for need in self.needs if not need.met(s)]

    def judge(self, s: Signals, t: Thresholds) -> tuple[Finding | None, list[Evidence]]:
        """``evaluate``, with the conditions its check helpers compared (which failed, when quiet)."""
        conditions: list[Evidence] = []
        token = _CONDITIONS.set(conditions)
        try:
            return self.evaluate(s, t), conditions
        finally:
            _CONDITIONS.reset(token)

    #: a regime judged after every other from their outcomes (``unexplained``): called with them
    #: instead of ``evaluate``, which judges it as if no other rule had run
    residual: Callable[[Signals, Thresholds, Sequence[Outcome]], Finding | None] | None = None

    #: more replicas of the same engine fix this regime: it comes from the load each replica
    #: carries (requests waiting for a slot, a KV cache too small for the batch). False where a
    #: request is slow however the load is spread (one prompt's prefill, decode at the memory
    #: bandwidth floor, stalls behind other prefills, offloaded weights) or the time is lost
    #: outside the engine or between replicas: the capacity signal (:mod:`app.diagnosis.capacity`) then
    #: holds the replica count and names the regime.
    replicas_help: bool = False


class NotJudged(Exception):
    """Raised by a rule whose other conditions hold but one cannot be decided from the data:
    a threshold inside the bucket that holds a quantile, or fewer samples than the evidence
    needs. The engine records the regime with this reason instead of a finding (never a
    silent "healthy", never a finding the numbers do not support)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decided(low: float, high: float, op: str, threshold: float) -> bool | None:
    """Whether every value of the bucket ``(low, high]`` meets ``op threshold`` (True), none
    does (False), or it depends on where inside the bucket the true value lies (None).

    Buckets are ``le`` buckets, open below: every value in ``(low, high]`` is above a
    threshold at or below ``low``, and none is above a threshold at or above ``high`` (the
    single point ``high`` itself counts as not above, as almost every value there is below)."""
    if op not in (">=", ">", "<="):
        raise ValueError(op)
    above = True if low >= threshold else False if high <= threshold else None
    if op == "<=":
        return None if above is None else not above
    return above


def check_quantile(name: str, summary: LatencySummary | None, key: str, op: str, threshold: float,
                   unit: str = "", note: str = "") -> tuple[Evidence, bool | None]:
    """A threshold on a histogram quantile, decided on the bucket that holds it, not on the
    value ``histogram_quantile`` interpolated inside it: met when the whole bucket meets the
    threshold, not met when none of it does, None (undecided) when the threshold lies inside
    the bucket. The evidence carries the bucket. A summary without buckets is compared as given."""
    value = getattr(summary, key) if summary is not None else None
    bucket = summary.interval(key) if summary is not None else None
    if value is None or bucket is None:  # no bucket known (a summary built without one): the value itself
        plain = check(name, value, op, threshold, unit, note)
        return plain, plain.met
    verdict = decided(bucket[0], bucket[1], op, threshold)
    evidence = _compared(Evidence(name, value, op, threshold, unit, bool(verdict), note,
                                  [bucket[0], bucket[1] if math.isfinite(bucket[1]) else None]))
    return evidence, verdict


def quantile_info(name: str, summary: LatencySummary | None, key: str, unit: str = "s", note: str = "") -> Evidence:
    """A quantile shown as evidence with the bucket that holds it (``< 0.3 s`` in the lowest)."""
    value = getattr(summary, key) if summary is not None else None
    bucket = summary.interval(key) if summary is not None else None
    interval = None if bucket is None else [bucket[0], bucket[1] if math.isfinite(bucket[1]) else None]
    return Evidence(name, value, "info", None, unit, True, note, interval)


def undecided_reason(evidence: Evidence) -> str:
    """Why a quantile comparison could not be made, in words for the not-judged list."""
    unit = "s" if evidence.unit == "s" else evidence.unit
    threshold = evidence.threshold
    shown = (human.seconds(threshold) if unit == "s" else human.number(threshold, unit)) \
        if isinstance(threshold, (int, float)) else str(threshold)
    return (f"{evidence.name} lies in the bucket {human.interval(evidence.interval, unit)}, and the threshold "
            f"{shown} is inside it: where in the bucket the true value falls decides")


def check(name: str, value: float | None, op: str, threshold: float, unit: str = "", note: str = "") -> Evidence:
    """Evidence for one comparison; a missing value never meets its condition."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = False
    elif op == ">=":
        met = value >= threshold
    elif op == ">":
        met = value > threshold
    elif op == "<=":
        met = value <= threshold
    else:
        raise ValueError(op)
    return _compared(Evidence(name, value, op, threshold, unit, met, note))


def info(name: str, value: float | str | None, unit: str = "", note: str = "") -> Evidence:
    return Evidence(name, value, "info", None, unit, True, note)


#: A fired finding's confidence runs from the floor (the weakest condition on its threshold: a little
#: noise would flip it) to the ceiling (every condition well past it, in a window with plenty of data).
CONFIDENCE_FLOOR, CONFIDENCE_CEILING = 0.5, 0.99


def margin(e: Evidence) -> float | None:
    """How far a met condition is past its threshold, 0 (on it) to 1; None where it compares no two
    numbers, or its threshold is 0 (any value past it counts alike). A condition decided on the
    bucket that holds a quantile counts from the bucket's edge nearest the threshold.

    * a share (a ratio or % compared upward with a threshold below 1): the part of the room between
      the threshold and 100 % it covers, ``(value - threshold) / (1 - threshold)``;
    * anything else: the ratio of value and threshold in doublings, ``log2(ratio) / 2``, so twice
      past is 0.5 and four times past (or more) is 1."""
    value, threshold = e.value, e.threshold
    if (e.op not in (">=", ">", "<=") or isinstance(value, bool) or not isinstance(value, (int, float))
            or not isinstance(threshold, (int, float)) or threshold == 0 or not math.isfinite(value)):
        return None
    if not e.met:
        return 0.0
    upward = e.op != "<="
    if e.interval is not None:
        edge = e.interval[0] if upward else e.interval[1]
        value = edge if edge is not None else value
    if upward and e.unit in ("%", "ratio") and 0 < threshold < 1:
        return min(1.0, max(0.0, (value - threshold) / (1 - threshold)))
    ratio = value / threshold if upward else (threshold / value if value > 0 else math.inf)
    return min(1.0, max(0.0, math.log2(ratio) / 2)) if ratio > 0 else 0.0


def confidence(conditions: list[Evidence], observations: float, wanted: float, reference: bool = True) -> float:
    """How sure a finding is that its rule's pattern holds (``docs/diagnosis.md#confidence``):

        0.5 + 0.49 x weakest margin x data x reference

    the weakest :func:`margin` of the conditions that fired (0.5 when none compares two numbers);
    data = observations / ``wanted`` (4x the rule's minimum), at most 1; reference 0.5 for a rule
    judging without the reference it compares with (``bandwidth_bound`` without a hardware
    profile, whose finding is then ``info``), else 1. So 0.5 is a finding on its threshold and
    0.99 one whose every condition is at least 4x past it (a share: at 100 %) with enough data;
    never below 0.5: a finding fires only when every condition is met."""
    margins = [m for m in map(margin, conditions) if m is not None]
    weakest = min(margins) if margins else 0.5
    data = min(1.0, observations / wanted) if wanted > 0 else 1.0
    span = CONFIDENCE_CEILING - CONFIDENCE_FLOOR
    return round(CONFIDENCE_FLOOR + span * weakest * max(0.0, data) * (1.0 if reference else 0.5), 3)


def estimates_disagree(s: Signals, t: Thresholds) -> bool:
    """The two queue-time estimates are ``queue_estimates_disagree`` apart, and the larger is a
    queue worth judging (``queue_seconds``): 5 ms against 50 ms is no disagreement about queueing."""
    ratio, larger = s.queue_estimates_ratio, max(s.queue_mean_estimated or 0.0, s.queue_mean_from_ttft or 0.0)
    return ratio is not None and ratio >= t.queue_estimates_disagree and larger >= t.queue_seconds


def queue_estimates(s: Signals, t: Thresholds) -> list[Evidence]:
    """The queue-time estimates of a page without a queue-time histogram, each naming its inputs,
    and a flag (a met comparison) when they disagree (:func:`estimates_disagree`): then at least
    one of them measures something else than the queue (see the threshold)."""
    out = []
    if s.queue_mean_estimated is not None:
        out.append(info("mean queue time by Little's law", s.queue_mean_estimated, "s",
                        s.derived.get("queue_mean_estimated", "")))
    if s.queue_mean_from_ttft is not None and s.prefill_expected is not None:
        out.append(info("mean queue time as TTFT minus the expected prefill", s.queue_mean_from_ttft, "s",
                        f"expected prefill {human.seconds(s.prefill_expected)} from "
                        f"{s.derived.get('prefill_expected', '')}"))
    ratio = s.queue_estimates_ratio
    if ratio is not None:
        disagree = estimates_disagree(s, t)
        name = "queue-time estimates apart (larger / smaller)"
        out.append(Evidence(name, ratio, ">=", t.queue_estimates_disagree, "ratio", True,
                            "they disagree: one of them measures more than the queue (abandoned requests inflate "
                            "Little's law; time outside the queue inflates TTFT minus prefill)")
                   if disagree else info(name, ratio, "ratio",
                                         f"they agree within {human.given(t.queue_estimates_disagree)}x"
                                         if ratio < t.queue_estimates_disagree else
                                         f"both below {human.given(t.queue_seconds)} s: no queue to disagree about"))
    return out


def probe_evidence(s: Signals, key: str, label: str) -> list[Evidence]:
    """Client-side single-request numbers, when a probe or canary measured them."""
    b = s.probe_baseline
    value = b.p50(key) if b is not None else None
    if b is None or value is None:
        return []
    return [info(f"single-request {label} p50 (client probe)", value, "s",
                 f"probe run {b.run_id}, {b.prompt_tokens} prompt tokens, {b.age_seconds:.0f} s ago")]


def weights_at_most(s: Signals, dtype: str) -> bool:
    """The target's hardware profile stores the weights in at most ``dtype``'s bytes per parameter
    (False without a profile)."""
    return s.weight_dtype is not None and WEIGHT_DTYPE_BYTES[s.weight_dtype] <= WEIGHT_DTYPE_BYTES[dtype]


def gpu_without_fp8(s: Signals) -> bool:
    """The profile's GPU preset has no FP8 tensor cores (A100): FP8 compute cannot speed it up."""
    return s.gpu in GPUS and GPUS[s.gpu].fp8_flops is None


def gpu_with_hbm(s: Signals) -> bool:
    """The profile's GPU preset reads HBM already: "an HBM GPU instead of GDDR" is no remedy for it."""
    return s.gpu in GPUS and GPUS[s.gpu].hbm


def kv_cache_fp8(s: Signals) -> bool:
    """The engine's own configuration (vLLM ``cache_config_info``) says its KV cache is FP8 already."""
    return s.config.get("cache_dtype", "").lower().startswith("fp8")


def quantize_weights(s: Signals, lead: str, int4: str, fp8: str | None = None, fp8_compute: bool = False) -> list[str]:
    """The weight-quantization remedy ``lead: int4 or fp8.``, naming only the formats smaller than the
    weights of the target's hardware profile (none left: no remedy), and FP8 only where it can help
    (``fp8_compute``: FP8 helps by its tensor cores, so not on a GPU without them)."""
    options = [] if weights_at_most(s, "int4") else [int4]
    if fp8 is not None and not weights_at_most(s, "fp8") and not (fp8_compute and gpu_without_fp8(s)):
        options.append(fp8)
    return [f"{lead}: {' or '.join(options)}."] if options else []


def unless(done: bool, *remedy: str) -> list[str]:
    """``remedy``, or none where the hardware profile or the engine's configuration says it is done
    already (INT4 advice for INT4 weights contradicts what the user told us)."""
    return [] if done else list(remedy)


def remedies(engine: str, vllm: list[str], tgi: list[str], sglang: list[str],
             trtllm: list[str] | None = None) -> list[str]:
    """The remedies phrased for ``engine``. Every regime that can fire on a trtllm-serve page gives
    its own TensorRT-LLM list (trtllm-serve flags, ``--extra_llm_api_options`` fields); the others
    (they read per-step ITL, vLLM's render time or data-parallel ranks, which trtllm-serve does not
    export) fall back to the vLLM wording."""
    return {"vllm": vllm, "tgi": tgi, "sglang": sglang, "trtllm": trtllm or vllm}.get(engine, vllm)
