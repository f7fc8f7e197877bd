"""``llm-latency probe``: a table (or JSON) on stdout, progress on stderr, exit 1 on failed requests."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from app.emulator import EmulatorFleet, TargetSpec
from app.probe.cli import probe
from tests.probe.prompt_ladder import LADDER, REQUESTS_PER_LEVEL, engine_ttft, prefill_slope_per_1k
from tests.probe.servers import FakeOpenAI
from tests.support.emulated_timing import check_lag

#: The sweep's target runs at half speed so that a busy machine's lag stays small in simulated seconds.
SWEEP_SCALE = 0.5


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet([TargetSpec("solo", "healthy", synthetic=False, time_scale=2.0),
                        TargetSpec("sweep", "healthy", synthetic=False, time_scale=SWEEP_SCALE)]) as f:
        yield f


def test_probe_prints_a_table_per_concurrency_level(fleet):
    runner = CliRunner()
    result = runner.invoke(probe, [fleet.urls["solo"], "--prompt-tokens", "256", "--max-tokens", "16",
                                   "--concurrency", "1,4", "--requests", "4"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(fleet.urls["solo"] + "/v1/completions  model meta-llama/Llama-3.1-8B-Instruct")
    assert lines[1].split()[:5] == ["conc", "prompt", "output", "reqs", "ok"]
    assert lines[2].split()[:5] == ["1", "256", "16", "4", "4"] and lines[2].endswith("-")
    assert lines[3].split()[:5] == ["4", "256", "16", "4", "4"]
    assert lines[4].startswith("single -> 4: TTFT x")
    assert result.stderr.startswith("probing")  # the progress bar (a bare label when stderr is no terminal)


def test_json_output_has_the_numbers(fleet):
    result = CliRunner().invoke(probe, [fleet.urls["solo"], "--prompt-tokens", "128", "--max-tokens", "12",
                                        "--json", "--chat"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    level = body["levels"][0]
    assert (level["concurrency"], level["requests"], level["succeeded"]) == (1, 2, 2)
    assert level["prompt_tokens_seen"]["mean"] == 128.0 and body["protocol"]["prompt_mode"] == "text"
    floor = fleet.state("solo")["decode_floor_seconds"]
    # time_scale 2; the engine sleeps its decode floor per token: a loaded machine adds to it, never less
    assert floor * 0.92 <= level["itl"]["mean"] * 2.0 <= floor * 1.5
    assert level["ttft"]["count"] == 2 and level["itl"]["count"] == 2 * 11


def test_a_prompt_sweep_reports_the_ladder_and_the_fitted_prefill_cost(fleet):
    """Three prompt lengths at concurrency 1: one level each, the engine's own TTFT of each
    (read from its /metrics around the level) is the roofline's exactly, and the client's
    least-squares TTFT-vs-prompt slope is the roofline's prefill cost within 10 % (why that
    holds on a busy machine: tests/probe/prompt_ladder.py)."""
    args = [fleet.urls["sweep"], "--prompt-tokens", ",".join(map(str, LADDER)), "--max-tokens", "4", "--json"]
    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert [(lv["prompt_tokens"], lv["concurrency"], lv["requests"], lv["succeeded"]) for lv in body["levels"]] == \
        [(p, 1, REQUESTS_PER_LEVEL, REQUESTS_PER_LEVEL) for p in LADDER]
    assert "itl_vs_concurrency" not in body["analysis"] and "load_split" not in body["analysis"]
    # the engine's page was read around every level: exactly the probe's 2 requests each, at the roofline's TTFT
    servers = [lv["server"] for lv in body["levels"]]
    assert [s["requests"] for s in servers] == [2.0, 2.0, 2.0] and all(s["error"] is None for s in servers)
    assert [s["ttft_mean"] for s in servers] == pytest.approx([engine_ttft(p) for p in LADDER], rel=1e-9)
    for level, server in zip(body["levels"], servers):  # the client waits at least as long as the engine
        check_lag(level["ttft"]["mean"] * SWEEP_SCALE, server["ttft_mean"], SWEEP_SCALE, f"{level['prompt_tokens']}")
    fit = body["analysis"]["ttft_vs_prompt"]
    assert fit["n"] == 6 and fit["r2"] > 0.98
    assert 0.09 < prefill_slope_per_1k() < 0.1  # the 8B's prefill on an A100: ~95 ms per 1k tokens
    assert fit["slope_seconds_per_1k_tokens"] * SWEEP_SCALE == pytest.approx(prefill_slope_per_1k(), rel=0.1)


def test_the_engine_page_is_optional(fleet):
    off = CliRunner().invoke(probe, [fleet.urls["solo"], "--max-tokens", "4", "--requests", "1", "--no-metrics",
                                     "--json"])
    assert off.exit_code == 0, off.output
    assert json.loads(off.stdout)["levels"][0]["server"] is None
    with FakeOpenAI() as fake:  # serves no /metrics: recorded, and the probe is unaffected
        result = CliRunner().invoke(probe, [fake.url("ok"), "--max-tokens", "4", "--concurrency", "1,2", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["failed"] == 0 and body["levels"][0]["server"]["source"] == fake.url("ok") + "/metrics"
    assert body["levels"][0]["server"]["error"].startswith("http_status: HTTP 404")
    assert "queue time over the single level is unknown" not in result.stdout  # the TTFT is fast: nothing to say


def test_failed_requests_exit_non_zero():
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(probe, [fake.url("http500"), "--requests", "3", "--max-tokens", "4"])
    assert result.exit_code == 1
    assert "3 of 3 requests failed: http_status=3" in result.stderr
    assert "http_status=3" in result.stdout  # the table's errors column


@pytest.mark.parametrize("args, option, needle", [
    (["--concurrency", "0"], "--concurrency", "between 1 and 1024"),
    (["--concurrency", "1,two"], "--concurrency", "integers separated by commas"),
    (["--prompt-tokens", "0"], "--prompt-tokens", "prompt lengths must be between 1 and 1000000, got 0"),
    (["--prompt-tokens", "512,512"], "--prompt-tokens", "prompt lengths must be distinct"),
    (["--prompt-tokens", "512,2048", "--concurrency", "1,8"], "'--prompt-tokens' / '--concurrency'",
     "only one factor may vary per sweep"),
    (["--metrics-url", "metrics"], "--metrics-url", "http(s) URL"),
    (["--timeout", "soon"], "--timeout", "not a duration"),
    (["--api-key-env", "PROBE_CLI_TEST_UNSET"], "--api-key-env", "is not set"),
    (["--chat", "--prompt-mode", "token_ids"], "--prompt-mode", "token ids need"),
])
def test_bad_arguments_name_the_option(args, option, needle, monkeypatch):
    monkeypatch.delenv("PROBE_CLI_TEST_UNSET", raising=False)
    result = CliRunner().invoke(probe, ["http://127.0.0.1:9", *args])
    assert result.exit_code == 2
    assert option in result.stderr and needle in result.stderr


def test_a_bad_url_is_refused():
    result = CliRunner().invoke(probe, ["localhost:8000"])
    assert result.exit_code == 2 and "URL" in result.stderr and "http(s) URL" in result.stderr
