"""The committed dashboards as data the tests can check: every PromQL expression with
where it comes from, Grafana's variable substitution, and the metric names an expression
reads."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"


def load_generator() -> ModuleType:
    """``grafana/generate.py`` as a module (it is a script, not a package)."""
    name = "grafana_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def load_dashboards(directory: Path = DASHBOARD_DIR) -> dict[str, dict]:
    """File name -> dashboard JSON, for every committed dashboard (of ``directory``)."""
    return {path.name: json.loads(path.read_text(encoding="utf-8")) for path in sorted(directory.glob("*.json"))}


@dataclass(frozen=True)
class Query:
    dashboard: str   # file name
    where: str       # panel title / annotation name / variable name
    ref: str         # refId, or "annotation" / "variable"
    expr: str        # as written in the dashboard (with Grafana variables)
    instant: bool

    @property
    def id(self) -> str:
        return f"{self.dashboard.removesuffix('.json')}:{self.where}:{self.ref}"


def panel_queries(dashboards: dict[str, dict] | None = None) -> list[Query]:
    out = []
    for name, dashboard in (dashboards or load_dashboards()).items():
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                out.append(Query(name, panel["title"], target["refId"], target["expr"], bool(target.get("instant"))))
    return out


def annotation_queries(dashboards: dict[str, dict] | None = None) -> list[Query]:
    return [Query(name, a["name"], "annotation", a["expr"], False)
            for name, dashboard in (dashboards or load_dashboards()).items()
            for a in dashboard["annotations"]["list"] if "expr" in a]


def all_queries(dashboards: dict[str, dict] | None = None) -> list[Query]:
    dashboards = dashboards or load_dashboards()
    return panel_queries(dashboards) + annotation_queries(dashboards)


def variable_queries(dashboards: dict[str, dict] | None = None) -> list[tuple[str, str, str]]:
    """(dashboard, variable name, query) of every Prometheus query variable."""
    return [(name, v["name"], v["query"]["query"])
            for name, dashboard in (dashboards or load_dashboards()).items()
            for v in dashboard["templating"]["list"] if v["type"] == "query"]


#: What Grafana would put in place of each variable: All (= the variables' allValue) for
#: target and model, the default objectives, and the Prometheus data source's
#: ``timeInterval``-based intervals at a short dashboard range.
DEFAULTS = {"target": ".*", "model": ".*", "slo": ".*", "ttft_slo": "2.5", "itl_slo": "0.15", "change_baseline": "1d",
            "__rate_interval": "1m", "__range": "1m", "__interval": "15s"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$([A-Za-z_]\w*)")  # not label_replace's "$1"


def substitute(expr: str, **values: str) -> str:
    """``expr`` with every Grafana variable replaced; unknown variables raise KeyError so a
    dashboard cannot use a variable the tests do not know."""
    table = {**DEFAULTS, **values}
    return _VARIABLE.sub(lambda m: table[m.group(1) or m.group(2)], expr)


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers left after removing strings, label
    matchers, ranges, grouping label lists, function calls and keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        if s[match.end():].lstrip().startswith("(") or match.group(0).lower() in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names
