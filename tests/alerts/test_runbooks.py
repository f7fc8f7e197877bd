"""Every alert links a runbook that exists, has the runbook sections and is served.

Covers every alert the service's engine raises (all regimes, an SLO on every signal,
target down: produced here from stored data by the real engine) and every alert of the
Prometheus rules export (generated, and the committed files under deploy/). Runbooks are
served as HTML pages (rendered Markdown, raw HTML escaped) under the status page's CSP,
with an index at /runbooks; HEAD answers like GET without a body."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from app.alerts import engine as alerts_engine
from app.alerts import repository as alert_repository
from app.alerts.config import ALERT_RUNBOOKS, SLO_SIGNALS, AlertsConfig, SloConfig, runbook_url
from app.api.routes import runbooks
from app.api.routes.status import SECURITY_HEADERS
from app.config import FileConfig
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.findings import REGIMES, Evidence, Finding
from app.main import GZIP_MINIMUM_BYTES, create_app
from app.rules_export import build_rules
from app.settings import Settings
from app.slo.config import SloObjective
from app.slo.record import record_increments
from app.slo.status import slo_statuses
from app.sources.base import Canonical, CanonicalHistogram
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
SECTIONS = ("**Symptom.**", "**Evidence in the ", "**Remedies.**", "**Verify the fix.**")
HTML_SECTIONS = ("<strong>Symptom.</strong>", "<strong>Evidence in the ", "<strong>Remedies.</strong>",
                 "<strong>Verify the fix.</strong>")
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
    assert served.status_code == 200 and served.headers["content-type"] == "text/html; charset=utf-8"
    assert served.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    assert f"<h1>Runbook: {html.escape(name)}" in served.text
    assert '<link rel="stylesheet" href="/ui/status.css">' in served.text
    for section in HTML_SECTIONS:
        assert section in served.text, (name, section)
    assert "**" not in served.text  # no Markdown left unrendered


def test_every_runbook_is_served_and_nothing_else(client: TestClient) -> None:
    names = sorted(set(ALERT_RUNBOOKS.values()))
    assert len(ALERT_RUNBOOKS) == len(REGIMES) + len(SLO_SIGNALS) + 2  # + target down, SLO burn rate
    assert {f"slo_{s}" for s in SLO_SIGNALS} | {"target_down", "slo_burn"} | set(REGIMES) == set(names)
    assert sorted(p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")) == names  # no runbook unserved
    for name in names:
        assert_runbook(client, f"{EXTERNAL}/runbooks/{name}")
    for bad in ("slo_nope", "README", "slo_ttft.md", "..."):
        response = client.get(f"/runbooks/{bad}")
        assert response.status_code == 404 and response.json()["detail"] == (
            f"no runbook {bad!r}; runbooks: {', '.join(names)}"), bad
    assert client.get("/runbooks/..%2F..%2FREADME.md").status_code == 404


def test_the_index_links_every_runbook_with_its_title(client: TestClient) -> None:
    response = client.get("/runbooks")
    assert response.status_code == 200 and response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    items = re.findall(r'<li data-runbook="([a-z0-9_]+)"><a href="/runbooks/\1">([^<]+)</a><br>'
                       r'<span class="muted">([^<]+)</span></li>', response.text)
    names = sorted(set(ALERT_RUNBOOKS.values()))
    assert len(names) == 24 and [name for name, _, _ in items] == names
    titles = {name: (title, summary) for name, title, summary in items}
    assert titles["queueing"] == ("queueing", "Time to first token is high, and most of it is spent waiting for "
                                  "the scheduler: the request is queued because every batch slot (or the "
                                  "batched-token budget) is taken.")
    assert titles["slo_ttft"][0] == "slo_ttft (LLMLatencyTTFTHigh)"
    assert all(summary.endswith(".") for _, summary in titles.values())


@pytest.mark.parametrize("path", ["/runbooks", "/runbooks/queueing", "/runbooks/slo_ttft"])
def test_head_answers_like_get_without_a_body(client: TestClient, path: str) -> None:
    plain = {"Accept-Encoding": "identity"}
    get, head = client.get(path, headers=plain), client.head(path, headers=plain)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"] == get.headers["content-type"] == "text/html; charset=utf-8"
    assert int(head.headers["content-length"]) == len(get.content) > 1000
    # to a client that accepts gzip, HEAD announces the length GET sends, compressed from 4 kB on
    compressed = len(get.content) >= GZIP_MINIMUM_BYTES
    packed = {"Accept-Encoding": "gzip"}
    get, head = client.get(path, headers=packed), client.head(path, headers=packed)
    assert head.content == b"" and head.headers["content-length"] == get.headers["content-length"]
    assert head.headers.get("content-encoding") == get.headers.get("content-encoding") == (
        "gzip" if compressed else None)
    assert (int(get.headers["content-length"]) < len(get.content) / 2) is compressed
    missing = client.head("/runbooks/nope")
    assert (missing.status_code, missing.content) == (404, b"")


def test_raw_html_in_a_runbook_is_escaped() -> None:
    rendered = runbooks.MARKDOWN.render("# Runbook: x\n\n<script>alert(1)</script> and [a](javascript:alert(1))\n")
    assert "<script>" not in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert 'href="javascript:' not in rendered


def test_every_alert_the_engine_raises_links_its_runbook(migrated_url: str, client: TestClient) -> None:
    """A finding per regime, an SLO breach per signal and a target down, through the real
    engine: every alert it makes (one per entry of ALERT_RUNBOOKS) links its runbook."""
    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    t0 = 1_800_000_000.0
    with sessions.begin() as session:
        slow = target_repository.create_target(session, name="slow", url="http://127.0.0.1:1/metrics", engine="vllm",
                                        labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
        down = target_repository.create_target(session, name="down", url="http://127.0.0.1:2/metrics", engine="vllm",
                                        labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
        for regime in REGIMES:
            finding = Finding(regime, "warning", 0.9, f"{regime} on slow",
                              [Evidence("some signal", 1.0, ">=", 0.5)], ["a remedy"])
            row = diagnosis_repository.create_finding(session, slow, "m", regime, t0, {**finding.to_dict(),
                                                      "window": 60.0})
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
    burn = [SloObjective(name="ttft", signal="ttft", threshold=1.0, objective=0.99,
                         burn_alerts=[{"kind": "page", "long": 3600, "short": 300, "factor": 14.4}])]
    with sessions.begin() as session:
        record_increments(session, burn, t0 + 60, 7 * 86400)
        statuses = slo_statuses(session, burn, t0 + 60, 7 * 86400)
        counts = alerts_engine.evaluate(session, config, [], t0 + 60, slo_statuses=statuses)
        alerts = {row.alertname: row.annotations for row in alert_repository.open_alerts(session)}
    engine.dispose()
    assert counts["conditions"] == len(ALERT_RUNBOOKS) == len(alerts)
    assert set(alerts) == set(ALERT_RUNBOOKS)
    for alertname, alert_annotations in alerts.items():
        assert alert_annotations["runbook_url"] == f"{EXTERNAL}/runbooks/{ALERT_RUNBOOKS[alertname]}"
        assert_runbook(client, alert_annotations["runbook_url"])


def test_every_exported_alert_links_its_runbook(client: TestClient) -> None:
    targets = yaml.safe_load((DEPLOY / "tests" / "hardware-targets.yaml").read_text())["targets"]
    every_slo = [{"name": f"{s}_p99", "signal": s, "threshold": "1s"} for s in SLO_SIGNALS]
    for external in (EXTERNAL, ""):
        config = FileConfig.model_validate({"targets": targets,
                                            "alerts": {"external_url": external, "slos": every_slo},
                                            "slos": [{"name": "burn", "signal": "ttft", "threshold": "1s",
                                                      "objective": "99%"}]})
        alerts = [rule for group in build_rules(config)["groups"] for rule in group["rules"] if "alert" in rule]
        exported = {a["alert"] for a in alerts}
        assert {"LLMLatencyTTFTHigh", "LLMLatencyDecodeTimeHigh", "LLMLatencyTargetDown",
                "LLMLatencyBandwidthBound", "LLMLatencySLOBurnRate"} <= exported <= set(ALERT_RUNBOOKS)
        for alert in alerts:
            assert alert["annotations"]["runbook_url"] == runbook_url(external, alert["alert"])
            assert_runbook(client, alert["annotations"]["runbook_url"])
    for committed in (DEPLOY / "llm-latency-rules.yaml", DEPLOY / "tests" / "hardware-rules.yaml"):
        rules = yaml.safe_load(committed.read_text())
        alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
        assert len(alerts) >= 20, committed
        for alert in alerts:
            assert_runbook(client, alert["annotations"]["runbook_url"])


def test_with_an_external_url_every_runbook_link_the_service_serves_is_absolute(tmp_path: Path) -> None:
    """alerts.external_url set (it wins over LLM_LATENCY_PUBLIC_URL): the status page's runbook
    links are absolute URLs under it, as the alerts' annotations are (above) and the API's
    finding runbook_url (built from the same Monitor.external_url)."""
    config = tmp_path / "targets.yaml"
    config.write_text(f"targets: []\nalerts: {{external_url: '{EXTERNAL}/'}}\n", encoding="utf-8")
    app = create_app(Settings(data_dir=tmp_path, config_file=config, public_url="http://ignored.example"))
    with TestClient(app) as c:
        page = c.get("/")
        links = re.findall(r'href="([^"]*/runbooks/[^"]*)"', page.text)
        assert page.status_code == 200 and len(links) == len(set(ALERT_RUNBOOKS.values())) == 24
        assert links == [f"{EXTERNAL}/runbooks/{name}" for name in sorted(set(ALERT_RUNBOOKS.values()))]
        assert c.app.state.monitor.external_url == EXTERNAL
