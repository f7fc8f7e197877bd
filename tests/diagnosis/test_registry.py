"""The regime registry is the single source of every regime: each rule module's ``RULE``
gives its rank, thresholds, runbook, exported PromQL, dashboard colour and place in the
regime lists, and a new regime is one more module."""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.alerts.config import ALERT_RUNBOOKS, regime_alertname
from app.config import FileConfig, load_config
from app.core.quantiles import LatencySummary
from app.core.thresholds import Thresholds
from app.diagnosis import rules as rules_package
from app.diagnosis.findings import PROBE_REGIMES, REGIMES, VERDICTS, Finding
from app.diagnosis.rules import RULES, collect, kv_cache_pressure, prefill_compute, queueing
from app.diagnosis.signals import Signals
from app.main import create_app
from app.rules_export import build_rules
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = Path(rules_package.__file__).parent
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))


def alerts_of(document: dict) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_every_module_is_a_regime_in_precedence_order() -> None:
    modules = {p.stem for p in RULES_DIR.glob("*.py")} - {"__init__", "base"}
    assert {rule.regime for rule in RULES} == modules
    # the engine's precedence (causes first) is the order the rules had in RULES
    assert [rule.regime for rule in RULES] == ["kv_cache_pressure", "scheduler_cpu_bound", "weights_offloaded",
                                              "prefill_interference",
                                              "prefill_compute", "kv_transfer", "frontend_bound",
                                              "speculation_ineffective", "bandwidth_bound", "lora_adapter_slots",
                                              "dp_imbalance", "replica_imbalance", "queueing", "outside_engine",
                                              "unexplained"]


def test_the_regime_lists_and_alert_names_are_the_registry() -> None:
    assert REGIMES == tuple(rule.regime for rule in RULES)
    assert PROBE_REGIMES == ("outside_engine",)
    assert VERDICTS == (*REGIMES, "healthy", "insufficient_data", "not_judged")
    for rule in RULES:
        assert ALERT_RUNBOOKS[regime_alertname(rule.regime)] == rule.regime


def test_every_regime_has_its_runbook_served(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        for rule in RULES:
            path = Finding(rule.regime, "warning", 0.5, "").runbook
            assert path == f"/runbooks/{rule.regime}"
            source = ROOT / "docs" / "runbooks" / f"{rule.regime}.md"
            assert source.read_text(encoding="utf-8").startswith(f"# Runbook: {rule.regime}\n")
            served = client.get(f"/runbooks/{rule.regime}")
            assert served.status_code == 200 and f"Runbook: {rule.regime}" in served.text, rule.regime


def test_every_regime_has_a_promql_twin_or_says_why_not() -> None:
    plain = alerts_of(build_rules(FileConfig()))
    profiled = alerts_of(build_rules(load_config(ROOT / "deploy" / "prometheus" / "tests" / "hardware-targets.yaml")))
    for rule in RULES:
        exported = [a for a in plain if a["labels"].get("regime") == rule.regime]
        if rule.promql is None:
            assert rule.no_promql and not exported, rule.regime
            continue
        assert not rule.no_promql and exported, rule.regime
        assert {a["alert"] for a in exported} == {regime_alertname(rule.regime)}
        against_floor = [a for a in profiled if a["labels"].get("regime") == rule.regime and "target" in a["labels"]]
        assert bool(against_floor) == (rule.promql_profiled is not None), rule.regime
    assert [rule.regime for rule in RULES if rule.promql is None] == ["lora_adapter_slots", "replica_imbalance",
                                                                      "outside_engine", "unexplained"]
    assert "newest timestamp" in next(r for r in RULES if r.regime == "lora_adapter_slots").no_promql
    assert "probe" in next(r for r in RULES if r.regime == "outside_engine").no_promql
    assert "service_labels" in next(r for r in RULES if r.regime == "replica_imbalance").no_promql


def _verdict_colours(node: object) -> dict[str, str]:
    """text -> colour of every value mapping in a dashboard that names a verdict."""
    found: dict[str, str] = {}
    if isinstance(node, dict):
        if node.get("type") == "value" and isinstance(node.get("options"), dict):
            for option in node["options"].values():
                if isinstance(option, dict) and option.get("text", "").replace(" ", "_") in VERDICTS:
                    found[option["text"].replace(" ", "_")] = option["color"]
        for value in node.values():
            found.update(_verdict_colours(value))
    elif isinstance(node, list):
        for value in node:
            found.update(_verdict_colours(value))
    return found


def test_every_regime_has_its_own_colour_in_the_dashboards() -> None:
    assert [p.name for p in DASHBOARDS] == ["llm-latency-fleet.json", "llm-latency-slo.json",
                                            "llm-latency-target.json"]
    for dashboard in DASHBOARDS:
        colours = _verdict_colours(json.loads(dashboard.read_text(encoding="utf-8")))
        assert colours == {"healthy": "green", "insufficient_data": "text", "not_judged": "super-light-yellow",
                           **{rule.regime: rule.colour for rule in RULES}}, dashboard.name
    assert len({rule.colour for rule in RULES} | {"green", "text", "super-light-yellow"}) == len(RULES) + 3


def _module_tree(regime: str) -> ast.Module:
    return ast.parse((RULES_DIR / f"{regime}.py").read_text(encoding="utf-8"))


def test_every_regime_reads_its_thresholds_from_thresholds() -> None:
    fields = set(Thresholds.model_fields)
    for rule in RULES:
        read = {node.attr for node in ast.walk(_module_tree(rule.regime))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "t"}
        assert read and read <= fields, (rule.regime, read - fields)


def test_no_rule_module_writes_a_number_where_severity_escalates() -> None:
    """Every ``"critical" if <condition> else ...`` compares with Thresholds fields only
    (0 stands for a missing value)."""
    escalations = 0
    for rule in RULES:
        choices = [node for node in ast.walk(_module_tree(rule.regime)) if isinstance(node, ast.IfExp)]
        for node in choices:
            if "critical" not in (ast.literal_eval(n) if isinstance(n, ast.Constant) else None
                                  for n in (node.body, node.orelse)):
                continue
            escalations += 1
            numbers = [n.value for n in ast.walk(node.test)
                       if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and n.value != 0]
            assert numbers == [], (rule.regime, ast.unparse(node.test))
    # queueing, prefill_compute, prefill_interference, kv_cache_pressure, replica_imbalance, kv_transfer,
    # speculation_ineffective, dp_imbalance, frontend_bound, scheduler_cpu_bound, lora_adapter_slots, unexplained
    assert escalations == 12


def test_default_escalations_are_the_numbers_the_rules_had() -> None:
    t = Thresholds()
    assert (t.queue_critical_factor, t.prefill_critical_factor, t.interference_critical_stall_share,
            t.interference_critical_itl_p99_seconds, t.kv_critical_preemptions_per_second, t.kv_waiting) == (
        5.0, 4.0, 0.4, 0.5, 1.0, 1.0)


ESCALATIONS = {"queue_critical_factor": 3, "prefill_critical_factor": 2.5, "interference_critical_stall_share": 0.33,
               "interference_critical_itl_p99_seconds": 0.77, "kv_critical_preemptions_per_second": 2.5,
               "kv_waiting": 1.75}


def _signals(engine: str = "vllm", **values: object) -> Signals:
    s = Signals("t", "m", engine, 0.0, 60.0, scrapes=5)
    s.ttft = LatencySummary(0.1, 0.2, 0.3, 0.4, 1.0, 100)
    s.itl = LatencySummary(0.02, 0.03, 0.04, 0.05, 0.025, 1000)
    s.queue_time = LatencySummary(None, None, None, None, values.pop("queue_mean", 0.01), 100)
    for key, value in values.items():
        setattr(s, key, value)
    return s


def test_escalations_are_overridable_and_both_the_rules_and_the_export_follow() -> None:
    config = FileConfig.model_validate({"diagnosis": {"thresholds": ESCALATIONS}})
    t = config.diagnosis.thresholds

    def severity(rule, s):
        finding = rule.evaluate(s, t)
        return finding.severity if finding else None

    waiting = dict(queue_share=0.9, waiting_mean=3.0)
    assert severity(queueing, _signals(queue_mean=1.5, **waiting)) == "critical"  # 3 x 0.5 s
    assert severity(queueing, _signals(queue_mean=1.49, **waiting)) == "warning"
    long = dict(prefill_share=0.9, prompt_tokens=LatencySummary(None, None, None, None, 5000.0, 100))
    assert severity(prefill_compute, _signals(prefill_per_request=1.25, **long)) == "critical"  # 2.5 x 0.5 s
    assert severity(prefill_compute, _signals(prefill_per_request=1.24, **long)) == "warning"
    full = dict(kv_usage_max=0.95, waiting_mean=2.0)
    assert severity(kv_cache_pressure, _signals(preemptions_per_second=2.5, **full)) == "critical"
    assert severity(kv_cache_pressure, _signals(preemptions_per_second=2.4, **full)) == "warning"
    assert severity(kv_cache_pressure, _signals("tgi", kv_usage_max=0.95, waiting_mean=1.75)) == "warning"
    assert severity(kv_cache_pressure, _signals("tgi", kv_usage_max=0.95, waiting_mean=1.7)) is None

    critical = "\n".join(a["expr"] for a in alerts_of(build_rules(config)) if a["labels"]["severity"] == "critical")
    for number in ("1.5", "1.25", "0.33", "0.77", "2.5"):
        assert re.search(rf">= {re.escape(number)}\)*(\n|$)", critical), number
    default_critical = "\n".join(a["expr"] for a in alerts_of(build_rules(FileConfig()))
                                 if a["labels"]["severity"] == "critical")
    for number in ("2.5", "2", "0.4", "0.5", "1"):
        assert re.search(rf">= {re.escape(number)}\)*(\n|$)", default_critical), number
    tgi_kv = next(a for a in alerts_of(build_rules(config))
                  if a["labels"] == {"severity": "warning", "regime": "kv_cache_pressure", "engine": "tgi"})
    assert "llm_latency:tgi_num_requests_waiting:avg_1m >= 1.75" in tgi_kv["expr"]
    assert "at least 1.75 request(s) waiting" in tgi_kv["annotations"]["description"]


# ------------------------------------------------------------ a new regime is one module


NEW_REGIME = '''
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check


def evaluate(s, t):
    c = check("mean running requests", s.running_mean, ">=", t.interference_running)
    return Finding("{name}", "warning", 0.5, "imbalanced", [c]) if c.met else None


RULE = Rule("{regime}", evaluate, precedence={precedence}, colour="pink", causes={causes},
            {promql})
'''


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Makes a package under ``tmp_path`` with one regime module per entry of ``modules``;
    forgets its modules afterwards."""
    made: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, modules: dict[str, dict]) -> str:
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "base.py").write_text("")  # skipped like app/diagnosis/rules/base.py
        for module, fields in modules.items():
            values = {"name": module, "regime": module, "precedence": 70, "causes": "()",
                      "promql": 'promql=None, no_promql="no engine metric"', **fields}
            (root / f"{module}.py").write_text(NEW_REGIME.format(**values))
        importlib.invalidate_caches()
        made.append(name)
        return str(root)

    yield make
    for name in list(sys.modules):
        if name.split(".")[0] in made:
            del sys.modules[name]


def test_a_new_regime_module_is_collected(package) -> None:
    path = package("regimes_ok", {
        "replica_imbalance": {"causes": '("queueing_like",)'},
        "queueing_like": {"precedence": 80, "promql": "promql=lambda x: None"},
    })
    rules = collect("regimes_ok", [path])
    assert [(r.regime, r.precedence, r.causes) for r in rules] == [
        ("replica_imbalance", 70, ("queueing_like",)), ("queueing_like", 80, ())]
    assert rules[0].evaluate(_signals(running_mean=2.0), Thresholds()).regime == "replica_imbalance"
    assert rules[0].evaluate(_signals(running_mean=1.0), Thresholds()) is None


@pytest.mark.parametrize(("modules", "error"), [
    ({"kv_transfer": {"regime": "kv_xfer"}},
     "regimes_bad.kv_transfer: RULE.regime is 'kv_xfer', must be the module's name"),
    ({"kv_transfer": {"promql": "promql=None"}}, "regimes_bad.kv_transfer: give either promql or no_promql"),
    ({"kv_transfer": {"promql": 'promql=lambda x: None, no_promql="both"'}},
     "regimes_bad.kv_transfer: give either promql or no_promql"),
    ({"kv_transfer": {}, "spec_decode": {}}, "regimes kv_transfer and spec_decode share precedence 70"),
    ({"kv_transfer": {"causes": '("nope",)'}}, "regimes_bad.kv_transfer: causes unknown regime(s) nope"),
])
def test_a_regime_module_that_breaks_an_assumption_is_refused(package, modules: dict, error: str) -> None:
    path = package("regimes_bad", modules)
    with pytest.raises(ImportError, match=re.escape(error)):
        collect("regimes_bad", [path])


def test_a_module_without_a_rule_is_refused(package) -> None:
    path = package("regimes_norule", {})
    Path(path, "helpers.py").write_text("X = 1\n")
    with pytest.raises(ImportError, match=re.escape("regimes_norule.helpers: a regime module must end in RULE")):
        collect("regimes_norule", [path])
