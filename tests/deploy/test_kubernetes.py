"""deploy/kubernetes/: every manifest validates offline against the Kubernetes OpenAPI
schemas (kubernetes-validate, strict: unknown fields are errors), the Prometheus Operator
resources against the validators generated from the Operator's own API types and against
the stricter subset of their CRD schemas written below (unknown fields are errors there),
and the pieces fit together (selectors, ports, config path, secrets, two replicas with a
rolling update and a PodDisruptionBudget)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from app.config import load_config
from app.settings import Settings
from tests.support.components import in_ci, missing_component, require_binary

try:
    from kubernetes_validate import utils as kubernetes_validate
except ImportError:  # the test extra is not installed: skip locally, fail under CI
    if in_ci():
        raise
    pytest.skip("kubernetes-validate is not installed (pip install -e '.[test]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
#: the oldest Kubernetes minor still commonly run, and the newest the validator ships
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
KUSTOMIZE_KIND = "Kustomization"


def manifests() -> dict[str, list[dict]]:
    return {path.name: list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
            for path in sorted(K8S.glob("*.yaml"))}


MANIFESTS = manifests()
BY_KIND = {doc["kind"]: doc for docs in MANIFESTS.values() for doc in docs}
BUILTIN = [(name, doc) for name, docs in MANIFESTS.items() for doc in docs
           if doc["kind"] not in CRD_KINDS | {KUSTOMIZE_KIND}]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,doc", BUILTIN, ids=[n for n, _ in BUILTIN])
def test_builtin_kinds_validate_against_the_kubernetes_schema(name: str, doc: dict, version: str) -> None:
    assert kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_is_strict_about_unknown_and_mistyped_fields() -> None:
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_every_kind_is_there() -> None:
    assert set(BY_KIND) == {"Namespace", "ConfigMap", "Secret", "Job", "Deployment", "Service", "ServiceMonitor",
                            "PrometheusRule", "PodDisruptionBudget", KUSTOMIZE_KIND}


# The parts of the Prometheus Operator CRDs (monitoring.coreos.com/v1) these manifests use;
# field names and types as in the Operator's CRD schemas. Unknown fields are errors.
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name"], "additionalProperties": False,
             "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS,
                            "annotations": _LABELS}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                          r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
CRD_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                     "properties": {
                         "selector": {"type": "object", "additionalProperties": False,
                                      "properties": {"matchLabels": _LABELS}},
                         "namespaceSelector": {"type": "object"},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False,
                             "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                            "scheme": {"enum": ["http", "https"]}, "interval": _DURATION,
                                            "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"}}}}}},
        }},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {"type": "object", "additionalProperties": False, "properties": {"groups": {
                "type": "array", "items": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                        "query_offset": _DURATION, "limit": {"type": "integer"},
                        "partial_response_strategy": {"type": "string"},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["expr"], "additionalProperties": False,
                            "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                            "properties": {"record": {"type": "string"}, "alert": {"type": "string"},
                                           "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                                           "keep_firing_for": _DURATION, "labels": _LABELS,
                                           "annotations": _LABELS}}}}}}}},
        }},
}


@pytest.mark.parametrize("kind", sorted(CRD_KINDS))
def test_operator_resources_match_their_crd_schema(kind: str) -> None:
    validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[kind])
    assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(BY_KIND[kind])] == []
    broken = yaml.safe_load(yaml.safe_dump(BY_KIND[kind]))
    broken["spec"]["endpoint" if kind == "ServiceMonitor" else "group"] = []
    assert list(validator.iter_errors(broken))


OPERATOR_MODELS = Path(__file__).parent / "operator_models"


def operator_validation(resources: list[dict]) -> subprocess.CompletedProcess:
    """Run the validators generated from the Prometheus Operator's monitoring.coreos.com
    API types (npm package @kubernetes-models/prometheus-operator, pinned in
    ``operator_models/package-lock.json``; ``scripts/test.sh`` installs it)."""
    node = require_binary("node", "validating ServiceMonitor/PrometheusRule with the Operator's generated schemas")
    if not (OPERATOR_MODELS / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        missing_component(f"npm ci --prefix {OPERATOR_MODELS} has not been run")
    return subprocess.run([node, str(OPERATOR_MODELS / "validate.mjs")], input=json.dumps(resources),
                          capture_output=True, text=True, timeout=60, cwd=OPERATOR_MODELS)


def test_operator_resources_validate_against_the_operators_own_api_schemas() -> None:
    resources = [BY_KIND[kind] for kind in sorted(CRD_KINDS)]
    result = operator_validation(resources)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == [f"ok {r['kind']}/{r['metadata']['name']}" for r in resources]
    # ... and the same validators refuse what the Operator would: a bad duration, a rule without expr
    monitor = json.loads(json.dumps(BY_KIND["ServiceMonitor"]))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    rules = json.loads(json.dumps(BY_KIND["PrometheusRule"]))
    del rules["spec"]["groups"][0]["rules"][0]["expr"]
    result = operator_validation([monitor, rules])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("invalid ServiceMonitor/") and "endpoints/0/interval must match pattern" in lines[0]
    assert lines[1].startswith("invalid PrometheusRule/") and "rules/0 must have required property expr" in lines[1]


def test_kustomization_lists_every_manifest_except_the_secret_template() -> None:
    kustomization = BY_KIND[KUSTOMIZE_KIND]
    assert kustomization["namespace"] == BY_KIND["Namespace"]["metadata"]["name"]
    assert set(kustomization["resources"]) == set(MANIFESTS) - {"kustomization.yaml", "secret.yaml"}
    assert all((K8S / r).is_file() for r in kustomization["resources"])
    images = {i["name"] for i in kustomization["images"]}
    containers = [c for kind in ("Deployment", "Job") for c in BY_KIND[kind]["spec"]["template"]["spec"]["containers"]]
    assert {c["image"].split(":")[0] for c in containers} == images


def test_two_replicas_rolled_one_at_a_time_and_never_both_evicted() -> None:
    """Replicas share the targets and one holds the leader lease (app/replicas/membership.py): a
    rollout starts a new pod before stopping an old one, and a drain evicts one at a time,
    so one replica always scrapes and takes the others' targets over."""
    deployment, pdb = BY_KIND["Deployment"], BY_KIND["PodDisruptionBudget"]
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] < spec["replicas"]  # a drain can make progress
    env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["LLM_LATENCY_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    settings = Settings(replica_heartbeat=env["LLM_LATENCY_REPLICA_HEARTBEAT"]["value"],
                        replica_expiry=env["LLM_LATENCY_REPLICA_EXPIRY"]["value"])
    # a replica that stops gets the grace period to finish, hand over and leave
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= settings.replica_expiry


def test_deployment_service_and_servicemonitor_select_each_other() -> None:
    deployment, service, monitor = BY_KIND["Deployment"], BY_KIND["Service"], BY_KIND["ServiceMonitor"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_port = service["spec"]["ports"][0]
    assert service_port["targetPort"] in ports and monitor["spec"]["endpoints"][0]["port"] == service_port["name"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["LLM_LATENCY_PORT"]) == ports["http"] and env["LLM_LATENCY_HOST"] == "0.0.0.0"
    probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def test_pods_run_as_the_image_user_with_a_read_only_root_and_no_service_links() -> None:
    """``enableServiceLinks: false``: Kubernetes would otherwise set ``<SERVICE>_PORT=tcp://...``
    for every Service, and one named ``llm-latency`` sets ``LLM_LATENCY_PORT`` -- a setting."""
    uid = re.search(r"^USER (\d+):", (ROOT / "deploy" / "Dockerfile").read_text(), re.M).group(1)
    for kind in ("Deployment", "Job"):
        pod = BY_KIND[kind]["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False and pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(uid)
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_configmap_is_a_valid_targets_file_mounted_where_the_monitor_reads_it(tmp_path: Path) -> None:
    deployment = BY_KIND["Deployment"]["spec"]["template"]["spec"]
    container = deployment["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    volume = next(v for v in deployment["volumes"] if v.get("configMap"))
    assert volume["configMap"]["name"] == BY_KIND["ConfigMap"]["metadata"]["name"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    key = Path(env["LLM_LATENCY_CONFIG_FILE"]).relative_to(mount["mountPath"]).as_posix()
    path = tmp_path / "targets.yaml"
    path.write_text(BY_KIND["ConfigMap"]["data"][key], encoding="utf-8")
    config = load_config(path, env["LLM_LATENCY_ALLOWED_TARGET_HOSTS"].split(","))
    assert {t.engine for t in config.targets} == {"vllm", "tgi"}
    secret_keys = set(BY_KIND["Secret"]["stringData"])
    assert {r.secret_env for r in config.alerts.receivers if r.secret_env} <= secret_keys
    assert {"LLM_LATENCY_DATABASE_URL", "LLM_LATENCY_API_TOKEN"} <= secret_keys


def test_every_llm_latency_variable_is_a_real_setting_and_job_and_monitor_share_image_and_secret() -> None:
    fields = {f"LLM_LATENCY_{name.upper()}" for name in Settings.model_fields}
    names = set(BY_KIND["Secret"]["stringData"])
    for kind in ("Deployment", "Job"):
        container = BY_KIND[kind]["spec"]["template"]["spec"]["containers"][0]
        names |= {e["name"] for e in container.get("env", [])}
        assert container["envFrom"] == [{"secretRef": {"name": BY_KIND["Secret"]["metadata"]["name"]}}]
    assert {n for n in names if n.startswith("LLM_LATENCY_")} <= fields
    job = BY_KIND["Job"]["spec"]["template"]["spec"]["containers"][0]
    monitor = BY_KIND["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["db", "upgrade"] and monitor["args"] == ["serve"] and job["image"] == monitor["image"]
