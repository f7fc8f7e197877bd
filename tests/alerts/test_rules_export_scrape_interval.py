"""Exported rules fit the evaluating Prometheus' scrape interval: every range selector holds at
least ``window_intervals`` (4) scrapes, from ``--scrape-interval`` or the source's own
``scrape_interval``; without either the ranges are the configured windows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from click.testing import CliRunner

from app.config import FileConfig
from app.core.durations import parse_duration
from app.rules_export import build_rules, render_rules, rules
from tests.alerts.test_rules_export import SOURCE, alerts_of, promtool, records_of

RANGE = re.compile(r"\[(\d+[smhdwy])(?::[^\]]*)?\]")


def ranges(document: dict) -> dict[str, int]:
    """Every range selector (and subquery range) of the rule file, with how often it occurs."""
    found: dict[str, int] = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            for match in RANGE.findall(rule["expr"]):
                found[match] = found.get(match, 0) + 1
    return dict(sorted(found.items(), key=lambda item: parse_duration(item[0])))


def config(**source: object) -> FileConfig:
    return FileConfig.model_validate({"sources": [{**SOURCE, **source}], "diagnosis": {"window": "1m"},
                                      "alerts": {"slos": [{"name": "ttft", "signal": "ttft", "threshold": "2s",
                                                           "window": "1m"}]},
                                      "slos": [{"name": "chat", "signal": "ttft", "threshold": "1s",
                                                "objective": 0.99, "period": "7d", "burn_alerts": [
                                                    {"kind": "page", "long": "1h", "short": "1m", "factor": 14.4}]}]})


def test_without_an_interval_the_ranges_are_the_configured_windows() -> None:
    found = ranges(build_rules(config()))
    assert list(found)[:2] == ["1m", "5m"] and found["1m"] > 100  # regime window, SLO window, burn window


def test_at_a_30s_scrape_every_range_holds_at_least_four_scrapes() -> None:
    fitted = build_rules(config(), scrape_interval=30.0)
    found = ranges(fitted)
    assert min(parse_duration(r) for r in found) == 120.0 and "1m" not in found
    assert found["2m"] == ranges(build_rules(config()))["1m"]  # every 1m range became 2m, none else moved
    assert build_rules(config(scrape_interval="30s")) == fitted  # the source's own interval, same rules
    assert "llm_latency:vllm_ttft_seconds:p99_2m" in records_of(fitted)
    slo = next(a for a in alerts_of(fitted) if a["alert"] == "LLMLatencyTTFTHigh" and a["labels"]["engine"] == "vllm")
    assert slo["expr"] == "llm_latency:vllm_ttft_seconds:p99_2m > 2"
    burn = next(a for a in alerts_of(fitted) if a["labels"].get("burn") == "page")
    assert (burn["labels"]["long_window"], burn["labels"]["short_window"]) == ("1h", "2m")
    assert 'llm_latency_slo:sli_error:ratio_rate2m{slo="chat"}' in burn["expr"]
    # 4 x 15 s is the 1m already configured; 6 intervals of 30 s make 3m
    assert build_rules(config(), scrape_interval=15.0) == build_rules(config())
    assert min(parse_duration(r) for r in ranges(build_rules(config(window_intervals=6), scrape_interval=30.0))) == 180


def test_the_header_says_why_and_promtool_accepts_the_fitted_rules(tmp_path: Path) -> None:
    text = render_rules(config(), scrape_interval=30.0)
    assert ("# Regime window 2m (diagnosis.window 1m, every range at least 4 scrape intervals of 30s); regime alerts "
            "hold for 30s") in text
    assert "# Regime window 1m (diagnosis.window); regime alerts" in render_rules(config())
    assert "# Regime window 5m (diagnosis.window; every range at least 4 scrape intervals of 30s)" in render_rules(
        config().model_copy(update={"diagnosis": config().diagnosis.model_copy(update={"window": 300.0})}), None,
        30.0)
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert yaml.safe_load(text) == build_rules(config(), scrape_interval=30.0)


def test_the_cli_option(tmp_path: Path) -> None:
    config_file = tmp_path / "targets.yaml"
    config_file.write_text(yaml.safe_dump({"sources": [SOURCE]}))
    runner = CliRunner()
    fitted = runner.invoke(rules, ["export", "--config", str(config_file), "--scrape-interval", "30s"])
    assert fitted.exit_code == 0 and "[1m]" not in fitted.stdout and fitted.stdout.count("[2m]") == 196
    for bad, message in (("30", "'30': a duration needs a unit, e.g. 30s"), ("0s", "'0s': must be above 0"),
                         ("2d", "'2d': must be above 0 and at most 1d"), ("soon", "not a duration: 'soon'")):
        refused = runner.invoke(rules, ["export", "--config", str(config_file), "--scrape-interval", bad])
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr
    out = tmp_path / "rules.yaml"
    out.write_text(fitted.stdout)
    assert runner.invoke(rules, ["export", "--config", str(config_file), "--scrape-interval", "30s", "--out", str(out),
                                 "--check"]).exit_code == 0
    stale = runner.invoke(rules, ["export", "--config", str(config_file), "--out", str(out), "--check"])
    assert stale.exit_code == 1 and "is stale" in stale.stderr
    out.write_text(fitted.stdout.replace("[2m]", "[3m]", 1))
    stale = runner.invoke(rules, ["export", "--config", str(config_file), "--scrape-interval", "30s", "--out",
                                  str(out), "--check"])
    assert stale.exit_code == 1 and f"--config {config_file} --scrape-interval 30s --out {out}`" in stale.stderr
