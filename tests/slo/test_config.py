"""The slos: section of the targets YAML: defaults, and every refusal with its file line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.config import ConfigError, load_config
from app.slo.buckets import DEFAULT_BOUNDS, not_a_bound

TARGETS = """\
targets:
  - name: chat-a
    url: http://10.0.0.5:8000/metrics
    engine: vllm
    labels: {service: chat}
  - name: tgi-a
    url: http://10.0.0.6:3000/metrics
    engine: tgi
    labels: {service: batch}
  - name: auto-a
    url: http://10.0.0.7:8000/metrics
"""


def load(tmp_path: Path, slos: str) -> object:
    path = tmp_path / "targets.yaml"
    path.write_text(TARGETS + "slos:\n" + slos)
    return load_config(path)


def problems(tmp_path: Path, slos: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, slos)
    prefix = f"{tmp_path / 'targets.yaml'}:"
    return [p.removeprefix(prefix) for p in exc.value.problems]


def test_an_slo_with_defaults_and_percent_objective(tmp_path: Path) -> None:
    config = load(tmp_path, "  - {name: chat-ttft, signal: ttft, threshold: 2.5s, objective: 99.5%, "
                            "match: {service: chat}}\n")
    (slo,) = config.slos  # type: ignore[attr-defined]
    assert (slo.threshold, slo.objective, slo.period) == (2.5, 0.995, 28 * 86400)
    assert [(a.kind, a.long, a.short, a.factor) for a in slo.burn_alerts] == [
        ("page", 3600, 300, 14.4), ("page", 21600, 1800, 6), ("ticket", 86400, 7200, 3), ("ticket", 259200, 21600, 1)]
    assert slo.severities == {"page": "critical", "ticket": "warning"}
    assert slo.matches("chat-a", {"service": "chat"}) and not slo.matches("tgi-a", {"service": "batch"})
    assert slo.windows() == [300, 1800, 3600, 7200, 21600, 86400, 259200]


def test_a_threshold_between_buckets_is_refused_with_the_two_nearest_bounds_and_its_line(tmp_path: Path) -> None:
    assert problems(tmp_path, "  - name: chat-ttft\n    signal: ttft\n    threshold: 2s\n    objective: 99%\n"
                              "    match: {service: chat}\n") == [
        "15: slos[0].threshold: threshold 2s is not a bucket bound of vllm's ttft histogram (default buckets); "
        "the nearest bounds are 1s and 2.5s (an SLI between bounds would be interpolated, a guess)"]
    # every target engine written in the file is checked: TGI's geometric bounds, and TTFT it does not have
    assert problems(tmp_path, "  - {name: b, signal: e2e, threshold: 2s, objective: 0.99, match: {service: batch}}\n"
                              "  - {name: c, signal: ttft, threshold: 1s, objective: 0.99, match: {name: tgi-a}}\n"
                    ) == [
        "13: slos[0].threshold: threshold 2s is not a bucket bound of tgi's e2e histogram (default buckets); the "
        "nearest bounds are 1.68341s and 2.52512s (an SLI between bounds would be interpolated, a guess)",
        "14: slos[1].signal: tgi exports no ttft histogram, so its SLI cannot be computed exactly"]
    # a bound copied from TGI's page, custom buckets, and engine: auto targets pass (checked at run time)
    load(tmp_path, "  - {name: b, signal: e2e, threshold: 2.52512s, objective: 0.99, match: {service: batch}}\n"
                   "  - {name: c, signal: ttft, threshold: 2s, objective: 0.99, match: {service: chat}, "
                   "custom_buckets: true}\n"
                   "  - {name: d, signal: ttft, threshold: 2s, objective: 0.99, match: {name: auto-a}}\n")
    # the defaults' 14.4x cannot fire with a 90% objective (at most 10x): said so, naming the default
    assert problems(tmp_path, "  - {name: e, signal: itl, threshold: 100ms, objective: 90%}\n") == [
        "13: slos[0]: the default page alert (burn_alerts[0], write burn_alerts for this objective): factor 14.4 "
        "can never be reached: with an objective of 0.9 the burn rate is at most 10 (every request bad)"]


def test_nearest_bounds_at_either_end() -> None:
    ttft = DEFAULT_BOUNDS["vllm"]["ttft"]
    assert "nearest bounds are 0.001s and 0.005s" in (not_a_bound(ttft, 0.0001, "x") or "")
    assert "nearest bounds are 640s and 2560s" in (not_a_bound(ttft, 9999, "x") or "")
    assert not_a_bound(ttft, 2.5, "x") is None


@pytest.mark.parametrize("objective, message", [
    ("100%", "objective must be strictly between 0 and 1 (0% and 100%), e.g. 99% or 0.99; got 1"),
    ("0", "objective must be strictly between 0 and 1 (0% and 100%), e.g. 99% or 0.99; got 0"),
    ("1.5", "objective must be strictly between 0 and 1 (0% and 100%), e.g. 99% or 0.99; got 1.5"),
    ("ninety%", "not a percentage: 'ninety%' (write e.g. 99% or 0.99)"),
])
def test_an_objective_out_of_range_is_refused(tmp_path: Path, objective: str, message: str) -> None:
    assert problems(tmp_path, f"  - name: a\n    signal: itl\n    threshold: 100ms\n    objective: {objective}\n") \
        == [f"16: slos[0].objective: {message}"]


def test_duplicate_names_unreachable_factors_and_bad_windows_are_refused(tmp_path: Path) -> None:
    assert problems(tmp_path, "  - {name: a, signal: itl, threshold: 100ms, objective: 99%}\n"
                              "  - {name: a, signal: ttft, threshold: 2.5s, objective: 99%}\n") == [
        "12: slos: duplicate SLO name 'a' (slos[0] and slos[1])"]
    assert problems(tmp_path, "  - name: a\n    signal: itl\n    threshold: 100ms\n    objective: 99.9%\n"
                              "    burn_alerts: [{kind: page, long: 1h, short: 5m, factor: 2000}]\n") == [
        "13: slos[0]: burn_alerts[0]: factor 2000 can never be reached: with an objective of 0.999 the burn rate "
        "is at most 1000 (every request bad)"]
    assert problems(tmp_path, "  - name: a\n    signal: itl\n    threshold: 100ms\n    objective: 99%\n"
                              "    burn_alerts: [{kind: page, long: 5m, short: 1h, factor: 2}]\n") == [
        "17: slos[0].burn_alerts[0]: the short window must be shorter than the long one"]
    assert problems(tmp_path, "  - {name: a, signal: tpot, threshold: 100ms, objective: 99%}\n")[0].startswith(
        "13: slos[0].signal: Input should be 'ttft', 'itl', 'e2e' or 'queue_time'")


def test_check_config_refuses_a_threshold_between_buckets(tmp_path: Path) -> None:
    path = tmp_path / "targets.yaml"
    path.write_text(TARGETS + "slos:\n  - {name: a, signal: itl, threshold: 120ms, objective: 99%, "
                    "match: {name: chat-a}}\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:13: slos[0].threshold: threshold 0.12s is not a bucket bound of vllm's itl "
                             "histogram (default buckets); the nearest bounds are 0.1s and 0.15s (an SLI between "
                             "bounds would be interpolated, a guess)\n")
