"""Every dashboard expression is valid PromQL and reads only metrics that exist: the
monitor's own, a real vLLM page's, TGI's, or Prometheus' ``up``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from app.emulator.simulation import Simulation
from app.telemetry import Telemetry
from tests.grafana.queries import all_queries, metric_names, substitute, variable_queries
from tests.support.components import require_binary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exposition"
QUERIES = all_queries()
#: Series Prometheus itself writes for every scrape target.
PROMETHEUS_SYNTHETIC = {"up"}


def sample_names(page: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", page, re.M)}


def service_names() -> set[str]:
    """Names the monitor's /metrics can expose: every family the registry declares, with
    the sample suffixes of its type (labelled families have no samples until used; the
    text format's TYPE line of a counter already ends in _total)."""
    page = Telemetry().exposition().decode()
    suffixes = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {name + suffix for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M)
            for suffix in suffixes[kind]}


def emulator_names(engine: str) -> set[str]:
    sim = Simulation("healthy", engine=engine, seed=0)
    sim.run_for(30)
    return sample_names(sim.render_metrics().decode())


def test_metric_name_extraction_skips_functions_labels_and_keywords() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, target) (rate(vllm:x_bucket{a="b:c"}[5m])))\n'
            '/ ignoring (quantile) foo_total offset 1m * on (target) group_right (model) bar > bool $slo or vector(0)')
    assert metric_names(expr) == {"vllm:x_bucket", "foo_total", "bar"}


def test_every_metric_a_dashboard_reads_is_exported_by_the_monitor_or_a_supported_engine() -> None:
    service = service_names()
    vllm_real = sample_names((FIXTURES / "vllm-0.32-cpu-real.prom").read_text(encoding="utf-8"))
    tgi = sample_names((FIXTURES / "tgi-3.3-constructed.prom").read_text(encoding="utf-8")) | emulator_names("tgi")
    # SGLang and trtllm-serve: the recorded pages built from their collectors' definitions
    sglang = sample_names((FIXTURES / "sglang-0.5-pd-constructed.prom").read_text(encoding="utf-8")) \
        | emulator_names("sglang")
    trtllm = sample_names((FIXTURES / "trtllm-serve-constructed.prom").read_text(encoding="utf-8"))
    assert "llm_latency_diagnosis_verdict" in service and "llm_latency_scrapes_total" in service
    unknown = {}
    for query in QUERIES:
        for name in metric_names(substitute(query.expr)):
            if name.startswith("llm_latency_"):
                known = name in service
            elif name.startswith("vllm:"):
                known = name in vllm_real     # a page of a real vLLM (0.32), not the emulator's
            elif name.startswith("tgi_"):
                known = name in tgi
            elif name.startswith("sglang:"):
                known = name in sglang
            elif name.startswith("trtllm_"):
                known = name in trtllm
            else:
                known = name in PROMETHEUS_SYNTHETIC
            if not known:
                unknown.setdefault(name, query.id)
    assert unknown == {}


def test_the_emulator_pages_carry_every_engine_metric_the_dashboards_read() -> None:
    """The live test runs against the emulator, so it must serve what the real engines do."""
    vllm, tgi = emulator_names("vllm"), emulator_names("tgi")
    for query in QUERIES:
        for name in metric_names(substitute(query.expr)):
            if name.startswith("vllm:"):
                assert name in vllm, (name, query.id)
            if name.startswith("tgi_"):
                assert name in tgi, (name, query.id)


@pytest.mark.prometheus
def test_every_expression_parses_with_promtool(tmp_path: Path) -> None:
    """Each expression (variables substituted as Grafana would) as a recording rule:
    ``promtool check rules`` parses and type-checks all of them."""
    promtool = require_binary("promtool", "parsing the dashboards' PromQL")
    rules = [{"record": f"grafana:query_{i}", "expr": substitute(q.expr)} for i, q in enumerate(QUERIES)]
    for i, (_, _, query) in enumerate(variable_queries()):
        selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert selector, query
        rules.append({"record": f"grafana:variable_{i}", "expr": substitute(selector.group(1))})
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The check above would catch a typo: the same harness fails on one."""
    promtool = require_binary("promtool", "parsing the dashboards' PromQL")
    path = tmp_path / "broken.rules.yaml"
    broken = substitute(QUERIES[0].expr).replace("(", "((", 1)
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": broken}]}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
