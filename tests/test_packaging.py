"""The wheel is enough: ``pip install .`` (or pipx, or ``pip install git+...``) gives a
service that migrates its database and serves the API, the runbooks and ``/docs``.

A wheel is built from a copy of the files the build reads (so a stale ``build/`` in the
checkout cannot help), installed into a fresh virtual environment (dependencies from the
package index), and run from a directory outside the repository with no PYTHONPATH, so
nothing of the checkout can be imported: ``llm-latency db upgrade`` on SQLite and on a
fresh PostgreSQL database, then ``llm-latency serve`` answering over HTTP.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.alerts.config import ALERT_RUNBOOKS
from app.store.db import head_revision

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "app", "alembic", "docs/runbooks")


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                            check=False)
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """(the venv's bin directory, an environment without the checkout) with the wheel installed."""
    work = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LLM_LATENCY_", "VIRTUAL_ENV"))}
    source = work / "src"
    for name in BUILD_INPUTS:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", source, "-w", work / "dist", cwd=work, env=env)
    wheels = list((work / "dist").glob("llm_latency_monitor-*.whl"))
    assert len(wheels) == 1, wheels
    run(sys.executable, "-m", "venv", work / "venv", cwd=work, env=env)
    bin_dir = work / "venv" / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "--disable-pip-version-check", wheels[0], cwd=work, env=env)
    shutil.rmtree(source)  # the installed wheel must stand alone
    where = run(bin_dir / "python", "-c", "import app, app.runtime.resources as r; print(app.__file__); "
                "print(r.migrations_dir()); print(r.runbooks_dir())", cwd=work, env=env).stdout.split()
    site = work / "venv" / "lib"
    assert all(Path(p).is_relative_to(site) for p in where), where  # app, migrations, runbooks: in the venv
    yield bin_dir, env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_installed_wheel_migrates_and_serves(installed, database_url: str, tmp_path: Path) -> None:
    bin_dir, base_env = installed
    env = {**base_env, "LLM_LATENCY_DATABASE_URL": database_url, "LLM_LATENCY_DATA_DIR": str(tmp_path / "data")}
    upgraded = run(bin_dir / "llm-latency", "db", "upgrade", cwd=tmp_path, env=env, timeout=120)
    assert upgraded.stdout == "database at revision head\n"
    current = run(bin_dir / "llm-latency", "db", "current", cwd=tmp_path, env=env, timeout=120)
    head = head_revision()  # the checkout's migrations are the ones the wheel was built from
    assert head is not None and current.stdout == f"current: {head}  head: {head}\n"

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([bin_dir / "llm-latency", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                  cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = http.get("/healthz")
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            assert health.status_code == 200
            ready = http.get("/readyz")
            assert ready.status_code == 200, ready.text
            runbook = http.get("/runbooks/queueing")
            assert runbook.status_code == 200 and runbook.headers["content-type"] == "text/html; charset=utf-8"
            assert "<h1>Runbook: queueing</h1>" in runbook.text and "<strong>Verify the fix.</strong>" in runbook.text
            index = http.get("/runbooks")
            assert index.text.count('<li data-runbook="') == len(set(ALERT_RUNBOOKS.values())) == 24
            docs = http.get("/docs")
            assert docs.status_code == 200 and 'src="/docs/assets/swagger-ui-bundle.js"' in docs.text
            script = http.get("/docs/assets/swagger-ui-bundle.js")
            assert script.status_code == 200 and len(script.content) > 1_000_000
            assert http.get("/docs/assets/swagger-ui.css").status_code == 200
            assert http.get("/ui/status.css").status_code == 200
            assert http.get("/").status_code == 200
    finally:
        os.kill(server.pid, signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal (exit -15) or exits 0
        assert server.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
