"""Every emulator regime scenario gets its label as the primary finding; healthy ones
stay quiet — for vLLM, TGI, SGLang and trtllm-serve pages, through parse -> store -> signals
-> rules. A regime whose signals an engine does not export is listed as not judged instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.thresholds import Thresholds
from tests.diagnosis.harness import OfflineTarget, profile_of

REGIME_SCENARIOS = ["queueing", "prefill_compute", "prefill_interference", "bandwidth_bound", "kv_cache_pressure",
                    "weights_offloaded"]


#: trtllm-serve exports no per-step ITL and no prompt-length histogram
UNJUDGED = {"trtllm": {"prefill_compute", "prefill_interference", "bandwidth_bound", "weights_offloaded"}}


@pytest.mark.parametrize("engine", ["vllm", "tgi", "sglang", "trtllm"])
@pytest.mark.parametrize("scenario", ["healthy", "healthy_bursty", *REGIME_SCENARIOS])
def test_scenario_gets_its_label(tmp_path: Path, scenario: str, engine: str) -> None:
    target = OfflineTarget(tmp_path, scenario, engine=engine, seed=1, hardware=profile_of(scenario))
    try:
        target.run(180)
        diagnosis = target.diagnose(120)
    finally:
        target.close()
    not_judged = {n["regime"] for n in diagnosis.not_judged}
    assert not_judged == UNJUDGED.get(engine, set()), diagnosis.not_judged
    if scenario in not_judged:  # never "found healthy": listed, with the reason
        assert scenario not in {f.regime for f in diagnosis.findings}
        return
    expected = "healthy" if scenario.startswith("healthy") else scenario
    assert diagnosis.verdict == expected, [(f.regime, f.summary) for f in diagnosis.findings]
    if expected == "healthy":
        assert diagnosis.findings == []
    else:
        primary = diagnosis.findings[0]
        assert primary.primary and primary.caused_by is None
        assert all(e.met for e in primary.evidence if e.op != "info")
        assert primary.remedies and primary.runbook == f"/runbooks/{scenario}"


def test_legacy_vllm_page_reveals_cpu_offload_without_a_profile(tmp_path: Path) -> None:
    target = OfflineTarget(tmp_path, "weights_offloaded", engine="vllm-legacy", seed=2, hardware=None)
    try:
        target.run(150)
        diagnosis = target.diagnose(120)
    finally:
        target.close()
    assert diagnosis.verdict == "weights_offloaded"
    assert next(e for e in diagnosis.findings[0].evidence if e.name == "cpu_offload_gb").value == 4.0


def test_transition_is_detected_and_lifecycle_activates_then_resolves(tmp_path: Path) -> None:
    from app.diagnosis import engine as diagnosis_engine
    from app.store import repository

    t = Thresholds()
    target = OfflineTarget(tmp_path, "healthy->queueing@120->healthy@300", seed=3)
    states = []
    try:
        for _ in range(30):  # 30 evaluations, one every 15 simulated seconds
            target.run(15)
            diagnosis = target.diagnose(60, t)
            with target.sessions.begin() as session:
                diagnosis_engine.apply_lifecycle(session, target.target_id, diagnosis, t,
                                                 now=round(1_800_000_000.0 + target.sim.clock, 3))
                rows = repository.finding_history(session, target.target_id)
                states.append((round(target.sim.clock), diagnosis.verdict,
                               [(r.regime, r.state) for _, r in rows]))
    finally:
        target.close()
    clock_of = lambda pred: next(c for c, v, rows in states if pred(v, rows))  # noqa: E731
    first_fire = clock_of(lambda v, rows: v == "queueing")
    active = clock_of(lambda v, rows: ("queueing", "active") in rows)
    resolved = clock_of(lambda v, rows: ("queueing", "resolved") in rows)
    assert all(v == "healthy" for c, v, _ in states if c <= 120)
    assert 120 < first_fire <= 120 + 3 * 15           # detected within three evaluation intervals
    assert active == first_fire + 15                   # active after two consecutive evaluations
    assert resolved > 300 and states[-1][2] == [("queueing", "resolved")]
