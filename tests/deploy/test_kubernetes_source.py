"""components/source of the Kubernetes kit: the monitor reads the cluster's Prometheus. Built
with kubectl's kustomize like every variant (schemas: tests/deploy/test_kubernetes.py), and the
pieces fit: a targets YAML with one source at the Operator's default service and no static
targets, the Prometheus host allowed, the token from an optional Secret, rules exported for that
source and grouped by pod, accepted by promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from app.config import ConfigError, load_config
from app.rules_export import build_rules
from tests.deploy.kit import KIT, Variant, env, render, rule_groups, targets_configmap
from tests.deploy.test_kubernetes import kubernetes_validate
from tests.support.components import require_binary

OPERATOR_SERVICE = "http://prometheus-operated.monitoring.svc:9090"
SECRET = KIT / "components" / "source" / "secret.yaml"
SOURCE = Variant(storage="postgres", mode="source")


def targets_yaml(docs: tuple[dict, ...], tmp_path: Path) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(targets_configmap(docs)["data"]["targets.yaml"], encoding="utf-8")
    return path


def test_the_config_reads_the_operators_prometheus_with_the_token_from_a_secret(tmp_path: Path) -> None:
    docs = render(SOURCE)
    variables = env(docs)
    allowed = variables["LLM_LATENCY_ALLOWED_TARGET_HOSTS"]["value"].split(",")
    config = load_config(targets_yaml(docs, tmp_path), allowed)
    assert config.targets == []  # no static target list: replicas are discovered
    (source,) = config.sources
    assert (source.url, source.target_labels, source.selector) == (OPERATOR_SERVICE, ["namespace", "pod"],
                                                                   '{namespace="inference"}')
    token = variables[source.bearer_token_env]["valueFrom"]["secretKeyRef"]
    secret = yaml.safe_load(SECRET.read_text())
    assert token == {"name": secret["metadata"]["name"], "key": "token", "optional": True}
    assert set(secret["stringData"]) == {"token"}
    assert kubernetes_validate.validate(secret, kubernetes_validate.latest_version(), strict=True)
    with pytest.raises(ConfigError, match=r"sources\[0\]\.url"):  # scrape mode's allow-list would refuse it
        load_config(targets_yaml(docs, tmp_path), env(render(Variant()))["LLM_LATENCY_ALLOWED_TARGET_HOSTS"]
                    ["value"].split(","))


def test_the_deployment_differs_from_scrape_mode_only_in_the_monitors_environment() -> None:
    source, scrape = render(SOURCE), render(Variant(storage="postgres"))
    specs = []
    for docs in (source, scrape):
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        spec = yaml.safe_load(yaml.safe_dump(deployment["spec"]))
        spec["template"]["spec"]["volumes"] = [v for v in spec["template"]["spec"]["volumes"] if v["name"] != "targets"]
        del spec["template"]["spec"]["containers"][0]["env"]
        specs.append(spec)
    assert specs[0] == specs[1]
    assert set(env(source)) - set(env(scrape)) == {"PROMETHEUS_TOKEN"}


def test_the_rules_are_exported_for_the_source_and_grouped_by_pod(tmp_path: Path) -> None:
    docs = render(SOURCE)
    config = load_config(targets_yaml(docs, tmp_path))
    groups = rule_groups(docs)
    assert sorted(groups, key=lambda g: g["name"]) == sorted(build_rules(config)["groups"], key=lambda g: g["name"])
    text = yaml.safe_dump(groups)
    assert "instance" not in text and "job" not in text
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert alerts["LLMLatencyTargetDown"]["expr"] == 'max by (namespace, pod) (up{namespace="inference"}) == 0'


@pytest.mark.prometheus
def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "checking the PrometheusRules' rules")
    groups = rule_groups(render(SOURCE))
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in result.stdout
