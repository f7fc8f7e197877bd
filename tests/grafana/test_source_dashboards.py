"""Dashboards generated for a Prometheus source (``grafana/generate.py --config``): the engine
panels select and group by the source's target labels (variables per label, no ``target``
relabeling), the monitor's panels keep the monitor's target names, and the scrape-mode
dashboards are untouched. The committed pair is the compose demo's Prometheus-source mode."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.grafana.queries import (
    GRAFANA,
    ROOT,
    Query,
    all_queries,
    load_dashboards,
    load_generator,
    metric_names,
    substitute,
    variable_queries,
)
from tests.grafana.test_dashboards import panels, sdk_losses
from tests.support.components import require_binary

SOURCE_CONFIG = ROOT / "deploy" / "compose" / "prometheus-source" / "targets.yaml"
SOURCE_DASHBOARDS = ROOT / "deploy" / "compose" / "prometheus-source" / "dashboards"
DASHBOARDS = load_dashboards(SOURCE_DASHBOARDS)
DEFAULT = load_dashboards()
QUERIES = all_queries(DASHBOARDS)
SOURCE_VALUES = {"namespace": ".*", "pod": ".*"}
ENGINE_SELECTOR = re.compile(r"\b(?:vllm:\w+|tgi_\w+|sglang:\w+|trtllm_\w+|up)\{([^}]*)\}")


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GRAFANA / "generate.py"), *args], capture_output=True, text=True,
                          timeout=60)


def reads_engine(expr: str) -> bool:
    return any(n.startswith(("vllm:", "tgi_", "sglang:", "trtllm_")) or n == "up"
               for n in metric_names(substitute(expr, **SOURCE_VALUES)))


def test_the_committed_source_dashboards_are_fresh_and_the_default_ones_unchanged(tmp_path: Path) -> None:
    result = generate("--config", str(SOURCE_CONFIG), "--out", str(SOURCE_DASHBOARDS), "--check")
    assert result.returncode == 0, result.stderr
    assert set(DASHBOARDS) == set(DEFAULT) == {"llm-latency-fleet.json", "llm-latency-target.json",
                                               "llm-latency-slo.json"}
    generator = load_generator()
    # a config without sources gives the scrape-mode dashboards, byte for byte
    plain = tmp_path / "plain.yaml"
    plain.write_text("targets: []\n")
    assert generator.render(generator.engine_labels(plain, None)) == generator.render()
    assert generator.render(generator.engine_labels(SOURCE_CONFIG, None)) != generator.render()
    assert generator.main(["--check"]) == 0  # rendering for a source left the module in scrape mode


def test_a_source_config_needs_its_own_directory_and_a_choice_among_several_sources(tmp_path: Path) -> None:
    refused = generate("--config", str(SOURCE_CONFIG))
    assert refused.returncode == 2
    assert "has a Prometheus source: write its dashboards elsewhere with --out DIR" in refused.stderr
    two = tmp_path / "two.yaml"
    source = yaml.safe_load(SOURCE_CONFIG.read_text())["sources"][0]
    two.write_text(yaml.safe_dump({"sources": [source, {**source, "name": "edge"}]}))
    several = generate("--config", str(two), "--out", str(tmp_path / "out"))
    assert several.returncode == 2 and "the config has 2 sources ('demo', 'edge')" in several.stderr
    assert generate("--config", str(two), "--source", "edge", "--out", str(tmp_path / "out")).returncode == 0
    edge = json.loads((tmp_path / "out" / "llm-latency-fleet.json").read_text())
    target = next(v for v in edge["templating"]["list"] if v["name"] == "target")
    assert target["query"]["query"].startswith('label_values(llm_latency_diagnosis_verdict{target=~"edge\\\\.')
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [{name: x, url: 'ftp://p', target_labels: [pod]}]\n")
    failed = generate("--config", str(bad), "--out", str(tmp_path / "bad"))
    assert failed.returncode == 2 and "sources[0].url" in failed.stderr and "Traceback" not in failed.stderr


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_key_survives_the_foundation_sdk_model(name: str) -> None:
    assert sdk_losses(DASHBOARDS[name]) == []


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variables_are_the_target_labels_and_target_is_derived_from_them(name: str) -> None:
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "pod", "target", "model", "ttft_slo", "itl_slo",
                               "monitor_url"] + (["slo"] if name == "llm-latency-slo.json" else []) \
        + (["change_baseline"] if name == "llm-latency-target.json" else [])
    presence = ('__name__=~"vllm:num_requests_running|tgi_batch_current_size|sglang:num_running_reqs|'
                'trtllm_num_requests_running", job="llm-engines"')
    assert variables["namespace"]["query"]["query"] == f"label_values({{{presence}}}, namespace)"
    assert variables["pod"]["query"]["query"] == f'label_values({{{presence}, namespace=~"$namespace"}}, pod)'
    target = variables["target"]
    assert target["query"]["query"] == (
        'label_values(llm_latency_diagnosis_verdict{target=~"demo\\\\.$namespace\\\\.$pod"}, target)')
    assert target["hide"] == 2 and "allValue" not in target  # All = the names the chosen pods give
    fleet = name in ("llm-latency-fleet.json", "llm-latency-slo.json")  # many targets at once
    for label in ("namespace", "pod", "target"):
        assert variables[label]["multi"] is fleet and variables[label]["includeAll"] is fleet
    assert variables["namespace"].get("allValue") == (".*" if fleet else None)


def test_the_slo_dashboard_reads_only_the_monitors_series() -> None:
    assert [q.id for q in QUERIES if q.dashboard == "llm-latency-slo.json" and reads_engine(q.expr)] == []


@pytest.mark.parametrize("name", ["llm-latency-fleet.json", "llm-latency-target.json"])
def test_engine_panels_select_by_the_source_and_group_by_its_labels(name: str) -> None:
    engine = [q for q in QUERIES if q.dashboard == name and reads_engine(q.expr)]
    assert len(engine) >= 10
    for query in engine:
        selectors = ENGINE_SELECTOR.findall(query.expr)
        assert selectors, query.id
        for selector in selectors:
            assert "target=" not in selector, query.id
            assert selector.startswith('job="llm-engines", namespace=~"$namespace", pod=~"$pod"'), (query.id, selector)
        for by in re.findall(r"\bby \(([^)]*)\)", query.expr):
            assert {"namespace", "pod"} <= {label.strip() for label in by.split(",")} or by == "le", (query.id, by)
    legends = {t.get("legendFormat", "") for p in panels(DASHBOARDS[name]) for t in p["targets"]
               if reads_engine(t["expr"])}
    assert not any("{{target}}" in legend for legend in legends)
    if name == "llm-latency-fleet.json":
        assert "{{namespace}}/{{pod}} running" in legends and "{{namespace}}/{{pod}} (Prometheus)" in legends


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_the_monitors_panels_are_the_scrape_mode_ones(name: str) -> None:
    """Only the engine panels change; a monitor query is the scrape-mode one, or that query
    with the target labels parsed out of the monitor's target name (for drill-down links)."""
    pairs = list(zip(panels(DASHBOARDS[name]), panels(DEFAULT[name]), strict=True))
    changed = 0
    for panel, scrape_mode in pairs:
        assert panel["title"] == scrape_mode["title"]
        for target, original_target in zip(panel["targets"], scrape_mode["targets"], strict=True):
            expr, original = target["expr"], original_target["expr"]
            if reads_engine(expr):
                continue
            if expr != original:
                changed += 1
                assert expr == (f'label_replace(label_replace({original}, "namespace", "$1", "target", '
                                f'"demo\\\\.([^.]*)\\\\..*"), "pod", "$1", "target", "demo\\\\.[^.]*\\\\.(.*)")')
    assert changed == (4 if name == "llm-latency-fleet.json" else 1)  # summary table x3, regime timeline


def test_drill_down_links_carry_the_target_labels() -> None:
    text = json.dumps(DASHBOARDS["llm-latency-fleet.json"])
    links = set(re.findall(r"/d/llm-latency-target\?([^\"]*)", text))
    assert links == {"var-namespace=${__field.labels.namespace}&var-pod=${__field.labels.pod}"
                     "&${datasource:queryparam}&${__url_time_range}",
                     "var-namespace=${__data.fields.namespace}&var-pod=${__data.fields.pod}"
                     "&${datasource:queryparam}&${__url_time_range}"}
    # the exported rules link alerts to the same variables
    rules = (ROOT / "deploy" / "compose" / "prometheus-source" / "rules" / "llm-latency-rules.yaml").read_text()
    assert "/d/llm-latency-target?var-namespace={{ $labels.namespace }}&var-pod={{ $labels.pod }}" in rules


@pytest.mark.prometheus
def test_every_expression_parses_and_target_names_split_into_the_labels(tmp_path: Path) -> None:
    """promtool parses every query; a promtool unit test runs the label split on the
    monitor's name of a discovered target (``demo.<namespace>.<pod>``)."""
    promtool = require_binary("promtool", "parsing the dashboards' PromQL")
    rules = [{"record": f"grafana:query_{i}", "expr": substitute(q.expr, **SOURCE_VALUES)}
             for i, q in enumerate(QUERIES)]
    (tmp_path / "dashboards.rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboards.rules.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout
    summary = next(q for q in QUERIES if q.dashboard == "llm-latency-fleet.json" and q.where == "Fleet summary"
                   and "llm_latency_diagnosis_verdict" in q.expr)
    test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            {"series": 'llm_latency_diagnosis_verdict{target="demo.llm.vllm-0",model="m",verdict="queueing"}',
             "values": "1x4"},
            {"series": 'llm_latency_diagnosis_verdict{target="demo.llm.vllm-1.a",model="m",verdict="healthy"}',
             "values": "1x4"}],
        "promql_expr_test": [{"expr": substitute(summary.expr, target=".*", model=".*"), "eval_time": "30s",
                              "exp_samples": [
                                  {"labels": '{target="demo.llm.vllm-0",model="m",verdict="queueing",namespace="llm",'
                                             'pod="vllm-0"}', "value": 1},
                                  {"labels": '{target="demo.llm.vllm-1.a",model="m",verdict="healthy",'
                                             'namespace="llm",pod="vllm-1.a"}', "value": 1}]}]}]}
    (tmp_path / "split.test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "split.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------- against a real Prometheus

#: the P/D decode worker's panel reads series the stack's engines (no P/D worker) never write: checked on the
#: emulator's decode workers (tests/diagnosis/test_pd_decode.py), its selectors and grouping above
PD_ONLY = ("P/D decode worker: TTFT terms (engine counters)",)
ENGINE_QUERIES = [q for q in QUERIES if reads_engine(q.expr) and q.where not in PD_ONLY]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.grafana.stack import running_stack

    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


def engine_kinds(query: Query) -> set[str]:
    names = metric_names(substitute(query.expr, **SOURCE_VALUES))
    return {"vllm" for n in names if n.startswith("vllm:")} | {"tgi" for n in names if n.startswith("tgi_")} \
        or {"vllm", "tgi"}  # up: every engine


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_label_variables_list_the_engines_namespace_and_pods(stack) -> None:
    from tests.grafana.stack import ENGINES

    for dashboard, name, query in variable_queries(DASHBOARDS):
        if name not in ("namespace", "pod"):
            continue
        selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
        values = stack.prometheus.api(f"label/{name}/values", **{"match[]": substitute(selector, **SOURCE_VALUES)})
        assert set(values) == ({"demo"} if name == "namespace" else {f"{n}-0" for n in ENGINES}), dashboard


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("query", ENGINE_QUERIES, ids=[q.id for q in ENGINE_QUERIES])
def test_engine_queries_return_data_for_one_chosen_pod_and_only_its(stack, query: Query) -> None:
    """Each engine query with one pod chosen (Grafana puts the regex-escaped value in place of
    ``$pod``) answers for that pod of every engine kind it reads, labelled with it."""
    from tests.grafana.stack import ENGINE_KIND
    from tests.grafana.test_queries_live import NO_RESTART

    if query.where in NO_RESTART:
        pytest.skip("the stack's engines neither restart nor change their configuration")
    for name, kind in ENGINE_KIND.items():
        if kind not in engine_kinds(query):
            continue
        # the What changed row compares with 2 s earlier here: the stack is a minute old
        values = {"namespace": "demo", "pod": f"{name}-0", "target": ".*", "change_baseline": "2s"}
        expr = substitute(query.expr, **values)
        if query.instant:
            result = stack.prometheus.query(expr)["result"]
        else:
            end = time.time()
            result = stack.prometheus.query_range(expr, end - 30, end, 1.0)["result"]
        assert result, f"no data for pod {name}-0: {expr}"
        numbers = [float(v) for series in result
                   for v in ([series["value"][1]] if "value" in series else [p[1] for p in series["values"]])]
        assert any(math.isfinite(v) for v in numbers), result
        assert {s["metric"].get("pod") for s in result} <= {f"{name}-0", None}


# ----------------------------------------------------------------------------- a source with services

SERVICE_NAME, REPLICA_NAME = "demo.svc.llm.chat", "demo.llm.chat-0"


def service_dashboards(tmp_path: Path) -> dict[str, dict]:
    """The dashboards of the demo's source with ``service_labels: [namespace, service]``: the
    monitor names its services ``demo.svc.<namespace>.<service>`` (app/promsource/service.py)."""
    config = yaml.safe_load(SOURCE_CONFIG.read_text())
    config["sources"][0]["service_labels"] = ["namespace", "service"]
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump(config))
    result = generate("--config", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    return load_dashboards(tmp_path / "out")


def promql_regex(query: str, **values: str) -> re.Pattern[str]:
    """The ``target=~"..."`` regex of a variable's query with ``values`` in place, as Prometheus
    reads it (the string literal's escapes undone, anchored)."""
    literal = re.search(r'target=~"((?:[^"\\]|\\.)*)"', query)
    assert literal, query
    return re.compile(substitute(literal.group(1), **values).encode().decode("unicode_escape"))


def test_the_services_of_a_source_are_targets_of_its_dashboards(tmp_path: Path) -> None:
    dashboards = service_dashboards(tmp_path)
    for name, dashboard in dashboards.items():
        assert sdk_losses(dashboard) == [], name
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        # the service label between the label both share and the replica's own: a pod is chosen last
        assert list(variables)[:5] == ["datasource", "namespace", "service", "pod", "target"], name
        assert variables["pod"]["query"]["query"].endswith(', namespace=~"$namespace", service=~"$service"}, pod)')
    fleet = {v["name"]: v for v in dashboards["llm-latency-fleet.json"]["templating"]["list"]}
    names = promql_regex(fleet["target"]["query"]["query"], namespace=".*", service=".*", pod=".*")
    assert [n for n in (SERVICE_NAME, REPLICA_NAME, "edge.svc.llm.chat", "demo.llm") if names.fullmatch(n)] == \
        [SERVICE_NAME, REPLICA_NAME]
    chosen = promql_regex(fleet["target"]["query"]["query"], namespace="llm", service="search", pod="chat-0")
    assert [n for n in (SERVICE_NAME, REPLICA_NAME, "demo.svc.llm.search") if chosen.fullmatch(n)] == \
        [REPLICA_NAME, "demo.svc.llm.search"]
    # engine panels select by the service label too; the drill-down's replica labels have an All: the service
    every = {"namespace": ".*", "service": ".*", "pod": ".*", "__all": "$__all"}
    engine = [q for q in all_queries(dashboards)
              if any(n.startswith(("vllm:", "tgi_", "sglang:", "trtllm_")) or n == "up"
                     for n in metric_names(substitute(q.expr, **every)))]
    assert len(engine) >= 20
    for query in engine:
        for selector in ENGINE_SELECTOR.findall(query.expr):
            assert selector.startswith('job="llm-engines", namespace=~"$namespace", service=~"$service", '
                                       'pod=~"$pod"'), (query.id, selector)
    target = {v["name"]: v for v in dashboards["llm-latency-target.json"]["templating"]["list"]}
    assert (target["namespace"]["includeAll"], target["service"]["includeAll"], target["pod"]["includeAll"]) == \
        (False, True, True)
    assert target["pod"]["allValue"] == ".*" and "All: its service" in target["pod"]["description"]
    assert target["target"]["query"]["query"].startswith("query_result(") and target["target"]["hide"] == 2
    assert target["target"]["regex"] == '/target="([^"]+)"/'
    # the SLO dashboard's capacity panels and every verdict panel read the monitor's series by $target
    capacity = [q for q in all_queries(dashboards) if q.dashboard == "llm-latency-slo.json"
                and "llm_latency_capacity_" in q.expr]
    assert len(capacity) >= 3 and all('target=~"$target"' in q.expr for q in capacity)
    links = set(re.findall(r"/d/llm-latency-target\?([^\"]*)", json.dumps(dashboards["llm-latency-fleet.json"])))
    assert all("var-namespace=" in link and "&var-service=" in link and "&var-pod=" in link for link in links)


def drill_down_expr(dashboards: dict[str, dict], pod_text: str, **values: str) -> str:
    target = next(v for v in dashboards["llm-latency-target.json"]["templating"]["list"] if v["name"] == "target")
    query = target["query"]["query"].replace("${pod:text}", pod_text)
    return substitute(query.removeprefix("query_result(").removesuffix(")"), **values)


@pytest.mark.prometheus
def test_the_drill_down_chooses_the_replica_or_with_every_pod_its_service(tmp_path: Path) -> None:
    """promtool evaluates the drill-down's target query (Grafana's text of "All" in place of
    ``${pod:text}``) and the fleet table's label split over the monitor's verdict series of two
    replicas and two services."""
    promtool = require_binary("promtool", "evaluating the dashboards' PromQL")
    dashboards = service_dashboards(tmp_path)
    names = (REPLICA_NAME, "demo.llm.chat-1", SERVICE_NAME, "demo.svc.llm.search")
    series = [{"series": f'llm_latency_diagnosis_verdict{{target="{n}",model="m",verdict="healthy"}}', "values": "1x4"}
              for n in names]
    summary = next(q for q in all_queries(dashboards) if q.dashboard == "llm-latency-fleet.json"
                   and q.where == "Fleet summary" and "llm_latency_diagnosis_verdict" in q.expr)
    split = substitute(summary.expr, target=".*", model=".*", __all="$__all")

    def sample(name: str, **labels: str) -> dict:
        text = ",".join(f'{k}="{v}"' for k, v in {"target": name, "model": "m", "verdict": "healthy", **labels}.items())
        return {"labels": "{" + text + "}", "value": 1}

    tests = [
        # one pod chosen: its replica, not its service
        (drill_down_expr(dashboards, "chat-0", namespace="llm", service="chat", pod="chat-0"),
         [sample(REPLICA_NAME, __name__="llm_latency_diagnosis_verdict")]),
        # every pod ("All", its value .*): the service the service label names
        (drill_down_expr(dashboards, "All", namespace="llm", service="chat", pod=".*"),
         [sample(SERVICE_NAME, __name__="llm_latency_diagnosis_verdict")]),
        (f"count({drill_down_expr(dashboards, 'All', namespace='llm', service='.*', pod='.*')})",
         [{"labels": "{}", "value": 2}]),
        # a drill-down link carries a service's labels, and All ($__all) for the pod; a replica's, All for the service
        (f'{split} and on(target) llm_latency_diagnosis_verdict{{target=~"{SERVICE_NAME}|{REPLICA_NAME}"}}',
         [sample(REPLICA_NAME, namespace="llm", pod="chat-0", service="$__all"),
          sample(SERVICE_NAME, namespace="llm", pod="$__all", service="chat")]),
    ]
    test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "30s", "exp_samples": expected} for expr, expected in tests]}]}
    (tmp_path / "drill.test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "drill.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
