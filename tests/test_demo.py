"""``llm-latency demo``, the Quick start's first command, run exactly as a user runs it.

The promise of the demo: within a minute or two of starting it, a new user sees each
emulated engine diagnosed with its own regime side by side, and Ctrl-C stops it
cleanly. This runs the console command in a subprocess with its default time scale,
scrape interval and diagnosis schedule, and reads the verdicts over HTTP.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.cli import DEMO_TARGETS
from tests.support.prometheus import free_port

pytestmark = pytest.mark.slow

#: the regime each demo target is built to show ("healthy" for the healthy one)
EXPECTED = {name: ("healthy" if scenario.startswith("healthy") else scenario) for name, scenario, _ in DEMO_TARGETS}
#: "within a minute or two": the verdicts must all be right by then
DEADLINE_S = 120.0


def test_demo_shows_every_regime_side_by_side_within_two_minutes(tmp_path: Path) -> None:
    command = shutil.which("llm-latency")
    assert command, "the llm-latency console command is not installed (pip install -e .)"
    port = free_port()
    proc = subprocess.Popen([command, "demo", "--port", str(port), "--data-dir", str(tmp_path / "demo")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    started = time.monotonic()
    verdicts: dict[str, str] = {}
    seen_at: float | None = None
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            while time.monotonic() - started < DEADLINE_S and proc.poll() is None:
                try:
                    response = client.get("/api/v1/diagnoses")
                except httpx.TransportError:
                    response = None  # not listening yet
                if response is not None and response.status_code == 200:
                    verdicts = {d["target"]: d["verdict"] for d in response.json()}
                    if verdicts == EXPECTED:
                        seen_at = time.monotonic() - started
                        break
                time.sleep(2)
            assert proc.poll() is None, proc.stdout.read()
            assert seen_at is not None, f"after {DEADLINE_S:.0f} s: {verdicts} != {EXPECTED}"
            # Six targets, six different verdicts (five regimes and healthy), on the status page too.
            assert len(set(verdicts.values())) == len(DEMO_TARGETS) == 6
            page = client.get("/")
            assert page.status_code == 200
            for name, regime in EXPECTED.items():
                assert name in page.text and (regime == "healthy" or regime.replace("_", " ") in page.text), regime
            latency = client.get("/api/v1/targets/vllm-queueing/latency", params={"window": "1m"}).json()
            assert latency["ttft"]["count"] > 0 and latency["queue_time"]["mean"] > 1.0, latency["queue_time"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
    # Ctrl-C stops it cleanly, and it told the user where to look.
    assert proc.returncode == 0, output[-2000:]
    assert f"http://127.0.0.1:{port}/docs" in output and f"status page: http://127.0.0.1:{port}/" in output
    print(f"\n[demo] all {len(EXPECTED)} verdicts right after {seen_at:.0f} s")
