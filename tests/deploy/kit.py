"""The Kubernetes kit (``deploy/kubernetes/``) built the way a user builds it: a settings file
(``kustomization.yaml``) with the base, the chosen components, the image and the release label,
rendered by kubectl's own kustomize, offline. A :class:`Variant` is one set of choices; its
settings file is written to a temporary folder that names the kit by a relative path (kustomize
refuses absolute ones)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.components import require_binary

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy" / "kubernetes"
EXAMPLE = KIT / "examples" / "prometheus-source"
ENGINES = ("vllm", "tgi", "sglang", "trtllm")
STORAGES = ("sqlite", "postgres")
MODES = ("scrape", "source")
RELEASE = "kube-prometheus-stack"
IMAGE = "registry.example.com/llm-latency-monitor"
MARK = "llm-latency/kube-prometheus-stack"
#: the JSON patch that adds kube-prometheus-stack's release label, as the settings file writes it
RELEASE_PATCH = '[{{"op": "add", "path": "/metadata/labels/release", "value": "{}"}}]'
NO_OPERATOR_PATCH = ('{"$patch": "delete", "apiVersion": "monitoring.coreos.com/v1", "kind": "Any", '
                     '"metadata": {"name": "any"}}')


@dataclass(frozen=True)
class Variant:
    """The choices of one settings file."""

    storage: str = "sqlite"
    mode: str = "scrape"
    engines: tuple[str, ...] = ENGINES
    dashboards: bool = True
    release: str | None = RELEASE
    replicas: int | None = None  # kustomize's `replicas:` (components/postgres)
    operator: bool = True  # False: the settings' patch that drops the Operator's resources
    namespace: str = "llm-latency"
    components: tuple[str, ...] = ()  # more components (e.g. one of the other mode)
    patches: tuple[str, ...] = ()  # more patches of the settings, each as JSON (hashable)

    @property
    def name(self) -> str:
        parts = [self.storage, self.mode, "+".join(self.engines) or "no-engines"]
        parts += [] if self.dashboards else ["no-dashboards"]
        if self.release != RELEASE:
            parts.append(f"release={self.release}" if self.release else "no-release")
        parts += [f"replicas={self.replicas}"] if self.replicas else []
        parts += [] if self.operator else ["no-operator"]
        parts += [f"ns={self.namespace}"] if self.namespace != "llm-latency" else []
        parts += list(self.components)
        parts += [f"{len(self.patches)} patches"] if self.patches else []
        return ",".join(parts)

    def settings(self, kit: str) -> dict:
        """The settings file (a Kustomization) for these choices, naming the kit by ``kit``."""
        components = [f"{kit}/components/{self.storage}", f"{kit}/components/{self.mode}"]
        components += [f"{kit}/components/{self.mode}/rules/{engine}" for engine in self.engines]
        components += [f"{kit}/components/{self.mode}/dashboards"] if self.dashboards else []
        components += [f"{kit}/components/{c}" for c in self.components]
        settings = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                    "namespace": self.namespace,
                    "labels": [{"pairs": {"app.kubernetes.io/part-of": "llm-latency-monitor"}}],
                    "resources": [f"{kit}/base"], "components": components,
                    "images": [{"name": "llm-latency-monitor", "newName": IMAGE, "newTag": "0.1.0"}],
                    "patches": []}
        if self.replicas:
            settings["replicas"] = [{"name": "llm-latency-monitor", "count": self.replicas}]
        if self.release:
            settings["patches"].append({"target": {"labelSelector": f"{MARK}=true"},
                                        "patch": RELEASE_PATCH.format(self.release)})
        if not self.operator:
            settings["patches"].append({"target": {"group": "monitoring.coreos.com"}, "patch": NO_OPERATOR_PATCH})
        settings["patches"] += [json.loads(patch) for patch in self.patches]
        return settings


def build(directory: Path) -> subprocess.CompletedProcess:
    """``kubectl kustomize DIRECTORY`` (offline: kustomize is kubectl's own)."""
    kubectl = require_binary("kubectl", "building the kit's kustomizations offline (kubectl kustomize)")
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)


def parse(text: str) -> list[dict]:
    """The documents of a build (libyaml's loader: a build with dashboards is 360 kB)."""
    return [doc for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if doc]


def kustomize(directory: Path) -> list[dict]:
    result = build(directory)
    assert result.returncode == 0, result.stderr
    return parse(result.stdout)


def build_variant(variant: Variant, kit: Path = KIT) -> subprocess.CompletedProcess:
    """Write ``variant``'s settings file into a new temporary folder and build it."""
    folder = Path(tempfile.mkdtemp(prefix="llm-latency-kit-"))
    try:
        relative = os.path.relpath(kit, folder)
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(variant.settings(relative), sort_keys=False))
        return build(folder)
    finally:
        (folder / "kustomization.yaml").unlink(missing_ok=True)
        folder.rmdir()


@functools.cache
def render(variant: Variant) -> tuple[dict, ...]:
    """The resources ``variant`` builds (built once per test process)."""
    result = build_variant(variant)
    assert result.returncode == 0, f"{variant.name}: {result.stderr}"
    return tuple(parse(result.stdout))


def of_kind(docs: tuple[dict, ...] | list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: tuple[dict, ...] | list[dict], kind: str) -> dict:
    (doc,) = of_kind(docs, kind)
    return doc


def targets_configmap(docs: tuple[dict, ...] | list[dict]) -> dict:
    (configmap,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("llm-latency-targets")]
    return configmap


def dashboards(docs: tuple[dict, ...] | list[dict]) -> list[dict]:
    return [d for d in of_kind(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]


def monitor(docs: tuple[dict, ...] | list[dict]) -> dict:
    """The monitor's container."""
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def env(docs: tuple[dict, ...] | list[dict]) -> dict[str, dict]:
    return {e["name"]: e for e in monitor(docs)["env"]}


def rule_groups(docs: tuple[dict, ...] | list[dict]) -> list[dict]:
    return [group for rule in of_kind(docs, "PrometheusRule") for group in rule["spec"]["groups"]]


def settings_file(path: Path = KIT / "kustomization.yaml") -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))
