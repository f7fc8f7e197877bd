"""The committed dashboards: generated, fresh, and loadable by Grafana's own model.

"Loadable" is checked with Grafana's official Python SDK (grafana-foundation-sdk, the
Grafana 11.6 line): each dashboard goes through ``Dashboard.from_json`` -- which decodes
panels, field configs, options and Prometheus queries into the typed models of their
panel/datasource plugins and silently drops whatever it does not know -- and back to
JSON; every key and value of the committed file must survive that round trip.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.diagnosis.rules import RULES
from tests.grafana.queries import DASHBOARD_DIR, GRAFANA, load_dashboards, load_generator
from tests.support.components import in_ci

try:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard, Panel
except ImportError:  # the test extra is not installed: skip locally, fail under CI
    if in_ci():
        raise
    pytest.skip("grafana-foundation-sdk is not installed (pip install -e '.[test]')", allow_module_level=True)

register_default_plugins()
DASHBOARDS = load_dashboards()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exposition"

#: Grafana's Prometheus annotation options (title/text templates, tag labels, step) are
#: stored on the annotation itself; the SDK's AnnotationQuery model does not carry them
#: yet ("TODO.. this should just be a normal query target"). Only these keys may drop.
SDK_UNMODELLED_ANNOTATION_KEYS = {"titleFormat", "textFormat", "tagKeys", "step"}


def lost_in_round_trip(original: object, round_tripped: object, path: str = "$") -> list[str]:
    """Paths of keys (and values) of ``original`` that the round trip dropped or changed."""
    if isinstance(original, dict):
        if not isinstance(round_tripped, dict):
            return [f"{path}: became {type(round_tripped).__name__}"]
        lost = []
        for key, value in original.items():
            if key not in round_tripped:
                lost.append(f"{path}.{key}")
            else:
                lost += lost_in_round_trip(value, round_tripped[key], f"{path}.{key}")
        return lost
    if isinstance(original, list):
        if not isinstance(round_tripped, list) or len(round_tripped) != len(original):
            return [f"{path}: list changed"]
        return [p for i, (a, b) in enumerate(zip(original, round_tripped))
                for p in lost_in_round_trip(a, b, f"{path}[{i}]")]
    return [] if original == round_tripped else [f"{path}: {original!r} became {round_tripped!r}"]


def round_trip(dashboard: dict) -> dict:
    return json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))


def sdk_losses(dashboard: dict) -> list[str]:
    allowed = re.compile(r"^\$\.annotations\.list\[\d+\]\.({})$".format("|".join(SDK_UNMODELLED_ANNOTATION_KEYS)))
    return [p for p in lost_in_round_trip(dashboard, round_trip(dashboard)) if not allowed.match(p)]


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


# ----------------------------------------------------------------------------- generated + fresh


def test_the_committed_dashboards_are_what_the_generator_writes() -> None:
    result = subprocess.run([sys.executable, str(GRAFANA / "generate.py"), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert set(DASHBOARDS) == {"llm-latency-fleet.json", "llm-latency-target.json", "llm-latency-slo.json"}


def test_check_mode_names_stale_missing_and_foreign_files(tmp_path: Path) -> None:
    generator = load_generator()
    assert generator.main(["--out", str(tmp_path)]) == 0
    assert generator.main(["--out", str(tmp_path), "--check"]) == 0
    fleet = tmp_path / "llm-latency-fleet.json"
    fleet.write_text(fleet.read_text().replace("Fleet overview", "Fleet"), encoding="utf-8")
    (tmp_path / "llm-latency-target.json").unlink()
    (tmp_path / "hand-made.json").write_text("{}", encoding="utf-8")
    problems = generator.check(tmp_path)
    assert [p.split(":")[0] for p in problems] == [str(fleet), str(tmp_path / "llm-latency-target.json"),
                                                   str(tmp_path / "hand-made.json")]
    assert "stale" in problems[0] and "-  \"title\": \"LLM Latency / Fleet\"," in problems[0]
    assert generator.main(["--out", str(tmp_path), "--check"]) == 1


# ----------------------------------------------------------------------------- Grafana's model


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_key_survives_the_foundation_sdk_model(name: str) -> None:
    dashboard = DASHBOARDS[name]
    assert sdk_losses(dashboard) == []
    assert Dashboard.from_json(dashboard).schema_version == 41  # Grafana 11.6


def test_the_round_trip_check_catches_unknown_keys_where_grafana_has_a_model() -> None:
    dashboard = json.loads(json.dumps(DASHBOARDS["llm-latency-target.json"]))
    by_type = {p["type"]: p for p in reversed(panels(dashboard))}
    by_type["timeseries"]["options"]["legend"]["placment"] = "right"
    by_type["timeseries"]["fieldConfig"]["defaults"]["custom"]["lineWidht"] = 2
    by_type["timeseries"]["targets"][0]["legend"] = "typo of legendFormat"
    by_type["table"]["options"]["showHeaders"] = True
    by_type["state-timeline"]["fieldConfig"]["defaults"]["mappings"][0]["options"]["0"]["colour"] = "red"
    by_type["stat"]["options"]["reduceOptions"]["calc"] = ["last"]
    dashboard["templating"]["list"][1]["multiValue"] = True
    lost = sdk_losses(dashboard)
    assert len(lost) == 7 and all(p.rsplit(".", 1)[-1] in {"placment", "lineWidht", "legend", "showHeaders",
                                                            "colour", "calc", "multiValue"} for p in lost), lost


KNOWN_TRANSFORMATIONS = {"merge": set(), "organize": {"excludeByName", "renameByName", "indexByName"}}
KNOWN_MATCHERS = {"byFrameRefID", "byName"}
PLAIN_PROPERTIES = {"unit", "decimals", "links", "mappings", "min", "max", "displayName", "color", "thresholds"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_transformations_and_overrides_use_only_known_ids(name: str) -> None:
    """The SDK keeps transformations and override properties as opaque values, so their
    ids are checked here: transformation ids and options, matcher ids, and override
    properties -- ``custom.*`` must be a field of the panel plugin's field config."""
    for panel in panels(DASHBOARDS[name]):
        for transformation in panel.get("transformations", []):
            assert transformation["id"] in KNOWN_TRANSFORMATIONS, panel["title"]
            assert set(transformation["options"]) <= KNOWN_TRANSFORMATIONS[transformation["id"]], panel["title"]
        for override in panel["fieldConfig"]["overrides"]:
            assert override["matcher"]["id"] in KNOWN_MATCHERS, panel["title"]
            if override["matcher"]["id"] == "byFrameRefID":
                assert override["matcher"]["options"] in {t["refId"] for t in panel["targets"]}, panel["title"]
            for prop in override["properties"]:
                if prop["id"].startswith("custom."):
                    key = prop["id"].removeprefix("custom.")
                    probe = {**panel, "fieldConfig": {"defaults": {"custom": {key: prop["value"]}}, "overrides": []}}
                    decoded = json.loads(json.dumps(Panel.from_json(probe), cls=JSONEncoder))
                    decoded = decoded["fieldConfig"]["defaults"].get("custom", {})
                    assert key in decoded, f"{panel['title']}: {prop['id']} is not a {panel['type']} field option"
                else:
                    assert prop["id"] in PLAIN_PROPERTIES, f"{panel['title']}: {prop['id']}"


def units(dashboard: dict) -> set[str]:
    found = set()
    for panel in panels(dashboard):
        found.add(panel["fieldConfig"]["defaults"].get("unit", "none"))
        found |= {p["value"] for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"}
    return found


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_unit_is_a_grafana_unit_id(name: str) -> None:
    """Units are free strings in the model; the SDK lists Grafana's unit ids."""
    from grafana_foundation_sdk.models import units as grafana_units

    known = {v for k, v in vars(grafana_units).items() if not k.startswith("_") and isinstance(v, str)}
    used = units(DASHBOARDS[name])
    assert {"s", "percentunit"} <= used
    assert {u for u in used if u not in known and not u.startswith(("suffix:", "prefix:"))} == set()


# ----------------------------------------------------------------------------- structure


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_tile_the_grid_without_overlap_and_ids_are_unique(name: str) -> None:
    dashboard = DASHBOARDS[name]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_uses_the_datasource_variable_and_known_variables(name: str) -> None:
    dashboard = DASHBOARDS[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"target", "model"} <= set(variables)
    builtins = {"__rate_interval", "__range", "__interval"}
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= set(variables) | builtins, (panel["title"], used - set(variables) - builtins)
    for annotation in dashboard["annotations"]["list"][1:]:
        assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_fleet_selects_many_targets_and_the_drill_down_exactly_one() -> None:
    fleet = {v["name"]: v for v in DASHBOARDS["llm-latency-fleet.json"]["templating"]["list"]}
    target = {v["name"]: v for v in DASHBOARDS["llm-latency-target.json"]["templating"]["list"]}
    assert fleet["target"]["multi"] and fleet["target"]["includeAll"] and fleet["target"]["allValue"] == ".*"
    assert not target["target"]["multi"] and not target["target"]["includeAll"]
    assert target["model"]["allValue"] == ".*"  # TGI series have no model label at all
    assert DASHBOARDS["llm-latency-target.json"]["uid"] == "llm-latency-target"


def test_the_drill_down_uid_is_the_one_the_alerts_config_documents() -> None:
    """Notifications link to ``alerts.dashboard_url`` + ``?var-target=``; the documented
    example URL is this dashboard's."""
    import app.alerts.config

    assert f"/d/{DASHBOARDS['llm-latency-target.json']['uid']}" in app.alerts.config.__doc__


def test_the_regime_mapping_names_every_verdict_the_service_can_export() -> None:
    generator = load_generator()
    expected = {"healthy", "insufficient_data", "not_judged"} | {rule.regime for rule in RULES}
    assert set(generator.VERDICTS) == expected
    for dashboard in DASHBOARDS.values():
        timeline = next(p for p in panels(dashboard) if p["title"] == "Diagnosed regime")
        mapping = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert {m["text"] for m in mapping.values()} == {v.replace("_", " ") for v in expected}
        for verdict in expected:
            assert f'verdict="{verdict}"}} * {generator.VERDICTS.index(verdict)}' in timeline["targets"][0]["expr"]


def test_objective_choices_are_bucket_bounds_of_a_real_vllm_page() -> None:
    """``le="$ttft_slo"`` must select a bucket, written exactly as vLLM exposes it."""
    page = (FIXTURES / "vllm-0.32-cpu-real.prom").read_text(encoding="utf-8")
    generator = load_generator()
    for family, choices in (("vllm:time_to_first_token_seconds", generator.TTFT_OBJECTIVES),
                            ("vllm:inter_token_latency_seconds", generator.ITL_OBJECTIVES)):
        bounds = set(re.findall(rf'^{re.escape(family)}_bucket{{.*le="([^"]+)"', page, re.M))
        assert set(choices) <= bounds, set(choices) - bounds
    variables = {v["name"]: v for v in DASHBOARDS["llm-latency-fleet.json"]["templating"]["list"]}
    assert variables["ttft_slo"]["current"]["value"] == "2.5"   # default SLO 2 s -> next bound
    assert variables["itl_slo"]["current"]["value"] == "0.15"   # default SLO 150 ms is a bound


def test_the_dashboard_json_is_deterministic() -> None:
    generator = load_generator()
    assert generator.render() == generator.render()
    for name, text in generator.render().items():
        assert text == (DASHBOARD_DIR / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- what the panels show

def _uses(panel: dict, *needles: str) -> bool:
    """Every needle (a metric name or a label matcher text) appears in the panel's queries."""
    exprs = " ".join(t["expr"] for t in panel.get("targets", []))
    return all(needle in exprs for needle in needles)


def _quantiles(signal: str) -> tuple[str, ...]:
    return tuple(f'signal="{signal}", quantile="{q}"' for q in ("0.5", "0.9", "0.99"))


#: The panels the dashboards exist for, each recognised by what it queries (titles may
#: change, the data may not): requirement -> predicate over one panel.
REQUIRED_PANELS = {
    "TTFT p50/p90/p99 over time": lambda p: p["type"] == "timeseries" and _uses(p, *_quantiles("ttft")),
    "ITL p50/p90/p99 over time": lambda p: p["type"] == "timeseries" and _uses(p, *_quantiles("itl")),
    "SLO attainment": lambda p: "SLO" in p["title"] and _uses(p, "ttft_slo") and _uses(p, "itl_slo"),
    "TTFT decomposition queue vs. prefill": lambda p: (
        _uses(p, 'signal="queue_time"', 'signal="prefill_time"')
        or _uses(p, "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum")),
    "ITL p99/p50 with engine-step size": lambda p: _uses(p, 'quantile="0.99"', 'quantile="0.5"',
                                                         "vllm:iteration_tokens_total_bucket"),
    "running and waiting": lambda p: _uses(p, "vllm:num_requests_running", "vllm:num_requests_waiting",
                                           "tgi_batch_current_size", "tgi_queue_size"),
    "KV usage and preemptions": lambda p: _uses(p, "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"),
    "prefix-cache hit rate": lambda p: _uses(p, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    "state timeline of the diagnosed regime": lambda p: p["type"] == "state-timeline"
                                                        and _uses(p, "llm_latency_diagnosis_verdict"),
    "active findings with evidence and remedies": lambda p: p["type"] == "table"
                                                            and _uses(p, "llm_latency_finding_remedy_info"),
    "finding evidence against thresholds": lambda p: p["type"] == "table"
                                                     and _uses(p, "llm_latency_finding_evidence",
                                                               "llm_latency_finding_threshold"),
    "client-side probe TTFT and ITL": lambda p: _uses(p, "llm_latency_probe_ttft_seconds",
                                                      "llm_latency_probe_itl_seconds"),
    "scrape health": lambda p: _uses(p, "llm_latency_target_up"),
    "scrape results": lambda p: _uses(p, "llm_latency_scrapes_total"),
}


#: The SLO dashboard's panels: budget, SLI and burn rate per window of the slos: section, and the
#: capacity signal with whether scaling helps.
SLO_PANELS = {
    "error budget left": lambda p: _uses(p, "llm_latency_slo_error_budget_remaining"),
    "SLI per window": lambda p: p["type"] == "timeseries" and _uses(p, "llm_latency_slo_sli"),
    "burn rate per window": lambda p: p["type"] == "timeseries" and _uses(p, "llm_latency_slo_burn_rate")
                                      and p["targets"][0].get("legendFormat") == "{{slo}} {{window}}",
    "time to exhaustion": lambda p: _uses(p, "llm_latency_slo_time_to_exhaustion_seconds"),
    "burn-rate alerts": lambda p: _uses(p, 'alertname="LLMLatencySLOBurnRate"'),
    "desired vs. current replicas": lambda p: _uses(p, "llm_latency_capacity_desired_replicas",
                                                    "llm_latency_capacity_current_replicas"),
    "whether scaling helps, and why": lambda p: p["type"] == "table"
                                                and _uses(p, "llm_latency_capacity_scaling_helps"),
}
LATENCY_DASHBOARDS = ("llm-latency-fleet.json", "llm-latency-target.json")


def test_the_slo_dashboard_has_its_panels_and_an_slo_variable() -> None:
    dashboard = DASHBOARDS["llm-latency-slo.json"]
    found = {requirement: [p["title"] for p in panels(dashboard) if matches(p)]
             for requirement, matches in SLO_PANELS.items()}
    assert all(found.values()), [requirement for requirement, titles in found.items() if not titles]
    slo = next(v for v in dashboard["templating"]["list"] if v["name"] == "slo")
    assert slo["query"]["query"] == "label_values(llm_latency_slo_objective, slo)" and slo["includeAll"]
    assert all('slo=~"$slo"' in t["expr"] for p in panels(dashboard) for t in p["targets"] if "_slo_" in t["expr"])


@pytest.mark.parametrize("name", LATENCY_DASHBOARDS)
def test_every_required_panel_is_on_every_dashboard(name: str) -> None:
    found = {requirement: [p["title"] for p in panels(DASHBOARDS[name]) if matches(p)]
             for requirement, matches in REQUIRED_PANELS.items()}
    assert all(found.values()), [requirement for requirement, titles in found.items() if not titles]
    dashboard = DASHBOARDS[name]
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"target", "model"}
    regime_annotations = [a for a in dashboard["annotations"]["list"]
                          if "llm_latency_diagnosis_verdict" in a.get("expr", "") and "changes(" in a["expr"]]
    assert len(regime_annotations) == 1


def test_the_required_panel_check_notices_a_missing_panel() -> None:
    dashboard = json.loads(json.dumps(DASHBOARDS["llm-latency-target.json"]))
    dashboard["panels"] = [p for p in dashboard["panels"] if p.get("type") != "state-timeline"
                           or "llm_latency_diagnosis_verdict" not in json.dumps(p)]
    missing = [r for r, matches in REQUIRED_PANELS.items() if not any(matches(p) for p in panels(dashboard))]
    assert missing == ["state timeline of the diagnosed regime"]
