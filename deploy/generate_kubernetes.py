#!/usr/bin/env python3
"""Regenerates what the Kubernetes kit (``deploy/kubernetes/``) derives from its targets YAML files.

    python3 deploy/generate_kubernetes.py             # rewrite the generated files
    python3 deploy/generate_kubernetes.py --check     # exit 1 when one is stale (CI)
    python3 deploy/generate_kubernetes.py --kit DIR   # a copy of the kit, after editing its targets.yaml
    python3 deploy/generate_kubernetes.py --kit DIR --chart CHART   # and a copy of the Helm chart

Each mode component (``components/scrape``, ``components/source``) holds the targets YAML the
monitor runs with, and next to it what is exported for that file:

* ``prometheusrule.yaml``: the rule groups of no engine (``llm-latency-targets``, and
  ``llm-latency-slos`` with a ``slos:`` section), part of the mode component;
* ``rules/<engine>/``: a component per engine (vllm, tgi, sglang, trtllm) with that engine's
  group only, so a cluster loads the rules of the engines it runs;
* ``dashboards/``: the Grafana dashboards generated for the file (``grafana/generate.py
  --config``; in scrape mode the same as ``grafana/dashboards/``), one ConfigMap each, labelled
  ``grafana_dashboard: "1"`` for Grafana's dashboard sidecar.

In scrape mode the rules run on the cluster's own scrapes of the engines, so their ranges are
fitted to ``--scrape-interval`` (default 30s, kube-prometheus-stack's): at least four scrapes a
range. In source mode they follow the source's ``scrape_interval`` in its targets YAML.

The engine and dashboard components check, when kustomize builds them, that the targets
ConfigMap is their mode's (a JSON-patch ``test`` of its ``llm-latency/mode`` label), so rules
exported for one mode are not applied with the other's config.

The Helm chart (``deploy/helm/llm-latency-monitor``) makes the same objects, and a chart reads
only files inside its own folder (``.Files.Get``): its ``files/<mode>/`` holds copies, written
here from the same exports, of the mode's ``targets.yaml``, the rules (``rules.yaml``, the groups
of no engine, and ``rules/<engine>.yaml``: each the ``spec`` of a PrometheusRule) and the
dashboards. They are written with the kit's own ``deploy/kubernetes``; with ``--kit DIR``, only
when ``--chart`` names a copy of the chart.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import yaml

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
for path in (ROOT, DEPLOY):  # the project and the wrapper script, when run from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from generate_prometheusrule import (  # noqa: E402
    NAME,
    config_rules,
    dump,
    engine_of,
    load_groups,
    render_groups,
)

from app.rules_export.engines import ENGINES  # noqa: E402

KIT = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "llm-latency-monitor"
MODES = ("scrape", "source")
TARGETS = "targets.yaml"
COMMAND = "python3 deploy/generate_kubernetes.py"
GENERATOR = "deploy/generate_kubernetes.py"
CLUSTER_SCRAPE_INTERVAL = 30.0  # kube-prometheus-stack's default: the scrape mode's rules are fitted to it
TITLES = {engine.name: engine.title for engine in ENGINES}
DASHBOARD_LABELS = {"app.kubernetes.io/name": "llm-latency-monitor", "app.kubernetes.io/component": "dashboards",
                    "grafana_dashboard": "1", "llm-latency/kube-prometheus-stack": "true"}


def _grafana() -> ModuleType:
    """``grafana/generate.py`` (a script of the checkout, not a package), loaded once."""
    name = "grafana_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "grafana" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def mode_guard(mode: str) -> list[dict]:
    """The patch that fails the build unless the targets ConfigMap is ``mode``'s."""
    test = [{"op": "test", "path": "/metadata/labels/llm-latency~1mode", "value": mode}]
    return [{"target": {"kind": "ConfigMap", "name": "llm-latency-targets"},
             "patch": json.dumps(test)}]


def _component(header: str, body: dict) -> str:
    document = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component", **body}
    return header + yaml.safe_dump(document, sort_keys=False, width=1000)


def regenerate_command(scrape_interval: str | None = None) -> str:
    """The command the generated files name (with ``--scrape-interval`` when not the default: it
    changes what they hold)."""
    return COMMAND + (f" --scrape-interval {scrape_interval}" if scrape_interval else "")


def mode_files(kit: Path, mode: str, grafana: ModuleType | None = None,
               scrape_interval: float = CLUSTER_SCRAPE_INTERVAL, command: str = COMMAND,
               chart: Path | None = None) -> dict[Path, str]:
    """Every file generated for one mode component: path -> text (scrape mode's rule ranges fitted to
    the cluster's ``scrape_interval``; source mode's to its targets YAML's); ``command``: the one
    their headers name. With ``chart``, the chart's copies for that mode too."""
    directory = kit / "components" / mode
    shown = f"components/{mode}/{TARGETS}"
    generated = f"# GENERATED by {GENERATOR} from {shown} -- DO NOT EDIT BY HAND.\n"
    fit = scrape_interval if mode == "scrape" else None
    groups = load_groups(config_rules(directory / TARGETS, scrape_interval=fit), shown)
    source = f"{shown} (via `llm-latency rules export`)"
    files = {directory / "prometheusrule.yaml":
             render_groups([g for g in groups if engine_of(g) is None], source, command, NAME, GENERATOR)}
    for group in groups:
        engine = engine_of(group)
        if engine is None:
            continue
        files[directory / "rules" / engine / "prometheusrule.yaml"] = render_groups(
            [group], source, command, f"{NAME}-{engine}", GENERATOR)
        files[directory / "rules" / engine / "kustomization.yaml"] = _component(
            generated + f"# The {TITLES[engine]} rules exported for {shown} (group {group['name']}): list this\n"
                        f"# component for every engine the cluster runs, with the {mode} component.\n",
            {"resources": ["prometheusrule.yaml"], "patches": mode_guard(mode)})
    grafana = grafana or _grafana()
    dashboards = grafana.render(grafana.engine_labels(directory / TARGETS, None))
    for name, text in dashboards.items():
        files[directory / "dashboards" / name] = text
    files[directory / "dashboards" / "kustomization.yaml"] = _component(
        generated + f"# The Grafana dashboards for {shown}, one ConfigMap each, labelled for Grafana's\n"
                    "# dashboard sidecar (kube-prometheus-stack's sidecar finds grafana_dashboard: \"1\" in every\n"
                    "# namespace). No hash in the names: the sidecar updates a dashboard in place.\n",
        {"generatorOptions": {"disableNameSuffixHash": True, "labels": DASHBOARD_LABELS},
         "configMapGenerator": [{"name": f"llm-latency-dashboard-{Path(name).stem.removeprefix('llm-latency-')}",
                                 "files": [name]} for name in dashboards],
         "patches": mode_guard(mode)})
    if chart is not None:
        files |= chart_files(chart, mode, (directory / TARGETS).read_text(encoding="utf-8"), groups,
                             dashboards, command)
    return files


def chart_files(chart: Path, mode: str, targets: str, groups: list[dict], dashboards: dict[str, str],
                command: str) -> dict[Path, str]:
    """The Helm chart's copies for one mode (``files/<mode>/``): the targets YAML and the dashboards
    as they are, each rule's ``spec`` (the chart's templates add the metadata, as the kit's do)."""
    folder = chart / "files" / mode
    shown = f"components/{mode}/{TARGETS}"

    def spec(name: str, chosen: list[dict]) -> str:
        return (f"# GENERATED by {GENERATOR} from the kit's {shown} -- DO NOT EDIT BY HAND.\n"
                f"# The spec of the PrometheusRule {name} (templates/prometheusrules.yaml). Regenerate after\n"
                f"# changing it or the rules: {command}\n" + dump({"groups": chosen}))

    files = {folder / TARGETS: targets,
             folder / "rules.yaml": spec(NAME, [g for g in groups if engine_of(g) is None])}
    for group in groups:
        engine = engine_of(group)
        if engine is not None:
            files[folder / "rules" / f"{engine}.yaml"] = spec(f"{NAME}-{engine}", [group])
    for name, text in dashboards.items():
        files[folder / "dashboards" / name] = text
    return files


def kit_files(kit: Path = KIT, scrape_interval: float = CLUSTER_SCRAPE_INTERVAL, command: str = COMMAND,
              chart: Path | None = None) -> dict[Path, str]:
    """Every generated file of the kit (and, with ``chart``, of the chart): path -> text."""
    grafana = _grafana()
    return {path: text for mode in MODES
            for path, text in mode_files(kit, mode, grafana, scrape_interval, command, chart).items()}


def leftovers(kit: Path, wanted: dict[Path, str], chart: Path | None = None) -> list[Path]:
    """Files in the generated folders that the generator no longer writes (an engine or a dashboard gone)."""
    found = [path for mode in MODES for folder in ("rules", "dashboards")
             for path in (kit / "components" / mode / folder).rglob("*") if path.is_file()]
    found += [path for path in (chart / "files").rglob("*") if path.is_file()] if chart is not None else []
    return sorted(path for path in found if path not in wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=KIT, help="The kit's folder (default: deploy/kubernetes).")
    parser.add_argument("--chart", type=Path, default=None,
                        help="The Helm chart's folder, whose files/ holds copies (default: "
                             "deploy/helm/llm-latency-monitor with the kit's own folder, none with --kit).")
    parser.add_argument("--check", action="store_true", help="Exit 1 if a generated file is stale.")
    parser.add_argument("--scrape-interval", default="30s", metavar="DURATION",
                        help="How often the cluster's Prometheus scrapes the engines: scrape mode's rule ranges "
                             "hold at least four of them (default 30s, kube-prometheus-stack's).")
    args = parser.parse_args(argv)
    from app.core.durations import parse_duration

    try:
        scrape_interval = parse_duration(args.scrape_interval)
        if scrape_interval <= 0:
            raise ValueError(f"must be above 0, not {args.scrape_interval!r}")
    except ValueError as exc:
        print(f"--scrape-interval: {exc}", file=sys.stderr)
        return 2
    kit = args.kit.resolve()
    own_kit = kit == KIT.resolve()
    chart = args.chart.resolve() if args.chart is not None else (CHART if own_kit else None)
    command = COMMAND + (f" --kit {args.kit}" if not own_kit else "") + (
        f" --chart {args.chart}" if chart is not None and chart != CHART else "") + (
        f" --scrape-interval {args.scrape_interval}" if scrape_interval != CLUSTER_SCRAPE_INTERVAL else "")
    try:
        wanted = kit_files(kit, scrape_interval, regenerate_command(
            args.scrape_interval if scrape_interval != CLUSTER_SCRAPE_INTERVAL else None), chart)
    except OSError as exc:
        print(f"{exc.filename}: cannot read: {exc.strerror}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a targets YAML the config refuses (ConfigError), or rules the CRD cannot carry
        print(str(exc), file=sys.stderr)
        return 2
    extra = leftovers(kit, wanted, chart)
    if args.check:
        problems = [f"{path}: not generated any more" for path in extra]
        for path, text in wanted.items():
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current is None:
                problems.append(f"{path}: missing")
            elif current != text:
                diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{path} (committed)",
                                                 f"{path} (generated)", lineterm="", n=1))
                problems.append(f"{path}: stale\n" + "\n".join(diff[:30]) + ("\n..." if len(diff) > 30 else ""))
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print(f"regenerate with: {command}", file=sys.stderr)
            return 1
        in_chart = sum(1 for path in wanted if chart is not None and path.is_relative_to(chart))
        print(f"{args.kit}: {len(wanted) - in_chart} generated files up to date")
        if chart is not None:
            print(f"{args.chart or CHART}: {in_chart} generated files up to date")
        return 0
    for path in extra:
        path.unlink()
        print(f"removed {path}", file=sys.stderr)
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
