"""deploy/autoscaling/: the KEDA ScaledObject and the autoscaling/v2 HPA validate offline
against their published schemas -- KEDA's keda.sh CRDs and Kubernetes' OpenAPI through the
validators @kubernetes-models/keda and kubernetes-models generate from them (npm, pinned in
``operator_models/package-lock.json``), the HPA also with kubernetes-validate (strict:
unknown fields are errors) and the ScaledObject with the strict subset of KEDA's CRD written
below -- and a broken example fails. The queries name the gauge the service exports and
parse as PromQL (promtool); the target is the name the monitor gives a source's service."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from app.diagnosis.capacity import Capacity
from app.diagnosis.telemetry import CapacityCollector
from app.promsource.service import target_name
from tests.deploy.test_kubernetes import VERSIONS, kubernetes_validate, operator_validation
from tests.support.components import require_binary

ROOT = Path(__file__).resolve().parents[2]
AUTOSCALING = ROOT / "deploy" / "autoscaling"
SCALED_OBJECT = yaml.safe_load((AUTOSCALING / "keda-scaledobject.yaml").read_text(encoding="utf-8"))
HPA = yaml.safe_load((AUTOSCALING / "hpa.yaml").read_text(encoding="utf-8"))
ADAPTER = yaml.safe_load((AUTOSCALING / "prometheus-adapter-config.yaml").read_text(encoding="utf-8"))
GAUGE = "llm_latency_capacity_desired_replicas"
SERVICE = target_name("prod.svc", ("llm", "chat"))  # service_labels [namespace, service] of source "prod"

# The parts of KEDA's ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x) the example uses, field
# names and types as in the CRD; unknown fields are errors (the API server's strict field
# validation). HPA behavior is validated as part of an autoscaling/v2 HPA below.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_INT = {"type": "integer", "minimum": 0}
SCALED_OBJECT_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                                    "labels": _STRING_MAP, "annotations": _STRING_MAP}},
        "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                 "properties": {
                     "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                       "name": {"type": "string"},
                                                       "envSourceContainerName": {"type": "string"}}},
                     "minReplicaCount": _INT, "maxReplicaCount": _INT, "idleReplicaCount": _INT,
                     "pollingInterval": _INT, "cooldownPeriod": _INT, "initialCooldownPeriod": _INT,
                     "fallback": {"type": "object", "required": ["failureThreshold", "replicas"],
                                  "additionalProperties": False,
                                  "properties": {"failureThreshold": _INT, "replicas": _INT,
                                                 "behavior": {"type": "string"}}},
                     "advanced": {"type": "object", "additionalProperties": False, "properties": {
                         "restoreToOriginalReplicaCount": {"type": "boolean"},
                         "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False,
                                                           "properties": {"name": {"type": "string"},
                                                                          "behavior": {"type": "object"}}}}},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                         "properties": {"type": {"type": "string"}, "name": {"type": "string"},
                                        "metadata": _STRING_MAP, "useCachedMetrics": {"type": "boolean"},
                                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                        "authenticationRef": {"type": "object"}}}}}},
    },
}


def test_examples_validate_with_the_models_generated_from_the_published_schemas() -> None:
    result = operator_validation([SCALED_OBJECT, HPA])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["ok ScaledObject/vllm-chat", "ok HorizontalPodAutoscaler/vllm-chat"]


def test_broken_examples_fail_validation() -> None:
    """What people get wrong: a number where KEDA wants a string, ``trigger`` for ``triggers``,
    the autoscaling/v2beta1 ``metricName`` in a v2 HPA."""
    number = copy.deepcopy(SCALED_OBJECT)
    number["spec"]["triggers"][0]["metadata"]["threshold"] = 1
    misspelt = copy.deepcopy(SCALED_OBJECT)
    misspelt["spec"]["trigger"] = misspelt["spec"].pop("triggers")
    old_hpa = copy.deepcopy(HPA)
    old_hpa["spec"]["metrics"][0]["external"] = {"metricName": GAUGE, "targetAverageValue": "1"}
    result = operator_validation([number, misspelt, old_hpa])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("invalid ScaledObject/") and "triggers/0/metadata/threshold must be string" in lines[0]
    assert lines[1].startswith("invalid ScaledObject/") and "must have required property triggers" in lines[1]
    assert lines[2].startswith("invalid HorizontalPodAutoscaler/") and "must have required property metric" \
        in lines[2]


@pytest.mark.parametrize("version", VERSIONS)
def test_hpa_and_keda_behavior_validate_strictly_against_the_kubernetes_schema(version: str) -> None:
    assert kubernetes_validate.validate(HPA, version, strict=True)
    behavior = SCALED_OBJECT["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert kubernetes_validate.validate({**HPA, "spec": {**HPA["spec"], "behavior": behavior}}, version, strict=True)
    typo = copy.deepcopy(HPA)
    typo["spec"]["behavior"]["scaleDown"]["stabilisationWindowSeconds"] = 600
    with pytest.raises(kubernetes_validate.ValidationError, match="stabilisationWindowSeconds"):
        kubernetes_validate.validate(typo, version, strict=True)


def test_scaled_object_matches_the_strict_crd_subset() -> None:
    validator = jsonschema.Draft202012Validator(SCALED_OBJECT_SCHEMA)
    assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(SCALED_OBJECT)] == []
    typo = copy.deepcopy(SCALED_OBJECT)
    typo["spec"]["pollingIntervall"] = 30
    assert [e.message for e in validator.iter_errors(typo)] == [
        "Additional properties are not allowed ('pollingIntervall' was unexpected)"]


def test_both_ask_for_the_gauge_itself_one_replica_per_unit() -> None:
    """AverageValue with a target of 1: the HPA's ceil(value / 1) is the signal's replica count."""
    [trigger] = SCALED_OBJECT["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"], trigger["metadata"]["threshold"]) == ("prometheus", "AverageValue",
                                                                                        "1")
    assert trigger["metadata"]["query"] == f'max({GAUGE}{{target="{SERVICE}"}})'
    [metric] = HPA["spec"]["metrics"]
    assert metric["external"]["metric"] == {"name": GAUGE, "selector": {"matchLabels": {"target": SERVICE}}}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    [rule] = ADAPTER["externalRules"]
    assert rule["name"]["as"] == GAUGE and rule["resources"] == {"namespaced": False}
    assert rule["seriesQuery"].startswith(GAUGE + "{")
    # the gauge of that name is what the service exports
    collector = CapacityCollector()
    collector.assessments = [Capacity(SERVICE, "m", "service", 2, 3, True, "queueing", 1.4, "slots", {"slots": 1.4})]
    desired = next(f for f in collector.collect() if f.name == GAUGE)
    assert [(s.labels, s.value) for s in desired.samples] == [({"target": SERVICE, "model": "m"}, 3.0)]
    for scaler in (SCALED_OBJECT, HPA):
        assert scaler["spec"]["scaleTargetRef"]["name"] == "vllm-chat"
        assert scaler["metadata"]["namespace"] == "llm"


def test_queries_parse_as_promql(tmp_path: Path) -> None:
    """promtool checks them as rule expressions; the adapter's template filled as it fills it."""
    promtool = require_binary("promtool", "checking the autoscaling queries' PromQL")
    [rule] = ADAPTER["externalRules"]
    adapter_query = rule["metricsQuery"].replace("<<.Series>>", GAUGE).replace("<<.LabelMatchers>>",
                                                                                f'target="{SERVICE}"')
    exprs = [SCALED_OBJECT["spec"]["triggers"][0]["metadata"]["query"], adapter_query, rule["seriesQuery"]]
    rules = {"groups": [{"name": "autoscaling", "rules": [{"record": f"check:{i}", "expr": e}
                                                          for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS: 3 rules found" in result.stdout, result.stdout + result.stderr
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x", "expr": "max(" + GAUGE}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, timeout=60).returncode == 1
