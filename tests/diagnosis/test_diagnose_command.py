"""``llm-latency diagnose URL``: one-shot checks of live (emulated) engines over HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from app.emulator.server import EmulatorFleet, TargetSpec
from tests.support.pages import StaticPageServer

pytestmark = pytest.mark.slow


def diagnose(*args: str, public_url: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLM_LATENCY_PUBLIC_URL"}
    if public_url:
        env["LLM_LATENCY_PUBLIC_URL"] = public_url
    return subprocess.run([sys.executable, "-m", "app.cli", "diagnose", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture(scope="module")
def fleet():
    specs = [TargetSpec("busy", "queueing", time_scale=5, warmup_s=60, seed=5),
             TargetSpec("fine", "healthy", time_scale=5, warmup_s=60, seed=5),
             TargetSpec("idle", "healthy", time_scale=1, synthetic=False, seed=5)]
    with EmulatorFleet(specs) as running:
        yield running


def test_queueing_engine_exits_1_with_the_split_and_the_remedy(fleet) -> None:
    result = diagnose(fleet.urls["busy"] + "/metrics", "--window", "6s", "--interval", "1s")
    assert result.returncode == 1, result.stderr
    assert "Diagnosis [meta-llama/Llama-3.1-8B-Instruct]: queueing" in result.stdout
    assert "[PRIMARY] queueing" in result.stdout and "raise --max-num-seqs" in result.stdout
    queue_row = next(line for line in result.stdout.splitlines() if line.strip().startswith("queue"))
    assert float(re.findall(r"([\d.]+) s\b", queue_row)[-1]) > 5  # mean queue time, seconds
    assert re.search(r" ≈\d+$", queue_row)  # the count is an increase() estimate, rounded
    # the runbook: its path on a monitor, or its URL when the monitor's external URL is known
    assert "      runbook: /runbooks/queueing" in result.stdout.splitlines()
    linked = diagnose(fleet.urls["busy"] + "/metrics", "--window", "2s", "--interval", "1s",
                      public_url="https://monitor.example.com/")
    assert linked.returncode == 1, linked.stderr
    assert "      runbook: https://monitor.example.com/runbooks/queueing" in linked.stdout.splitlines()


def test_healthy_engine_exits_0_and_json_has_the_numbers(fleet) -> None:
    result = diagnose(fleet.urls["fine"] + "/metrics", "--window", "6s", "--interval", "1s", "--json",
                      "--gpu", "A100-80G", "--model", "llama-3.1-8b")
    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["engine"] == "vllm" and body["scrapes"] == 7 and body["exit_code"] == 0
    assert body["diagnoses"][0]["verdict"] == "healthy"
    assert 0.005 < body["latency"]["itl"]["mean"] < 0.05
    assert body["diagnoses"][0]["signals"]["decode_floor_seconds"] == pytest.approx(8.03e9 * 2 / 2.039e12)


def test_idle_engine_is_insufficient_data_and_dead_url_is_unreachable(fleet) -> None:
    idle = diagnose(fleet.urls["idle"] + "/metrics", "--window", "2s", "--interval", "1s")
    assert idle.returncode == 4, idle.stdout
    assert "insufficient_data" in idle.stdout
    dead = diagnose("http://127.0.0.1:1/metrics", "--window", "2s", "--interval", "1s")
    assert dead.returncode == 3 and "scrape problem: connect" in dead.stdout
    bad = diagnose("ftp://x/metrics")
    assert bad.returncode == 2 and "URL scheme must be http or https" in bad.stderr
    bad = diagnose(fleet.urls["idle"] + "/metrics", "--gpu", "TPU")
    assert bad.returncode == 2 and "unknown gpu 'TPU'" in bad.stderr


def test_a_url_without_the_metrics_path_gets_the_url_it_probably_meant(fleet) -> None:
    """``http://host:8000`` answers 404 (vLLM's API server) or an HTML page (a UI in front):
    exit 3 at once with the ``/metrics`` URL to use instead, in text and JSON."""
    base = fleet.urls["idle"]
    result = diagnose(base, "--window", "30s", "--interval", "1s")
    assert result.returncode == 3, result.stdout
    assert result.stdout.splitlines()[1:3] == ["  scrape problem: http_status: HTTP 404 Not Found",
                                               f"  did you mean {base}/metrics?"]
    assert "Traceback" not in result.stderr
    with StaticPageServer("<!doctype html><html><body>Chat UI</body></html>", content_type="text/html",
                          path="/") as ui:
        ui_base = ui.base_url
        result = diagnose(ui_base + "/", "--window", "30s", "--interval", "1s", "--json")
    body = json.loads(result.stdout)
    assert (result.returncode, body["exit_code"], body["scrapes"]) == (3, 3, 1)  # did not wait out the window
    assert body["hint"] == f"did you mean {ui_base}/metrics?"
    right = diagnose(base + "/metrics", "--window", "2s", "--interval", "1s", "--json")
    assert json.loads(right.stdout)["hint"] is None


def test_slow_with_its_rule_silenced_is_unexplained_and_in_range_it_is_healthy(fleet) -> None:
    """The queueing engine (TTFT ~16 s) with queueing's threshold out of reach: no rule explains the TTFT,
    so unexplained (exit 1); with the expected TTFT raised too, every rule was judged and the latency is in
    range: healthy (exit 0)."""
    silenced = ("--threshold", "queue_seconds=10000")
    result = diagnose(fleet.urls["busy"] + "/metrics", "--window", "4s", "--interval", "1s", *silenced)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Diagnosis [meta-llama/Llama-3.1-8B-Instruct]: unexplained" in result.stdout
    ttft = next(line for line in result.stdout.splitlines() if "- TTFT mean = " in line)
    assert float(re.findall(r"= ([\d.]+) s", ttft)[0]) > 10 and "(> 10.00 s)" in ttft
    assert re.search(r"- queueing = judged, quiet \(conditions not met: mean queue time = [\d.]+ s \(>= 10000",
                     result.stdout)
    widened = diagnose(fleet.urls["busy"] + "/metrics", "--window", "4s", "--interval", "1s", *silenced,
                       "--threshold", "expected_ttft_seconds=600")
    assert widened.returncode == 0, widened.stdout + widened.stderr
    assert "Diagnosis [meta-llama/Llama-3.1-8B-Instruct]: healthy (every regime judged, none found, latency in its " \
           "expected range)" in widened.stdout


def test_a_bad_threshold_is_refused_naming_it() -> None:
    result = diagnose("http://127.0.0.1:9/metrics", "--threshold", "expected_ttft_seconds=soon")
    assert result.returncode == 2 and "Invalid value for '--threshold': expected_ttft_seconds: Input should be a " \
                                       "valid number" in result.stderr
    result = diagnose("http://127.0.0.1:9/metrics", "--threshold", "expected_ttft")
    assert result.returncode == 2 and "'expected_ttft': expected NAME=VALUE" in result.stderr


def test_sglang_04_docs_page_live_is_never_called_healthy() -> None:
    """SGLang's own 0.4 page (2,826 waiting, 213.6 s mean TTFT) served as a live engine whose counters grow
    as the ~1,000 s run its numbers imply: queueing from its gauges; without the waiting gauge, unexplained."""
    import time

    from tests.diagnosis.test_not_judged import EXPOSITION, _scaled

    text = (EXPOSITION / "sglang-v0.4-docs-production_metrics.prom").read_text()
    started = time.monotonic()

    def growing(page: str) -> Callable[[], str]:
        return lambda: _scaled(page, (980.0 + time.monotonic() - started) / 1000.0)

    no_gauge = "".join(line for line in text.splitlines(keepends=True) if "sglang:num_queue_reqs" not in line)
    for page, verdict in ((text, "queueing"), (no_gauge, "unexplained")):
        with StaticPageServer(growing(page)) as server:
            result = diagnose(server.url, "--window", "4s", "--interval", "1s")
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"Diagnosis [meta-llama/Llama-3.1-8B-Instruct]: {verdict}" in result.stdout
        assert f"[PRIMARY] {verdict} (critical" in result.stdout
