"""``llm-latency diagnose URL --baseline``: the one-shot watch says what changed between its first
part and its last, on an emulated engine over HTTP whose load doubles during the watch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from app.diagnosis import oneshot
from app.emulator.scenarios import ScenarioPlan
from app.emulator.server import EmulatorFleet, TargetSpec
from tests.attribution.harness import CASES

pytestmark = pytest.mark.slow

SCALE, WARMUP = 20.0, 300.0  # 20 simulated seconds per second; the page starts with 5 minutes of data


def test_a_load_step_during_the_watch_is_named(tmp_path) -> None:
    """Baseline 4 s, window 4 s (80 simulated seconds each); the load doubles 4 s after the watch
    starts: the one-shot names the request rate, as the service does."""
    (_, capped), (_, doubled) = CASES["load step"][0].phases
    plan = ScenarioPlan("load step", ((0.0, capped), (WARMUP + 4 * SCALE, doubled)))
    with EmulatorFleet([TargetSpec("step", plan, time_scale=SCALE, warmup_s=WARMUP, seed=3)]) as fleet:
        result = oneshot.run(fleet.urls["step"] + "/metrics", window=4.0, interval=0.25, baseline=4.0)
    changes = result.changes
    assert changes is not None and changes["changed"], changes
    assert changes["drivers"][0]["name"] == "load", changes["summary"]
    assert changes["baseline"]["kind"] == "previous"
    assert changes["summary"].startswith(("TTFT p99", "TTFT mean")) and "request rate +" in changes["summary"]
    text = oneshot.format_text(result)
    assert f"What changed: {changes['summary']}" in text and "  - request rate: " in text
    assert result.to_dict()["changes"] == changes
    # the diagnosis reads the window after the baseline only: 4 s of a 8 s watch
    assert result.latency["window_seconds"] == pytest.approx(4.0, abs=0.5)


def test_without_a_baseline_there_is_no_change_and_a_short_baseline_is_refused() -> None:
    with EmulatorFleet([TargetSpec("fine", "healthy", time_scale=SCALE, warmup_s=60, seed=3)]) as fleet:
        url = fleet.urls["fine"] + "/metrics"
        result = oneshot.run(url, window=2.0, interval=0.5)
        assert result.changes is None and "changes" not in result.to_dict()
        done = subprocess.run([sys.executable, "-m", "app.cli", "diagnose", url, "--baseline", "1s", "--interval",
                               "1s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--baseline (1s) must be at least three --interval (1s)" in done.stderr


def test_configuration_changes_between_scrapes_are_events() -> None:
    from app.scrape.jobs import PageProcessor
    from app.store.record import ScrapeRecord

    def record(ts: float, caching: str) -> ScrapeRecord:
        page = ("# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="{caching}"}} 1\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{model_name="m"} 1\n')
        parsed, canonical, _ = PageProcessor("vllm").process(page.encode())
        return ScrapeRecord(1, ts, True, 0.001, 0, 0, 0, 0, "vllm", None, None, canonical)

    records = [record(1.0, "True"), record(2.0, "True"), replace(record(3.0, "False")), record(4.0, "False")]
    (event,) = oneshot._config_events(records)
    assert (event.kind, event.ts, event.subject, event.before, event.after) == (
        "config", 3.0, "cache_config.enable_prefix_caching", "True", "False")
