"""Emulated causes switched at a known time, through the built-in store: the events round finds
the change (a step, a restart, a configuration change) within a few rounds, and the attribution
of the 10 minutes after it against the 10 minutes before names the cause as the top driver; on
steady load (smooth and bursty) no event is found in hours and the attribution says nothing
changed. The Prometheus-source twin is tests/attribution/test_scenarios_prometheus.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.attribution import reads, rounds
from app.attribution.events import ChangeEvent
from app.attribution.explain import Attribution
from app.emulator import scenarios
from app.emulator.scenarios import ScenarioPlan
from app.targets import repository as target_repository
from app.windows.store import StoreWindows
from tests.attribution.harness import CASES, CHANGE_AT, DETECT_S, EXPECTED_EVENTS, ROUND_S, STEADY, WINDOW
from tests.diagnosis.harness import T0, OfflineTarget


@dataclass
class Run:
    events: list[ChangeEvent] = field(default_factory=list)
    attribution: Attribution | None = None


def run_case(tmp: Path, plan: ScenarioPlan, seconds: float, seed: int = 1) -> Run:
    """``plan`` on the emulator's clock, scraped every 5 s into the store, the events round every
    30 s; the attribution of the last 10 minutes against the 10 before."""
    target = OfflineTarget(tmp, plan, seed=seed)  # type: ignore[arg-type]
    out = Run()
    try:
        while target.sim.clock < seconds - 1e-9:
            target.run(ROUND_S)
            out.events += rounds.detect_events(target.sessions, StoreWindows(), ROUND_S,
                                               now=round(T0 + target.sim.clock, 3))
        with target.sessions() as session:
            view = target_repository.get_target(session, "t")
            assert view is not None
            out.attribution = reads.attribution(StoreWindows(), session, view, WINDOW, round(T0 + seconds, 3))
    finally:
        target.close()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    yield {name: run_case(tmp_path_factory.mktemp("case"), plan, CHANGE_AT + WINDOW)
           for name, (plan, _) in CASES.items()}


def row(name: str, run: Run) -> str:
    """The scenario table's row (docs/changes.md): cause, top driver, share explained, time to detect."""
    a = run.attribution
    assert a is not None and a.lead is not None
    top = a.drivers[0]
    change = a.signals[a.lead].split.change
    detected = [e.detected_at - (T0 + CHANGE_AT) for e in run.events if e.detected_at is not None]
    when = f"{min(detected):.0f} s" if detected else "no event"
    return f"| {name} | {top.name} | {top.explains[a.lead] / change:.0%} of {a.lead} | {when} |"


@pytest.mark.parametrize("name", list(CASES))
def test_the_top_driver_is_the_cause_and_the_event_is_found(runs: dict[str, Run], name: str) -> None:
    run, (_, cause) = runs[name], CASES[name]
    a = run.attribution
    assert a is not None and a.changed, a.summary if a else None
    print(row(name, run), "\n", a.summary)
    top = a.drivers[0]
    assert top.name == cause and top.significant, [(d.name, d.explains) for d in a.drivers]
    lead_change = a.signals[a.lead].split.change
    assert top.explains[a.lead] / lead_change > 0.5  # the cause explains most of the change
    # no event before the change; the expected ones within four rounds of it, dated at it
    assert all(e.ts >= T0 + CHANGE_AT for e in run.events), [e.summary for e in run.events]
    found = {(e.kind, e.subject) for e in run.events}
    assert found == EXPECTED_EVENTS[name], [e.summary for e in run.events]
    for e in run.events:
        assert e.detected_at is not None and e.detected_at - (T0 + CHANGE_AT) <= DETECT_S, e
        assert e.ts - (T0 + CHANGE_AT) <= ROUND_S, e
    # events in the current window are said, and restarts and configuration changes are drivers
    assert {e.id for e in a.events} == {e.id for e in run.events} or len(a.events) == len(run.events)
    context = {d.name for d in a.drivers if d.name in ("restart", "config")}
    assert context == {k for k, _ in EXPECTED_EVENTS[name] if k in ("restart", "config")}


def test_the_sentences(runs: dict[str, Run]) -> None:
    said = {name: run.attribution.summary for name, run in runs.items() if run.attribution is not None}
    assert "request rate +" in said["load step"] and "with the same prompts" in said["load step"]
    assert "prompts " in said["prompt-length step"] and "% longer (" in said["prompt-length step"]
    assert "capacity 4 running requests, down from at least 18" in said["restart with lower max_num_seqs"]
    assert "restarted 08:25 UTC" in said["restart with lower max_num_seqs"]
    assert "prefix-cache hit rate 78% → 0%" in said["prefix caching turned off"]
    assert "cache_config.enable_prefix_caching: True -> False" in said["prefix caching turned off"]
    assert said["neighbour stealing decode bandwidth"].startswith("ITL p99 ")
    assert "slower at the same batch size" in said["neighbour stealing decode bandwidth"]
    assert "no restart or config change" in said["neighbour stealing decode bandwidth"]


#: hours of steady load the events round watches, per steady scenario
STEADY_HOURS = 3.0


@pytest.mark.parametrize("plan", [STEADY, scenarios.parse("healthy_bursty")], ids=["smooth", "bursty"])
def test_steady_load_has_no_event_and_nothing_changed(tmp_path: Path, plan: ScenarioPlan) -> None:
    run = run_case(tmp_path, plan, STEADY_HOURS * 3600, seed=2)
    assert run.events == [], [e.summary for e in run.events]
    a = run.attribution
    assert a is not None and not a.changed and a.summary.startswith("Nothing changed"), a.summary
    assert a.drivers == [], [(d.name, d.before, d.after, d.noise) for d in a.drivers]


class _Counted(StoreWindows):
    """The built-in store's windows, counting the windows read."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[tuple[float, float]] = []

    def window(self, session, target, start, end, signals, diagnosis=False, buckets=None):  # type: ignore[no-untyped-def]
        self.read.append((start, end))
        return super().window(session, target, start, end, signals, diagnosis, buckets)


def test_a_baseline_without_history_costs_one_read(tmp_path: Path) -> None:
    """The status page's and an alert's attribution tries a day earlier first: on a target younger
    than that, the baseline is read once and found empty (not eight windows), and the answer is
    the window before's, as read alone."""
    target = OfflineTarget(tmp_path, STEADY, seed=3)  # type: ignore[arg-type]
    try:
        target.run(2 * WINDOW + 60.0)
        end = round(T0 + target.sim.clock, 3)
        with target.sessions() as session:
            view = target_repository.get_target(session, "t")
            assert view is not None
            counted = _Counted()
            found = reads.what_changed(counted, session, view, end, lookback=1.0)
            alone = reads.attribution(StoreWindows(), session, view, WINDOW, end, "previous")
    finally:
        target.close()
    assert found is not None and found.baseline_kind == "previous"
    assert len(counted.read) == 1 + 8  # a day earlier: the baseline alone; the window before: all eight
    assert counted.read[0] == (end - WINDOW - 86400.0, end - 86400.0)
    assert found.summary == alone.summary and found.lead == alone.lead
    changes = [{n: s.split.change for n, s in a.signals.items()} for a in (found, alone)]
    assert changes[0] == changes[1] and changes[0]
