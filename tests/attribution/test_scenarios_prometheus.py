"""The emulated causes of tests/attribution/test_scenarios.py read through a Prometheus source: the
same pages with the same timestamps backfilled into a real Prometheus 2.42
(tests/support/backfill.py), discovered and read by :class:`app.promsource.service.SourceService`
behind the windows, the events round every 30 s over all of them at once. Here also a service of
two replicas loses one, whose traffic goes to the other: the top driver is the replica count."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from app.attribution import drivers, reads, rounds
from app.attribution.events import ChangeEvent
from app.emulator.scenarios import ScenarioPlan
from app.emulator.simulation import Simulation
from app.promsource.config import PrometheusSourceConfig
from app.promsource.service import SourceService
from app.store import db
from app.targets import repository as target_repository
from app.windows import Windows
from app.windows.prometheus import PrometheusWindows
from app.windows.store import StoreWindows
from tests.attribution.harness import (
    CASES,
    CHANGE_AT,
    DETECT_S,
    EXPECTED_EVENTS,
    REPLICA,
    REPLICA_DOUBLE,
    ROUND_S,
    SCRAPE_S,
    STEADY,
    WINDOW,
)
from tests.diagnosis.harness import T0
from tests.support.backfill import Backfill
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

END = CHANGE_AT + WINDOW
STALE_S = 300.0
#: pod -> (plan, the simulated second its pages stop: the pod removed)
REPLICAS = {"replica-a": (ScenarioPlan("replica a", ((0.0, REPLICA), (CHANGE_AT, REPLICA_DOUBLE))), END),
            "replica-b": (ScenarioPlan("replica b", ((0.0, REPLICA),)), CHANGE_AT)}


def _pod(name: str) -> str:
    return name.replace(" ", "-").replace("_", "-")


@dataclass
class Recorded:
    windows: Windows
    sessions: Any
    events: list[ChangeEvent]
    prometheus: Any  # tests.support.prometheus.PrometheusHandle


def _record(backfill: Backfill, pod: str, plan: ScenarioPlan, until: float, service: str, seed: int = 1) -> None:
    sim = Simulation(plan, seed=seed)
    while sim.clock < until - 1e-9:
        sim.run_for(SCRAPE_S)
        page = sim.render_metrics()
        backfill.add({"namespace": "llm", "pod": pod, "service": service}, round(T0 + sim.clock, 3),
                     page.decode() if isinstance(page, bytes) else page)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    tmp = tmp_path_factory.mktemp("attribution-prometheus")
    backfill = Backfill()
    for name, (plan, _) in CASES.items():
        _record(backfill, _pod(name), plan, END, _pod(name))
    _record(backfill, "steady", STEADY, END, "steady")
    for seed, (pod, (plan, until)) in enumerate(REPLICAS.items(), start=1):
        _record(backfill, pod, plan, until, "svc", seed)
    backfill.write_tsdb(tmp, tmp / "prom" / "prometheus-data")
    url = f"sqlite:///{tmp / 'source.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    with running_prometheus(tmp / "prom", "scrape_configs: []") as prom:
        service = SourceService()
        service.configure([PrometheusSourceConfig(name="m", url=prom.url, selector='{namespace="llm"}',
                                                  target_labels=["namespace", "pod"], service_labels=["service"])])
        windows = Windows(StoreWindows(), PrometheusWindows(service))
        events: list[ChangeEvent] = []
        try:
            t = ROUND_S
            while t <= END + 1e-9:
                now = round(T0 + t, 3)
                windows.discover(sessions, now, ROUND_S, rounds.ROUND_SIGNALS)
                events += rounds.detect_events(sessions, windows, ROUND_S, now=now)
                t += ROUND_S
            yield Recorded(windows, sessions, events, prom)
        finally:
            service.close()
            engine.dispose()


def _attribution(recorded: Recorded, target: str) -> Any:
    with recorded.sessions() as session:
        view = target_repository.get_target(session, target)
        assert view is not None, target
        return reads.attribution(recorded.windows, session, view, WINDOW, round(T0 + END, 3))


@pytest.mark.parametrize("name", list(CASES))
def test_the_top_driver_is_the_cause_through_a_source(recorded: Recorded, name: str) -> None:
    target = f"m.llm.{_pod(name)}"
    a = _attribution(recorded, target)
    detected = [(e.detected_at or 0) - (T0 + CHANGE_AT) for e in recorded.events if e.target == target]
    print(f"| {name} | {a.drivers[0].name} | {a.drivers[0].explains[a.lead] / a.signals[a.lead].split.change:.0%} "
          f"of {a.lead} | {min(detected, default=-1):.0f} s |", a.summary)
    assert a.changed and a.drivers[0].name == CASES[name][1], [(d.name, d.explains) for d in a.drivers]
    assert a.drivers[0].explains[a.lead] / a.signals[a.lead].split.change > 0.5
    found = [e for e in recorded.events if e.target == target]
    assert {(e.kind, e.subject) for e in found} == EXPECTED_EVENTS[name], [e.summary for e in found]
    for e in found:  # a configuration change once the replaced info series is stale (no staleness
        # markers in a backfilled TSDB: Prometheus' 5-minute lookback)
        late = STALE_S if e.kind == "config" else 0.0
        assert e.detected_at is not None and 0 <= e.detected_at - (T0 + CHANGE_AT) <= DETECT_S + late, e


def test_a_replica_removed_from_a_service(recorded: Recorded) -> None:
    a = _attribution(recorded, "m.svc.svc")
    detected = [(e.detected_at or 0) - (T0 + CHANGE_AT) for e in recorded.events if e.target == "m.svc.svc"]
    print(f"| replica removed | {a.drivers[0].name} | "
          f"{a.drivers[0].explains[a.lead] / a.signals[a.lead].split.change:.0%} of {a.lead} | "
          f"{min(detected, default=-1):.0f} s |", a.summary)
    top = a.drivers[0]
    assert top.name == "replicas" and (top.before, top.after) == (2.0, 1.0) and top.note == "gone: m.llm.replica-b"
    assert top.explains[a.lead] / a.signals[a.lead].split.change > 0.5
    assert "replicas 2 → 1 (gone: m.llm.replica-b)" in a.summary
    gone = [e for e in recorded.events if e.target == "m.svc.svc"]
    assert [(e.kind, e.subject, e.after) for e in gone] == [("replicas", "m.llm.replica-b", "gone")]
    assert gone[0].detected_at is not None and gone[0].detected_at - (T0 + CHANGE_AT) <= DETECT_S


def test_steady_load_through_a_source_has_no_event_and_nothing_changed(recorded: Recorded) -> None:
    a = _attribution(recorded, "m.llm.steady")
    assert not a.changed and a.summary.startswith("Nothing changed"), a.summary
    assert [e.summary for e in recorded.events if e.target in ("m.llm.steady", "m.svc.steady")] == []


def test_the_dashboards_restart_and_configuration_annotations_mark_the_change(recorded: Recorded) -> None:
    """The two dashboard annotations read from the engines' metrics alone (grafana/generate.py,
    generated here for this recording's labels) mark the restart and the configuration change
    within two minutes after them, and nothing before them or on a steady engine."""
    from tests.grafana.queries import load_generator

    generator = load_generator()
    kept = generator.ENGINE
    generator.ENGINE = generator.EngineLabels(vllm='namespace="llm", pod=~"$pod", model_name=~".*"',
                                              tgi='namespace="llm", pod=~"$pod"', labels=("namespace", "pod"),
                                              source="m", matchers='namespace="llm"')
    try:
        restarts, configs = generator.Q.engine_restarts(), generator.Q.config_changes()
    finally:
        generator.ENGINE = kept

    def marked(expr: str, pod: str, t: float) -> list:
        return recorded.prometheus.query(expr.replace("$pod", pod), time=T0 + t)["result"]

    after = CHANGE_AT + 60
    for pod in ("restart-with-lower-max-num-seqs", "prefix-caching-turned-off"):
        assert [s["metric"]["pod"] for s in marked(restarts, pod, after)] == [pod]
        assert marked(restarts, pod, CHANGE_AT - 60) == [] and marked(restarts, pod, CHANGE_AT + 300) == []
    assert [s["metric"]["pod"] for s in marked(configs, "prefix-caching-turned-off", after)] == \
        ["prefix-caching-turned-off"]
    assert marked(configs, "prefix-caching-turned-off", CHANGE_AT - 60) == []
    for pod in ("steady", "load-step"):
        assert marked(restarts, pod, after) == [] and marked(configs, pod, after) == []


def test_a_firing_alerts_attribution_reads_the_raw_samples_held(recorded: Recorded) -> None:
    """A firing alert's attribution (app/lifespan.py ``what_changed``) ends where the round's shared
    read of the source does: its raw samples' last refresh, within their lag. At the defaults
    (``for`` 2 minutes and the diagnosis minute: 3-minute windows, the one before as long) both
    windows and the baseline's parts lie in the samples held: each window's read asks only the
    target's configuration (info series), and the attribution is the one the queries give."""
    (source,) = recorded.windows.sources.sources.sources.values()  # type: ignore[attr-defined]
    mirror, client = source.reader.mirror, source.client
    refreshed = round(T0 + END, 3)
    assert mirror is not None and mirror.time == refreshed
    mirror.lag = 30.0  # the service's (SHARED_LAG)
    try:
        with recorded.sessions() as session:
            view = target_repository.get_target(session, f"m.llm.{_pod(next(iter(CASES)))}")
            assert view is not None
            assert recorded.windows.shared_end(view, refreshed + 20.0) == refreshed  # within the lag
            assert recorded.windows.shared_end(view, refreshed + 31.0) == refreshed + 31.0  # past it: now

            def attributed() -> tuple[Any, int]:
                before = client.queries
                found = reads.what_changed(recorded.windows, session, view, refreshed, window=180.0,
                                           lookback=180.0, fallbacks=("previous",))
                return found, client.queries - before

            held, held_queries = attributed()
            source.reader.mirror = None  # every window queried
            try:
                queried, queried_queries = attributed()
            finally:
                source.reader.mirror = mirror
    finally:
        mirror.lag = 0.0
    assert held is not None and queried is not None
    windows_read = 2 + drivers.PARTS
    assert held_queries == windows_read and queried_queries >= 3 * windows_read, (held_queries, queried_queries)
    assert held.to_dict() == queried.to_dict()  # every number, bit for bit
    assert held.window == (refreshed - 180.0, refreshed) and held.signals, held.summary


class _EveryBucket:
    """The windows of ``inner``, every histogram's buckets read (the attribution asks for its
    signals' alone)."""

    def __init__(self, inner: Windows) -> None:
        self.inner = inner

    def window(self, session, target, start, end, signals, diagnosis=False, buckets=None):  # type: ignore[no-untyped-def]
        return self.inner.window(session, target, start, end, signals, diagnosis, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_attribution_reads_buckets_only_for_the_quantiles_it_shows(recorded: Recorded) -> None:
    """Every window queried: an attribution shows quantiles of its signals alone (TTFT, ITL, TPOT,
    end-to-end, the two windows compared), so its components' histograms and the baseline's
    parts are read as means - the same attribution, number for number, as with every bucket read,
    for fewer bytes."""
    (source,) = recorded.windows.sources.sources.sources.values()  # type: ignore[attr-defined]
    mirror, client = source.reader.mirror, source.client
    source.reader.mirror = None
    try:
        with recorded.sessions() as session:
            view = target_repository.get_target(session, f"m.llm.{_pod(next(iter(CASES)))}")
            assert view is not None

            def attributed(windows: Any) -> tuple[Any, int]:
                before = client.bytes_read
                found = reads.what_changed(windows, session, view, T0 + END, window=180.0, lookback=180.0,
                                           fallbacks=("previous",))
                return found, client.bytes_read - before

            narrow, narrow_bytes = attributed(recorded.windows)
            every, every_bytes = attributed(_EveryBucket(recorded.windows))
    finally:
        source.reader.mirror = mirror
    assert narrow is not None and every is not None and narrow.signals
    assert narrow.to_dict() == every.to_dict()  # every number, bit for bit
    assert any(c.after is not None and c.after.p99 is not None for c in narrow.signals.values())
    assert narrow_bytes < 0.5 * every_bytes, (narrow_bytes, every_bytes)
