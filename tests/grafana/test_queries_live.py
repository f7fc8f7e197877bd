"""Every dashboard query returns data from a real Prometheus that scrapes emulated vLLM
and TGI engines and the monitor -- for every engine the query is written for."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from tests.grafana.queries import Query, all_queries, load_dashboards, metric_names, substitute, variable_queries
from tests.grafana.stack import ENGINE_KIND, ENGINES, Stack, running_stack

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

QUERIES = all_queries()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


def engines_of(query: Query) -> list[str]:
    """The targets a query must return data for: one per engine family whose metrics it
    reads; queries over the monitor's own series are checked over all targets."""
    names = metric_names(substitute(query.expr))
    kinds = {"vllm" for n in names if n.startswith("vllm:")} | {"tgi" for n in names if n.startswith("tgi_")}
    if not kinds:
        return [".*"]
    return [name for name, kind in ENGINE_KIND.items() if kind in kinds]


def run(stack: Stack, query: Query, **values: str) -> list:
    """The query with Grafana's variables set to ``values`` (defaults: All, the default
    objectives): instant, or over the last 30 s at 1 s steps, as its panel asks."""
    # the What changed row compares with 2 s earlier here: the stack is a minute old
    expr = substitute(query.expr, **{"change_baseline": "2s", **values})
    if query.instant:
        return stack.prometheus.query(expr)["result"]
    end = time.time()
    return stack.prometheus.query_range(expr, end - 30, end, 1.0)["result"]


#: Panels of series only a P/D decode worker writes: the stack runs none (their numbers are checked on the
#: emulator's decode workers in tests/diagnosis/test_pd_decode.py); every expression still parses (test_promql)
PD_ONLY = ("P/D decode worker: TTFT terms (engine counters)",)
#: Annotations of engine restarts and configuration changes: the stack's engines have none (they are
#: checked on recorded restarts and a configuration change in tests/attribution/test_scenarios_prometheus.py)
NO_RESTART = ("Engine restarts (engine metrics)", "Configuration changes (engine metrics)")


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_query_returns_data_for_every_engine_it_reads(stack: Stack, query: Query) -> None:
    if query.where in PD_ONLY:
        pytest.skip("the stack runs no P/D decode worker")
    if query.where in NO_RESTART:
        pytest.skip("the stack's engines neither restart nor change their configuration")
    for target in engines_of(query):
        result = run(stack, query, target=target)
        assert result, f"no data for target={target!r}: {substitute(query.expr, target=target)}"
        values = [float(v) for series in result
                  for v in ([series["value"][1]] if "value" in series else [p[1] for p in series["values"]])]
        assert any(math.isfinite(v) for v in values), f"only NaN/Inf for target={target!r}: {result}"


def test_the_regime_change_annotation_names_the_new_regime(stack: Stack) -> None:
    annotation = next(q for q in QUERIES if q.where == "Regime changes")
    result = stack.prometheus.query(substitute(annotation.expr))["result"]
    changed = {series["metric"]["target"]: series["metric"]["verdict"] for series in result}
    assert changed["vllm-queueing"] == "queueing"


def test_the_regime_timeline_maps_each_target_to_its_verdict(stack: Stack) -> None:
    from tests.grafana.queries import load_generator

    generator = load_generator()
    timeline = next(q for q in QUERIES if q.where == "Diagnosed regime")
    result = stack.prometheus.query(substitute(timeline.expr))["result"]
    verdicts = {s["metric"]["target"]: generator.VERDICTS[int(float(s["value"][1]))] for s in result}
    current = {d["target"]: d["verdict"] for d in stack.monitor.telemetry.diagnosis.diagnoses}
    assert verdicts == current and set(verdicts) == set(ENGINES)


def test_template_variables_list_the_targets_and_models(stack: Stack) -> None:
    for dashboard, name, query in variable_queries():
        label = query.split(",")[-1].strip(" )")
        selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
        values = stack.prometheus.api("label/" + label + "/values", **{"match[]": substitute(selector)})
        assert values, (dashboard, name)
        if name == "target":
            assert set(values) == set(ENGINES)
        if name == "model":
            assert "meta-llama/Llama-3.1-8B-Instruct" in values


MERGED_TABLES = [(name, panel) for name, dashboard in load_dashboards().items() for panel in dashboard["panels"]
                 if any(t["id"] == "merge" for t in panel.get("transformations", []))]


@pytest.mark.parametrize("name,panel", MERGED_TABLES, ids=[f"{n.removesuffix('.json')}:{p['title']}"
                                                          for n, p in MERGED_TABLES])
def test_merged_tables_join_their_frames_on_shared_labels(stack: Stack, name: str, panel: dict) -> None:
    """Grafana's merge transformation joins table frames on the fields they share; the
    frames must share the identifying labels (and not ``__name__``, which differs), and
    every row of the later frames must find its partner row in the first."""
    frames = [[s["metric"] for s in stack.prometheus.query(substitute(t["expr"]))["result"]]
              for t in panel["targets"]]
    keys = [set().union(*(row.keys() for row in frame)) for frame in frames]
    assert all(frames) and not set().union(*keys) & {"__name__", "job", "instance"}
    shared = set.intersection(*keys)
    assert "target" in shared
    first = {tuple(row.get(k, "") for k in sorted(shared)) for row in frames[0]}
    for frame in frames[1:]:
        assert {tuple(row.get(k, "") for k in sorted(shared)) for row in frame} <= first


MODEL_QUERIES = [q for q in QUERIES if "$model" in q.expr and q.where not in PD_ONLY
                 and (engines_of(q) == [".*"] or "vllm-queueing" in engines_of(q))]


@pytest.mark.parametrize("query", MODEL_QUERIES, ids=[q.id for q in MODEL_QUERIES])
def test_query_returns_data_for_one_selected_model_and_none_for_another(stack: Stack, query: Query) -> None:
    """With one model picked in the ``model`` variable (Grafana puts the regex-escaped
    value in place of ``$model``), every query that filters on it still finds that
    model's series, only that model's, and nothing for a model nobody serves."""
    if query.where in NO_RESTART:
        pytest.skip("the stack's engines neither restart nor change their configuration")
    model = next(d["model"] for d in stack.monitor.telemetry.diagnosis.diagnoses if d["target"] == "vllm-queueing")
    result = run(stack, query, target="vllm-queueing", model=model.replace(".", "\\\\."))
    assert result, substitute(query.expr, target="vllm-queueing", model=model)
    labelled = {s["metric"].get("model", s["metric"].get("model_name")) for s in result} - {None}
    # series that keep a model label carry the selected one (aggregates by target keep none;
    # that they were filtered at all is what the unknown model's empty answer below shows)
    assert labelled <= {model}, labelled
    if "or vector(0)" not in query.expr:
        assert run(stack, query, target="vllm-queueing", model="no-such-model") == []
