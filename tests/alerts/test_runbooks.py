"""Every alert links a runbook that exists, has the runbook sections and is served.

Covers every alert the service's engine raises (all regimes, an SLO on every signal,
target down: produced here from stored data by the real engine) and every alert of the
Prometheus rules export (generated, and the committed files under deploy/)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from app.alerts import engine as alerts_engine
from app.alerts.config import ALERT_RUNBOOKS, SLO_SIGNALS, AlertsConfig, SloConfig, runbook_url
from app.alerts.rules_export import build_rules
from app.config import FileConfig
from app.diagnosis.findings import REGIMES, Evidence, Finding
from app.main import create_app
from app.settings import Settings
from app.sources.base import Canonical, CanonicalHistogram
from app.store import db, repository
from app.store.repository import SampleWriter, ScrapeRecord

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
SECTIONS = ("**Symptom.**", "**Evidence in the ", "**Remedies.**", "**Verify the fix.**")
BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0, math.inf)
EXTERNAL = "https://llm-latency.example.com"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("runbooks")))
    with TestClient(app) as c:
        yield c


def assert_runbook(client: TestClient, url: str) -> None:
    """``url`` is a runbook link (served path or repository path) to a complete runbook."""
    assert url.startswith(f"{EXTERNAL}/runbooks/") or url.startswith("docs/runbooks/"), url
    name = url.rsplit("/", 1)[1].removesuffix(".md")
    assert name in ALERT_RUNBOOKS.values(), url
    text = (ROOT / "docs" / "runbooks" / f"{name}.md").read_text(encoding="utf-8")
    assert text.startswith(f"# Runbook: {name}"), name
    for section in SECTIONS:
        assert section in text, (name, section)
    served = client.get(f"/runbooks/{name}")
    assert (served.status_code, served.text) == (200, text)


def test_every_runbook_is_served_and_nothing_else(client: TestClient) -> None:
    names = sorted(set(ALERT_RUNBOOKS.values()))
    assert len(ALERT_RUNBOOKS) == len(REGIMES) + len(SLO_SIGNALS) + 1
    assert {f"slo_{s}" for s in SLO_SIGNALS} | {"target_down"} | set(REGIMES) == set(names)
    for name in names:
        assert_runbook(client, f"{EXTERNAL}/runbooks/{name}")
    for bad in ("slo_nope", "README", "slo_ttft.md", "..."):
        response = client.get(f"/runbooks/{bad}")
        assert response.status_code == 404 and response.json()["detail"] == (
            f"no runbook {bad!r}; runbooks: {', '.join(names)}"), bad
    assert client.get("/runbooks/..%2F..%2FREADME.md").status_code == 404


def test_every_alert_the_engine_raises_links_its_runbook(migrated_url: str, client: TestClient) -> None:
    """A finding per regime, an SLO breach per signal and a target down, through the real
    engine: every alert it makes (one per entry of ALERT_RUNBOOKS) links its runbook."""
    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    t0 = 1_800_000_000.0
    with sessions.begin() as session:
        slow = repository.create_target(session, name="slow", url="http://127.0.0.1:1/metrics", engine="vllm",
                                        labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
        down = repository.create_target(session, name="down", url="http://127.0.0.1:2/metrics", engine="vllm",
                                        labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
        for regime in REGIMES:
            finding = Finding(regime, "warning", 0.9, f"{regime} on slow",
                              [Evidence("some signal", 1.0, ">=", 0.5)], ["a remedy"])
            row = repository.create_finding(session, slow, "m", regime, t0, {**finding.to_dict(), "window": 60.0})
            row.state, row.activated_at = "active", t0
    records = []
    for ts, count in ((t0, 0.0), (t0 + 60, 100.0)):  # 100 observations in (1 s, 10 s] for every signal
        canonical = Canonical(engine="vllm")
        for signal in SLO_SIGNALS:
            counts = (0.0, 0.0, 0.0, 0.0, count, count)
            canonical.histograms.append(CanonicalHistogram(signal, "m", "0", BOUNDS, counts, 5.0 * count, count))
        records.append(ScrapeRecord(slow, ts, True, 0.01, 1000, 10, 10, 0, "vllm", None, None, canonical))
    records.append(ScrapeRecord(down, t0 + 60, False, 0.01, 0, 0, 0, 0, None, "connect", "connection refused"))
    SampleWriter(engine).write(records)
    config = AlertsConfig(external_url=EXTERNAL, target_down_for=0, slos=[
        SloConfig(name=f"{signal}_p99", signal=signal, threshold=0.5, **{"for": 0}) for signal in SLO_SIGNALS])
    with sessions.begin() as session:
        counts = alerts_engine.evaluate(session, config, [], t0 + 60)
        alerts = {row.alertname: row.annotations for row in repository.open_alerts(session)}
    engine.dispose()
    assert counts["conditions"] == len(ALERT_RUNBOOKS) == len(alerts)
    assert set(alerts) == set(ALERT_RUNBOOKS)
    for alertname, annotations in alerts.items():
        assert annotations["runbook_url"] == f"{EXTERNAL}/runbooks/{ALERT_RUNBOOKS[alertname]}"
        assert_runbook(client, annotations["runbook_url"])


def test_every_exported_alert_links_its_runbook(client: TestClient) -> None:
    targets = yaml.safe_load((DEPLOY / "tests" / "hardware-targets.yaml").read_text())["targets"]
    every_slo = [{"name": f"{s}_p99", "signal": s, "threshold": "1s"} for s in SLO_SIGNALS]
    for external in (EXTERNAL, ""):
        config = FileConfig.model_validate({"targets": targets,
                                            "alerts": {"external_url": external, "slos": every_slo}})
        alerts = [rule for group in build_rules(config)["groups"] for rule in group["rules"] if "alert" in rule]
        exported = {a["alert"] for a in alerts}
        assert {"LLMLatencyTTFTHigh", "LLMLatencyDecodeTimeHigh", "LLMLatencyTargetDown",
                "LLMLatencyBandwidthBound"} <= exported <= set(ALERT_RUNBOOKS)
        for alert in alerts:
            assert alert["annotations"]["runbook_url"] == runbook_url(external, alert["alert"])
            assert_runbook(client, alert["annotations"]["runbook_url"])
    for committed in (DEPLOY / "llm-latency-rules.yaml", DEPLOY / "tests" / "hardware-rules.yaml"):
        rules = yaml.safe_load(committed.read_text())
        alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
        assert len(alerts) >= 20, committed
        for alert in alerts:
            assert_runbook(client, alert["annotations"]["runbook_url"])
