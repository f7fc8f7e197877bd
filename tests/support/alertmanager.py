"""Run a real, throw-away Alertmanager (Debian's ``prometheus-alertmanager``) for tests.

No clustering (``--cluster.listen-address=``), everything routed to one webhook, stopped
by PID on exit. A missing binary follows :func:`tests.support.components.require_binary`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support.components import require_binary
from tests.support.prometheus import free_port

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


@contextlib.contextmanager
def running_alertmanager(tmp_path: Path, webhook_url: str, resolve_timeout: str | None = None) -> Iterator[str]:
    """Start Alertmanager (no clustering) routing everything to ``webhook_url``; yield its URL.
    ``resolve_timeout`` sets ``global.resolve_timeout`` (after it, Alertmanager resolves an
    alert posted without ``endsAt`` that was not posted again). Stopped by PID on exit."""
    exe = require_binary(ALERTMANAGER, "Alertmanager routing the exported alerts to a webhook")
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        (f"global:\n  resolve_timeout: {resolve_timeout}\n" if resolve_timeout else "") +
        "route:\n  receiver: webhook\n  group_by: [alertname]\n  group_wait: 1s\n  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n  - name: webhook\n    webhook_configs:\n"
        f"      - url: {webhook_url}\n        send_resolved: true\n")
    log_path = tmp_path / "alertmanager.log"
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [exe, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", f"--web.external-url={url}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 30
            ready = False
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                        ready = True
                        break
                time.sleep(0.05)
            if not ready:
                tail = log_path.read_text(errors="replace")[-2000:]
                if "address already in use" in tail and attempt < 2:
                    continue
                raise RuntimeError(f"alertmanager did not become ready (exit {proc.poll()}):\n{tail}")
            yield url
            return
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
