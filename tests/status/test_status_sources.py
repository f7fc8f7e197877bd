"""The status page with a Prometheus source: a real Prometheus 2.42 scraping emulated vLLM replicas
through file-based discovery. Discovered targets name their source and labels; a replica whose
series stopped is listed apart as gone, not as a live row; while the source is failing a banner
names it and its (classified) error, and every target of it says its verdict is the last one."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

from app.emulator.server import EmulatorFleet, TargetSpec
from tests.api.conftest import make_service
from tests.status.helpers import levels, rows, stat, text_of
from tests.support.prometheus import FileSD, free_port, running_prometheus
from tests.support.sources import source_config

WINDOW = 20.0


def _banner(page: str) -> str | None:
    match = re.search(r'<section class="banner source-failing"[^>]*data-source="prod"[^>]*>(.*?)</section>', page, re.S)
    return text_of(match.group(1)) if match else None


def _gone(page: str) -> list[str]:
    return re.findall(r'<li data-gone-target="([^"]+)"', page)


def test_sources_on_the_status_page(migrated_url: str, tmp_path: Path) -> None:
    specs = [TargetSpec("a", "healthy", time_scale=10.0, warmup_s=60, seed=1),
             TargetSpec("b", "queueing", time_scale=10.0, warmup_s=60, seed=2)]
    with EmulatorFleet(specs) as fleet:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"], "b": fleet.urls["b"]}, namespace="llm")
        with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s")) as prom:
            prom.wait_for_samples('vllm:num_requests_running{namespace="llm"}', int(WINDOW) + 2, timeout=60)
            config = source_config(tmp_path / "t.yaml", prom.url, WINDOW)
            for svc in make_service(migrated_url, tmp_path, config_file=config):
                c, monitor = svc.client, svc.monitor
                results = monitor.evaluate_diagnoses(now=time.time())
                verdicts = {d.target: d.verdict for d, _ in results}
                assert verdicts["prod.llm.b"] == "queueing", verdicts

                # Discovered targets: their source and their labels, no banner, nothing gone.
                page = c.get("/").text
                fleet_rows = rows(page)
                assert set(fleet_rows) == {"prod.llm.a", "prod.llm.b"}
                for pod in ("a", "b"):
                    row = fleet_rows[f"prod.llm.{pod}"]
                    assert 'data-origin="prod"' in row and "Prometheus source prod" in text_of(row)
                    labels = re.findall(r'<li><span class="k">(\w+)</span>=<span class="v">([^<]*)</span></li>', row)
                    assert labels == [("namespace", "llm"), ("pod", pod)]
                    assert "data-stale" not in row
                assert list(levels(page).items())[1] == ("prod.llm.a", "healthy")  # b, queueing, sorts first
                assert _banner(page) is None and _gone(page) == []
                detail = c.get("/targets/prod.llm.a").text
                assert '<dd data-origin="prod">Prometheus source prod</dd>' in detail
                assert "source failing" not in detail

                # Their numbers are the source's: Prometheus' own histogram_quantile over the page's window.
                end = round(time.time(), 3)
                row = rows(c.get("/", params={"end": end}).text)["prod.llm.b"]
                detail = c.get("/targets/prod.llm.b", params={"end": end}).text
                for signal, metric in (("ttft", "vllm:time_to_first_token_seconds"),
                                       ("itl", "vllm:inter_token_latency_seconds")):
                    for q in ("p50", "p99"):
                        expected = prom.query(f'histogram_quantile({int(q[1:]) / 100}, sum by (le) (increase('
                                              f'{metric}_bucket{{pod="b"}}[{int(WINDOW)}s])))', time=end)
                        value = float(expected["result"][0]["value"][1])
                        assert math.isclose(float(stat(row, f"{signal}-{q}")[0]), value, rel_tol=1e-9), (signal, q)
                        cell = re.search(rf'<tr data-signal="{signal}">.*?data-key="{q}" data-value="([^"]+)"',
                                         detail, re.S)
                        assert cell and math.isclose(float(cell.group(1)), value, rel_tol=1e-9), (signal, q)

                # b scaled away: its series stop, it is gone - not a live row, listed apart.
                sd.set({"a": fleet.urls["a"]}, namespace="llm")
                deadline = time.monotonic() + 60
                while prom.query('vllm:num_requests_running{pod="b"}')["result"]:
                    assert time.monotonic() < deadline, "Prometheus still has b's series"
                    time.sleep(0.5)
                monitor.evaluate_diagnoses(now=time.time())
                page = c.get("/").text
                assert set(rows(page)) == {"prod.llm.a"}
                assert _gone(page) == ["prod.llm.b"]
                assert re.search(r'<details class="card gone" data-gone="1">\s*<summary>1 gone target:', page)
                assert re.search(r'<strong>1</strong> target</span>', page)
                gone_page = c.get("/targets/prod.llm.b").text
                assert 'class="banner gone"' in gone_page and "Gone since" in gone_page

                # Prometheus stopped: a banner names the source and its error; a's verdict is stale.
                evaluated = {d["target"]: d["evaluated_at"] for d in c.get("/api/v1/diagnoses").json()}
                prom.stop()
                monitor.evaluate_diagnoses(now=time.time())
                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "failing"
                assert source["last_error"] == "unreachable: connection refused"
                page = c.get("/").text
                banner = _banner(page)
                assert banner is not None
                assert banner.startswith(f"Source prod is failing ({prom.url}): unreachable: connection refused.")
                assert "never" not in banner  # it had succeeded before: the last success is a time
                row = rows(page)["prod.llm.a"]
                stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(evaluated["prod.llm.a"]))
                assert f"last verdict from {stamp}, source failing" in text_of(row)
                assert 'data-stale="prod"' in row
                assert '<span class="badge warning">stale</span>' in row
                assert stat(row, "ttft-p99") == ("", "–")  # no numbers while it cannot be read
                assert set(rows(page)) == {"prod.llm.a"} and _gone(page) == ["prod.llm.b"]  # gone stays gone
                detail = c.get("/targets/prod.llm.a").text
                assert _banner(detail) == banner
                assert f"last verdict from {stamp}, source failing" in text_of(detail)

                # Back: no banner, no stale mark.
                prom.start()
                monitor.evaluate_diagnoses(now=time.time())
                page = c.get("/").text
                assert _banner(page) is None and "data-stale" not in rows(page)["prod.llm.a"]


def test_a_failing_source_banner_shows_no_credentials(migrated_url: str, tmp_path: Path) -> None:
    """The banner is on the page readers without the token see: the URL without its user info,
    the classified error only; a source that never answered says so."""
    port = free_port()  # nothing listens there
    config = tmp_path / "t.yaml"
    config.write_text(f"""
targets: []
sources:
  - name: prod
    url: http://monitor:hunter2@127.0.0.1:{port}/prom
    target_labels: [pod]
    headers: {{X-Scope-OrgID: tenant-a}}
""")
    for svc in make_service(migrated_url, tmp_path, config_file=config):
        svc.monitor.evaluate_diagnoses(now=time.time())
        page = svc.client.get("/").text
        assert _banner(page) == (f"Source prod is failing (http://127.0.0.1:{port}/prom): unreachable: connection "
                                 "refused. Its targets show their last verdict, marked stale; no finding resolves and "
                                 "no alert fires or resolves for lack of data until it answers again. Last success: "
                                 f"never; last attempt: {_stamp(page)}.")
        assert "hunter2" not in page and "monitor:" not in page
        assert rows(page) == {} and _gone(page) == []


def _stamp(page: str) -> str:
    match = re.search(r'last attempt: <time datetime="[^"]+">([^<]+)</time>', page)
    assert match
    return match.group(1)
