"""50 concurrent API clients against the real service (uvicorn, scraping targets) never get an
error: the connection pool holds every worker thread, SQLite readers never wait on the writer
long enough to fail ("database is locked"), on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import FIXTURES
from tests.support.pages import StaticPageServer

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 50
PATHS = ("/api/v1/targets", "/", "/api/v1/targets/t03/latency?window=5m", "/api/v1/diagnoses", "/metrics",
         "/api/v1/latency?window=5m", "/readyz")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fifty_concurrent_clients_get_no_error(migrated_url: str, tmp_path: Path) -> None:
    page = (FIXTURES / "exposition" / "vllm-0.32-cpu-real.prom").read_text()
    with StaticPageServer(page) as engine_page:
        config = tmp_path / "targets.yaml"
        config.write_text("targets:\n" + "".join(
            f"  - {{name: t{i:02d}, url: '{engine_page.base_url}/e{i}/metrics', engine: vllm, scrape_interval: 1s}}\n"
            for i in range(20)))
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LLM_LATENCY_DATA_DIR": str(tmp_path),
               "LLM_LATENCY_DATABASE_URL": migrated_url, "LLM_LATENCY_SUMMARY_INTERVAL": "1s",
               "LLM_LATENCY_ALERT_INTERVAL": "1s"}
        log = (tmp_path / "service.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--port",
                                 str(port)], env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, (tmp_path / "service.log").read_text()[-3000:]
                try:
                    if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the service did not start"
                time.sleep(0.3)
            time.sleep(3)  # a few scrapes and rounds written: the clients read real rows

            async def clients() -> tuple[int, dict[str, int]]:
                statuses: dict[str, int] = {}
                done = 0

                async def one(k: int) -> None:
                    nonlocal done
                    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
                        for i in range(4):
                            response = await client.get(PATHS[(k + i) % len(PATHS)])
                            done += 1
                            if response.status_code != 200:
                                key = f"{PATHS[(k + i) % len(PATHS)]} {response.status_code}"
                                statuses[key] = statuses.get(key, 0) + 1

                await asyncio.gather(*(one(k) for k in range(CLIENTS)))
                return done, statuses

            done, errors = asyncio.run(clients())
            metrics = httpx.get(f"{base}/metrics", timeout=60).text
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
        assert done == CLIENTS * 4 and errors == {}, errors
        text = (tmp_path / "service.log").read_text()
        assert "database is locked" not in text and "QueuePool limit" not in text, text[-3000:]
        assert engine_page.requests >= 20  # the service was scraping while the clients read
        assert 'llm_latency_round_duration_seconds_count{round="summaries"}' in metrics
