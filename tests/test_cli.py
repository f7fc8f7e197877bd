"""The ``llm-latency`` command in a real process: failures are one line on stderr with a
non-zero exit, never a traceback, and the service announces itself only once it listens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.store.db import head_revision
from tests.support.prometheus import free_port

ROOT = Path(__file__).resolve().parents[1]


def llm_latency(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process-like listener holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_serve_on_a_busy_port_exits_1_naming_the_port_without_a_banner(busy_port: int, tmp_path: Path) -> None:
    result = llm_latency("serve", "--port", str(busy_port), env={"LLM_LATENCY_DATA_DIR": str(tmp_path)})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"Error: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"


def test_demo_on_a_busy_port_exits_1_before_starting_anything(busy_port: int, tmp_path: Path) -> None:
    result = llm_latency("demo", "--port", str(busy_port), "--data-dir", str(tmp_path / "demo"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"Error: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"
    assert not (tmp_path / "demo").exists()  # no engines, no database: it stopped at the port


def test_a_blank_token_does_not_open_a_public_listen_address(tmp_path: Path) -> None:
    result = llm_latency("serve", "--host", "0.0.0.0", "--port", str(free_port()),
                         env={"LLM_LATENCY_API_TOKEN": "", "LLM_LATENCY_DATA_DIR": str(tmp_path)})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("Error: refusing to listen on '0.0.0.0' without LLM_LATENCY_API_TOKEN; set a token, "
                             "or LLM_LATENCY_ALLOW_UNAUTHENTICATED_PUBLIC=true to accept the risk\n")


def test_serve_with_a_bad_config_lists_its_problems_and_does_not_start(tmp_path: Path) -> None:
    config = tmp_path / "targets.yaml"
    config.write_text("targets:\n  - name: a\n    url: http://10.0.0.5:8000/metrics\n    scrape_interval: 15\n"
                      "alerts:\n  receivers:\n    - {name: r, url: 'gopher://hooks/x'}\n", encoding="utf-8")
    result = llm_latency("serve", "--config", str(config), "--port", str(free_port()),
                         env={"LLM_LATENCY_DATA_DIR": str(tmp_path)})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"{config}:4: targets[0].scrape_interval: a duration needs a unit, e.g. 15s",
        f"{config}:7: alerts.receivers[0].url: URL scheme must be http or https, got 'gopher'",
    ]


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "current"], ["db", "downgrade", "base"]])
def test_db_commands_with_postgresql_down_print_one_line_naming_the_database(command: list[str]) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://monitor:hunter2@127.0.0.1:{port}/llm"
    result = llm_latency(*command, env={"LLM_LATENCY_DATABASE_URL": url})
    assert (result.returncode, result.stdout) == (1, "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: database postgresql+psycopg://monitor:***@127.0.0.1:{port}/llm: "
                               f"connection failed: connection to server at \"127.0.0.1\", port {port} failed: ")
    assert "Connection refused" in lines[0]
    assert "hunter2" not in result.stderr


@pytest.mark.slow
def test_serve_prints_its_banner_once_it_answers_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LLM_LATENCY_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"})
    try:
        banner = proc.stdout.readline()  # blocks until the service printed it
        assert banner == f"LLM Latency Monitor on http://127.0.0.1:{port}  (API docs: /docs)\n"
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200  # already serving
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_serve_with_postgresql_down_prints_one_line_and_no_banner() -> None:
    port = free_port()  # nothing listens there
    result = llm_latency("serve", "--port", str(free_port()),
                         env={"LLM_LATENCY_DATABASE_URL": f"postgresql+psycopg://monitor:hunter2@127.0.0.1:{port}/llm"})
    assert (result.returncode, result.stdout) == (1, "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"Error: database postgresql+psycopg://monitor:***@127.0.0.1:{port}/llm: ")
    assert "Connection refused" in lines[0] and "hunter2" not in result.stderr


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_serve_on_an_unmigrated_postgresql_says_to_run_db_upgrade(database_url: str) -> None:
    result = llm_latency("serve", "--port", str(free_port()), env={"LLM_LATENCY_DATABASE_URL": database_url})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"Error: database schema is at revision none, the service needs {head_revision()}: "
                             "run `llm-latency db upgrade` first\n")


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not installed on Windows")
def test_the_server_runs_on_uvloop_with_the_httptools_parser() -> None:
    """``serve`` leaves uvicorn's loop and HTTP parser on ``auto``, which take uvloop and
    httptools when installed: both are dependencies (7.6 % more requests in bench/load.py at
    1,000 targets). A packaging that drops them falls back to asyncio's loop and h11 silently;
    this fails instead."""
    import uvicorn
    import uvloop

    config = uvicorn.Config(lambda scope, receive, send: None, log_level="warning")
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    if hasattr(config, "get_loop_factory"):  # newer uvicorn; older ones set the policy
        loop = config.get_loop_factory()()
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()
    else:
        config.setup_event_loop()
        assert isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)
        asyncio.set_event_loop_policy(None)


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    result = llm_latency("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"llm-latency {version('llm-latency-monitor')}\n",
                                                                 "")
    assert version("llm-latency-monitor") == "0.1.0"


def test_diagnose_on_a_refused_connection_says_why_and_stops_there() -> None:
    """Nothing listens: the scrape problem and what to check, exit 3, and no diagnosis of an empty window
    after them (it said "insufficient_data", as if the engine had too little traffic)."""
    port = free_port()
    result = llm_latency("diagnose", f"http://127.0.0.1:{port}/metrics", "--window", "30s", "--interval", "1s")
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"http://127.0.0.1:{port}/metrics  engine: unknown  scrapes: 1"
    assert lines[1].startswith("  scrape problem: connect: cannot connect: ")
    assert lines[2:] == [f"  is the engine running, and does it serve its metrics on 127.0.0.1:{port}?"]
    as_json = llm_latency("diagnose", f"http://127.0.0.1:{port}/metrics", "--json")
    body = json.loads(as_json.stdout)
    assert (as_json.returncode, body["exit_code"], body["diagnoses"], body["latency"]) == (3, 3, [], {})
    assert body["hint"] == f"is the engine running, and does it serve its metrics on 127.0.0.1:{port}?"


def _serve_in(directory: Path, port: int) -> subprocess.Popen[str]:
    """``serve`` started in ``directory`` with no setting of ours in its environment: the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_LATENCY_")}
    return subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], cwd=directory, env={
        **env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C once the banner is out (a clean stop: the lease is given up); its log."""
    try:
        assert proc.stdout is not None and "LLM Latency Monitor on http://" in proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_serve_names_its_sqlite_file_and_a_restart_after_a_clean_stop_warns_of_nothing(tmp_path: Path) -> None:
    port = free_port()
    database = (tmp_path / "data" / "llm-latency.db").resolve()
    first = _stop(_serve_in(tmp_path, port))
    assert f"INFO app.lifespan: created the SQLite database {database}\n" in first and database.is_file()
    second = _stop(_serve_in(tmp_path, port))
    assert f"INFO app.lifespan: using the SQLite database {database}\n" in second
    assert "released at its stop" in second  # the first one's lease, given up at its Ctrl-C
    assert "WARNING" not in second and "expired" not in second, second


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that are free now."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for offset in range(count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", base + offset))
            except OSError:
                continue
        return base
    raise AssertionError(f"no {count} consecutive free ports")


def test_demo_serves_its_engines_on_pinned_ports(tmp_path: Path) -> None:
    base, port = _free_run(6), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--port", str(port), "--engine-port-base",
                             str(base), "--data-dir", str(tmp_path / "demo")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(7)]  # "Emulated engines:" and one line each
        ports = [int(re.search(r":(\d+)/metrics$", line.strip()).group(1)) for line in banner[1:]]
        assert ports == list(range(base, base + 6)), banner
        page = httpx.get(f"http://127.0.0.1:{base + 1}/metrics", timeout=10)
        assert page.status_code == 200 and "vllm:num_requests_waiting" in page.text
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_demo_on_a_taken_engine_port_exits_1_naming_it(tmp_path: Path) -> None:
    base = _free_run(6)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 2))
        holder.listen()
        result = llm_latency("demo", "--port", str(free_port()), "--engine-port-base", str(base),
                             "--data-dir", str(tmp_path / "demo"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"Error: cannot serve the emulated engines on ports {base}–{base + 5}: ")
    assert f"('127.0.0.1', {base + 2})" in result.stderr and "Traceback" not in result.stderr
    bad = llm_latency("demo", "--engine-port-base", "65535")
    assert bad.returncode == 2 and "--engine-port-base" in bad.stderr and "65535" in bad.stderr
