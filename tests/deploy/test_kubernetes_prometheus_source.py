"""deploy/kubernetes-prometheus-source/: the kustomize variant that reads the cluster's
Prometheus. Built with kustomize (``kubectl kustomize``, offline), every resource validates
like the base kit's (Kubernetes OpenAPI schemas, strict; the Operator's own validators and
the CRD subset for the PrometheusRule), and the pieces fit: a targets YAML with one source at
the Operator's default service and no static targets, the token from a Secret, rules
exported for that source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from app.config import ConfigError, load_config
from app.rules_export import build_rules
from tests.deploy.test_kubernetes import CRD_KINDS, CRD_SCHEMAS, VERSIONS, kubernetes_validate, operator_validation
from tests.support.components import require_binary

ROOT = Path(__file__).resolve().parents[2]
VARIANT = ROOT / "deploy" / "kubernetes-prometheus-source"
BASE = ROOT / "deploy" / "kubernetes"
OPERATOR_SERVICE = "http://prometheus-operated.monitoring.svc:9090"


def kustomize(directory: Path) -> list[dict]:
    kubectl = require_binary("kubectl", "building the kustomizations offline (kubectl kustomize)")
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _merge(base: object, patch: object, by_name: bool) -> object:
    """A strategic merge as kustomize does it for these files: mappings key by key, lists of
    named items (containers, env) item by item when ``by_name`` (built-in kinds), other lists
    replaced (custom resources get a JSON merge patch)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _merge(base[k], v, by_name) if k in base else v for k, v in patch.items()}}
    if (by_name and isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])):
        patched = {i["name"]: i for i in patch}
        merged = [_merge(i, patched.pop(i["name"]), by_name) if i["name"] in patched else i for i in base]
        return merged + list(patched.values())
    return patch


def kustomize_in_python(directory: Path) -> list[dict]:
    """The variant built without kubectl (a fresh Debian machine has none recent enough):
    the base's resources with its namespace and labels, each patch merged into the resource
    of the same kind and name. Where kubectl exists, a test checks both builds agree."""
    base_kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    labels = {k: v for entry in base_kustomization["labels"] for k, v in entry["pairs"].items()}
    docs = []
    for name in base_kustomization["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            doc["metadata"].setdefault("labels", {}).update(labels)
            if doc["kind"] != "Namespace":
                doc["metadata"]["namespace"] = base_kustomization["namespace"]
            docs.append(doc)
    for patch_file in yaml.safe_load((directory / "kustomization.yaml").read_text())["patches"]:
        patch = yaml.safe_load((directory / patch_file["path"]).read_text())
        index = next(i for i, d in enumerate(docs)
                     if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]))
        docs[index] = _merge(docs[index], patch, by_name=patch["kind"] not in CRD_KINDS)
    return docs


def _normalized(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for doc in docs:
        doc = yaml.safe_load(yaml.safe_dump(doc))
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            container["env"] = sorted(container.get("env", []), key=lambda e: e["name"])
        out[doc["kind"]] = doc
    return out


@pytest.fixture(scope="module")
def built() -> dict[str, dict]:
    docs = kustomize_in_python(VARIANT)
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs)  # one resource of each kind
    return by_kind


def targets_yaml(built: dict[str, dict], tmp_path: Path) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(built["ConfigMap"]["data"]["targets.yaml"], encoding="utf-8")
    return path


def monitor_env(built: dict[str, dict]) -> dict[str, dict]:
    container = built["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


def test_kubectl_kustomize_builds_the_same_resources() -> None:
    assert _normalized(kustomize(VARIANT)) == _normalized(kustomize_in_python(VARIANT))


def test_the_variant_is_the_base_with_three_resources_replaced(built: dict[str, dict]) -> None:
    base_kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    base = {doc["kind"]: doc for name in base_kustomization["resources"]
            for doc in yaml.safe_load_all((BASE / name).read_text())}
    assert set(built) == set(base) == {"Namespace", "ConfigMap", "Service", "Deployment", "Job", "PrometheusRule",
                                       "ServiceMonitor", "PodDisruptionBudget"}
    assert built["Namespace"]["metadata"]["name"] == base["Namespace"]["metadata"]["name"]
    for kind in ("Service", "Job", "ServiceMonitor"):
        assert built[kind]["spec"] == base[kind]["spec"], kind
    assert built["ConfigMap"]["metadata"]["name"] == base["ConfigMap"]["metadata"]["name"]  # the Deployment mounts it
    assert {d["metadata"]["namespace"] for k, d in built.items() if k != "Namespace"} == {"llm-latency"}
    # the Deployment's spec differs only in the monitor's environment
    strip = yaml.safe_load(yaml.safe_dump(built["Deployment"]["spec"]))
    plain = yaml.safe_load(yaml.safe_dump(base["Deployment"]["spec"]))
    for spec in (strip, plain):
        del spec["template"]["spec"]["containers"][0]["env"]
    assert strip == plain
    kustomization = yaml.safe_load((VARIANT / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../kubernetes"]
    assert "secret.yaml" not in {p["path"] for p in kustomization["patches"]}  # a template, like the base's


@pytest.mark.parametrize("version", VERSIONS)
def test_every_builtin_resource_and_the_secret_template_validate(built: dict[str, dict], version: str) -> None:
    secret = yaml.safe_load((VARIANT / "secret.yaml").read_text())
    for doc in [*(d for kind, d in built.items() if kind not in CRD_KINDS), secret]:
        assert kubernetes_validate.validate(doc, version, strict=True), doc["kind"]


def test_operator_resources_validate_against_the_crd_subset_and_the_operators_own_validators(
        built: dict[str, dict]) -> None:
    for kind in sorted(CRD_KINDS):
        validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[kind])
        assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(built[kind])] == [], kind
    resources = [built[kind] for kind in sorted(CRD_KINDS)]
    result = operator_validation(resources)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == [f"ok {r['kind']}/{r['metadata']['name']}" for r in resources]


def test_the_config_reads_the_operators_prometheus_with_the_token_from_a_secret(built: dict[str, dict],
                                                                              tmp_path: Path) -> None:
    env = monitor_env(built)
    allowed = env["LLM_LATENCY_ALLOWED_TARGET_HOSTS"]["value"].split(",")
    config = load_config(targets_yaml(built, tmp_path), allowed)
    assert config.targets == []  # no static target list: replicas are discovered
    (source,) = config.sources
    assert (source.url, source.target_labels, source.selector) == (OPERATOR_SERVICE, ["namespace", "pod"],
                                                                   '{namespace="inference"}')
    token = env[source.bearer_token_env]["valueFrom"]["secretKeyRef"]
    secret = yaml.safe_load((VARIANT / "secret.yaml").read_text())
    assert token == {"name": secret["metadata"]["name"], "key": "token", "optional": True}
    assert set(secret["stringData"]) == {"token"}
    # the base's Secret still provides the monitor's own secrets (receivers, database, API token)
    base_secret = yaml.safe_load((BASE / "secret.yaml").read_text())
    assert {r.secret_env for r in config.alerts.receivers if r.secret_env} <= set(base_secret["stringData"])
    with pytest.raises(ConfigError, match=r"sources\[0\]\.url"):  # the base's allow-list would refuse it
        load_config(targets_yaml(built, tmp_path), ["*.svc.cluster.local", "hooks.example.com"])


def test_the_rules_are_exported_for_the_source_and_fresh(built: dict[str, dict], tmp_path: Path) -> None:
    config = load_config(targets_yaml(built, tmp_path))
    assert built["PrometheusRule"]["spec"]["groups"] == build_rules(config)["groups"]
    text = yaml.safe_dump(built["PrometheusRule"])
    assert "instance" not in text and "job" not in text
    alerts = {r["alert"]: r for g in built["PrometheusRule"]["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["LLMLatencyTargetDown"]["expr"] == 'max by (namespace, pod) (up{namespace="inference"}) == 0'
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "generate_prometheusrule.py"), "--configmap",
                             str(VARIANT / "configmap.yaml"), "--out", str(VARIANT / "prometheusrule.yaml"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text((VARIANT / "prometheusrule.yaml").read_text().replace('"inference"', '"llm"', 1))
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "generate_prometheusrule.py"), "--configmap",
                             str(VARIANT / "configmap.yaml"), "--out", str(stale), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert ("regenerate it with `python3 deploy/generate_prometheusrule.py --configmap "
            "deploy/kubernetes-prometheus-source/configmap.yaml --out ") in result.stderr


@pytest.mark.prometheus
def test_promtool_accepts_the_rules(built: dict[str, dict], tmp_path: Path) -> None:
    promtool = require_binary("promtool", "checking the PrometheusRule's rules")
    groups = built["PrometheusRule"]["spec"]["groups"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in result.stdout
