"""The capacity signal on emulated engines (simulated time, the production path from page
bytes to the diagnosis): a queueing engine needs more replicas, an engine whose problem
replicas do not fix holds its count and says why, a healthy one needs no more than it has;
and a Prometheus source's service (replicas merged as the source merges them) is sized as a
whole."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.thresholds import Thresholds
from app.diagnosis import capacity
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.capacity import Capacity
from app.diagnosis.rules import RULES
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS, from_window
from app.store import reads
from app.window import TargetWindow, merge_windows
from tests.diagnosis.harness import T0, OfflineTarget, profile_of

WINDOW = 60.0


def _run(tmp_path: Path, scenario: str, seconds: float = 180.0, name: str = "t") -> tuple[Capacity, dict]:
    profile = profile_of(scenario.split("->")[-1].split("@")[0])
    target = OfflineTarget(tmp_path, scenario, seed=1, hardware=profile, name=name)
    try:
        target.run(seconds)
        diagnosis = target.diagnose(WINDOW).to_dict()
    finally:
        target.close()
    return capacity.assess(diagnosis, Thresholds()), diagnosis["signals"]


def test_queueing_engine_needs_the_replicas_its_queue_would_fill(tmp_path: Path) -> None:
    """48 users on 8 slots: 8 running and ~37 waiting -> (8 + 37.2) / 8 = 5.65 -> 6 replicas."""
    c, s = _run(tmp_path, "queueing")
    assert (c.reason, c.scaling_helps, c.kind, c.current_replicas) == ("queueing", True, "engine", 1)
    assert s["running_max"] == 8.0 and s["running_mean"] == pytest.approx(8.0)
    assert c.inputs["slots"] == pytest.approx((s["running_mean"] + s["waiting_mean"]) / 8.0)
    assert c.inputs["slots"] == pytest.approx(5.654, abs=0.01)
    assert c.bound_by == "slots" and c.utilization == c.inputs["slots"]
    assert c.desired_replicas == 6 == math.ceil(48 / 8)  # the workload's own answer: 48 users / 8 slots
    # a closed-loop workload arrives as fast as it is served: the queue is standing, not growing
    assert c.inputs["arrival"] == pytest.approx(1.0, abs=0.05)
    assert c.inputs["kv_cache"] < 0.05


def test_a_growing_queue_counts_arrivals_above_completions(tmp_path: Path) -> None:
    """Switched to queueing 30 s before the end of the window: the requests in the engine are
    still climbing, so arrivals exceed completions."""
    c, s = _run(tmp_path, "healthy->queueing@150")
    assert (c.reason, c.scaling_helps) == ("queueing", True)
    completions = s["requests_per_second"]
    growth = 2 * (s["running_last"] + s["waiting_last"] - s["running_mean"] - s["waiting_mean"]) / WINDOW
    assert growth > 0.3
    assert c.inputs["arrival"] == pytest.approx((completions + growth) / completions)
    assert c.inputs["arrival"] > 1.2
    assert c.desired_replicas == math.ceil(max(c.inputs.values())) >= 3


def test_kv_cache_pressure_is_sized_by_the_cache(tmp_path: Path) -> None:
    c, s = _run(tmp_path, "kv_cache_pressure")
    assert (c.reason, c.scaling_helps, c.bound_by) == ("kv_cache_pressure", True, "kv_cache")
    assert c.inputs["kv_cache"] == pytest.approx(s["kv_usage_mean"] / 0.8) and s["kv_usage_mean"] > 0.95
    assert c.desired_replicas == 2


@pytest.mark.parametrize("scenario", ["prefill_interference", "bandwidth_bound", "weights_offloaded"])
def test_regimes_replicas_do_not_fix_hold_the_count(tmp_path: Path, scenario: str) -> None:
    c, _ = _run(tmp_path, scenario)
    assert (c.reason, c.scaling_helps, c.desired_replicas, c.current_replicas) == (scenario, False, 1, 1)
    assert c.inputs["slots"] > 0  # the load is still shown
    assert f"the diagnosis is {scenario}, which more replicas do not fix" in c.summary


@pytest.mark.parametrize("scenario", ["healthy", "healthy_bursty"])
def test_healthy_engine_needs_no_more_than_it_has(tmp_path: Path, scenario: str) -> None:
    c, s = _run(tmp_path, scenario)
    assert (c.reason, c.scaling_helps, c.current_replicas) == ("healthy", True, 1)
    assert c.utilization == pytest.approx(s["running_mean"] / s["running_max"]) and c.utilization < 0.7
    assert c.desired_replicas == 1


def test_the_hold_overrides_the_load() -> None:
    """The same numbers size the target under a load verdict and hold it under any regime
    whose rule says replicas do not help (the rule's ``replicas_help``, not a list here)."""
    signals = {"running_mean": 8.0, "running_max": 8.0, "waiting_mean": 16.0, "kv_usage_mean": 0.2}
    holding = [rule.regime for rule in RULES if not rule.replicas_help]
    assert {"prefill_interference", "bandwidth_bound", "weights_offloaded", "outside_engine", "replica_imbalance",
            "prefill_compute", "kv_transfer", "speculation_ineffective", "dp_imbalance",
            "frontend_bound", "unexplained", "scheduler_cpu_bound", "lora_adapter_slots"} == set(holding)
    for verdict in ["queueing", "kv_cache_pressure", "healthy", "not_judged"]:
        c = capacity.assess({"target": "t", "verdict": verdict, "signals": signals}, Thresholds())
        assert (c.desired_replicas, c.scaling_helps, c.utilization) == (3, True, 3.0)
    for verdict in [*holding, "insufficient_data"]:
        c = capacity.assess({"target": "t", "verdict": verdict, "signals": signals}, Thresholds())
        assert (c.desired_replicas, c.scaling_helps, c.reason, c.utilization) == (1, False, verdict, 3.0)
    bare = capacity.assess({"target": "t", "verdict": "queueing", "signals": {"kv_usage_mean": 0.2}}, Thresholds())
    assert (bare.desired_replicas, bare.scaling_helps, bare.reason) == (1, False, "no_load_data")


def test_tolerance_keeps_the_count_near_one_and_idle_goes_to_one() -> None:
    t = Thresholds()
    near = {"running_mean": 10.8, "running_max": 10.0, "waiting_mean": 0.0}  # 1.08: within 0.1
    assert capacity.assess({"target": "t", "verdict": "healthy", "signals": near}, t).desired_replicas == 1
    over = {**near, "running_mean": 11.5}
    assert capacity.assess({"target": "t", "verdict": "healthy", "signals": over}, t).desired_replicas == 2
    replicas = [{"target": f"r{i}"} for i in range(4)]
    idle = {"running_mean": 0.0, "running_max": 0.0, "waiting_mean": 0.0, "replicas": replicas}
    c = capacity.assess({"target": "svc", "verdict": "healthy", "signals": idle}, t)
    assert (c.kind, c.current_replicas, c.desired_replicas) == ("service", 4, 1)


# ---------------------------------------------------------------- services (Prometheus sources)

@pytest.fixture
def replicas(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, TargetWindow]]:
    """Each replica's window over the same simulated minute, as a source reads them."""
    targets = [OfflineTarget(tmp_path, scenario, seed=i, name=f"r{i}") for i, scenario in enumerate(request.param)]
    try:
        for target in targets:
            target.run(180)
        end = round(T0 + targets[0].sim.clock, 3)
        windows = {}
        for target in targets:
            with target.sessions() as session:
                windows[target.name] = reads.store_window(session, [target.target_id], end - WINDOW, end,
                                                            DIAGNOSIS_HISTOGRAMS, diagnosis=True)
        yield windows
    finally:
        for target in targets:
            target.close()


def _service(windows: dict[str, TargetWindow]) -> Capacity:
    first = next(iter(windows.values()))
    merged = merge_windows(windows, first.start, first.end)
    [signals] = from_window(merged, "prod.svc.chat", "vllm")
    return capacity.assess(diagnosis_engine.diagnose(signals, Thresholds()).to_dict(), Thresholds())


@pytest.mark.parametrize("replicas", [("queueing",) * 3], indirect=True)
def test_a_queueing_service_is_sized_as_a_whole(replicas: dict[str, TargetWindow]) -> None:
    c = _service(replicas)
    assert (c.kind, c.current_replicas, c.reason, c.scaling_helps) == ("service", 3, "queueing", True)
    running = sum(w.overall.gauges["running"].mean for w in replicas.values())
    waiting = sum(w.overall.gauges["waiting"].mean for w in replicas.values())
    assert c.inputs["slots"] == pytest.approx((running + waiting) / 24.0)  # 3 replicas x 8 slots
    assert c.desired_replicas == math.ceil(3 * c.inputs["slots"]) and 16 <= c.desired_replicas <= 18


@pytest.mark.parametrize("replicas", [("queueing", "healthy")], indirect=True)
def test_an_unevenly_loaded_service_holds_its_count(replicas: dict[str, TargetWindow]) -> None:
    """One replica queues while the other has room: routing, not replicas, is the fix."""
    c = _service(replicas)
    assert (c.current_replicas, c.reason, c.scaling_helps, c.desired_replicas) == (2, "replica_imbalance", False, 2)
    assert c.inputs["slots"] > 2  # summed, the load would have asked for more


# ---------------------------------------------------------------- SLO burn (the slos: section)

def test_an_slo_burning_its_budget_asks_for_one_more_replica(tmp_path: Path) -> None:
    """A healthy engine whose load alone needs no more replicas, under two TTFT SLOs: a tight
    one (99.9 % within 0.1 s, which its tail misses) burns over 5 m and 30 m and raises the
    signal to 2; a loose one (2.5 s) alone would not."""
    from app.emulator.simulation import Simulation
    from tests.slo.harness import T0 as SLO_T0
    from tests.slo.harness import SloHarness

    slos = [{"name": "tight", "signal": "ttft", "threshold": "0.1s", "objective": "99.9%", "period": "28d"},
            {"name": "loose", "signal": "ttft", "threshold": "2.5s", "objective": "99%", "period": "28d"}]
    harness = SloHarness(tmp_path, slos, {"chat": Simulation("healthy", seed=2)})
    try:
        statuses = list(harness.run(35 * 60))[-1]
        now = round(SLO_T0 + harness.clock, 3)
        with harness.sessions() as session:
            [diagnosis] = diagnosis_engine.evaluate_target(session, harness.engines[0].target_id, "chat", "vllm",
                                                           now, WINDOW, Thresholds())
    finally:
        harness.close()
    tight, loose = statuses
    burns = {s.name: [w.burn_rate(s.objective) for w in s.targets[0].windows[:2]] for s in statuses}
    assert [w.label for w in tight.windows[:2]] == ["5m", "30m"]
    assert min(burns["tight"]) > 1.0 and max(burns["loose"]) == 0.0

    alone = capacity.assess(diagnosis.to_dict(), Thresholds(), [loose])
    assert (alone.reason, alone.scaling_helps, alone.desired_replicas) == ("healthy", True, 1)
    assert (alone.slo, alone.slo_burn_rate) == ("loose", 0.0)
    c = capacity.assess(diagnosis.to_dict(), Thresholds(), statuses)
    assert (c.slo, c.slo_burn_rate) == ("tight", pytest.approx(min(burns["tight"])))
    assert (c.desired_replicas, c.bound_by, c.utilization < 1.0) == (2, "slo_burn", True)
    assert "SLO tight burns its budget" in c.summary
    # the diagnosis still decides: a regime replicas do not fix holds the count whatever burns
    held = capacity.assess({**diagnosis.to_dict(), "verdict": "prefill_interference"}, Thresholds(), statuses)
    assert (held.desired_replicas, held.scaling_helps, held.slo) == (1, False, "tight")


def test_a_service_takes_the_fastest_burn_among_its_replicas() -> None:
    """SLOs are evaluated on a source's replicas; their service's signal sees their burn."""
    from app.slo.status import SloStatus, SloTargetStatus, SloWindow

    def part(target: str, bad: float) -> SloTargetStatus:
        windows = (SloWindow(300, 1000 - bad, 1000, 300), SloWindow(1800, 6000 - 6 * bad, 6000, 1800))
        return SloTargetStatus(target, {}, SloWindow(86400, 1, 1, 86400), windows, ())

    period = SloWindow(28 * 86400, 1, 1, 86400)
    status = SloStatus("chat-ttft", "ttft", 2.5, 0.99, 28 * 86400, period, (), (part("r0", 30), part("r1", 5)),
                       0.03, None, ())
    signals = {"running_mean": 4.0, "running_max": 8.0, "waiting_mean": 0.0,
               "replicas": [{"target": "r0"}, {"target": "r1"}]}
    c = capacity.assess({"target": "prod.svc.llm.chat", "verdict": "healthy", "signals": signals}, Thresholds(),
                        [status])
    assert (c.slo, c.slo_burn_rate) == ("chat-ttft", pytest.approx(3.0))  # r0: 3 % bad of a 1 % budget
    assert (c.current_replicas, c.desired_replicas, c.bound_by) == (2, 3, "slo_burn")
