#!/usr/bin/env python3
"""Wraps the exported Prometheus rules in a Prometheus Operator ``PrometheusRule``.

    python3 deploy/generate_prometheusrule.py --config targets.yaml --out rule.yaml   # export + wrap
    python3 deploy/generate_prometheusrule.py --config targets.yaml --engines vllm --out rule.yaml
    python3 deploy/generate_prometheusrule.py --rules exported.yaml --out rule.yaml   # wrap any rule file
    python3 deploy/generate_prometheusrule.py [--check]   # the Kubernetes kit's (deploy/generate_kubernetes.py)

The rules themselves have one source, ``llm-latency rules export``: with ``--config`` they are
exported for that targets YAML, so they carry its thresholds, hardware profiles and links
(with its ``alerts.external_url`` every ``runbook_url`` is an absolute URL of the deployed
monitor). This script only moves the ``groups`` into ``spec.groups`` of the custom resource,
unchanged; ``--engines`` keeps the groups of those engines (``llm-latency-<engine>``) and the
groups of no engine (target down, SLOs). ``--check`` exits 1 when ``--out`` is stale.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
NAME = "llm-latency-rules"
#: ``llm-latency/kube-prometheus-stack`` marks what kube-prometheus-stack selects by its release
#: label: the kit's settings add ``release: <name>`` to every resource so marked
LABELS = {"app.kubernetes.io/name": "llm-latency-monitor", "app.kubernetes.io/component": "rules",
          "llm-latency/kube-prometheus-stack": "true"}
GROUP_KEYS = {"name", "interval", "limit", "query_offset", "rules"}
RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


class RulesError(ValueError):
    """The input is not a Prometheus rule file this script can wrap."""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """Multi-line strings (long PromQL, descriptions) as literal blocks, as in the rule file."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(document: dict) -> str:
    """YAML text as the generated files write it (multi-line strings as literal blocks, no folding)."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def _project_on_path() -> None:
    """The project importable when run as a script from a checkout (ahead of an installed copy)."""
    if str(DEPLOY.parent) not in sys.path:
        sys.path.insert(0, str(DEPLOY.parent))


def config_rules(targets: Path, source: str | None = None, scrape_interval: float | None = None) -> str:
    """``llm-latency rules export`` for the targets YAML ``targets`` (its ``source``; ranges fitted to
    ``scrape_interval`` seconds when given), as rule-file text."""
    _project_on_path()
    from app.config import load_config
    from app.rules_export import render_rules

    return render_rules(load_config(targets), source, scrape_interval)


def load_groups(text: str, source: str) -> list[dict]:
    """The ``groups`` of a rule file, refusing keys the Operator's CRD would not carry."""
    document = yaml.safe_load(text)
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list) or not document["groups"]:
        raise RulesError(f"{source}: not a Prometheus rule file (no 'groups' list)")
    for i, group in enumerate(document["groups"]):
        if not isinstance(group, dict) or not group.get("name") or not isinstance(group.get("rules"), list):
            raise RulesError(f"{source}: groups[{i}] needs a name and a rules list")
        if unknown := set(group) - GROUP_KEYS:
            raise RulesError(f"{source}: groups[{i}] has keys the PrometheusRule CRD lacks: {sorted(unknown)}")
        for j, rule in enumerate(group["rules"]):
            if not isinstance(rule, dict) or ("record" in rule) == ("alert" in rule) or "expr" not in rule:
                raise RulesError(f"{source}: groups[{i}].rules[{j}] needs expr and exactly one of record/alert")
            if unknown := set(rule) - RULE_KEYS:
                raise RulesError(f"{source}: groups[{i}].rules[{j}] has unknown keys {sorted(unknown)}")
    return document["groups"]


def engine_names() -> tuple[str, ...]:
    """The engines the exporter writes a group for (imported when needed: wrapping a rule file
    needs no app)."""
    _project_on_path()
    from app.rules_export.engines import ENGINES

    return tuple(engine.name for engine in ENGINES)


def engine_of(group: dict) -> str | None:
    """The engine whose rules a group holds (``llm-latency-<engine>``), None for the others."""
    name = group["name"].removeprefix("llm-latency-")
    return name if name in engine_names() else None


def parse_engines(text: str) -> tuple[str, ...]:
    """``--engines vllm,tgi`` as a tuple, refusing names the exporter does not know."""
    engines = tuple(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    if not engines or any(e not in engine_names() for e in engines):
        raise RulesError(f"--engines {text!r}: give one or more of {', '.join(engine_names())}")
    return engines


def select(groups: list[dict], engines: tuple[str, ...] | None) -> list[dict]:
    """The groups of ``engines`` and of no engine (all groups when ``engines`` is None)."""
    return [g for g in groups if engines is None or engine_of(g) in (None, *engines)]


def render_groups(groups: list[dict], source: str, command: str, name: str = NAME,
                  generator: str = "deploy/generate_prometheusrule.py") -> str:
    """The PrometheusRule manifest (YAML text, with a do-not-edit header) holding ``groups``."""
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": LABELS},
        "spec": {"groups": groups},
    }
    header = (f"# GENERATED by {generator} from {source} -- DO NOT EDIT BY HAND.\n"
              f"# Regenerate after changing it or the rules: {command}\n"
              "# kube-prometheus-stack selects PrometheusRules by its release label: the kit's settings add it\n"
              "# (llm-latency/kube-prometheus-stack marks this resource; deploy/kubernetes/kustomization.yaml).\n")
    return header + dump(resource)


def render(text: str, source: str, command: str = "python3 deploy/generate_prometheusrule.py",
           engines: tuple[str, ...] | None = None) -> str:
    """The PrometheusRule manifest for a rule file (the groups of ``engines`` and of no engine)."""
    return render_groups(select(load_groups(text, source), engines), source, command)


def _shown(path: Path) -> str:
    """A path as the header and messages show it: relative to the checkout when inside it."""
    try:
        return path.resolve().relative_to(DEPLOY.parent).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--rules", type=Path, help="Wrap this exported rule file.")
    given.add_argument("--config", type=Path, help="Export the rules for this targets YAML and wrap them.")
    parser.add_argument("--source", help="With --config: the source whose Prometheus evaluates the rules.")
    parser.add_argument("--engines", help="Keep these engines' groups (comma-separated: vllm, tgi, sglang, trtllm) "
                                          "and the groups of no engine; default: every engine.")
    parser.add_argument("--out", type=Path, help="The PrometheusRule manifest (needed with --rules/--config).")
    parser.add_argument("--check", action="store_true", help="Exit 1 if --out differs from what would be generated.")
    args = parser.parse_args(argv)
    if args.rules is None and args.config is None:  # the kit: its rules and dashboards
        if args.out or args.engines or args.source:
            parser.error("--out, --engines and --source need --rules or --config")
        sys.path.insert(0, str(DEPLOY))
        from generate_kubernetes import main as kit

        return kit(["--check"] if args.check else [])
    if args.out is None:
        parser.error("--out FILE is needed with --rules or --config")
    path = args.rules or args.config
    command = "python3 deploy/generate_prometheusrule.py " + " ".join(
        f"{flag} {value}" for flag, value in (("--rules", args.rules and _shown(args.rules)),
                                              ("--config", args.config and _shown(args.config)),
                                              ("--source", args.source), ("--engines", args.engines),
                                              ("--out", _shown(args.out))) if value)
    try:
        engines = parse_engines(args.engines) if args.engines else None
        if args.rules:
            text = render(args.rules.read_text(encoding="utf-8"), _shown(args.rules), command, engines)
        else:
            text = render(config_rules(args.config, args.source),
                          f"{_shown(args.config)} (via `llm-latency rules export`)", command, engines)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror}", file=sys.stderr)
        return 2
    except (RulesError, ValueError, yaml.YAMLError) as exc:  # ConfigError is a ValueError
        print(str(exc), file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{args.out} (committed)",
                                             f"{args.out} (generated)", lineterm="", n=1))
            print(f"{args.out} is stale: regenerate it with `{command}`", file=sys.stderr)
            print("\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else ""), file=sys.stderr)
            return 1
        print(f"{args.out}: up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
