"""deploy/kubernetes/: the kit's variants -- SQLite or PostgreSQL, scrape or source mode, any set
of engines, with or without dashboards, kube-prometheus-stack's release label, without the
Operator -- each built by kubectl's kustomize (offline) and every resource validated against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields are errors), the Operator's
resources against the validators generated from its own API types and the stricter subset of
their CRD schemas below. And what the choices mean: one replica with Recreate and a volume on
SQLite, N rolled replicas with the migration Job on PostgreSQL, the release label on exactly the
three kinds kube-prometheus-stack selects, only the chosen engines' rules, resources from the
sizing table (docs/deployment.md), the pieces fitting together."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from sqlalchemy.engine import make_url

from app.config import load_config
from app.rules_export import build_rules
from app.settings import Settings
from tests.deploy.kit import (
    ENGINES,
    EXAMPLE,
    IMAGE,
    KIT,
    MARK,
    MODES,
    NO_OPERATOR_PATCH,
    RELEASE,
    ROOT,
    STORAGES,
    Variant,
    build_variant,
    dashboards,
    env,
    kustomize,
    monitor,
    of_kind,
    one,
    render,
    rule_groups,
    settings_file,
    targets_configmap,
)
from tests.support.components import in_ci, missing_component, require_binary

try:
    from kubernetes_validate import utils as kubernetes_validate
except ImportError:  # the test extra is not installed: skip locally, fail under CI
    if in_ci():
        raise
    pytest.skip("kubernetes-validate is not installed (pip install -e '.[test]')", allow_module_level=True)

#: the oldest Kubernetes minor still commonly run, and the newest the validator ships
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
SECRET_TEMPLATES = (KIT / "base" / "secret.yaml", KIT / "components" / "source" / "secret.yaml")
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"
#: kubectl apply (client side) keeps the whole object in this annotation, limited to 256 KiB
LAST_APPLIED_LIMIT = 262144

#: engines chosen apart from the default entry's vLLM + TGI: each of the other two alone, and a pair
SELECTIONS = (("sglang",), ("trtllm",), ("vllm", "sglang"))
#: every combination of storage and mode with everything on; the selections (and no engine) in
#: each mode; more replicas, another release, another namespace, no Operator
VARIANTS = [Variant(storage=storage, mode=mode) for storage in STORAGES for mode in MODES]
VARIANTS += [Variant(mode=mode, engines=engines, dashboards=False) for mode in MODES for engines in SELECTIONS]
VARIANTS += [Variant(storage="postgres", mode=mode, engines=(), dashboards=False, release=None) for mode in MODES]
#: three replicas, another release name and namespace
MORE = Variant(storage="postgres", mode="source", engines=("vllm",), replicas=3, release="prometheus",
               namespace="observability")
VARIANTS += [MORE, Variant(operator=False), Variant(mode="source", operator=False)]


def committed() -> dict[str, tuple[dict, ...]]:
    """The settings file as shipped (the default entry) and the ready example, built."""
    return {"default": tuple(kustomize(KIT)), "example": tuple(kustomize(EXAMPLE))}


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[dict, ...]]:
    return {**committed(), **{variant.name: render(variant) for variant in VARIANTS}}


def unique(docs: list[dict]) -> list[dict]:
    """Each distinct resource once (most variants share most resources)."""
    seen: dict[str, dict] = {}
    for doc in docs:
        seen.setdefault(json.dumps(doc, sort_keys=True), doc)
    return list(seen.values())


# ----------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", VERSIONS)
def test_every_variant_validates_against_the_kubernetes_schemas(built: dict[str, tuple[dict, ...]],
                                                                 version: str) -> None:
    docs = unique([doc for docs in built.values() for doc in docs if doc["kind"] not in CRD_KINDS])
    docs += [yaml.safe_load(path.read_text(encoding="utf-8")) for path in SECRET_TEMPLATES]
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "Secret", "Service", "Deployment", "Job",
                                         "PodDisruptionBudget", "PersistentVolumeClaim"}
    for doc in docs:
        assert kubernetes_validate.validate(doc, version, strict=True), (doc["kind"], doc["metadata"]["name"])


def test_the_validator_is_strict_about_unknown_and_mistyped_fields() -> None:
    deployment = json.loads(json.dumps(one(render(Variant()), "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    claim = json.loads(json.dumps(one(render(Variant()), "PersistentVolumeClaim")))
    claim["spec"]["resources"]["requests"]["storage"] = ["40Gi"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, VERSIONS[-1], strict=True)


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


def test_operator_resources_validate_against_the_crd_subset_and_the_operators_own_validators(
        built: dict[str, tuple[dict, ...]]) -> None:
    resources = unique([doc for docs in built.values() for doc in docs if doc["kind"] in CRD_KINDS])
    # the monitor's ServiceMonitor with and without the release label, the rules of two modes
    assert len([r for r in resources if r["kind"] == "ServiceMonitor"]) >= 2
    assert len({r["metadata"]["name"] for r in resources if r["kind"] == "PrometheusRule"}) == 1 + len(ENGINES)
    for resource in resources:
        validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[resource["kind"]])
        assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(resource)] == [], resource["kind"]
    result = operator_validation(resources)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"ok {r['kind']}/{r['metadata']['name']}" for r in resources]


def test_the_operator_validators_refuse_what_the_operator_would() -> None:
    docs = render(Variant(engines=("vllm",), dashboards=False))
    monitor_ = json.loads(json.dumps(one(docs, "ServiceMonitor")))
    monitor_["spec"]["endpoints"][0]["interval"] = "15 seconds"
    rules = json.loads(json.dumps(next(r for r in of_kind(docs, "PrometheusRule")
                                       if r["metadata"]["name"] == "llm-latency-rules-vllm")))
    del rules["spec"]["groups"][0]["rules"][0]["expr"]
    result = operator_validation([monitor_, rules])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("invalid ServiceMonitor/") and "endpoints/0/interval must match pattern" in lines[0]
    assert lines[1].startswith("invalid PrometheusRule/") and "rules/0 must have required property expr" in lines[1]
    for kind, broken in (("ServiceMonitor", monitor_), ("PrometheusRule", rules)):
        assert list(jsonschema.Draft202012Validator(CRD_SCHEMAS[kind]).iter_errors(broken))


def test_every_object_fits_the_annotation_client_side_apply_keeps(built: dict[str, tuple[dict, ...]]) -> None:
    """``kubectl apply`` stores the object in ``last-applied-configuration`` (256 KiB at most):
    the largest are the dashboards and the vLLM rules, one resource each."""
    sizes = {(d["kind"], d["metadata"]["name"]): len(json.dumps(d, separators=(",", ":")))
             for docs in built.values() for d in docs}
    assert max(sizes.values()) < LAST_APPLIED_LIMIT, max(sizes.items(), key=lambda item: item[1])
    assert sizes[("ConfigMap", "llm-latency-dashboard-target")] > 100_000  # what the limit is about


# ----------------------------------------------------------------------------- storage


def test_sqlite_runs_one_replica_replaced_with_recreate_its_database_on_the_volume() -> None:
    """SQLite serves one process (the monitor locks ``<database>.replica-lock`` and refuses a
    second, app/replicas/membership.py): one replica, the old pod gone before the new starts."""
    docs = render(Variant())
    deployment, claim = one(docs, "Deployment"), one(docs, "PersistentVolumeClaim")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not of_kind(docs, "Job") and not of_kind(docs, "PodDisruptionBudget")  # no drain would ever pass a PDB
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (mount,) = [m for m in monitor(docs)["volumeMounts"] if m["name"] == volume["name"]]
    assert not mount.get("readOnly")
    database = Path(make_url(env(docs)["LLM_LATENCY_DATABASE_URL"]["value"]).database)
    assert database == Path(mount["mountPath"]) / "llm-latency.db"
    assert Path(f"{database}.replica-lock").parent == Path(mount["mountPath"])  # the lock lives on the volume too
    data_dir = re.search(r"LLM_LATENCY_DATA_DIR=(\S+)", (ROOT / "deploy" / "Dockerfile").read_text()).group(1)
    assert mount["mountPath"] == data_dir  # the image's own data directory (owned by its user)
    assert deployment["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001  # the volume is writable


@pytest.mark.parametrize("replicas", [None, 3])
def test_postgres_runs_n_replicas_rolled_one_at_a_time_with_the_migration_job(replicas: int | None) -> None:
    """Replicas share the targets and one holds the leader lease (app/replicas/membership.py): a
    rollout starts a new pod before stopping an old one, a drain evicts one at a time."""
    docs = render(MORE if replicas else Variant(storage="postgres"))
    deployment, pdb, job = one(docs, "Deployment"), one(docs, "PodDisruptionBudget"), one(docs, "Job")
    spec = deployment["spec"]
    assert spec["replicas"] == (replicas or 2)
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert not of_kind(docs, "PersistentVolumeClaim")
    assert "LLM_LATENCY_DATABASE_URL" not in env(docs)  # the Secret's, shared with the Job
    job_container = job["spec"]["template"]["spec"]["containers"][0]
    assert job_container["args"] == ["db", "upgrade"] and job_container["image"] == monitor(docs)["image"]
    assert job_container["envFrom"] == monitor(docs)["envFrom"]
    variables = env(docs)
    assert variables["LLM_LATENCY_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    settings = Settings(replica_heartbeat=variables["LLM_LATENCY_REPLICA_HEARTBEAT"]["value"],
                        replica_expiry=variables["LLM_LATENCY_REPLICA_EXPIRY"]["value"])
    # a replica that stops gets the grace period to finish, hand over and leave
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= settings.replica_expiry


def test_the_namespace_is_one_setting() -> None:
    docs = render(MORE)
    assert one(docs, "Namespace")["metadata"]["name"] == "observability"
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] != "Namespace"} == {"observability"}


# ----------------------------------------------------------------------------- kube-prometheus-stack


def test_the_release_label_is_on_exactly_the_three_kinds_kube_prometheus_stack_selects(
        built: dict[str, tuple[dict, ...]]) -> None:
    for name in ("default", "example", Variant().name, Variant(storage="postgres", mode="source").name):
        docs = built[name]
        labelled = {(d["kind"], d["metadata"]["name"]) for d in docs if "release" in d["metadata"].get("labels", {})}
        expected = {(d["kind"], d["metadata"]["name"]) for d in docs
                    if d["kind"] in CRD_KINDS or d in dashboards(docs)}
        assert labelled == expected and len(dashboards(docs)) == 3, name
        assert {d["metadata"]["labels"]["release"] for d in docs if (d["kind"], d["metadata"]["name"]) in labelled} \
            == {RELEASE}
    other = render(MORE)
    assert {d["metadata"]["labels"].get("release") for d in other if d["kind"] in CRD_KINDS} == {"prometheus"}
    bare = render(Variant(storage="postgres", engines=(), dashboards=False, release=None))
    assert not [d for d in bare if "release" in d["metadata"].get("labels", {})]
    # the settings file names the value once; the marker is what the patch selects
    patch = settings_file()["patches"][0]
    assert patch["target"] == {"labelSelector": f"{MARK}=true"}
    assert json.loads(patch["patch"]) == [{"op": "add", "path": "/metadata/labels/release", "value": RELEASE}]


def test_without_the_operator_the_rest_is_unchanged() -> None:
    """The settings' commented last patch (built here uncommented) drops only the Operator's kinds."""
    assert f"#   patch: '{NO_OPERATOR_PATCH}'" in (KIT / "kustomization.yaml").read_text()
    for mode in MODES:
        full, bare = render(Variant(mode=mode)), render(Variant(mode=mode, operator=False))
        assert [d for d in full if d["kind"] not in CRD_KINDS] == list(bare)
        assert {d["kind"] for d in full} - {d["kind"] for d in bare} == CRD_KINDS


# ----------------------------------------------------------------------------- rules and dashboards


@pytest.mark.parametrize("mode", MODES)
def test_the_engines_chosen_are_the_engines_whose_rules_load(mode: str, tmp_path: Path) -> None:
    for engines in (*SELECTIONS, ("vllm", "tgi")):
        groups = rule_groups(render(Variant(mode=mode, engines=engines, dashboards=False)))
        assert sorted(g["name"] for g in groups) == sorted(["llm-latency-targets",
                                                            *(f"llm-latency-{engine}" for engine in engines)])
        for group in (g for g in groups if g["name"] != "llm-latency-targets"):
            engine = group["name"].removeprefix("llm-latency-")
            assert {r["labels"]["engine"] for r in group["rules"] if "alert" in r} == {engine}
            assert all(r["record"].startswith(f"llm_latency:{engine}_") for r in group["rules"] if "record" in r)
    assert [g["name"] for g in rule_groups(render(Variant(storage="postgres", mode=mode, engines=(),
                                                          dashboards=False, release=None)))] == ["llm-latency-targets"]
    # all four: the export for the mode's targets YAML, split and nothing lost
    path = tmp_path / "targets.yaml"
    path.write_text(targets_configmap(render(Variant(mode=mode)))["data"]["targets.yaml"], encoding="utf-8")
    # scrape mode's ranges fit the cluster's 30s scrapes; source mode's its own scrape_interval
    exported = build_rules(load_config(path), scrape_interval=30.0 if mode == "scrape" else None)["groups"]
    assert sorted(rule_groups(render(Variant(mode=mode))), key=lambda g: g["name"]) == sorted(
        exported, key=lambda g: g["name"])


def test_a_component_of_the_other_mode_fails_the_build() -> None:
    """Rules and dashboards exported for one mode's targets YAML say so when built with the other's."""
    for extra in ("source/rules/tgi", "source/dashboards"):
        result = build_variant(Variant(engines=("vllm",), dashboards=False, components=(extra,)))
        assert result.returncode != 0
        assert f"components/{extra}" in result.stderr
        assert "testing value /metadata/labels/llm-latency~1mode failed" in result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_dashboards_are_configmaps_for_grafanas_sidecar(mode: str) -> None:
    docs = render(Variant(mode=mode))
    found = {d["metadata"]["name"]: d for d in dashboards(docs)}
    assert set(found) == {"llm-latency-dashboard-fleet", "llm-latency-dashboard-target", "llm-latency-dashboard-slo"}
    folder = KIT / "components" / mode / "dashboards"
    for name, configmap in found.items():
        (key,) = configmap["data"]
        assert key == f"llm-latency-{name.rsplit('-', 1)[1]}.json"
        assert configmap["data"][key] == (folder / key).read_text(encoding="utf-8")
        assert json.loads(configmap["data"][key])["uid"] == key.removesuffix(".json")
    if mode == "scrape":  # the repository's dashboards, as grafana/generate.py writes them
        for key in (k for d in found.values() for k in d["data"]):
            assert (folder / key).read_bytes() == (ROOT / "grafana" / "dashboards" / key).read_bytes()


# ----------------------------------------------------------------------------- sizing


def _table(text: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after ``heading``, as rows of header -> cell."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [dict(zip(rows[0], row)) for row in rows[2:]]


def measured_load() -> dict[tuple[str, int], tuple[float, float]]:
    """(database, targets) -> (CPU cores, maximum RSS MiB) of docs/benchmarks.md's load runs."""
    text = BENCHMARKS_DOC.read_text(encoding="utf-8")
    section = text[text.index("## The built-in store under load"):text.index("## HA:")]
    found, database, targets, header = {}, "", None, None
    for line in section.splitlines():
        if line.startswith("**"):
            database = "postgresql" if line.startswith("**PostgreSQL") else "sqlite"
            one_size = re.match(r"\*\*\w+, N = ([\d,]+), ", line)
            targets = int(one_size.group(1).replace(",", "")) if one_size else None
        elif line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if "CPU (cores)" in cells:
                header = cells
            elif header and not set(line) <= set("|-: "):
                row = dict(zip(header, cells))
                n = int(row["N"].replace(",", "")) if "N" in row else targets
                found[(database, n)] = (float(row["CPU (cores)"]), float(row["RSS warm / max / end"].split("/")[1]))
        else:
            header = None
    return found


def sizing() -> list[dict[str, str]]:
    return _table(DEPLOYMENT_DOC.read_text(encoding="utf-8"), "## Sizing")


def test_the_sizing_table_follows_from_the_benchmarks_by_its_rule() -> None:
    """CPU request: the load benchmark's CPU, the larger of the two databases, rounded up to 100m.
    Memory request: its maximum RSS rounded up to 128 MiB; limit: the request + 50 %. SQLite
    volume: twice the steady state of the default retention, rounded up to 10 GiB."""
    load = measured_load()
    assert load[("sqlite", 1000)] == (0.96, 858.0) and load[("postgresql", 1000)] == (0.92, 802.0)
    storage = {row["storage"]: row for row in _table(BENCHMARKS_DOC.read_text(encoding="utf-8"), "| storage |")}
    per_target = float(storage["sqlite"]["steady state MB/target-day"]) * 1e6 * Settings().retention / 86400
    rows = sizing()
    assert [row["targets"] for row in rows] == ["150", "500", "1,000"]
    for row in rows:
        n = int(row["targets"].replace(",", ""))
        (cpu_s, rss_s), (cpu_p, rss_p) = load[("sqlite", n)], load[("postgresql", n)]
        assert row["measured: CPU, max RSS (SQLite / PostgreSQL)"] == (
            f"{cpu_s:.2f} / {cpu_p:.2f} cores, {rss_s:.0f} / {rss_p:.0f} MiB")
        memory = math.ceil(max(rss_s, rss_p) / 128) * 128
        assert row["CPU request"] == f"{math.ceil(round(max(cpu_s, cpu_p) * 10, 6)) * 100}m"
        assert (row["memory request"], row["memory limit"]) == (f"{memory}Mi", f"{memory * 3 // 2}Mi")
        assert row["SQLite volume"] == f"{math.ceil(2 * per_target * n / 2 ** 30 / 10) * 10}Gi"


def test_the_kit_is_sized_by_the_tables_row_for_1000_targets(built: dict[str, tuple[dict, ...]]) -> None:
    row = sizing()[-1]
    assert row["targets"] == "1,000"
    expected = {"requests": {"cpu": row["CPU request"], "memory": row["memory request"]},
                "limits": {"memory": row["memory limit"]}}  # no CPU limit: one interpreter
    for name, docs in built.items():
        assert monitor(docs)["resources"] == expected, name
        for claim in of_kind(docs, "PersistentVolumeClaim"):
            assert claim["spec"]["resources"]["requests"]["storage"] == row["SQLite volume"]


def test_another_row_is_two_patches_of_the_settings_as_the_page_shows() -> None:
    text = DEPLOYMENT_DOC.read_text(encoding="utf-8")
    section = text[text.index("### Sizing"):]
    snippet = section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]
    patches = yaml.safe_load(snippet)
    docs = render(Variant(engines=(), dashboards=False, patches=tuple(json.dumps(p) for p in patches)))
    row = next(row for row in sizing() if row["targets"] == "150")
    assert monitor(docs)["resources"] == {"requests": {"cpu": row["CPU request"], "memory": row["memory request"]},
                                          "limits": {"memory": row["memory limit"]}}
    assert one(docs, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"] == row["SQLite volume"]


# ----------------------------------------------------------------------------- the settings file


def test_the_default_entry_is_sqlite_scraping_two_engines_with_their_rules_and_dashboards(
        built: dict[str, tuple[dict, ...]]) -> None:
    settings = settings_file()
    assert settings["resources"] == ["base"]
    assert settings["components"] == ["components/sqlite", "components/scrape", "components/scrape/rules/vllm",
                                      "components/scrape/rules/tgi", "components/scrape/dashboards"]
    docs = built["default"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs if not d["metadata"]["name"].startswith(
        "llm-latency-targets-")) == [
        ("ConfigMap", "llm-latency-dashboard-fleet"), ("ConfigMap", "llm-latency-dashboard-slo"),
        ("ConfigMap", "llm-latency-dashboard-target"), ("Deployment", "llm-latency-monitor"),
        ("Namespace", "llm-latency"), ("PersistentVolumeClaim", "llm-latency-data"),
        ("PrometheusRule", "llm-latency-rules"), ("PrometheusRule", "llm-latency-rules-tgi"),
        ("PrometheusRule", "llm-latency-rules-vllm"), ("Service", "llm-latency-monitor"),
        ("ServiceMonitor", "llm-latency-monitor")]
    assert {d["metadata"]["labels"]["app.kubernetes.io/part-of"] for d in docs} == {"llm-latency-monitor"}
    assert list(docs) == list(render(Variant(engines=("vllm", "tgi"))))


def test_the_image_is_one_setting_built_by_the_repositorys_dockerfile(built: dict[str, tuple[dict, ...]]) -> None:
    (image,) = settings_file()["images"]
    assert (image["name"], image["newName"]) == ("llm-latency-monitor", IMAGE)
    for name, docs in built.items():
        containers = [c for kind in ("Deployment", "Job") for d in of_kind(docs, kind)
                      for c in d["spec"]["template"]["spec"]["containers"]]
        assert {c["image"] for c in containers} == {f"{IMAGE}:{image['newTag']}"}, name
    build_command = f"docker build -f deploy/Dockerfile -t {IMAGE}:{image['newTag']} ."
    assert build_command in (KIT / "kustomization.yaml").read_text()
    assert (ROOT / "deploy" / "Dockerfile").is_file()


def test_the_example_reads_the_clusters_prometheus_with_two_replicas_on_postgres(
        built: dict[str, tuple[dict, ...]]) -> None:
    docs = built["example"]
    assert targets_configmap(docs)["metadata"]["labels"]["llm-latency/mode"] == "source"
    assert one(docs, "Deployment")["spec"]["replicas"] == 2 and one(docs, "Job")
    assert [g["name"] for g in rule_groups(docs)] == ["llm-latency-targets", "llm-latency-vllm"]
    same = render(Variant(storage="postgres", mode="source", engines=("vllm",)))
    assert list(docs) == list(same)


# ----------------------------------------------------------------------------- the pieces fit


@pytest.mark.parametrize("mode", MODES)
def test_deployment_service_and_servicemonitor_select_each_other(mode: str) -> None:
    docs = render(Variant(mode=mode))
    deployment, service, monitor_ = one(docs, "Deployment"), one(docs, "Service"), one(docs, "ServiceMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor_["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    container = monitor(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_port = service["spec"]["ports"][0]
    assert service_port["targetPort"] in ports and monitor_["spec"]["endpoints"][0]["port"] == service_port["name"]
    variables = {e["name"]: e.get("value") for e in container["env"]}
    assert int(variables["LLM_LATENCY_PORT"]) == ports["http"] and variables["LLM_LATENCY_HOST"] == "0.0.0.0"
    probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def test_pods_run_as_the_image_user_with_a_read_only_root_and_no_service_links() -> None:
    """``enableServiceLinks: false``: Kubernetes would otherwise set ``<SERVICE>_PORT=tcp://...``
    for every Service, and one named ``llm-latency`` sets ``LLM_LATENCY_PORT`` -- a setting."""
    uid = re.search(r"^USER (\d+):", (ROOT / "deploy" / "Dockerfile").read_text(), re.M).group(1)
    docs = render(Variant(storage="postgres"))
    for kind in ("Deployment", "Job"):
        pod = one(docs, kind)["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False and pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(uid)
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("mode", MODES)
def test_the_configmap_is_a_valid_targets_file_mounted_where_the_monitor_reads_it(mode: str, tmp_path: Path) -> None:
    docs = render(Variant(mode=mode))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container, configmap = monitor(docs), targets_configmap(docs)
    variables = {e["name"]: e.get("value") for e in container["env"]}
    volume = next(v for v in pod["volumes"] if v.get("configMap"))
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]  # the hashed name: a change rolls the pods
    assert re.fullmatch(r"llm-latency-targets-[a-z0-9]{10}", configmap["metadata"]["name"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    key = Path(variables["LLM_LATENCY_CONFIG_FILE"]).relative_to(mount["mountPath"]).as_posix()
    assert configmap["data"][key] == (KIT / "components" / mode / "targets.yaml").read_text(encoding="utf-8")
    path = tmp_path / "targets.yaml"
    path.write_text(configmap["data"][key], encoding="utf-8")
    config = load_config(path, variables["LLM_LATENCY_ALLOWED_TARGET_HOSTS"].split(","))
    assert {t.engine for t in config.targets} == ({"vllm", "tgi"} if mode == "scrape" else set())
    assert len(config.sources) == (mode == "source")
    secret_keys = set(yaml.safe_load(SECRET_TEMPLATES[0].read_text())["stringData"])
    assert {r.secret_env for r in config.alerts.receivers if r.secret_env} <= secret_keys
    assert "LLM_LATENCY_API_TOKEN" in secret_keys


def test_every_llm_latency_variable_is_a_real_setting_and_job_and_monitor_share_the_secret() -> None:
    fields = {f"LLM_LATENCY_{name.upper()}" for name in Settings.model_fields}
    secret = yaml.safe_load(SECRET_TEMPLATES[0].read_text())
    names = set(secret["stringData"])
    for variant in (Variant(), Variant(storage="postgres", mode="source")):
        docs = render(variant)
        for kind in ("Deployment", "Job"):
            for doc in of_kind(docs, kind):
                container = doc["spec"]["template"]["spec"]["containers"][0]
                names |= {e["name"] for e in container.get("env", [])}
                assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    assert {n for n in names if n.startswith("LLM_LATENCY_")} <= fields


def test_the_deployment_page_counts_the_variants_built_here() -> None:
    found = re.search(r"the example and (\d+)\s+more sets of choices", DEPLOYMENT_DOC.read_text(encoding="utf-8"))
    assert found and int(found.group(1)) == len(VARIANTS)
