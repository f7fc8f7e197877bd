"""unexplained — latency is out of its expected range and no rule explains it.

Symptom: mean TTFT, decode time per token (ITL, or per-request TPOT where the engine has no
per-step ITL) or end-to-end latency beyond what a healthy deployment shows (the ``expected_*``
thresholds), while every other regime was judged quiet or could not be judged. Why it matters:
each rule checks its own pattern, so without this one a 213-second mean TTFT on a page that lacks
what the queueing rule reads would be called "healthy". It does not guess a cause: the evidence
lists the numbers against their ranges, the derived numbers with their inputs, every rule judged
(with the conditions that were not met) and every rule not judged (with what it lacks); the
remedies say what to export or configure so a rule can judge.

Judged after all the others from their outcomes (:attr:`Rule.residual`), and fires only when none
of them did. End-to-end latency is out of range above the expected TTFT plus the mean output length
times the expected decode time per token, so it is judged only where the output length is known.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Evidence, Finding
from app.diagnosis.rules.base import Need, NotJudged, Outcome, Rule, check, confidence, info, queue_estimates
from app.diagnosis.signals import Signals

#: what to do when the numbers are right for this deployment: the last remedy of every finding
EXPECTED_HERE = ("If this latency is what this deployment is for (offline batch traffic, very long prompts or "
                 "outputs), raise expected_ttft_seconds / expected_itl_seconds for this target under "
                 "diagnosis.overrides in the targets YAML; a user-facing objective belongs in an SLO (slos:).")


def _decode_ceiling(s: Signals, t: Thresholds) -> tuple[float, str]:
    """The expected decode time per token and why: ``expected_itl_seconds``, or the target's decode
    floor times ``expected_itl_floor_factor`` where a hardware profile makes that lower."""
    if s.decode_floor_seconds is not None and t.expected_itl_floor_factor * s.decode_floor_seconds < \
            t.expected_itl_seconds:
        return (t.expected_itl_floor_factor * s.decode_floor_seconds,
                f"{human.given(t.expected_itl_floor_factor)}x the decode floor {s.decode_floor_seconds * 1000:.1f} ms "
                f"({s.hardware})")
    return t.expected_itl_seconds, "expected_itl_seconds"


def latencies(s: Signals, t: Thresholds) -> tuple[list[Evidence], list[Evidence]]:
    """Each latency the page gives compared with its expected range: (comparisons, notes on what
    could not be compared). Raises :class:`NotJudged` when no latency can be compared."""
    compared, notes = [], []
    ttft = s.ttft.mean if s.ttft is not None else None
    if ttft is not None:
        compared.append(check("TTFT mean", ttft, ">", t.expected_ttft_seconds, "s",
                              "expected_ttft_seconds" + ("; TTFT derived: queue + prefill" if s.ttft_derived else "")))
    decode, decode_name = s.decode_mean
    ceiling, why = _decode_ceiling(s, t)
    if decode is not None:
        compared.append(check(decode_name, decode, ">", ceiling, "s", why))
    e2e = s.e2e.mean if s.e2e is not None else None
    output = s.output_mean
    if e2e is not None and output is not None:
        expected = t.expected_ttft_seconds + output * ceiling
        compared.append(check("end-to-end latency mean", e2e, ">", expected, "s",
                              f"expected TTFT + mean output length {human.number(output)} tokens "
                              f"({s.output_mean_source}) "
                              f"x {ceiling * 1000:.0f} ms per token"))
    elif e2e is not None:
        notes.append(info("end-to-end latency mean", e2e, "s", "not compared: the page gives no output length "
                          "(an output-length histogram, or the generated-token counter with finished requests)"))
    if not compared:
        raise NotJudged("no latency to compare with its expected range: the window has end-to-end latency but no "
                        "output length, and neither TTFT nor a decode time")
    return compared, notes


def _rules_evidence(outcomes: Sequence[Outcome]) -> list[Evidence]:
    """One line per rule judged quiet or not judged, one for those that did not apply."""
    out = []
    for o in outcomes:
        if o.state in ("quiet", "not_judged"):
            out.append(info(o.regime, "judged, quiet" if o.state == "quiet" else "not judged", note=o.detail))
    idle = [o.regime for o in outcomes if o.state == "not_applicable"]
    if idle:
        out.append(info("rules with nothing to judge here", ", ".join(idle),
                        note="the window has no trace of what they are about (e.g. no KV transfers, no speculation)"))
    return out


def _remedies(outcomes: Sequence[Outcome]) -> list[str]:
    """What would let the rules that could not judge do so: each thing to export or configure once,
    with the rules it unblocks; then what to do when the numbers are expected here."""
    unblocks: dict[str, list[str]] = {}
    undecided = []
    for o in outcomes:
        if o.state != "not_judged":
            continue
        if o.lacks:
            for how in o.lacks:
                unblocks.setdefault(how, []).append(o.regime)
        else:
            undecided.append(o.regime)
    out = [f"To judge {', '.join(regimes)}: export or configure {how}." for how, regimes in unblocks.items()]
    if undecided:
        out.append(f"{', '.join(undecided)}: the numbers could not decide (see the evidence); a longer "
                   "diagnosis.window gives them more observations.")
    return out + [EXPECTED_HERE]


def explain(s: Signals, t: Thresholds, outcomes: Sequence[Outcome]) -> Finding | None:
    """A finding when a latency is out of its expected range and no other rule fired."""
    if any(o.state == "fired" for o in outcomes):
        return None
    compared, notes = latencies(s, t)
    out = [c for c in compared if c.met]
    if not out:
        return None
    critical = any(isinstance(c.value, (int, float)) and isinstance(c.threshold, (int, float))
                   and c.value >= t.expected_critical_factor * c.threshold for c in out)
    in_range = [info(c.name, c.value, c.unit, f"in its range (at most {human.seconds(c.threshold)}): {c.note}")
                for c in compared if not c.met and isinstance(c.threshold, float)]
    derived = [info("mean prompt length", s.prompt_mean, "tokens", s.prompt_mean_source or ""),
               info("mean output length", s.output_mean, "tokens", s.output_mean_source or ""),
               info("first tokens per second", s.first_tokens_per_second, "/s",
                    s.derived.get("first_tokens_per_second", "")),
               info("finished requests per second", s.finished_per_second, "/s",
                    s.derived.get("finished_per_second", "")),
               info("running requests (mean)", s.running_mean), info("waiting requests (mean)", s.waiting_mean),
               info("KV-cache usage (max)", s.kv_usage_max, "%")]
    evidence = (out + in_range + notes + queue_estimates(s, t)
                + [e for e in derived if e.value is not None] + _rules_evidence(outcomes))
    judged = sum(1 for o in outcomes if o.state == "quiet")
    not_judged = [o.regime for o in outcomes if o.state == "not_judged"]
    what = "; ".join(f"{c.name} {human.seconds(c.value)} above {human.seconds(c.threshold)}" for c in out
                     if isinstance(c.value, float) and isinstance(c.threshold, float))
    summary = (f"Out of its expected range: {what}. No rule explains it: {judged} judged quiet"
               + (f", {len(not_judged)} not judged ({', '.join(not_judged)})" if not_judged else "") + ".")
    observations = s.ttft.count if s.ttft is not None else s.itl.count if s.itl is not None else 0.0
    return Finding("unexplained", "critical" if critical else "warning",
                   confidence(out, observations, 4 * t.min_requests), summary, evidence, _remedies(outcomes))


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    """Judged alone, as if no other rule had run (the engine calls :func:`explain` with their outcomes)."""
    return explain(s, t, ())


RULE = Rule("unexplained", evaluate, precedence=99, colour="light-red", residual=explain, promql=None,
            no_promql="it fires on the absence of every other regime's finding and lists the rules that could not "
                      "be judged; a Prometheus twin would have to read the other alerts' ALERTS series, which "
                      "exist only for twins whose series the engine exports, and could not say which were "
                      "skipped. Latency above a bound alerts in Prometheus through the SLO rules (alerts.slos, "
                      "slos:)",
            needs=(Need("a latency (TTFT, ITL or TPOT, or end-to-end latency)", ("ttft", "itl", "tpot", "e2e"),
                        "the engine's TTFT, inter-token or end-to-end latency histograms"),))
