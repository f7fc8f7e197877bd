"""The ``emulate`` command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from app.emulator import scenarios
from app.emulator.cli import build_specs, emulate, parse_target
from app.emulator.readout import Page


@pytest.mark.parametrize("text, expected", [
    ("api=healthy", ("api", "healthy", "vllm", None)),
    ("api=healthy@8001", ("api", "healthy", "vllm", 8001)),
    ("api=healthy:tgi", ("api", "healthy", "tgi", None)),
    ("api=queueing:vllm-legacy@9000", ("api", "queueing", "vllm-legacy", 9000)),
    ("api=healthy->queueing@60", ("api", "healthy->queueing@60", "vllm", None)),
    ("api=healthy->queueing@60@8001", ("api", "healthy->queueing@60", "vllm", 8001)),
    ("api=healthy->queueing@60:tgi@8001", ("api", "healthy->queueing@60", "tgi", 8001)),
])
def test_parse_target(text, expected):
    assert parse_target(text) == expected


def test_build_specs_assigns_ports_and_seeds():
    specs = build_specs(("healthy", "queueing"), ("x=kv_cache_pressure:tgi@9100",), engine="vllm", port=8100,
                        seed=7, time_scale=2.0, model_name=None, host="127.0.0.1", warmup=0.0)
    assert [(s.name, s.scenario, s.engine, s.port, s.seed) for s in specs] == [
        ("healthy", "healthy", "vllm", 8100, 7), ("queueing", "queueing", "vllm", 8101, 8),
        ("x", "kv_cache_pressure", "tgi", 9100, 9)]
    assert all(s.time_scale == 2.0 for s in specs)


def test_list_scenarios():
    result = CliRunner().invoke(emulate, ["--list-scenarios"])
    assert result.exit_code == 0
    for name in scenarios.names():
        assert re.search(rf"^{name}\s", result.output, re.M)
    assert result.output.count("Signature") == len(scenarios.names())


@pytest.mark.parametrize("args, needle", [
    ([], "at least one --scenario or --target"),
    (["--scenario", "nope"], "unknown scenario 'nope'; valid: healthy, healthy_bursty"),
    (["--target", "a=healthy:lmdeploy"], "unknown engine 'lmdeploy'"),
    (["--target", "healthy"], "expected name=scenario"),
    (["--target", "a=healthy", "--target", "a=queueing"], "duplicate target name"),
    (["--scenario", "healthy->queueing"], "expected NAME@SECONDS"),
    (["--scenario", "healthy", "--engine", "lmdeploy"], "lmdeploy"),
    (["--scenario", "healthy", "--time-scale", "0"], "time-scale"),
])
def test_bad_arguments(args, needle):
    result = CliRunner().invoke(emulate, args)
    assert result.exit_code == 2
    assert needle in result.output


def test_runs_until_sigint():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.emulator.cli", "--scenario", "healthy", "--target",
                             "t=queueing:tgi", "--time-scale", "5", "--warmup", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        urls = {}
        deadline = time.monotonic() + 30
        while len(urls) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.match(r"^(\S+)\s+\S+\s+\S+\s+(http://\S+)/metrics$", line.strip())
            if m:
                urls[m[1]] = m[2]
        assert set(urls) == {"healthy", "t"}, proc.stderr.read() if proc.poll() is not None else urls
        page = Page(httpx.get(urls["healthy"] + "/metrics", timeout=10).content)
        assert page.hist("vllm:time_to_first_token_seconds").count > 20  # warmed up
        assert "tgi_queue_size" in httpx.get(urls["t"] + "/metrics", timeout=10).text
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
