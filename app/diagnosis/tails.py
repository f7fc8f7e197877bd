"""Which histograms' buckets a diagnosis needs, judged from a means-first window.

A Prometheus source's round reads every histogram's ``_sum`` and ``_count`` for every target
(2 series per histogram and target) and its buckets (~20 series each) only where the diagnosis
needs a distribution: :func:`buckets_needed` evaluates the rules on the means-first window and
names the histograms whose buckets can change what the diagnosis concludes, so that a second
read of those buckets for those targets gives the same verdict, findings and evidence as one
full read. Everything the rules judge from means, gauges and rates is exact without buckets.

What needs buckets:

* a rule that judges a tail, where its other conditions (all from means) leave it possible:
  ``bandwidth_bound`` (ITL p99/p50 steady) when the small-batch ITL is slow at a small batch;
  ``prefill_interference`` (stall share, ITL p99/p50 and p99, prompt p90, the step budget in its
  advice) when enough requests run and a stall may be there: it fires only with steps of
  ``STALL_SECONDS`` or more or an ITL p99 at its threshold, which the ITL buckets at those two
  bounds and ``+Inf`` tell first (a :class:`~app.window.TailProbe`);
* a finding whose evidence shows a quantile (TTFT p99, render p99, KV transfer p99, ITL p99/p50).
"""

from __future__ import annotations

import math

from app.core.thresholds import Thresholds
from app.diagnosis.engine import diagnose
from app.diagnosis.signals import STALL_SECONDS, Signals, from_window
from app.window import TailProbe, TargetWindow

#: What a finding of each regime shows or decides from buckets: its histograms.
EVIDENCE_BUCKETS: dict[str, frozenset[str]] = {
    "bandwidth_bound": frozenset({"itl"}),
    "prefill_interference": frozenset({"itl", "prompt_tokens", "iteration_tokens", "prefill_time"}),
    "kv_cache_pressure": frozenset({"itl"}),
    "queueing": frozenset({"ttft"}),
    "prefill_compute": frozenset({"ttft"}),
    "lora_adapter_slots": frozenset({"ttft"}),
    "scheduler_cpu_bound": frozenset({"ttft"}),
    "frontend_bound": frozenset({"render_time"}),
    "kv_transfer": frozenset({"kv_transfer_time"}),
}
#: Every histogram whose buckets a diagnosis may need.
TAIL_SIGNALS = frozenset().union(*EVIDENCE_BUCKETS.values())


def _tail_possible(s: Signals, t: Thresholds) -> set[str | TailProbe]:
    """The histograms of the tail rules whose conditions from means do not rule them out."""
    out: set[str | TailProbe] = set()
    has_itl = s.itl is not None and s.itl.count > 0
    itl_small = s.itl_typical
    if has_itl and itl_small is not None and itl_small >= t.slow_itl_seconds and s.running_mean is not None \
            and s.running_mean <= t.low_batch_running:
        out |= EVIDENCE_BUCKETS["bandwidth_bound"]
    if has_itl and s.running_mean is not None and s.running_mean >= t.interference_running:
        if s.engine == "tgi":  # its stall share is a ratio of means, its ratio path the ITL buckets
            out |= EVIDENCE_BUCKETS["prefill_interference"]
        else:  # no step of STALL_SECONDS or more and p99 below itl_p99_seconds: it cannot stall
            out.add(TailProbe("itl", ((1.0, STALL_SECONDS), (0.99, math.nextafter(t.itl_p99_seconds, 0.0))),
                              EVIDENCE_BUCKETS["prefill_interference"]))
    return out


def buckets_needed(window: TargetWindow, target: str, engine: str, thresholds: Thresholds
                   ) -> frozenset[str | TailProbe]:
    """The histograms whose buckets this target's diagnosis needs, from its means-first window
    (each histogram ``_sum``/``_count`` only): none for a target whose every rule is decided by
    means and whose findings show no quantile."""
    needed: set[str | TailProbe] = set()
    for s in from_window(window, target, engine):
        needed |= _tail_possible(s, thresholds)
        diagnosis = diagnose(s, thresholds, keep_signals=False)
        for regime in [f.regime for f in diagnosis.findings] + [n["regime"] for n in diagnosis.not_judged]:
            needed |= EVIDENCE_BUCKETS.get(regime, frozenset())
    return frozenset(needed)
