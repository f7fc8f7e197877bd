"""``llm-latency probe``: a table (or JSON) on stdout, progress on stderr, exit 1 on failed requests."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from app.emulator import EmulatorFleet, TargetSpec
from app.probe.cli import probe
from tests.probe.servers import FakeOpenAI


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet([TargetSpec("solo", "healthy", synthetic=False, time_scale=2.0)]) as f:
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
    assert level["itl"]["mean"] * 2.0 == pytest.approx(floor, rel=0.08)  # time_scale 2
    assert level["ttft"]["count"] == 2 and level["itl"]["count"] == 2 * 11


def test_failed_requests_exit_non_zero():
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(probe, [fake.url("http500"), "--requests", "3", "--max-tokens", "4"])
    assert result.exit_code == 1
    assert "3 of 3 requests failed: http_status=3" in result.stderr
    assert "http_status=3" in result.stdout  # the table's errors column


@pytest.mark.parametrize("args, option, needle", [
    (["--concurrency", "0"], "--concurrency", "between 1 and 1024"),
    (["--concurrency", "1,two"], "--concurrency", "integers separated by commas"),
    (["--prompt-tokens", "0"], "--prompt-tokens", "0 is not in the range"),
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
