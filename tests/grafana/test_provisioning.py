"""Grafana provisioning: one Prometheus datasource whose scrape interval is the compose
Prometheus', and a file provider that loads the generated dashboards."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.grafana.queries import GRAFANA, load_dashboards

ROOT = Path(__file__).resolve().parents[2]


def load(relative: str) -> dict:
    return yaml.safe_load((GRAFANA / "provisioning" / relative).read_text(encoding="utf-8"))


def test_the_datasource_is_the_compose_prometheus_with_its_scrape_interval() -> None:
    provisioning = load("datasources/prometheus.yaml")
    assert provisioning["apiVersion"] == 1
    [datasource] = provisioning["datasources"]
    assert datasource["type"] == "prometheus" and datasource["access"] == "proxy" and datasource["isDefault"]
    prometheus = yaml.safe_load((ROOT / "deploy/compose/prometheus.yml").read_text(encoding="utf-8"))
    # $__rate_interval is max(4 x timeInterval, step + timeInterval): timeInterval must be the scrape interval
    assert datasource["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text(encoding="utf-8"))
    port = compose["services"]["prometheus"]["ports"][0].split(":")[-1]
    assert datasource["url"] == f"http://prometheus:{port}"


def test_the_dashboard_provider_loads_the_generated_files_read_only() -> None:
    provisioning = load("dashboards/llm-latency.yaml")
    assert provisioning["apiVersion"] == 1
    [provider] = provisioning["providers"]
    assert provider["type"] == "file" and provider["allowUiUpdates"] is False and provider["disableDeletion"]
    assert provider["options"]["path"].startswith("/var/lib/grafana/dashboards/")
    uids = {d["uid"] for d in load_dashboards().values()}
    assert uids == {"llm-latency-fleet", "llm-latency-target", "llm-latency-slo"}
    assert all(d["tags"] == ["llm-latency"] for d in load_dashboards().values())
