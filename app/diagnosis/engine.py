"""Evaluating the rules, ranking findings, and the finding lifecycle.

Ranking: when several rules fire, a finding whose regime is listed in another firing
rule's ``causes`` is a symptom — it keeps its evidence but is marked ``caused_by`` and
is never primary (KV pressure causes queueing: name the cause). Among the rest, the
primary is the first in ``RULES`` order (causes before symptoms), ties broken by
severity and confidence.

Data gates: the engine-side rules judge the window's engine traffic and need enough of it
(:func:`data_problems`); the client-side probe rules (``PROBE_REGIMES``: ``outside_engine``)
judge probe runs against the engine over the probes' own periods, with their own minimum
(``outside_min_requests``), so they run even when the window is too quiet for the others: a
gateway delay in front of an engine whose only traffic is the canary is still a finding.

Lifecycle (per target x model x regime): a firing finding is ``pending`` until it has
held for ``activate_after`` consecutive evaluations, then ``active``; an active finding
``resolved`` after ``resolve_after`` consecutive clear evaluations. A pending finding
that clears is dropped. Every transition is persisted, so the history survives restarts.
"""

from __future__ import annotations

import time
from dataclasses import replace

from sqlalchemy.orm import Session

from app import latency
from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis import signals as signals_module
from app.diagnosis.findings import PROBE_REGIMES, Diagnosis, Evidence, Finding
from app.diagnosis.profile import HardwareProfile
from app.diagnosis.rules import RULES
from app.diagnosis.rules.base import Need, NotJudged, Outcome, Rule, estimates_disagree
from app.diagnosis.signals import Signals
from app.probe.canary import ProbeBaseline
from app.probe.consistency import period_consistency
from app.store.models import FindingRow, Target, TargetView
from app.window import TargetWindow
from app.windows import default_windows
from app.windows.base import WindowError, WindowReader

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
RULE_ORDER = {rule.regime: i for i, rule in enumerate(RULES)}


def data_problems(s: Signals, t: Thresholds) -> list[str]:
    problems = []
    if s.scrapes < t.min_scrapes:
        problems.append(f"{s.scrapes} successful scrape(s) in the window, need {t.min_scrapes}")
    requests = s.ttft.count if s.ttft else 0.0
    steps = s.itl.count if s.itl else 0.0
    if requests < t.min_requests and steps < t.min_decode_steps:
        problems.append(f"{human.number(requests)} requests and {human.number(steps)} decode steps in the window, need "
                        f"{human.number(t.min_requests)} requests or {human.number(t.min_decode_steps)} steps")
    return problems


def not_judged_reason(engine: str, missing: list[Need]) -> str:
    """Why a rule was not run: what it needs that this engine's page did not have in the window."""
    return f"needs {' and '.join(need.what for need in missing)}, which this {engine} target's window does not have"


def judge(rule: Rule, s: Signals, t: Thresholds, outcomes: list[Outcome]) -> Finding | None:
    """One rule's finding, with its outcome appended to ``outcomes``: not judged when the window
    lacks what it needs or its numbers cannot decide; a residual rule is given the others' outcomes."""
    if missing := rule.missing(s):
        outcomes.append(Outcome(rule.regime, "not_judged", not_judged_reason(s.engine, missing),
                                tuple(need.how or need.what for need in missing)))
        return None
    compared: list[Evidence] = []  # a residual rule compares latencies, not conditions of its own pattern
    try:
        if rule.residual is not None:
            finding = rule.residual(s, t, tuple(outcomes))
        else:
            finding, compared = rule.judge(s, t)
    except NotJudged as undecided:  # the numbers cannot decide (see app.diagnosis.rules.base.NotJudged)
        outcomes.append(Outcome(rule.regime, "not_judged", undecided.reason))
        return None
    if finding is not None:
        outcomes.append(Outcome(rule.regime, "fired"))
    elif rule.residual is not None:
        outcomes.append(Outcome(rule.regime, "quiet", "latency in its expected range, or another rule fired"))
    elif any(e.value is not None for e in compared):
        failed = "; ".join(replace(e, note="").text() for e in compared if not e.met)
        outcomes.append(Outcome(rule.regime, "quiet", f"conditions not met: {failed}" if failed else
                                "its conditions hold one by one, not in the combination it needs"))
    else:  # it compared nothing the window has (no KV transfers, one data-parallel rank, ...)
        outcomes.append(Outcome(rule.regime, "not_applicable"))
    return finding


def diagnose(s: Signals, t: Thresholds, keep_signals: bool = True) -> Diagnosis:
    """Run every rule on one target/model's signals and rank what fired.

    The verdict is the primary finding's regime; ``insufficient_data`` when the window has too
    little engine traffic; ``not_judged`` when nothing fired but some rule could not be judged;
    ``healthy`` only when every rule that applies was judged, none fired, and the latency is in
    its expected range (``unexplained``, judged last from the others' outcomes, says otherwise).
    ``keep_signals`` False: the diagnosis holds no copy of the signals (a caller that reads only
    its findings)."""
    diagnosis = Diagnosis(s.target, s.model, s.engine, s.window_start, s.window_end, "healthy",
                          signals=s.to_dict() if keep_signals else {})
    if s.ttft_derived:
        diagnosis.notes.append("TTFT derived as queue + prefill batch time (the engine exports no TTFT histogram)")
    if s.probe_baseline:
        b = s.probe_baseline
        diagnosis.notes.append(
            f"single-request baseline from client-side probe run {b.run_id} ({b.kind}, "
            f"{b.age_seconds:.0f} s old): TTFT p50 {b.ttft['p50']:.3f} s, ITL p50 "
            f"{b.p50('itl') or 0:.4f} s with {b.prompt_tokens} prompt tokens")
    if s.probe_consistency:
        c = s.probe_consistency
        diagnosis.notes.append(f"client-side probe run(s) {', '.join(map(str, c.runs))} vs. the engine's TTFT: "
                               f"{c.message}")
    if estimates_disagree(s, t):
        diagnosis.notes.append(f"the two queue-time estimates disagree by {s.queue_estimates_ratio:.1f}x: Little's "
                               f"law {human.seconds(s.queue_mean_estimated)}, TTFT minus the expected prefill "
                               f"{human.seconds(s.queue_mean_from_ttft)}")
    problems = data_problems(s, t)
    diagnosis.notes.extend(f"engine-side rules not judged: {p}" for p in problems)
    rules = [rule for rule in RULES if rule.regime in PROBE_REGIMES] if problems else RULES
    outcomes: list[Outcome] = []
    findings = [finding for rule in sorted(rules, key=lambda r: r.residual is not None)
                if (finding := judge(rule, s, t, outcomes)) is not None]
    diagnosis.not_judged = [{"regime": o.regime, "reason": o.detail} for o in sorted(
        (o for o in outcomes if o.state == "not_judged"), key=lambda o: RULE_ORDER[o.regime])]
    for finding in findings:
        finding.window_start, finding.window_end = s.window_start, s.window_end
    rank(findings)
    diagnosis.findings = findings
    if findings:
        diagnosis.verdict = findings[0].regime
    elif problems:
        diagnosis.verdict = "insufficient_data"
    elif diagnosis.not_judged:
        diagnosis.verdict = "not_judged"
    return diagnosis


def rank(findings: list[Finding]) -> None:
    """Order in place: primary first, then other causes, then symptoms."""
    if not findings:
        return
    firing = {f.regime for f in findings}
    for finding in findings:
        # The first firing cause in precedence order, so the answer does not depend on
        # set iteration order (which changes with the interpreter's hash seed).
        cause = next((rule.regime for rule in RULES if rule.regime in firing
                      and rule.regime != finding.regime and finding.regime in rule.causes), None)
        if cause is not None:
            finding.caused_by = cause
    findings.sort(key=lambda f: (f.caused_by is not None, RULE_ORDER.get(f.regime, 99),
                                 SEVERITY_ORDER.get(f.severity, 9), -f.confidence))
    findings[0].primary = findings[0].caused_by is None


def evaluate_target(session: Session, target_id: int, target: str, engine: str, end: float, window: float,
                    thresholds: Thresholds, hardware: HardwareProfile | None = None,
                    probe_baseline: ProbeBaseline | None = None, data: TargetWindow | None = None,
                    probed: bool = True, prefill: tuple[list[str], TargetWindow] | None = None) -> list[Diagnosis]:
    """Diagnoses for every model of one target over ``[end - window, end]``.

    ``probe_baseline`` is the latest client-side single-request measurement (a canary or
    probe, :func:`app.probe.canary.latest_single_request_baseline`): it is shown as
    evidence next to the load-dependent server numbers, and the diagnosis says so. Probe runs
    that finished within ``thresholds.outside_lookback`` (or the window, if longer) are
    compared with the engine's TTFT over their own periods
    (:func:`app.probe.consistency.period_consistency`) for the ``outside_engine`` rule.

    ``data`` is the target's window when another source (a Prometheus) already read it;
    without it the window comes from the built-in store. ``probed`` False: the caller knows no
    probe run of the target finished in the lookback (a round over many targets asks once for
    all of them), so there are no runs to compare. ``prefill``: the prefill side a P/D decode worker
    is paired with (:func:`prefill_side`), its names and window."""
    if data is None:
        data = default_windows().window(session, session.get_one(Target, target_id), end - window, end,
                                        signals_module.DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    all_signals = signals_module.from_window(data, target, engine, hardware, prefill) or [
        Signals(target, "", engine, end - window, end, scrapes=data.scrapes)]
    for s in all_signals:
        s.probe_baseline = probe_baseline
    consistency = period_consistency(session, target_id, end - max(window, thresholds.outside_lookback), end,
                                     thresholds) if probed else None
    if consistency is not None:  # the probed model's diagnosis (all when the engine labels no model by name)
        for s in [s for s in all_signals if s.model in consistency.models] or all_signals:
            s.probe_consistency = consistency
    return [diagnose(s, thresholds) for s in all_signals]


def prefill_side(reads: WindowReader, session: Session, target: TargetView, data: TargetWindow, engine: str,
                 start: float, end: float) -> tuple[list[str], TargetWindow] | None:
    """The prefill side paired with ``target`` over ``[start, end]`` (:meth:`WindowReader.prefill_of`: its
    ``llm_latency_prefill_target`` label, or its source's ``pd_pair_labels`` when it decodes); None when
    nothing pairs it or that side cannot answer now (the worker is then judged on its own numbers)."""
    role = latency.pd_role(data.infos, {*data.overall.histograms, *data.overall.rates}, engine)
    try:
        return reads.prefill_of(session, target, start, end, role is not None and role.role == "decode")
    except WindowError:
        return None


def apply_lifecycle(session: Session, target_id: int, diagnosis: Diagnosis, thresholds: Thresholds,
                    now: float | None = None, open_rows: list[FindingRow] | None = None,
                    flush: bool = True) -> list[dict]:
    """Advance the persisted state of every regime for this target/model; returns transitions.
    ``open_rows``: its pending/active findings when the caller loaded a whole round's at once;
    ``flush`` False: the caller flushes the whole round's changes in one batch."""
    now = time.time() if now is None else now
    firing = {f.regime: f for f in diagnosis.findings}
    transitions = []
    if open_rows is None:
        open_rows = diagnosis_repository.open_findings(session, target_id, diagnosis.model)
    states = {row.regime: row for row in open_rows}
    for regime, finding in firing.items():
        row = states.get(regime)
        payload = finding.to_dict()
        if row is None:
            row = diagnosis_repository.create_finding(session, target_id, diagnosis.model, regime, now, payload, flush)
            states[regime] = row
        else:
            diagnosis_repository.touch_finding(session, row, now, payload)
        if row.state == "pending" and row.consecutive >= thresholds.activate_after:
            diagnosis_repository.set_finding_state(session, row, "active", now, flush)
            transitions.append({"regime": regime, "state": "active", "ts": now})
    for regime, row in states.items():
        if regime in firing:
            continue
        if row.state == "pending":
            diagnosis_repository.set_finding_state(session, row, "dropped", now, flush)
        else:
            diagnosis_repository.clear_finding(session, row, now)
            if row.clear_count >= thresholds.resolve_after:
                diagnosis_repository.set_finding_state(session, row, "resolved", now, flush)
                transitions.append({"regime": regime, "state": "resolved", "ts": now})
    return transitions
