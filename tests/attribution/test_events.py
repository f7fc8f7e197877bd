"""Change events: the detector's comparisons round by round, the events round over the store with
the diagnosis round's findings, and the events' table."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from app.attribution import repository, rounds
from app.attribution.changepoint import CusumSettings
from app.attribution.events import Memory, config_of, detect
from app.attribution.measures import facts_of
from app.core.quantiles import WindowHistogram
from app.diagnosis.config import DiagnosisConfig
from app.diagnosis.rounds import evaluate_diagnoses
from app.sources.base import CanonicalInfo
from app.store.models import ChangeEventRow
from app.window import ModelWindow, TargetWindow, merge_windows
from app.windows.store import StoreWindows
from tests.attribution.factories import facts
from tests.diagnosis.harness import T0, OfflineTarget

SETTINGS = CusumSettings()


def _info(**labels: str) -> CanonicalInfo:
    return CanonicalInfo("cache_config", "m", "0", {"engine": "0", **labels})


def test_a_configuration_label_change_is_an_event_and_the_first_round_only_remembers() -> None:
    memory = Memory()
    assert detect(memory, facts(0, 30), [_info(block_size="16", enable_prefix_caching="True")], False,
                  SETTINGS) == []
    assert memory.config == {"cache_config[m].block_size": "16", "cache_config[m].enable_prefix_caching": "True"}
    (event,) = detect(memory, facts(30, 60), [_info(block_size="16", enable_prefix_caching="False")], False,
                      SETTINGS)
    assert (event.kind, event.ts, event.subject, event.before, event.after) == (
        "config", 60, "cache_config[m].enable_prefix_caching", "True", "False")
    # the engine index vLLM writes in the info is not configuration; a label with two values at once
    # (a replaced series not yet stale) is not judged until one is left
    assert detect(memory, facts(60, 90), [_info(block_size="16", enable_prefix_caching="False", engine="1")],
                  False, SETTINGS) == []
    assert config_of([_info(block_size="16"), _info(block_size="32")]) == {}
    assert detect(memory, facts(90, 120), [_info(block_size="16", enable_prefix_caching="False"),
                                           _info(block_size="32", enable_prefix_caching="False")], False,
                  SETTINGS) == []
    assert memory.config["cache_config[m].block_size"] == "16"


def test_a_restart_is_an_event_and_its_window_judges_no_step() -> None:
    memory = Memory()
    for i in range(40):
        assert detect(memory, facts(i * 30, i * 30 + 30, rate=3.0 + 0.01 * (i % 3)), [], False, SETTINGS) == []
    before = dict(memory.steps)
    (event,) = detect(memory, facts(1200, 1230, rate=0.5, restarts=1), [], False, SETTINGS)
    assert (event.kind, event.ts, event.summary) == ("restart", 1230, "the engine restarted (1 counter reset in the "
                                                                       "30 s before)")
    assert memory.steps == before
    assert detect(memory, facts(1230, 1260, scrapes=0), [], False, SETTINGS) == []  # no scrape: nothing


def test_a_service_replica_gone_and_back() -> None:
    memory = Memory()
    assert detect(memory, facts(replicas=("a", "b")), [], True, SETTINGS) == []
    (gone,) = detect(memory, facts(30, 60, replicas=("a",)), [], True, SETTINGS)
    assert (gone.kind, gone.subject, gone.before, gone.after) == ("replicas", "b", "up", "gone")
    assert gone.summary == "replica b is gone: no longer scraped (1 up)"
    (back,) = detect(memory, facts(60, 90, replicas=("a", "b")), [], True, SETTINGS)
    assert (back.subject, back.after, back.summary) == ("b", "up", "replica b joined (2 up)")
    assert detect(memory, facts(90, 120, replicas=("a",)), [], False, SETTINGS) == []  # not a service


def test_a_load_step_is_dated_where_it_began() -> None:
    memory = Memory()
    found = []
    for i in range(60):
        rate = 3.0 + 0.05 * ((i * 7) % 5 - 2) + (3.0 if i >= 45 else 0.0)
        found += detect(memory, facts(i * 30, i * 30 + 30, rate=rate), [], False, SETTINGS)
    (step,) = found
    assert (step.kind, step.subject, step.ts, step.before) == ("step", "request_rate", 1350, "3 req/s")
    assert step.summary == "request rate stepped up: 3 req/s -> 6 req/s"


def test_the_events_round_stores_regime_changes_and_steps(tmp_path: Path) -> None:
    """A healthy engine that starts queueing: the diagnosis round's finding becomes active, and the
    events round stores it as a regime event next to the load step; a round with nothing new
    stores nothing; old events are pruned."""
    target = OfflineTarget(tmp_path, "healthy->queueing@1200", seed=1)
    found = []
    try:
        while target.sim.clock < 1800 - 1e-9:
            target.run(30)
            now = round(T0 + target.sim.clock, 3)
            evaluate_diagnoses(target.sessions, DiagnosisConfig(window=120.0), now=now, windows=StoreWindows())
            found += rounds.detect_events(target.sessions, StoreWindows(), 30, now=now)
        kinds = {(e.kind, e.subject.split("[")[0]) for e in found}
        assert ("regime", "queueing") in kinds, [e.summary for e in found]
        regime = next(e for e in found if e.kind == "regime")
        assert regime.after == "active" and regime.ts > T0 + 1200 and regime.target == "t"
        assert regime.summary.startswith("queueing active: Requests wait")
        with target.sessions() as session:
            stored = repository.events(session, since=T0)
            assert [(e.kind, e.subject, e.ts) for e in stored] == sorted(((e.kind, e.subject, e.ts) for e in found),
                                                                          key=lambda k: k[2])
            assert all(e.id is not None for e in stored)
            assert repository.counts(session) == {("t", kind): sum(1 for e in found if e.kind == kind)
                                                  for kind in {e.kind for e in found}}
        with target.sessions.begin() as session:
            assert repository.prune(session, regime.ts + 1) == sum(1 for e in found if e.ts < regime.ts + 1)
            assert session.query(ChangeEventRow).count() == sum(1 for e in found if e.ts >= regime.ts + 1)
    finally:
        target.close()


def test_the_round_reads_on_from_where_it_stopped(tmp_path: Path) -> None:
    target = OfflineTarget(tmp_path, "healthy", seed=1)
    try:
        target.run(60)
        assert rounds.detect_events(target.sessions, StoreWindows(), 30, now=T0 + 60) == []
        with target.sessions() as session:
            (row,) = repository.detectors(session, [target.target_id]).values()
            assert row.read_until == T0 + 60
            memory = Memory.from_json(row.state)
            assert memory.config and memory.config["cache_config.block_size"] == "16"
            assert set(memory.steps) == {"request_rate", "prompt_length", "output_length", "prefix_cache_hit_rate"}
    finally:
        target.close()


def test_settings_floors_per_series() -> None:
    memory = Memory()
    detect(memory, facts(rate=3.0), [], False, replace(SETTINGS, reference=1))
    assert memory.steps["request_rate"]["spread"] >= 0.01 and memory.steps["prompt_length"]["spread"] >= 1.0


def test_an_idle_replica_of_a_quiet_service_is_no_replica_change() -> None:
    """At 0.02 req/s a replica serves no request in most 30 s rounds: it stays in the set while it
    is scraped; the set changes when a replica is no longer scraped (its pod gone)."""
    def replica(t: float, scrapes: int, requests: float) -> TargetWindow:
        ttft = WindowHistogram((0.1, math.inf), (requests, requests), 0.05 * requests, requests)
        return TargetWindow(t, t + 30, ModelWindow(histograms={"ttft": ttft}), {"": ModelWindow(
            histograms={"ttft": ttft})}, scrapes=scrapes)

    memory, events = Memory(), []
    for i in range(40):
        t = i * 30.0
        busy, quiet = replica(t, 3, 3.0), replica(t, 3, float(i % 3 == 0))  # 1 request every third round
        rows = {"svc.a": busy, "svc.b": quiet}
        if i >= 30:  # its pod deleted: the scrape at the window's start (range selectors include it), then none
            rows["svc.b"] = replica(t, 1 if i == 30 else 0, 0.0)
        found = facts_of(merge_windows(rows, t, t + 30))
        assert found.replicas == (("svc.a", "svc.b") if i < 30 else ("svc.a",))
        events += detect(memory, found, [], True, SETTINGS)
    replicas = [(e.ts, e.subject, e.before, e.after) for e in events if e.kind == "replicas"]
    assert replicas == [(930.0, "svc.b", "up", "gone")]


def test_a_service_has_the_configuration_all_its_replicas_share() -> None:
    """A label every replica reports alike is the service's; one they differ in (num_gpu_blocks) or
    an info one replica lacks says nothing of it: a rollout half done changes no service label."""
    def replica(**labels: str) -> TargetWindow:
        base = {"block_size": "16", "enable_prefix_caching": "True", "num_gpu_blocks": "2000"}
        return TargetWindow(0, 30, scrapes=3, infos=[CanonicalInfo("cache_config", "", "", {**base, **labels})])

    both = merge_windows({"a": replica(), "b": replica(num_gpu_blocks="1990")}, 0, 30)
    assert [(i.name, i.labels) for i in both.infos] == [
        ("cache_config", {"block_size": "16", "enable_prefix_caching": "True"})]
    memory = Memory()
    assert detect(memory, facts_of(both), both.infos, True, SETTINGS) == []
    half = merge_windows({"a": replica(enable_prefix_caching="False"), "b": replica()}, 30, 60)
    assert half.infos[0].labels == {"block_size": "16", "num_gpu_blocks": "2000"}
    assert detect(memory, facts_of(half), half.infos, True, SETTINGS) == []  # half rolled out: no change
    done = merge_windows({"a": replica(enable_prefix_caching="False"),
                          "b": replica(enable_prefix_caching="False", num_gpu_blocks="1990")}, 60, 90)
    (changed,) = detect(memory, facts_of(done), done.infos, True, SETTINGS)
    assert (changed.kind, changed.subject, changed.before, changed.after) == (
        "config", "cache_config.enable_prefix_caching", "True", "False")
    lacking = TargetWindow(0, 30, scrapes=3)
    assert merge_windows({"a": replica(), "b": lacking}, 0, 30).infos == []
