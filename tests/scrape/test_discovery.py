"""File and HTTP service discovery: Prometheus' target-group lists become scraped targets,
targets that leave are marked gone (kept, not scraped, no target-down alert), bad files and
entries are named and skipped. Against real emulated engines and a real aiohttp SD server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from app.alerts import engine as alerts_engine
from app.cli import main
from app.emulator.server import EmulatorFleet, TargetSpec
from app.lifespan import Monitor
from app.main import create_app
from app.scrape.discovery import (
    MAX_PROBLEMS,
    MAX_SD_BYTES,
    Discovered,
    HttpSD,
    HttpSDConfig,
    assign_names,
    base_name,
    parse_target_groups,
)
from app.settings import Settings
from tests.support.aiohttp_servers import SDServer

# --------------------------------------------------------------------------- pure parts

def test_target_groups_honour_metrics_path_scheme_and_plain_labels() -> None:
    groups = [{"targets": ["10.0.0.5:8000", "10.0.0.6:8001"],
               "labels": {"pool": "a", "__metrics_path__": "/engine/metrics", "__scheme__": "https",
                          "__meta_kubernetes_pod_name": "p-1", "__address_hint": "x"}},
              {"targets": ["10.0.0.7:9000"]}]
    items, problems = parse_target_groups(groups, "file_sd_configs[0]", "file_sd", [])
    assert problems == []
    assert [(i.address, i.url, i.labels) for i in items] == [
        ("10.0.0.5:8000", "https://10.0.0.5:8000/engine/metrics", (("pool", "a"),)),
        ("10.0.0.6:8001", "https://10.0.0.6:8001/engine/metrics", (("pool", "a"),)),
        ("10.0.0.7:9000", "http://10.0.0.7:9000/metrics", ()),
    ]


def test_bad_entries_are_named_and_skipped_the_rest_is_used() -> None:
    groups: list[Any] = [
        {"targets": ["10.0.0.5:8000", "http://10.0.0.6:8000/metrics", 7, "evil.example:80"]},
        {"targets": ["10.0.0.8:8000"], "labels": {"target": "x"}},
        {"targets": ["10.0.0.9:8000"], "labels": {"bad-name": "x"}},
        {"targets": ["10.0.0.10:8000"], "labels": {"__scheme__": "ftp"}},
        {"targets": ["10.0.0.11:8000"], "labels": {"__metrics_path__": "metrics"}},
        {"targets": ["10.0.0.12:8000"], "labels": {"k": "v" * 1025}},
        "not a group",
        {"targets": ["10.0.0.13:8000"], "extra": 1},
    ]
    items, problems = parse_target_groups(groups, "o", "file_sd", ["10.0.0.0/8"])
    assert [i.address for i in items] == ["10.0.0.5:8000"]
    assert problems == [
        "groups[0].targets[1]: not a host:port address",
        "groups[0].targets[2]: not a host:port address",
        "groups[0].targets[3]: host 'evil.example' is not in allowed_target_hosts",
        "groups[1].labels.target: label name is reserved",
        "groups[2].labels: label #0: invalid label name",
        "groups[3].labels.__scheme__: must be http or https",
        "groups[4].labels.__metrics_path__: must start with '/'",
        "groups[5].labels.k: value longer than 1024 characters",
        "groups[6]: not a mapping with 'targets' and 'labels'",
        "groups[7]: unknown key(s) extra; a group has only 'targets' and 'labels'",
    ]
    items, problems = parse_target_groups(groups, "o", "http_sd", ["10.0.0.0/8"])  # an HTTP SD list: never quoted
    assert [i.address for i in items] == ["10.0.0.5:8000"]
    assert problems[2] == ("groups[0].targets[3]: refused by the URL policy (http(s) with a valid port, "
                           "LLM_LATENCY_ALLOWED_TARGET_HOSTS)")
    assert problems[7] == "groups[5].labels: label #0: value longer than 1024 characters"
    assert problems[9] == "groups[7]: unknown key(s); a group has only 'targets' and 'labels'"
    assert not any("evil" in p or "extra" in p for p in problems)
    assert parse_target_groups({"targets": []}, "o", "file_sd", []) == ([], ["not a list of target groups"])


def test_names_come_from_the_address_and_collisions_get_a_stable_suffix() -> None:
    assert base_name("10.0.0.5:8000") == "10.0.0.5-8000"
    assert base_name("[::1]:9000") == "1-9000"
    assert base_name("vllm-0.llm.svc:8000") == "vllm-0.llm.svc-8000"
    a = Discovered("file_sd_configs[0]", "file_sd", "10.0.0.5:8000", "http://10.0.0.5:8000/metrics", ())
    b = Discovered("file_sd_configs[0]", "file_sd", "10.0.0.5:8000", "http://10.0.0.5:8000/other", ())
    c = Discovered("http_sd_configs[0]", "http_sd", "10.0.0.6:8000", "http://10.0.0.6:8000/metrics", ())
    names = assign_names([b, c, a], taken=set())
    assert len(names) == 3
    assert names["10.0.0.5-8000"] == a and names["10.0.0.6-8000"] == c
    (suffixed,) = [n for n in names if n not in ("10.0.0.5-8000", "10.0.0.6-8000")]
    assert names[suffixed] == b and len(suffixed) == len("10.0.0.5-8000-") + 8
    assert assign_names([a, c, b], taken=set()) == names  # order of discovery does not matter
    taken = assign_names([a], taken={"10.0.0.5-8000"})  # a config target owns the plain name
    assert list(taken) != ["10.0.0.5-8000"] and list(taken)[0].startswith("10.0.0.5-8000-")


# --------------------------------------------------------------------------- the service

@pytest.fixture(scope="module")
def engines() -> Iterator[EmulatorFleet]:
    with EmulatorFleet([TargetSpec("a", "healthy", seed=1, warmup_s=30),
                        TargetSpec("b", "healthy", seed=2, warmup_s=30)]) as fleet:
        yield fleet


def address(url: str) -> str:
    return url.removeprefix("http://")


def write_groups(path: Path, groups: Any) -> None:
    """Write and move the mtime on, so a rewrite within one clock tick is seen too."""
    path.write_text(groups if isinstance(groups, str) else json.dumps(groups))
    stamp = time.time() + (getattr(write_groups, "bump", 0))
    write_groups.bump = getattr(write_groups, "bump", 0) + 1  # type: ignore[attr-defined]
    os.utime(path, (stamp, stamp))


def start_service(tmp_path: Path, config: str, **settings: Any) -> Iterator[tuple[TestClient, Monitor]]:
    (tmp_path / "targets.yaml").write_text(config)
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path,
                              config_file=tmp_path / "targets.yaml", default_scrape_interval="1h",
                              default_scrape_timeout="5s", **settings))
    with TestClient(app) as client:
        yield client, app.state.monitor


def targets(client: TestClient) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in client.get("/api/v1/targets").json()}


def refresh_all(client: TestClient, monitor: Monitor) -> None:
    for discoverer in monitor.discovery.discoverers:
        client.portal.call(monitor.discovery.refresh, discoverer)


def test_file_sd_adds_changes_and_removes_targets(tmp_path: Path, engines: EmulatorFleet) -> None:
    a, b = address(engines.urls["a"]), address(engines.urls["b"])
    name_a, name_b = base_name(a), base_name(b)
    (tmp_path / "sd").mkdir()
    write_groups(tmp_path / "sd" / "pods.json", [{"targets": [a, b], "labels": {"pool": "blue"}}])
    config = "targets: []\nfile_sd_configs:\n  - files: [sd/*.json]\n    refresh_interval: 1s\n"
    service = start_service(tmp_path, config)
    client, monitor = next(service)
    try:
        found = targets(client)
        assert sorted(found) == sorted([name_a, name_b])
        assert found[name_a]["source"] == "file_sd" and found[name_a]["origin"] == "file_sd_configs[0]"
        assert found[name_a]["labels"] == {"pool": "blue"} and found[name_a]["gone_at"] is None
        assert found[name_a]["url"] == f"http://{a}/metrics"
        assert sorted(monitor.scraping.scrapers) == sorted([name_a, name_b])
        record = client.portal.call(monitor.scraping.scrape_now, name_a)
        client.portal.call(monitor.scraping.flush)
        assert record.up and record.error_class is None and record.samples_kept > 100

        # b leaves, a changes labels and metrics path: picked up by the scheduled refresh (1 s)
        write_groups(tmp_path / "sd" / "pods.json",
                     [{"targets": [a], "labels": {"pool": "green", "__metrics_path__": "/metrics/"}}])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and targets(client)[name_b]["gone_at"] is None:
            time.sleep(0.2)
        found = targets(client)
        assert found[name_b]["gone_at"] is not None
        assert found[name_a]["labels"] == {"pool": "green"} and found[name_a]["url"] == f"http://{a}/metrics/"
        assert found[name_a]["gone_at"] is None
        assert sorted(monitor.scraping.scrapers) == [name_a]
        assert monitor.scraping.scrapers[name_a].spec.url == f"http://{a}/metrics/"
        assert monitor.scraping.scrapers[name_a].spec.labels == {"pool": "green"}
        page = client.get("/").text  # on the status page only in the collapsed list of gone targets
        assert f'data-target="{name_b}"' not in page and f'data-gone-target="{name_b}"' in page
        scrapes_of_a = client.get(f"/api/v1/targets/{name_a}/scrapes").json()
        assert len(scrapes_of_a) == 1  # the same target: its history is kept

        # b comes back: gone_at cleared, same row
        write_groups(tmp_path / "sd" / "pods.json", [{"targets": [a, b]}])
        refresh_all(client, monitor)
        found = targets(client)
        assert found[name_b]["gone_at"] is None and found[name_a]["labels"] == {}
        assert sorted(monitor.scraping.scrapers) == sorted([name_a, name_b])

        # the file is removed: both gone, nothing scraped, both rows kept
        (tmp_path / "sd" / "pods.json").unlink()
        refresh_all(client, monitor)
        found = targets(client)
        assert all(found[n]["gone_at"] is not None for n in (name_a, name_b))
        assert monitor.scraping.scrapers == {}
        assert len(client.get(f"/api/v1/targets/{name_a}/scrapes").json()) == 1
    finally:
        next(service, None)


def test_gone_targets_raise_no_target_down_alert(tmp_path: Path) -> None:
    (tmp_path / "sd.yaml").write_text("- targets: ['127.0.0.1:9']\n  labels: {team: x}\n")
    service = start_service(tmp_path, "targets: []\nfile_sd_configs:\n  - files: [sd.yaml]\n")
    client, monitor = next(service)
    try:
        record = client.portal.call(monitor.scraping.scrape_now, "127.0.0.1-9")
        client.portal.call(monitor.scraping.flush)
        assert record.up is False and record.error_class == "connect"
        with monitor.sessions() as session:
            down = alerts_engine.target_down_conditions(session, monitor.alerts_config)
        assert [c.labels["target"] for c in down] == ["127.0.0.1-9"] and down[0].labels["team"] == "x"
        write_groups(tmp_path / "sd.yaml", "[]")
        refresh_all(client, monitor)
        with monitor.sessions() as session:
            assert alerts_engine.target_down_conditions(session, monitor.alerts_config) == []
        assert targets(client)["127.0.0.1-9"]["gone_at"] is not None
    finally:
        next(service, None)


def test_invalid_files_are_reported_by_file_and_entry_and_never_stop_the_service(tmp_path: Path) -> None:
    (tmp_path / "sd").mkdir()
    write_groups(tmp_path / "sd" / "good.json", [{"targets": ["127.0.0.1:8000", "10.1.2.3:80"]},
                                                 {"targets": ["127.0.0.1:8001"], "labels": {"le": "1"}}])
    (tmp_path / "sd" / "broken.json").write_text("[{\"targets\": [")
    (tmp_path / "sd" / "list.yml").write_text("targets: [a]\n")
    config = "targets: []\nfile_sd_configs:\n  - files: ['sd/*.json', 'sd/*.yml']\n"
    service = start_service(tmp_path, config, allowed_target_hosts="127.0.0.1")
    client, monitor = next(service)
    try:
        assert sorted(targets(client)) == ["127.0.0.1-8000"]
        (status,) = client.get("/api/v1/discovery").json()
        sd = tmp_path / "sd"
        assert status["origin"] == "file_sd_configs[0]" and status["kind"] == "file_sd"
        assert status["targets"] == 1 and status["error"] is None
        assert status["problems"] == [
            f"{sd}/broken.json: not valid JSON (line 1)",
            f"{sd}/good.json: groups[0].targets[1]: host '10.1.2.3' is not in allowed_target_hosts",
            f"{sd}/good.json: groups[1].labels.le: label name is reserved",
            f"{sd}/list.yml: not a list of target groups",
        ]
        # a file that breaks later keeps its last good targets
        write_groups(sd / "good.json", "{not json")
        refresh_all(client, monitor)
        assert sorted(targets(client)) == ["127.0.0.1-8000"]
        assert targets(client)["127.0.0.1-8000"]["gone_at"] is None
        (status,) = client.get("/api/v1/discovery").json()
        assert f"{sd}/good.json: not valid JSON (line 1); keeping its last good targets" in status["problems"]
    finally:
        next(service, None)


def test_http_sd_follows_the_server_and_keeps_the_last_good_list(tmp_path: Path, engines: EmulatorFleet) -> None:
    a, b = address(engines.urls["a"]), address(engines.urls["b"])
    with SDServer([{"targets": [a, b], "labels": {"zone": "z1"}}]) as sd:
        config = f"targets: []\nhttp_sd_configs:\n  - url: {sd.url}\n    refresh_interval: 1s\n"
        service = start_service(tmp_path, config)
        client, monitor = next(service)
        try:
            found = targets(client)
            assert sorted(found) == sorted([base_name(a), base_name(b)])
            assert {t["source"] for t in found.values()} == {"http_sd"}
            assert {t["origin"] for t in found.values()} == {"http_sd_configs[0]"}
            assert found[base_name(a)]["labels"] == {"zone": "z1"}
            assert sd.refresh_headers[0] == "1"

            for broken, error in ((dict(status=503), "HTTP 503 Service Unavailable"),
                                  (dict(content_type="text/html"), "the answer is not application/json"),
                                  (dict(body=b"[{]"), "the answer is not valid JSON"),
                                  (dict(body=b"[" + b" " * (1 << 20) + b"]"), "larger than 1 MiB"),
                                  (dict(body=b"{}"), "not a list of target groups")):
                sd.status, sd.content_type, sd.body = 200, "application/json", None
                for key, value in broken.items():
                    setattr(sd, key, value)
                refresh_all(client, monitor)
                (status,) = client.get("/api/v1/discovery").json()
                assert error in status["error"] and "keeping the last good list" in status["error"]
                assert all(t["gone_at"] is None for t in targets(client).values())  # last good list kept
                assert len(monitor.scraping.scrapers) == 2
            sd.status, sd.content_type, sd.body = 200, "application/json", None

            sd.groups = [{"targets": [a]}]  # b scaled down: the scheduled refresh (1 s) sees it
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and targets(client)[base_name(b)]["gone_at"] is None:
                time.sleep(0.2)
            found = targets(client)
            assert found[base_name(b)]["gone_at"] is not None and found[base_name(a)]["labels"] == {}
            assert sorted(monitor.scraping.scrapers) == [base_name(a)]
            (status,) = client.get("/api/v1/discovery").json()
            assert status["error"] is None and status["targets"] == 1 and sd.requests >= 7
        finally:
            next(service, None)


def test_check_config_validates_discovery_keys_and_files(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: []\nfile_sd_configs:\n  - files: [sd.txt]\n    refresh: 1m\n"
                   "http_sd_configs:\n  - url: ftp://x/sd\n")
    result = runner.invoke(main, ["check-config", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:3: file_sd_configs[0].files: files[0]: must end in .json, .yml or .yaml" in result.output
    assert f"{bad}:4: file_sd_configs[0].refresh: Extra inputs are not permitted" in result.output
    assert f"{bad}:6: http_sd_configs[0].url: URL scheme must be http or https, got 'ftp'" in result.output

    (tmp_path / "sd.json").write_text(json.dumps([{"targets": ["127.0.0.1:1", "x/y"]}]))
    good = tmp_path / "good.yaml"
    good.write_text("targets: []\nfile_sd_configs:\n  - files: [sd.json]\n")
    result = runner.invoke(main, ["check-config", str(good)])
    assert result.exit_code == 1
    assert result.output.strip() == f"{tmp_path}/sd.json: groups[0].targets[1]: not a host:port address"
    (tmp_path / "sd.json").write_text(json.dumps([{"targets": ["127.0.0.1:1", "127.0.0.1:2"]}]))
    result = runner.invoke(main, ["check-config", str(good)])
    assert result.exit_code == 0
    assert "1 discovery config(s) (2 target(s) in the files now)" in result.output


def test_a_removed_discovery_config_leaves_its_targets_gone(tmp_path: Path) -> None:
    (tmp_path / "sd.json").write_text(json.dumps([{"targets": ["127.0.0.1:9", "127.0.0.1:10"]}]))
    service = start_service(tmp_path, "targets: []\nfile_sd_configs:\n  - files: [sd.json]\n")
    client, monitor = next(service)
    assert [t["gone_at"] for t in targets(client).values()] == [None, None]
    next(service, None)
    # same database, the discovery config dropped; the file now names one of the addresses itself
    service = start_service(tmp_path, "targets:\n  - {name: 127.0.0.1-9, url: 'http://127.0.0.1:9/metrics'}\n")
    client, monitor = next(service)
    try:
        found = targets(client)
        assert sorted(found) == ["127.0.0.1-10", "127.0.0.1-9"]
        assert found["127.0.0.1-10"]["gone_at"] is not None and found["127.0.0.1-10"]["source"] == "file_sd"
        assert found["127.0.0.1-9"]["gone_at"] is None and found["127.0.0.1-9"]["source"] == "config"
        assert found["127.0.0.1-9"]["origin"] is None
        assert sorted(monitor.scraping.scrapers) == ["127.0.0.1-9"] and client.get("/api/v1/discovery").json() == []
    finally:
        next(service, None)


# --------------------------------------------------------------------------- size and the event loop

def test_a_huge_list_is_read_in_linear_time_and_bounded() -> None:
    """500,000 bad entries give 100 problems and a count of the rest; 80,000 targets stop at
    the limit of 1,000 (reading stops there: the rest are never validated)."""
    bad, problems = parse_target_groups([1] * 500_000, "http_sd_configs[0]", "http_sd", [])
    assert bad == [] and len(problems) == MAX_PROBLEMS + 1
    assert problems[-1] == f"{500_000 - MAX_PROBLEMS} more problems not listed"
    many = [{"targets": [f"10.0.{i // 250}.{i % 250}:8000" for i in range(80_000)]}]
    found, problems = parse_target_groups(many, "targets.json", "file_sd", [])
    assert len(found) == 1000 and problems == ["more than 1000 targets; the rest are ignored"]


def test_reading_a_huge_http_sd_answer_leaves_the_event_loop_free() -> None:
    """The answer is decoded and checked in a worker thread: a coroutine ticking every 10 ms is
    never held up for long while 1 MiB of ``[1,1,1,...]`` (about 500,000 bad entries) is read."""
    body = b"[" + b",".join([b"1"] * 524_000) + b"]"
    assert len(body) <= MAX_SD_BYTES

    async def run(sd_url: str) -> tuple[float, list[str]]:
        import aiohttp

        discoverer = HttpSD("http_sd_configs[0]", HttpSDConfig(url=sd_url, refresh_interval=30), [])
        discoverer.session = aiohttp.ClientSession()
        worst, ticking = 0.0, True

        async def tick() -> None:
            nonlocal worst
            while ticking:
                before = time.perf_counter()
                await asyncio.sleep(0.01)
                worst = max(worst, time.perf_counter() - before - 0.01)

        ticker = asyncio.create_task(tick())
        try:
            _, problems = await discoverer.refresh()
        finally:
            ticking = False
            await ticker
            await discoverer.session.close()
        return worst, problems

    with SDServer([]) as sd:
        sd.body = body
        worst, problems = asyncio.run(run(sd.url))
    assert problems[-1] == f"{524_000 - MAX_PROBLEMS} more problems not listed"
    assert worst < 0.5, worst  # the loop waited at most this long for its turn (minutes on the event loop)
