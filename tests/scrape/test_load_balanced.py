"""A URL answered by several engine processes is refused as ``load_balanced``; one engine
restart (a single counter reset) is not. Against two real emulated engines behind a
round-robin proxy, as a Kubernetes Service without session affinity serves a scraper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.emulator.server import EmulatorFleet, TargetSpec
from app.main import create_app
from app.scrape.load_balancing import COUNTER_BOUNCES, ReplicaDetector, process_start_time
from app.settings import Settings
from tests.support.aiohttp_servers import RoundRobinProxy

KEY = ("requests_total", "m", "0")


def test_process_start_time_is_read_from_the_page() -> None:
    page = b"# HELP x\nprocess_start_time_seconds 1.7e+09\nvllm:x_total 3\n"
    assert process_start_time(page) == 1.7e9
    assert process_start_time(b'process_start_time_seconds{pid="1"} 12.5\n') == 12.5
    assert process_start_time(b"my_process_start_time_seconds 5\n") is None
    assert process_start_time(b"process_start_time_seconds NaNx\n") is None
    # only a line that starts with the name counts, the first one with a value
    assert process_start_time(b"# HELP process_start_time_seconds 9\nprocess_start_time_seconds_x 3\n"
                              b"process_start_time_seconds\r\nprocess_start_time_seconds 4\r\n") == 4.0
    assert process_start_time(b"process_start_time_seconds\n5\n") is None  # a value is on the name's line


def test_start_time_going_back_is_proof_a_single_restart_is_not() -> None:
    detector = ReplicaDetector()
    verdicts = [detector.observe(start, {KEY: float(i)}) for i, start in enumerate((100.0, 100.0, 250.0, 250.0, 250.0))]
    assert verdicts == [None] * 5  # one restart: the start time moves forward once
    alternating = ReplicaDetector()
    verdicts = [alternating.observe(start, {}) for start in (100.0, 250.0, 100.0)]
    assert verdicts[:2] == [None, None]
    assert verdicts[2] == "process_start_time_seconds went back to 100 after 250 (a restart never goes back)"


def test_counters_going_down_and_back_up_twice_is_load_balancing_a_reset_is_not() -> None:
    restart = ReplicaDetector()
    values = (500.0, 510.0, 3.0, 9.0, 20.0, 31.0, 45.0, 60.0)  # reset to zero once, then climbing
    assert [restart.observe(None, {KEY: v}) for v in values] == [None] * len(values)

    crash_loop = ReplicaDetector()
    values = (500.0, 4.0, 9.0, 2.0, 7.0, 1.0, 5.0)  # resets again and again, never back up
    assert [crash_loop.observe(None, {KEY: v}) for v in values] == [None] * len(values)

    replicas = ReplicaDetector()
    values = (500.0, 40.0, 505.0, 41.0, 511.0, 43.0)  # two replicas in turn
    verdicts = [replicas.observe(None, {KEY: v}) for v in values]
    assert COUNTER_BOUNCES == 2 and verdicts[:4] == [None] * 4
    assert verdicts[4] == "counter requests_total went down from 505 to 41 and back up to 511 " \
                          "(a restart starts again from zero)"
    assert verdicts[5] is not None

    one_back = ReplicaDetector()  # three replicas: a drop undone two scrapes later counts too
    values = (900.0, 40.0, 300.0, 901.0, 41.0, 301.0, 903.0)
    verdicts = [one_back.observe(None, {KEY: v}) for v in values]
    assert verdicts[:6] == [None] * 6 and verdicts[6] is not None


def test_the_verdict_clears_after_a_clean_history() -> None:
    detector = ReplicaDetector()
    for value in (500.0, 40.0, 505.0, 41.0, 511.0):
        verdict = detector.observe(None, {KEY: value})
    assert verdict is not None
    clean = [detector.observe(None, {KEY: 600.0 + i}) for i in range(12)]
    assert clean[0] is not None and clean[-1] is None


@pytest.fixture(scope="module")
def engines() -> Iterator[EmulatorFleet]:
    # a has served much longer than b: every switch from a to b drops the counters
    with EmulatorFleet([TargetSpec("a", "healthy", seed=1, warmup_s=600),
                        TargetSpec("b", "healthy", seed=2, warmup_s=30)]) as fleet:
        yield fleet


def service(tmp_path: Path, url: str) -> Iterator[tuple[TestClient, Any]]:
    (tmp_path / "targets.yaml").write_text(f"targets:\n  - name: svc\n    url: {url}\n")
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path,
                              config_file=tmp_path / "targets.yaml", default_scrape_interval="1h",
                              default_scrape_timeout="5s"))
    with TestClient(app) as client:
        yield client, app.state.monitor


def scrape(client: TestClient, monitor: Any) -> Any:
    record = client.portal.call(monitor.scraping.scrape_now, "svc")
    client.portal.call(monitor.scraping.flush)
    return record


def test_round_robin_proxy_is_refused_as_load_balanced(tmp_path: Path, engines: EmulatorFleet) -> None:
    with RoundRobinProxy([engines.urls["a"] + "/metrics", engines.urls["b"] + "/metrics"]) as proxy:
        running = service(tmp_path, proxy.url)
        client, monitor = next(running)
        try:
            records = [scrape(client, monitor) for _ in range(8)]
            classes = [r.error_class for r in records]
            first = classes.index("load_balanced")
            assert first <= 5  # within a few scrapes: two a->b->a bounces
            assert classes[first:] == ["load_balanced"] * (8 - first)
            assert classes[:first] == [None] * first
            assert all(r.up and r.samples_kept == 0 and r.canonical is None for r in records[first:])
            assert all(r.samples_kept > 100 for r in records[:first])
            assert proxy.served[:4] == [engines.urls["a"] + "/metrics", engines.urls["b"] + "/metrics"] * 2

            last = client.get("/api/v1/targets/svc").json()["last_scrape"]
            assert last["error_class"] == "load_balanced"
            assert "Scrape the pods instead (file_sd_configs / http_sd_configs" in last["error"]
            assert "went down from" in last["error"]
            answer = client.get("/api/v1/targets/svc/latency?window=1h")
            assert answer.status_code == 409
            assert answer.json()["detail"]["error_class"] == "load_balanced"
            assert client.get("/api/v1/targets/svc/series?window=1h").status_code == 409
            fleet = client.get("/api/v1/latency?window=1h").json()
            assert fleet["targets"] == [] and fleet["excluded_load_balanced"] == ["svc"]
            health = {h["target"]: h for h in client.get("/api/v1/scrape-health").json()}
            assert health["svc"]["last"]["error_class"] == "load_balanced"
        finally:
            next(running, None)


def test_one_engine_restart_is_not_load_balancing(tmp_path: Path, engines: EmulatorFleet) -> None:
    """The proxy sends everything to a, then (a failover, like a restarted pod behind the same
    URL) everything to b: the counters drop once and climb again, the numbers are reported."""
    with RoundRobinProxy([engines.urls["a"] + "/metrics"]) as proxy:
        running = service(tmp_path, proxy.url)
        client, monitor = next(running)
        try:
            records = [scrape(client, monitor) for _ in range(3)]
            proxy.backends = [engines.urls["b"] + "/metrics"]
            records += [scrape(client, monitor) for _ in range(6)]
            assert [r.error_class for r in records] == [None] * 9
            assert all(r.samples_kept > 100 for r in records)
            assert client.get("/api/v1/targets/svc/latency?window=1h").status_code == 200
        finally:
            next(running, None)
