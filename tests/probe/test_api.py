"""Probe API, canary storage, the baseline query, the client/server consistency check and the
exported telemetry - on SQLite and PostgreSQL, against emulated engines."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import inspect

from app.emulator import EmulatorFleet, TargetSpec
from app.probe import repository as probe_repository
from app.probe.canary import CanaryConfig, latest_single_request_baseline, run_canary
from app.probe.consistency import FINDING, check_consistency
from app.probe.runner import ProbeSpec, run_probe
from app.probe.telemetry import ProbeCollector
from app.store import db
from app.targets import repository as target_repository
from tests.api.conftest import make_service
from tests.probe.prompt_ladder import LADDER, prefill_slope_per_1k
from tests.probe.servers import DelayProxy, FakeOpenAI


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet([TargetSpec("solo", "healthy", synthetic=False),
                        TargetSpec("quiet", "healthy", synthetic=False)]) as f:
        yield f


@pytest.fixture
def service(migrated_url: str, tmp_path: Path):
    yield from make_service(migrated_url, tmp_path)


def wait_done(client, run_id: int, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/v1/probes/{run_id}").json()
        if body["state"] != "running":
            return body
        time.sleep(0.05)
    raise AssertionError(f"probe {run_id} still running after {timeout}s")


def test_post_runs_a_probe_in_the_background_and_stores_it(service, fleet) -> None:
    c = service.client
    assert c.post("/api/v1/targets", json={"name": "solo", "url": fleet.urls["solo"] + "/metrics"}).status_code == 201
    r = c.post("/api/v1/probes", json={"target": "solo", "prompt_tokens": 256, "max_tokens": 16,
                                       "concurrency": "1,4", "time_limit": "30s"})
    assert r.status_code == 202, r.text
    run_id = r.json()["id"]
    assert r.json() == {"id": run_id, "state": "running", "href": f"/api/v1/probes/{run_id}"}
    body = wait_done(c, run_id)
    assert body["state"] == "done" and body["error"] is None and body["kind"] == "sweep"
    assert body["target"] == "solo" and body["target_id"] is not None
    assert body["params"]["concurrency"] == [1, 4] and "api_key" not in body["params"]
    summary = body["summary"]
    assert [lv["concurrency"] for lv in summary["levels"]] == [1, 4]
    assert [lv["requests"] for lv in summary["levels"]] == [2, 8] and summary["failed"] == 0
    single = summary["levels"][0]
    floor = fleet.state("solo")["decode_floor_seconds"]
    # the engine sleeps its decode floor per token: a loaded machine adds to it, and may deliver two
    # tokens in one read (a short gap after a long one), so the lower bound is on the time to the last token
    assert single["itl"]["mean"] <= floor * 1.5
    assert single["prompt_tokens_seen"] == {"min": 256, "max": 256, "mean": 256.0}
    assert summary["analysis"]["load_split"]["single_concurrency"] == 1
    assert [p["concurrency"] for p in summary["analysis"]["itl_vs_concurrency"]] == [1, 4]

    full = c.get(f"/api/v1/probes/{run_id}", params={"requests": "true"}).json()
    rows = full["requests"]
    assert len(rows) == 10 and all(row["tokens"] == 16 and row["error"] is None for row in rows)
    assert [row["concurrency"] for row in rows] == [1] * 2 + [4] * 8
    stored_ttft = [row["ttft"] for row in rows if row["concurrency"] == 1]
    assert single["ttft"]["mean"] == pytest.approx(sum(stored_ttft) / 2, rel=1e-12)
    for row in rows[:2]:  # alone on the engine: 15 decode steps of the floor after the first token
        assert row["ttft"] + 15 * row["itl_mean"] >= 15 * floor * 0.95 and row["itl_mean"] <= floor * 1.5

    listed = c.get("/api/v1/probes", params={"target": "solo"}).json()
    assert [p["id"] for p in listed] == [run_id] and "requests" not in listed[0]
    assert c.get("/api/v1/probes", params={"target": "other"}).json() == []
    assert c.get("/api/v1/probes/999999").status_code == 404
    assert c.get("/api/v1/probes/999999").json()["detail"] == "probe 999999 not found"


def test_post_runs_a_prompt_length_sweep(service, fleet) -> None:
    c = service.client
    assert c.post("/api/v1/targets", json={"name": "solo", "url": fleet.urls["solo"] + "/metrics"}).status_code == 201
    r = c.post("/api/v1/probes", json={"target": "solo", "prompt_tokens": list(LADDER), "max_tokens": 4})
    assert r.status_code == 202, r.text
    body = wait_done(c, r.json()["id"])
    assert body["state"] == "done" and body["kind"] == "sweep" and body["params"]["prompt_tokens"] == list(LADDER)
    levels = body["summary"]["levels"]
    assert [(lv["prompt_tokens"], lv["concurrency"], lv["succeeded"]) for lv in levels] == [(p, 1, 2) for p in LADDER]
    fit = body["summary"]["analysis"]["ttft_vs_prompt"]
    # 10 %: see tests/probe/prompt_ladder.py (a 40 ms hiccup in one request moves the slope ~3 %)
    assert fit["n"] == 6 and fit["slope_seconds_per_1k_tokens"] == pytest.approx(prefill_slope_per_1k(), rel=0.1)
    # the service read the target's own /metrics around every level: the probe was its only traffic
    assert [lv["server"]["requests"] for lv in levels] == [2.0, 2.0, 2.0]
    assert levels[0]["server"]["source"] == fleet.urls["solo"] + "/metrics"
    # the consistency check needs a scrape after the run (this service scrapes hourly)
    assert body["consistency"]["status"] == "insufficient_data" and body["consistency"]["runs"] == [body["id"]]
    assert body["consistency"]["message"] == "no successful scrape before and after the probe period"


@pytest.mark.parametrize("body, loc, needle", [
    ({}, ["body", "target"], "give a target name or a url"),
    ({"target": "nope"}, ["body", "target"], "unknown target 'nope'"),
    ({"url": "file:///etc/passwd"}, ["body", "url"], "scheme must be http or https"),
    ({"url": "http://127.0.0.1:9", "concurrency": [0]}, ["body", "concurrency", 0], "greater than or equal to 1"),
    ({"url": "http://127.0.0.1:9", "concurrency": 65}, ["body", "concurrency", 0], "less than or equal to 64"),
    ({"url": "http://127.0.0.1:9", "concurrency": "1,x"}, ["body", "concurrency"], "integers separated by commas"),
    ({"url": "http://127.0.0.1:9", "concurrency": [1, 1]}, ["body", "concurrency"], "distinct"),
    ({"url": "http://127.0.0.1:9", "prompt_tokens": "512,2048", "concurrency": [1, 4]}, ["body", "prompt_tokens"],
     "only one factor may vary per sweep"),
    ({"url": "http://127.0.0.1:9", "prompt_tokens": [0]}, ["body", "prompt_tokens", 0], "greater than or equal to 1"),
    ({"url": "http://127.0.0.1:9", "prompt_tokens": [512, 512]}, ["body", "prompt_tokens"], "distinct"),
    ({"url": "http://127.0.0.1:9", "prompt_tokens": [128] * 9}, ["body", "prompt_tokens"], "at most 8 items"),
    ({"url": "http://127.0.0.1:9", "max_tokens": 100000}, ["body", "max_tokens"], "less than or equal to 4096"),
    ({"url": "http://127.0.0.1:9", "concurrency": [64, 63, 62, 61, 60]}, ["body", "requests"], "at most 512"),
    ({"url": "http://127.0.0.1:9", "time_limit": "forever"}, ["body", "time_limit"], "not a duration"),
    ({"url": "http://127.0.0.1:9", "time_limit": "1h"}, ["body", "time_limit"], "less than or equal to 600"),
    ({"url": "http://127.0.0.1:9", "colour": "red"}, ["body", "colour"], "Extra inputs are not permitted"),
])
def test_bad_probe_requests_are_422_naming_the_field(service, body, loc, needle) -> None:
    r = service.client.post("/api/v1/probes", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == loc and needle in detail["msg"]
    assert service.client.get("/api/v1/probes").json() == []  # nothing stored, nothing started


def test_probe_writes_need_the_token_and_urls_obey_the_allow_list(migrated_url: str, tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        for svc in make_service(migrated_url, tmp_path, api_token="s3cret", allowed_target_hosts=["127.0.0.0/8"]):
            c = svc.client
            body = {"url": fake.url("ok"), "prompt_tokens": 8, "max_tokens": 4, "requests": 3}
            assert c.post("/api/v1/probes", json=body).status_code == 401
            assert c.post("/api/v1/probes", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
            blocked = c.post("/api/v1/probes", json={**body, "url": "http://10.1.2.3:8000"},
                             headers={"Authorization": "Bearer s3cret"})
            assert blocked.status_code == 422 and blocked.json()["detail"][0]["loc"] == ["body", "url"]
            assert "not in allowed_target_hosts" in blocked.json()["detail"][0]["msg"]
            r = c.post("/api/v1/probes", json={**body, "api_key": "sk-test"},
                       headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 202
            done = wait_done(c, r.json()["id"])  # reads stay open
            assert done["state"] == "done" and done["summary"]["requests"] == 3 and done["kind"] == "adhoc"
            assert done["target"] == fake.url("ok") and done["target_id"] is None
            assert "sk-test" not in str(done)
        assert fake.requests["ok"] == 3 + 1


def test_shutdown_cancels_a_running_probe_and_records_it(migrated_url: str, tmp_path: Path) -> None:
    with FakeOpenAI(gap=0.5) as fake:
        for svc in make_service(migrated_url, tmp_path):
            r = svc.client.post("/api/v1/probes", json={"url": fake.url("ok"), "max_tokens": 100, "requests": 2})
            assert r.status_code == 202
            run_id = r.json()["id"]
            time.sleep(0.3)
            assert svc.client.get(f"/api/v1/probes/{run_id}").json()["state"] == "running"
        engine = db.make_engine(migrated_url)
        with db.make_sessionmaker(engine)() as session:
            row = probe_repository.get_run(session, run_id)
            assert row.state == "cancelled" and row.finished_at is not None and "stopped" in row.error
        engine.dispose()


def test_canary_is_stored_and_is_the_single_request_baseline(migrated_url: str, fleet, monkeypatch) -> None:
    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            target = target_repository.create_target(session, name="solo", url=fleet.urls["solo"] + "/metrics",
                                              engine="auto", labels={})
        config = CanaryConfig.model_validate({"enabled": True, "interval": "2m", "prompt_tokens": 300,
                                              "max_tokens": 12, "requests": 2})
        assert config.interval == 120.0
        t0 = time.time()
        row = run_canary(sessions, target, config)
        assert row.state == "done" and row.kind == "canary" and row.target_id == target.id
        level = row.summary["levels"][0]
        assert (level["concurrency"], level["requests"], level["succeeded"]) == (1, 2, 2)
        floor = fleet.state("solo")["decode_floor_seconds"]
        with sessions() as session:
            by_id = latest_single_request_baseline(session, target.id, since=t0)
            by_name = latest_single_request_baseline(session, "solo", since=t0)
            stored = probe_repository.requests_of(session, row.id)
            assert latest_single_request_baseline(session, target.id, since=time.time() + 60) is None
            assert latest_single_request_baseline(session, "other", since=0) is None
        assert by_id is not None and by_name is not None
        assert by_id == replace(by_name, age_seconds=by_id.age_seconds)
        assert by_id.run_id == row.id and by_id.kind == "canary" and by_id.prompt_tokens == 300
        assert by_id.prompt_tokens_seen == {"min": 300, "max": 300, "mean": 300.0}
        assert by_id.itl is not None
        # per token, not per request (11 tokens a request): the client's clock on a loaded machine adds to the floor
        assert floor * 0.9 <= by_id.itl["mean"] <= floor * 4 and by_id.itl["count"] == 2 * 11
        assert by_id.ttft["mean"] == pytest.approx(sum(r.ttft for r in stored) / 2, rel=1e-12)
        assert 0.01 < by_id.ttft["mean"] < 0.2 and by_id.errors == {}

        # a canary that cannot run (its key is missing) is stored as an error, and is no baseline
        monkeypatch.delenv("PROBE_TEST_KEY", raising=False)
        bad = run_canary(sessions, target, config.model_copy(update={"api_key_env": "PROBE_TEST_KEY"}))
        assert bad.state == "error" and "PROBE_TEST_KEY" in bad.error
        with sessions() as session:
            assert latest_single_request_baseline(session, target.id, since=t0).run_id == row.id

        collector = ProbeCollector()
        registry = CollectorRegistry()
        registry.register(collector)
        with sessions() as session:
            collector.refresh(session)  # primes with the latest runs
        text = generate_latest(registry).decode()
        p50 = level["ttft"]["p50"]
        assert f'llm_latency_probe_ttft_seconds{{concurrency="1",kind="canary",quantile="0.5",target="solo"}} ' \
               f'{p50!r}' in text
        assert 'llm_latency_probe_requests{concurrency="1",kind="canary",target="solo"} 2.0' in text
        assert 'llm_latency_probe_prompt_tokens{kind="canary",target="solo"} 300.0' in text
        assert "llm_latency_probe_errors_total{" not in text  # counts start with the process

        # a run against a dead endpoint: errors are counted, the gauges follow the latest run
        dead = config.model_copy(update={"url": "http://127.0.0.1:9", "requests": 3})
        run_canary(sessions, target, dead)
        with sessions() as session:
            collector.refresh(session)
        text = generate_latest(registry).decode()
        assert 'llm_latency_probe_errors_total{error="connect",kind="canary",target="solo"} 3.0' in text
        assert 'llm_latency_probe_failed_requests{concurrency="1",kind="canary",target="solo"} 3.0' in text
        assert 'llm_latency_probe_ttft_seconds{' not in text  # no successful request in the latest run
        with sessions() as session:
            collector.refresh(session)  # idempotent
        assert 'error="connect",kind="canary",target="solo"} 3.0' in generate_latest(registry).decode()
    finally:
        engine.dispose()


def test_runs_outlive_their_target_and_are_pruned_by_age(service, fleet) -> None:
    c = service.client
    assert c.post("/api/v1/targets", json={"name": "gone", "url": fleet.urls["solo"] + "/metrics"}).status_code == 201
    sessions = service.monitor.sessions
    with sessions() as session:
        target = target_repository.get_target(session, "gone")
    row = run_canary(sessions, target, CanaryConfig(enabled=True, prompt_tokens=64, max_tokens=4))
    assert row.state == "done" and row.target_id == target.id
    assert c.delete("/api/v1/targets/gone").status_code == 204
    kept = c.get(f"/api/v1/probes/{row.id}", params={"requests": True}).json()
    assert kept["target_id"] is None and kept["target"] == "gone" and len(kept["requests"]) == 1
    with sessions() as session:
        assert latest_single_request_baseline(session, "gone", since=0).run_id == row.id
    with sessions.begin() as session:
        assert probe_repository.prune(session, before=row.started_at) == 0
        assert probe_repository.prune(session, before=row.started_at + 0.001) == 1
    assert c.get(f"/api/v1/probes/{row.id}").status_code == 404
    with sessions() as session:
        assert probe_repository.requests_of(session, row.id) == []


def test_client_and_server_ttft_agree_and_a_slow_gateway_is_a_finding(service, fleet) -> None:
    """The probe is the only traffic of a `synthetic=False` target, so the TTFT histogram's
    increase between the scrapes around the probe holds exactly the probe's requests (its
    preflight request included, on both sides)."""
    c = service.client
    url = fleet.urls["quiet"]
    assert c.post("/api/v1/targets", json={"name": "quiet", "url": url + "/metrics"}).status_code == 201
    sessions = service.monitor.sessions
    with sessions() as session:
        target_id = target_repository.get_target(session, "quiet").id

    def measured(base: str):
        service.scrape("quiet")
        spec = ProbeSpec(base, prompt_tokens=1500, max_tokens=4, requests=3)
        result = asyncio.run(run_probe(spec))
        assert result.ok
        service.scrape("quiet")
        with sessions() as session:
            return result, check_consistency(session, target_id, result)

    result, direct = measured(url)
    assert direct.status == "ok" and not direct.finding and not direct.other_traffic
    assert result.preflight_requests == 1 and len(result.preflight_ttfts) == 1
    assert direct.client_requests == 4 and direct.server_requests == pytest.approx(4.0)
    assert direct.window_start <= result.started_at and direct.window_end >= result.finished_at
    # 3 x one 1500-token prefill step of the 8B on an A100 (~0.13 s) + the 16-token preflight
    assert 0.07 < direct.server_mean < 0.2
    # a few ms of HTTP and event-loop scheduling on loopback (up to a hundred on a saturated 2-core
    # machine): far below the 0.25 s a finding needs
    assert direct.client_mean == pytest.approx(direct.server_mean, abs=0.15)
    assert -0.005 < direct.gap_seconds < 0.15 and "agree" in direct.message
    with sessions() as session:  # the same from the summary stored on a run row
        stored = check_consistency(session, target_id, result.summary())
    assert stored.client_mean == pytest.approx(direct.client_mean, rel=1e-9)
    assert (stored.server_mean, stored.client_requests, stored.finding) == (direct.server_mean, 4, False)

    with DelayProxy(url, delay=0.3) as proxy:
        _, slow = measured(proxy.base)
    assert slow.status == "finding" and slow.finding and slow.server_requests == pytest.approx(4.0)
    assert slow.server_mean == pytest.approx(direct.server_mean, rel=0.05)
    assert 0.3 - 0.03 <= slow.gap_seconds <= 0.3 + 0.15  # the proxy's 0.3 s, plus what a loaded machine adds
    # 0.3 s of ~0.42 s: about 70 % of what the client waits happens before the engine
    assert slow.gap_share == pytest.approx(slow.gap_seconds / slow.client_mean) and 0.6 < slow.gap_share < 0.8
    assert slow.message.startswith(FINDING)
    assert (slow.to_dict()["threshold_seconds"], slow.to_dict()["threshold_share"]) == (0.25, 0.3)

    with sessions() as session:  # a period without scrapes around it cannot be judged
        none = check_consistency(session, target_id, result, start=time.time() + 10, end=time.time() + 20)
    assert none.status == "insufficient_data" and none.gap_seconds is None and not none.finding


def test_migration_creates_the_probe_tables_as_the_models_say(database_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from app.store.models import Base

    db.upgrade(database_url)
    engine = db.make_engine(database_url)
    try:
        assert {"probe_runs", "probe_requests"} <= set(inspect(engine).get_table_names())
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        probe_diff = [d for d in diff if "probe" in repr(d)]
        assert probe_diff == []
        head = db.current_revision(engine)
        assert head >= "0004"
        db.downgrade(database_url, "0003")  # the revision before the probe tables
        assert not {"probe_runs", "probe_requests"} & set(inspect(engine).get_table_names())
        assert db.current_revision(engine) == "0003"
        db.upgrade(database_url)
        assert db.current_revision(engine) == head
    finally:
        engine.dispose()


def test_api_probes_feed_a_collector_wired_on_the_telemetry(migrated_url: str, tmp_path: Path) -> None:
    """Finished API probes reach the service's ProbeCollector (``Telemetry.probes``, given to
    the probe jobs by the Monitor) without a database round trip."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(database_url=migrated_url, data_dir=tmp_path, default_scrape_interval="1h"))
    collector = app.state.monitor.telemetry.probes
    assert isinstance(collector, ProbeCollector) and app.state.monitor.probe_jobs.on_finished == collector.observe
    registry = CollectorRegistry()
    registry.register(collector)
    with FakeOpenAI() as fake, TestClient(app) as c:
        assert c.post("/api/v1/targets", json={"name": "f", "url": fake.url("ok") + "/metrics"}).status_code == 201
        run_id = c.post("/api/v1/probes", json={"target": "f", "prompt_tokens": 8, "max_tokens": 5,
                                                 "concurrency": [1, 2]}).json()["id"]
        body = wait_done(c, run_id)
    assert body["state"] == "done" and body["url"].endswith("/ok/metrics")
    assert collector.latest[("f", "sweep")]["id"] == run_id
    text = generate_latest(registry).decode()
    for conc, n in (("1", 2), ("2", 4)):
        assert f'llm_latency_probe_requests{{concurrency="{conc}",kind="sweep",target="f"}} {n:.1f}' in text
        itl = body["summary"]["levels"][int(conc) - 1]["itl"]["p99"]
        assert f'llm_latency_probe_itl_seconds{{concurrency="{conc}",kind="sweep",quantile="0.99",target="f"}} ' \
               f'{itl!r}' in text
