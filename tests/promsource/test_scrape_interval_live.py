"""A real Prometheus 2.42 scraping emulated engines every 30 s, as kube-prometheus-stack does:
the source learns the interval from ``/api/v1/targets`` and diagnoses over 2m instead of the
configured 1m (four scrapes, what bandwidth_bound needs), says so in ``GET /api/v1/sources``
and on the status page, and asks again only after ten minutes. Pods without a ``service``
label (a vLLM and a TGI pod, as a PodMonitor scrapes them) stay replicas in no service and are
counted; labelled pods are still grouped, a service of two engines included. ``check-config``
says the same against the same server. VictoriaMetrics, whose ``/api/v1/targets`` has no
``scrapeInterval``, tells it by the discovered ``__scrape_interval__``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.cli import main
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.emulator.server import EmulatorFleet, TargetSpec
from app.promql.client import PrometheusClient
from app.promsource import intervals
from app.store.models import Target
from tests.api.conftest import make_service
from tests.support.prometheus import FileSD, PrometheusHandle, running_prometheus
from tests.support.victoria_metrics import running_victoria_metrics

SCRAPE = "30s"
# pod -> (engine, service label or None): two unlabelled pods of two engines, a labelled service of two
# vLLM replicas, and a labelled service whose replicas run different engines
PODS = {"v": ("vllm", None), "t": ("tgi", None), "a": ("vllm", "chat"), "b": ("vllm", "chat"),
        "m1": ("vllm", "mixed"), "m2": ("tgi", "mixed")}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusHandle]:
    specs = [TargetSpec(pod, "healthy", engine=engine, time_scale=10.0, warmup_s=60, seed=i)
             for i, (pod, (engine, _)) in enumerate(PODS.items())]
    tmp = tmp_path_factory.mktemp("scrape30")
    with EmulatorFleet(specs) as fleet:
        sd = FileSD(tmp / "targets.json")
        sd.write([{"targets": [fleet.urls[pod].split("://", 1)[1]],
                   "labels": {"namespace": "llm", "pod": pod, **({"service": service} if service else {})}}
                  for pod, (_, service) in PODS.items()])
        jobs = sd.scrape_configs(scrape_interval=SCRAPE)
        with running_prometheus(tmp / "prom", jobs, scrape_interval=SCRAPE) as prom:
            deadline = time.monotonic() + 120  # each target's first scrape comes within one interval
            while len(prom.query('up{job="engines"} == 1')["result"]) < len(PODS):
                assert time.monotonic() < deadline, "Prometheus did not scrape every engine within 2 minutes"
                time.sleep(1.0)
            yield prom


def write_config(path: Path, url: str, thresholds: str = "") -> Path:
    path.write_text(f"""\
targets: []
diagnosis:
  interval: 1h
  window: 1m
{thresholds}sources:
  - name: prod
    url: {url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    service_labels: [namespace, service]
""")
    return path


def test_the_source_learns_30s_and_diagnoses_over_four_scrapes(prometheus: PrometheusHandle, migrated_url: str,
                                                               tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.yaml", prometheus.url)
    for svc in make_service(migrated_url, tmp_path, config_file=config):
        c, monitor = svc.client, svc.monitor
        (before,) = c.get("/api/v1/sources").json()
        assert (before["scrape_interval"], before["diagnosis_window"]) == (None, None)
        assert before["scrape_interval_note"] == "not asked yet: no engine discovered"

        now = time.time()
        results = monitor.evaluate_diagnoses(now=now)
        (source,) = c.get("/api/v1/sources").json()
        learned = "the server's /api/v1/targets, 6 engine targets"
        assert (source["scrape_interval"], source["scrape_interval_from"], source["scrape_interval_note"]) == (
            30.0, "server", learned)
        assert source["diagnosis_window"] == 120.0 and source["window_warning"] is None
        assert source["window_note"] == ("diagnosis window 2m instead of diagnosis.window 1m: at least 4 scrape "
                                         f"intervals, targets scraped every 30s ({learned})")
        # every target, replica or service, was judged over [now - 2m, now]
        assert {d.target for d, _ in results} >= {f"prod.llm.{pod}" for pod in PODS}
        assert {(d.window_start, d.window_end) for d, _ in results} == {(now - 120.0, now)}

        # services only where the label exists: v and t are replicas in no service, and counted
        assert (source["targets"], source["services"]) == (6, 2)
        assert (source["pods_without_service_labels"], source["missing_service_labels"]) == (2, {"service": 2})
        targets = {t["name"]: t for t in c.get("/api/v1/targets").json()}
        services = {name: t for name, t in targets.items() if t["source"] == "service"}
        assert sorted(services) == ["prod.svc.llm.chat", "prod.svc.llm.mixed"]
        assert targets["prod.llm.v"]["labels"] == {"namespace": "llm", "pod": "v", "service": ""}
        assert targets["prod.llm.t"]["detected_engine"] == "tgi"
        # a service of two engines is one target, its engine the first of theirs by name
        assert services["prod.svc.llm.mixed"]["detected_engine"] == "tgi"
        assert services["prod.svc.llm.chat"]["detected_engine"] == "vllm"
        with monitor.sessions() as session:
            chat, mixed = (session.query(Target).filter_by(name=name).one()
                           for name in ("prod.svc.llm.chat", "prod.svc.llm.mixed"))
            assert sorted(monitor.windows.window(session, chat, now - 120, now, DIAGNOSIS_HISTOGRAMS).replicas) == [
                "prod.llm.a", "prod.llm.b"]
            assert sorted(monitor.windows.window(session, mixed, now - 120, now, DIAGNOSIS_HISTOGRAMS).replicas) == [
                "prod.llm.m1", "prod.llm.m2"]

        page = c.get("/").text
        assert ("<strong>Note · source prod:</strong> diagnosis window 2m instead of diagnosis.window 1m: at least "
                "4 scrape intervals, targets scraped every 30s (the server&#39;s /api/v1/targets, 6 engine "
                "targets).") in page
        assert ("<strong>Note · source prod:</strong> 2 pods lack a value of service_labels (service: 2): diagnosed as "
                "replicas only, in no service.") in page

        # the interval is asked again only after ten minutes: the next round does not ask the server
        source_handle = monitor.sources.get("prod")
        asked_at = source_handle.interval_asked
        calls: list[float] = []
        original = source_handle.client.active_targets

        def counted(calls: list[float] = calls, original: Any = original) -> list:
            calls.append(time.time())
            return original()

        source_handle.client.active_targets = counted  # type: ignore[method-assign]
        monitor.evaluate_diagnoses(now=now + 30.0)
        assert calls == [] and source_handle.interval_asked == asked_at == now
        # ten minutes after the last answer (moved back, not waited for), the round asks again
        source_handle.interval_asked = now - intervals.REFRESH
        monitor.evaluate_diagnoses(now=now + 30.0)
        assert len(calls) == 1 and source_handle.interval_asked == now + 30.0
        (again,) = c.get("/api/v1/sources").json()
        assert again["scrape_interval"] == 30.0


def test_a_window_too_short_for_a_rule_is_named_in_the_api(prometheus: PrometheusHandle, migrated_url: str,
                                                          tmp_path: Path) -> None:
    """With bandwidth_bound asking for 6 scrapes, the 4 of the fitted 2m window are too few."""
    config = write_config(tmp_path / "t.yaml", prometheus.url, "  thresholds: {steady_min_scrapes: 6}\n")
    for svc in make_service(migrated_url, tmp_path, config_file=config):
        svc.monitor.evaluate_diagnoses(now=time.time())
        (source,) = svc.client.get("/api/v1/sources").json()
        warning = ("scraped every 30s, the 2m diagnosis window holds 4 scrapes: bandwidth_bound needs 6 "
                   "(diagnosis.thresholds.steady_min_scrapes), so it is never judged; a window of 3m holds enough")
        assert source["window_warning"] == warning
        assert f"<strong>Not judged · source prod:</strong> its targets are {warning}." in svc.client.get("/").text


def check_config(path: Path) -> Any:
    return CliRunner().invoke(main, ["check-config", str(path)])


def test_check_config_against_the_same_server(prometheus: PrometheusHandle, tmp_path: Path) -> None:
    path = write_config(tmp_path / "t.yaml", prometheus.url)
    result = check_config(path)
    assert result.exit_code == 0 and result.stdout == f"{path}: OK, 0 target(s), 1 source(s), 0 receiver(s)\n"
    assert result.stderr == (f"{path}:10: warning: sources[0].service_labels: 2 of 6 discovered pods lack a value of "
                             "service_labels (service: 2): they are diagnosed as replicas only, in no service\n")
    path = write_config(tmp_path / "t.yaml", prometheus.url, "  thresholds: {steady_min_scrapes: 6}\n")
    result = check_config(path)
    assert result.exit_code == 0
    assert result.stderr.splitlines()[1] == (
        f"{path}:7: warning: sources[0]: its targets are scraped every 30s, the 2m diagnosis window holds 4 scrapes: "
        "bandwidth_bound needs 6 (diagnosis.thresholds.steady_min_scrapes), so it is never judged; a window of 3m "
        "holds enough (scrape interval: the server's /api/v1/targets, 6 engine targets)")


def test_victoria_metrics_tells_the_interval_by_its_discovered_label(tmp_path: Path) -> None:
    with EmulatorFleet([TargetSpec("a", "healthy", time_scale=10.0, warmup_s=60)]) as fleet:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"]}, namespace="llm")
        jobs = sd.scrape_configs(scrape_interval="2s", refresh_interval=None)
        with running_victoria_metrics(tmp_path / "vm", jobs, scrape_interval="2s") as vm, \
                PrometheusClient(vm.url) as client:
            deadline = time.monotonic() + 60
            while not vm.query('up{pod="a"} == 1')["result"]:
                assert time.monotonic() < deadline, "VictoriaMetrics did not scrape the engine within a minute"
                time.sleep(0.5)
            (active,) = client.active_targets()
            assert active.labels == {"instance": fleet.urls["a"].split("://", 1)[1], "job": "engines",
                                     "namespace": "llm", "pod": "a"}
            assert intervals.learn(client, ["namespace", "pod"], {("llm", "a")}) == intervals.ScrapeInterval(
                2.0, "server", "the server's /api/v1/targets, 1 engine target")
