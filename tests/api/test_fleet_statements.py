"""The target list, the fleet view and ``/metrics`` run a fixed number of SQL statements
whatever the fleet's size: the fleet's default window and the quantile gauges are the last
summary round's numbers, and another window is read with set-based queries (SQLite and
PostgreSQL)."""

from __future__ import annotations

import time

from app.store import repository
from app.store.record import ScrapeRecord
from app.targets import repository as target_repository
from tests.api.conftest import Service, counted_statements
from tests.status.helpers import history_records

PATHS = ("/api/v1/targets", "/api/v1/latency", "/api/v1/latency?window=1h", "/metrics", "/api/v1/scrape-health")


def test_fleet_endpoints_run_the_same_statements_for_5_and_50_targets(quiet_service: Service) -> None:
    c, monitor = quiet_service.client, quiet_service.monitor
    end = float(int(time.time()))

    def add(names: list[str]) -> None:
        for name in names:
            assert c.post("/api/v1/targets",
                          json={"name": name, "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        with monitor.sessions() as session:
            ids = [t.id for t in target_repository.list_targets(session) if t.name in names]
        monitor.scraping.writer.write(history_records(ids, end, snapshots=61))

    def counted() -> dict[str, int]:
        out = {}
        for path in PATHS:
            with counted_statements(monitor.engine) as statements:
                assert c.get(path).status_code == 200, path
            out[path] = len(statements)
        return out

    add([f"small-{i:02d}" for i in range(5)])
    monitor.refresh_summaries()  # the summary round: per-target gauges and the fleet's default window
    small = counted()
    add([f"large-{i:02d}" for i in range(45)])
    monitor.refresh_summaries()
    large = counted()
    assert small == large, (small, large)
    # the default window and /metrics read nothing: the round's numbers; the list reads two tables
    assert large["/api/v1/latency"] == 0 and large["/metrics"] == 0, large
    assert large["/api/v1/targets"] <= 3 and large["/api/v1/latency?window=1h"] <= 12, large
    assert large["/api/v1/scrape-health"] <= 3, large
    with monitor.sessions() as session:
        first = target_repository.get_target(session, "small-00")
        assert first is not None
        monitor.scraping.writer.write([ScrapeRecord(first.id, end - 30.5, False, 0.01, error_class="connect",
                                                    error="connection refused")])
        since = time.time() - 7200
        health = {h["target"]: h for h in c.get("/api/v1/scrape-health", params={"window": "2h"}).json()}
        # the one set-based query gives each target's own counts (the per-target query's)
        for target in target_repository.list_targets(session):
            total, failed = repository.scrape_counts(session, target.id, since - 60)
            assert (health[target.name]["scrapes"], health[target.name]["failed"]) == (total, failed), target.name
            assert total >= 61
    assert len(health) == 50 and health["small-00"]["failed"] >= 1
    assert health["small-00"]["success_ratio"] == 1 - health["small-00"]["failed"] / health["small-00"]["scrapes"]

    # the round's answer is the one a request for its window computes, number for number
    kept = monitor.fleet_summary
    assert kept is not None and kept.end - kept.start == monitor.settings.latency_window
    default = c.get("/api/v1/latency").json()
    computed = c.get("/api/v1/latency", params={"start": kept.start, "end": kept.end}).json()
    assert default["start"] == kept.start and default["end"] == kept.end
    assert len(default["targets"]) == 50 and default["ttft"]["count"] > 0
    assert {**default, "window": None} == {**computed, "window": None}
    metrics = c.get("/metrics").text
    assert metrics.count('llm_latency_observations{model=') >= 50


def test_the_round_answers_only_its_own_window_while_it_is_fresh(quiet_service: Service) -> None:
    c, monitor = quiet_service.client, quiet_service.monitor
    end = time.time()
    assert c.post("/api/v1/targets", json={"name": "a", "url": "http://127.0.0.1:9/metrics"}).status_code == 201
    monitor.refresh_summaries()
    kept = monitor.fleet_summary
    assert kept is not None
    assert c.get("/api/v1/latency").json()["end"] == kept.end  # the round's answer
    assert c.get("/api/v1/latency", params={"window": "10m"}).json()["end"] >= end  # another window: computed
    # a round older than two summary intervals no longer answers (here: one that ended 2 h ago)
    monitor.fleet_summary = type(kept)(kept.start - 7200, kept.end - 7200, kept.body)
    assert c.get("/api/v1/latency").json()["end"] >= end
    # a late round (one that took longer than its interval) still answers within three of its own
    # durations (the run it overlapped was skipped): its answer is served instead of recomputed per
    # request (the body is the round's,
    # so a served answer ends exactly where the round ended; a computed one ends later)
    interval = monitor.settings.summary_interval
    late = type(kept)(kept.start - 3 * interval, kept.end - 3 * interval, kept.body, took=2 * interval)
    monitor.fleet_summary = late
    assert c.get("/api/v1/latency").json()["end"] == kept.end
    monitor.fleet_summary = type(kept)(kept.start - 3 * interval, kept.end - 3 * interval, kept.body)
    assert c.get("/api/v1/latency").json()["end"] > kept.end  # the same age, from a round on time: computed
    monitor.fleet_summary = type(kept)(kept.start - 5 * interval, kept.end - 5 * interval, kept.body,
                                       took=2 * interval)
    assert c.get("/api/v1/latency").json()["end"] == kept.end  # 5 intervals: within 3 x 2 intervals
    monitor.fleet_summary = type(kept)(kept.start - 7 * interval, kept.end - 7 * interval, kept.body,
                                       took=2 * interval)
    assert c.get("/api/v1/latency").json()["end"] > kept.end  # older than that: computed
