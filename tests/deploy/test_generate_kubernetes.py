"""deploy/generate_kubernetes.py: what the Kubernetes kit derives from its two targets YAML files
(the PrometheusRules, one per engine, and the dashboard ConfigMaps) is committed fresh, and a
copy of the kit follows its own edited targets YAML the way a user's does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.kit import KIT, ROOT, kustomize, rule_groups

SCRIPT = ROOT / "deploy" / "generate_kubernetes.py"
CHART = ROOT / "deploy" / "helm" / "llm-latency-monitor"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    """A user's copy of the kit."""
    copy = tmp_path / "my-llm-latency"
    shutil.copytree(KIT, copy)
    return copy


def test_the_committed_kit_is_fresh() -> None:
    result = run("--check")
    assert result.returncode == 0, result.stderr
    # per mode: the rule of no engine, 4 engines x (rule, component), 3 dashboards + their component;
    # the Helm chart's copies: the targets YAML, the rules of no engine, 4 engines' rules, 3 dashboards
    assert result.stdout.splitlines() == [f"{KIT}: 26 generated files up to date",
                                          f"{CHART}: 18 generated files up to date"]
    # the wrapper's own command without arguments checks the kit too
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "generate_prometheusrule.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "26 generated files up to date" in result.stdout, result.stderr


def test_a_copy_follows_its_own_targets_yaml(kit: Path) -> None:
    targets = kit / "components" / "source" / "targets.yaml"
    targets.write_text(targets.read_text().replace('namespace="inference"', 'namespace="llm"'))
    result = run("--kit", str(kit), "--check")
    assert result.returncode == 1
    stale = sorted(Path(line.split(": ")[0]).relative_to(kit).as_posix() for line in result.stderr.splitlines()
                   if line.endswith(": stale"))
    assert stale == ["components/source/dashboards/llm-latency-fleet.json",
                     "components/source/dashboards/llm-latency-slo.json",
                     "components/source/dashboards/llm-latency-target.json",
                     "components/source/prometheusrule.yaml",
                     *(f"components/source/rules/{e}/prometheusrule.yaml" for e in ("sglang", "tgi", "trtllm", "vllm"))]
    assert f"regenerate with: python3 deploy/generate_kubernetes.py --kit {kit}" in result.stderr
    assert run("--kit", str(kit)).returncode == 0
    assert run("--kit", str(kit), "--check").returncode == 0
    docs = kustomize(kit / "examples" / "prometheus-source")
    alerts = {r["alert"]: r for g in rule_groups(docs) for r in g["rules"] if "alert" in r}
    assert alerts["LLMLatencyTargetDown"]["expr"] == 'max by (namespace, pod) (up{namespace="llm"}) == 0'
    target = next(d for d in docs if d["metadata"]["name"] == "llm-latency-dashboard-target")
    text = target["data"]["llm-latency-target.json"]
    assert 'namespace=\\"llm\\"' in text and 'namespace=\\"inference\\"' not in text


def test_files_no_longer_generated_are_named_then_removed(kit: Path) -> None:
    gone = kit / "components" / "scrape" / "rules" / "tensorrt" / "prometheusrule.yaml"
    gone.parent.mkdir()
    gone.write_text("kind: PrometheusRule\n")
    result = run("--kit", str(kit), "--check")
    assert result.returncode == 1 and f"{gone}: not generated any more" in result.stderr
    result = run("--kit", str(kit))
    assert result.returncode == 0 and f"removed {gone}" in result.stderr and not gone.exists()


def test_a_targets_yaml_the_config_refuses_is_named_and_nothing_written(kit: Path) -> None:
    targets = kit / "components" / "scrape" / "targets.yaml"
    targets.write_text(targets.read_text().replace("window: 1m", "window: 1"))
    before = (kit / "components" / "scrape" / "prometheusrule.yaml").read_text()
    result = run("--kit", str(kit))
    assert result.returncode == 2
    assert str(targets) in result.stderr and "window" in result.stderr
    assert (kit / "components" / "scrape" / "prometheusrule.yaml").read_text() == before


def test_scrape_mode_rules_fit_the_clusters_scrape_interval(kit: Path) -> None:
    """The cluster's Prometheus evaluates scrape mode's rules on its own scrapes of the engines: at
    kube-prometheus-stack's 30s a 1m range holds two, so every range is at least 2m (four scrapes);
    at 15s the configured 1m stays."""
    vllm = kit / "components" / "scrape" / "rules" / "vllm" / "prometheusrule.yaml"
    shipped = vllm.read_text(encoding="utf-8")
    assert "[1m]" not in shipped and shipped.count("[2m]") == 66
    result = run("--kit", str(kit), "--scrape-interval", "15s")
    assert result.returncode == 0, result.stderr
    fifteen = vllm.read_text(encoding="utf-8")
    assert fifteen.count("[1m]") == 66 and "[2m]" not in fifteen
    # the files name the command that made them, the interval with it; --check holds them to it
    assert "# Regenerate after changing it or the rules: python3 deploy/generate_kubernetes.py --scrape-interval 15s" \
        in fifteen and "--scrape-interval" not in shipped
    assert run("--kit", str(kit), "--scrape-interval", "15s", "--check").returncode == 0
    stale = run("--kit", str(kit), "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr
    # the source component follows its own targets.yaml (scrape_interval: 30s), not the option
    source = kit / "components" / "source" / "rules" / "vllm" / "prometheusrule.yaml"
    assert "[1m]" not in source.read_text(encoding="utf-8")
    refused = run("--kit", str(kit), "--scrape-interval", "0s")
    assert refused.returncode == 2 and "--scrape-interval: must be above 0" in refused.stderr
