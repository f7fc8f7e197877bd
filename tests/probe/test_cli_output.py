"""``llm-latency probe`` as a user runs it (a real process, default log level): no log line
per request, the engine's own view of every level in the text table, a progress line per
level on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.emulator import EmulatorFleet, TargetSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet([TargetSpec("solo", "healthy", synthetic=False, time_scale=2.0)]) as f:
        yield f


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "probe", *args], capture_output=True, text=True,
                          timeout=300)


def test_the_text_table_has_the_engine_view_and_stderr_has_progress_not_request_logs(fleet) -> None:
    result = probe(fleet.urls["solo"], "--prompt-tokens", "128", "--max-tokens", "4", "--concurrency", "1,2",
                   "--requests", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    head = lines[1].split("  ")
    columns = [c.strip() for c in head if c.strip()]
    assert columns[-3:] == ["engine queue", "engine ttft", "errors"]
    rows = [line.split() for line in lines[2:4]]
    assert [row[:5] for row in rows] == [["1", "128", "4", "3", "3"], ["2", "128", "4", "3", "3"]]
    for row in rows:  # the engine served exactly these requests: both of its means are numbers
        queue, ttft = row[-3], row[-2]
        assert queue.endswith("ms") and ttft.endswith("ms"), row
        assert 0 <= float(queue[:-2]) < float(ttft[:-2])  # queue time is part of the engine's TTFT
    assert "HTTP Request:" not in result.stderr and "HTTP Request:" not in result.stdout
    assert result.stderr.splitlines() == [
        "probing: 2 level(s), 6 request(s)",
        "probing: level 1/2 done (concurrency 1, prompt 128 tokens): 3/3 ok, 3/6 requests",
        "probing: level 2/2 done (concurrency 2, prompt 128 tokens): 3/3 ok, 6/6 requests",
    ]


def test_without_the_engine_page_the_table_has_no_engine_columns(fleet) -> None:
    result = probe(fleet.urls["solo"], "--max-tokens", "4", "--requests", "1", "--no-metrics")
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[1]
    assert "engine" not in header and header.split()[-1] == "errors"
    assert result.stdout.splitlines()[2].split()[:5] == ["1", "512", "4", "1", "1"]


def test_an_unreadable_engine_page_is_named_under_the_table(fleet) -> None:
    missing = fleet.urls["solo"] + "/no-such-page"
    result = probe(fleet.urls["solo"], "--max-tokens", "4", "--requests", "1", "--metrics-url", missing)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2].split()[-3:] == ["-", "-", "-"]  # no engine view, no errors
    assert lines[3] == f"engine page ({missing}): http_status: HTTP 404 Not Found"
