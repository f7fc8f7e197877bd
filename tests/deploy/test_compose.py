"""deploy/compose.yaml and the files it mounts: valid against the Compose Specification
schema, every referenced file present, and the three places that name the demo targets
(emulator command, the monitor's targets.yaml, Prometheus' scrape config) in agreement.
No Docker engine is needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from app.config import load_config
from app.emulator.cli import parse_target
from app.settings import Settings
from tests.support.components import require_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
SERVICES = COMPOSE["services"]
PROMETHEUS_YML = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text(encoding="utf-8"))
TARGETS_YAML = DEPLOY / "compose" / "targets.yaml"


def config_file(name: str) -> Path:
    return (DEPLOY / COMPOSE["configs"][name]["file"]).resolve()


def mounted_config(service: str, target: str) -> Path:
    """The host file a service sees at ``target`` (through ``configs:``)."""
    source = next(c["source"] for c in SERVICES[service]["configs"] if c["target"] == target)
    return config_file(source)


def bind_mounts(service: str) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short syntax)."""
    mounts = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (DEPLOY / source).resolve()
    return mounts


def test_compose_file_is_valid_against_the_compose_specification_schema() -> None:
    schema = json.loads((FIXTURES / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft201909Validator(schema)
    assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(COMPOSE)] == []
    broken = json.loads(json.dumps(COMPOSE))
    broken["services"]["grafana"]["volume"] = []  # a typo the schema must catch
    assert any("volume" in e.message for e in validator.iter_errors(broken))


def test_every_file_compose_references_exists() -> None:
    referenced = []
    for name, service in SERVICES.items():
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            referenced += [context, context / service["build"]["dockerfile"]]
        referenced += list(bind_mounts(name).values())
    referenced += [config_file(name) for name in COMPOSE["configs"]]
    missing = [str(p.relative_to(ROOT)) for p in referenced if not p.exists()]
    assert missing == [] and len(referenced) >= 10
    assert (ROOT / "deploy" / "prometheus" / "llm-latency-rules.yaml").is_file()


def test_the_stack_has_every_component_and_migrates_before_the_monitor_starts() -> None:
    assert set(SERVICES) == {"postgres", "migrate", "llm-latency", "emulator", "prometheus", "alertmanager",
                             "grafana"}
    migrate, monitor = SERVICES["migrate"], SERVICES["llm-latency"]
    assert migrate["command"] == ["db", "upgrade"] and migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert monitor["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert monitor["command"][0] == "serve"
    url = monitor["environment"]["LLM_LATENCY_DATABASE_URL"]
    assert url == migrate["environment"]["LLM_LATENCY_DATABASE_URL"] and url.startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in url
    # the image listens on 0.0.0.0, which the monitor refuses without a token
    assert monitor["environment"]["LLM_LATENCY_API_TOKEN"]
    assert migrate["build"] == monitor["build"] == SERVICES["emulator"]["build"]


def test_every_environment_variable_the_monitor_gets_is_a_real_setting() -> None:
    fields = {f"LLM_LATENCY_{name.upper()}" for name in Settings.model_fields}
    for name in ("migrate", "llm-latency"):
        unknown = {k for k in SERVICES[name]["environment"] if k.startswith("LLM_LATENCY_")} - fields
        assert unknown == set(), name


def test_emulator_monitor_and_prometheus_agree_on_the_demo_targets() -> None:
    """Names are the join key of the dashboards: the monitor's target name must be the
    ``target`` label Prometheus puts on the same engine."""
    emulated = {}
    for arg in SERVICES["emulator"]["command"]:
        if arg.startswith("--target="):
            name, _, engine, port = parse_target(arg.removeprefix("--target="))
            emulated[name] = (engine, f"emulator:{port}")
    monitor_path = mounted_config("llm-latency", "/etc/llm-latency/targets.yaml")
    assert monitor_path == TARGETS_YAML.resolve()
    allowed = SERVICES["llm-latency"]["environment"]["LLM_LATENCY_ALLOWED_TARGET_HOSTS"].split(",")
    config = load_config(monitor_path, allowed)
    monitored = {t.name: (t.engine, urlsplit(t.url).netloc) for t in config.targets}
    engines_job = next(j for j in PROMETHEUS_YML["scrape_configs"] if j["job_name"] == "llm-engines")
    scraped = {c["labels"]["target"]: c["targets"] for c in engines_job["static_configs"]}
    assert len(emulated) == 5 and {e for e, _ in emulated.values()} == {"vllm", "tgi"}
    assert monitored == emulated
    assert scraped == {name: [address] for name, (_, address) in emulated.items()}


def test_prometheus_scrapes_the_monitor_loads_the_rules_and_alerts_alertmanager() -> None:
    jobs = {j["job_name"]: j for j in PROMETHEUS_YML["scrape_configs"]}
    monitor_port = SERVICES["llm-latency"]["ports"][0].split(":")[-1]
    assert jobs["llm-latency"]["static_configs"] == [{"targets": [f"llm-latency:{monitor_port}"]}]
    assert "labels" not in jobs["llm-latency"]["static_configs"][0]  # its series carry `target` already
    rules_dir = next(t for t, host in bind_mounts("prometheus").items() if host == DEPLOY / "prometheus")
    assert PROMETHEUS_YML["rule_files"] == [f"{rules_dir}/*.yaml"]
    assert mounted_config("prometheus", "/etc/prometheus/prometheus.yml") == DEPLOY / "compose" / "prometheus.yml"
    alertmanager_port = SERVICES["alertmanager"]["ports"][0].split(":")[-1]
    assert PROMETHEUS_YML["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        f"alertmanager:{alertmanager_port}"]


def test_alertmanager_inhibits_symptoms_exactly_as_the_rules_export_suggests() -> None:
    from app.rules_export import inhibit_rules

    config = yaml.safe_load(mounted_config("alertmanager", "/etc/alertmanager/alertmanager.yml").read_text())
    assert config["inhibit_rules"] == inhibit_rules()
    webhook = next(r for r in config["receivers"] if r["name"] == "oncall-webhook")
    assert webhook["webhook_configs"][0]["url"].startswith("http")
    assert config["route"]["routes"][0]["receiver"] == "oncall-webhook"


def test_grafana_gets_the_provisioning_and_the_dashboards_where_the_provider_looks() -> None:
    mounts = bind_mounts("grafana")
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/llm-latency.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert mounts[path] == ROOT / "grafana" / "dashboards"
    assert mounts["/etc/grafana/provisioning/datasources"] == ROOT / "grafana/provisioning/datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == ROOT / "grafana/provisioning/dashboards"
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (ROOT / "grafana/dashboards" / Path(home).name).is_file()
    assert SERVICES["grafana"]["image"].startswith("grafana/grafana:11.6.")  # the SDK line the tests load with


@pytest.mark.prometheus
def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = require_binary("promtool", "checking deploy/compose/prometheus.yml")
    result = subprocess.run([promtool, "check", "config", str(DEPLOY / "compose" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.prometheus
def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = require_binary("amtool", "checking deploy/compose/alertmanager.yml (Debian's prometheus-alertmanager)")
    from app.rules_export import inhibit_rules

    result = subprocess.run([amtool, "check-config", str(DEPLOY / "compose" / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and f"{len(inhibit_rules())} inhibit rules" in result.stdout


# ----------------------------------------------------------------------------- Prometheus-source mode

SOURCE_MODE = yaml.safe_load((DEPLOY / "compose.prometheus-source.yaml").read_text(encoding="utf-8"))
SOURCE_DIR = DEPLOY / "compose" / "prometheus-source"


def merged_compose() -> dict:
    """``docker compose -f compose.yaml -f compose.prometheus-source.yaml``: the Compose
    Specification's merge -- mappings merge by key, ``configs`` by ``target``, ``volumes`` by
    container path."""
    merged = json.loads(json.dumps(COMPOSE))
    for name, override in SOURCE_MODE["services"].items():
        service = merged["services"][name]
        for key, value in override.items():
            if key == "configs":
                kept = [c for c in service.get("configs", []) if c["target"] not in {v["target"] for v in value}]
                service["configs"] = kept + value
            elif key == "volumes":
                targets = {v.split(":")[1] for v in value}
                service["volumes"] = [v for v in service.get("volumes", []) if v.split(":")[1] not in targets] + value
            elif isinstance(value, dict):
                service[key] = {**service.get(key, {}), **value}
            else:
                service[key] = value
    merged["configs"] = {**merged["configs"], **SOURCE_MODE["configs"]}
    return merged


def test_the_source_mode_override_and_the_merged_stack_are_valid_compose_files() -> None:
    schema = json.loads((FIXTURES / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft201909Validator(schema)
    merged = merged_compose()
    for document in (SOURCE_MODE, merged):
        assert [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)] == []
    assert set(merged["services"]) == set(SERVICES)  # the same stack, no second monitor
    missing = [f for f in [*(DEPLOY / c["file"] for c in SOURCE_MODE["configs"].values()),
                           *(DEPLOY / v.split(":")[0] for s in SOURCE_MODE["services"].values()
                             for v in s.get("volumes", []))] if not f.exists()]
    assert missing == []


def test_the_monitor_reads_the_stacks_prometheus_for_the_engines_it_scrapes() -> None:
    merged = merged_compose()
    monitor = merged["services"]["llm-latency"]
    path = next((DEPLOY / merged["configs"][c["source"]]["file"]).resolve() for c in monitor["configs"]
                if c["target"] == "/etc/llm-latency/targets.yaml")
    assert path == (SOURCE_DIR / "targets.yaml").resolve()
    config = load_config(path, monitor["environment"]["LLM_LATENCY_ALLOWED_TARGET_HOSTS"].split(","))
    assert config.targets == []
    (source,) = config.sources
    prometheus_port = SERVICES["prometheus"]["ports"][0].split(":")[-1]
    assert source.url == f"http://prometheus:{prometheus_port}"
    assert monitor["depends_on"]["prometheus"] == {"condition": "service_started"}
    # the selector picks the engines job, and every engine there has the target labels
    engines_job = next(j for j in PROMETHEUS_YML["scrape_configs"] if j["job_name"] == "llm-engines")
    assert source.selector == '{job="llm-engines"}'
    label_sets = [tuple(c["labels"][label] for label in source.target_labels) for c in engines_job["static_configs"]]
    assert len(set(label_sets)) == len(label_sets) == 5
    assert {c["labels"]["pod"] for c in engines_job["static_configs"]} == {
        f"{c['labels']['target']}-0" for c in engines_job["static_configs"]}


def test_prometheus_alertmanager_and_grafana_get_the_source_modes_files() -> None:
    from app.rules_export import inhibit_rules, render_rules, scope_of

    merged = merged_compose()
    config = load_config(SOURCE_DIR / "targets.yaml")
    volumes = {v.split(":")[1]: (DEPLOY / v.split(":")[0]).resolve()
               for v in merged["services"]["prometheus"]["volumes"] if v.startswith(".")}
    rules_dir = volumes["/etc/prometheus/rules"]
    assert rules_dir == (SOURCE_DIR / "rules").resolve()
    assert [p.name for p in rules_dir.glob("*.yaml")] == ["llm-latency-rules.yaml"]  # what rule_files loads
    assert (rules_dir / "llm-latency-rules.yaml").read_text() == render_rules(config), (
        "regenerate: llm-latency rules export --config deploy/compose/prometheus-source/targets.yaml "
        "--out deploy/compose/prometheus-source/rules/llm-latency-rules.yaml")
    alertmanager = next(c for c in merged["services"]["alertmanager"]["configs"]
                        if c["target"] == "/etc/alertmanager/alertmanager.yml")
    am_path = DEPLOY / merged["configs"][alertmanager["source"]]["file"]
    am = yaml.safe_load(am_path.read_text())
    assert am["inhibit_rules"] == inhibit_rules(scope_of(config))
    assert am["route"]["group_by"] == ["alertname", "namespace", "pod", "model_name"]
    scrape_mode = yaml.safe_load((DEPLOY / "compose" / "alertmanager.yml").read_text())
    assert {k: v for k, v in am.items() if k != "inhibit_rules"} == {
        **{k: v for k, v in scrape_mode.items() if k != "inhibit_rules"},
        "route": {**scrape_mode["route"], "group_by": am["route"]["group_by"]}}
    grafana = {v.split(":")[1]: (DEPLOY / v.split(":")[0]).resolve() for v in merged["services"]["grafana"]["volumes"]
               if v.startswith(".")}
    assert grafana["/var/lib/grafana/dashboards/llm-latency"] == (SOURCE_DIR / "dashboards").resolve()
    assert {p.name for p in (SOURCE_DIR / "dashboards").glob("*.json")} == {"llm-latency-fleet.json",
                                                                            "llm-latency-target.json",
                                                                            "llm-latency-slo.json"}


@pytest.mark.prometheus
def test_amtool_accepts_the_source_modes_alertmanager_config() -> None:
    amtool = require_binary("amtool", "checking the Prometheus-source mode's alertmanager.yml")
    from app.rules_export import inhibit_rules

    result = subprocess.run([amtool, "check-config", str(SOURCE_DIR / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and f"{len(inhibit_rules())} inhibit rules" in result.stdout
