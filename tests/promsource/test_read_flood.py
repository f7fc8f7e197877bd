"""Readers without a token cannot load the user's Prometheus or starve the service: 40 concurrent
``GET /api/v1/slos`` (each distinct, so none share an answer) against a source whose server takes
0.25 s a query. The reads hold at most the source's read slots (2 of its 4), each answers within
its budget (here all 503 naming it: an SLO read needs several queries, and 40 share two
slots), the server gets a number of queries bounded by the slots and
the time, and ``/healthz`` answers within a second throughout. The server is the scripted
Prometheus of tests/promsource/test_route_parameters.py."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from app.core.durations import parse_duration
from app.main import create_app
from app.promql.client import PrometheusClient
from app.settings import Settings
from app.store import db
from tests.promapi.local_api import Answer, LocalAPI, Received
from tests.promsource.test_route_parameters import _api
from tests.support.live_app import serving

DELAY = 0.25
BUDGET = 2.0
READERS = 40
READ_SLOTS = 2  # max_concurrency 4 // 2


class _Sends:
    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()


def _count_sends(client: PrometheusClient) -> _Sends:
    """Count the requests ``client`` has out at once (its ``_send``, inside its slots)."""
    counts, send = _Sends(), client._send

    def counted(*args: object, **kwargs: object) -> tuple[int, bytes]:
        with counts.lock:
            counts.in_flight += 1
            counts.max_in_flight = max(counts.max_in_flight, counts.in_flight)
        try:
            return send(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with counts.lock:
                counts.in_flight -= 1

    client._send = counted  # type: ignore[method-assign]
    return counts


def test_a_read_flood_keeps_to_the_read_slots_and_the_budget(tmp_path: Path) -> None:
    slow = threading.Event()

    def prometheus(request: Received) -> Answer:
        """The scripted answers, each after DELAY, or a timeout error once the query's own
        ``timeout`` is up (as Prometheus abandons a query past it)."""
        if slow.is_set():
            limit = parse_duration(request.params.get("timeout", ["1h"])[0])
            time.sleep(min(DELAY, limit))
            if limit < DELAY:
                return Answer(503, json.dumps({"status": "error", "errorType": "timeout", "error": "timeout"}).encode())
        return _api(request)

    url = f"sqlite:///{tmp_path / 'flood.db'}"
    db.upgrade(url)
    with LocalAPI(prometheus) as server:
        config = tmp_path / "t.yaml"
        config.write_text(f"""
targets: []
diagnosis: {{interval: 1h, window: 60s}}
sources:
  - {{name: prod, url: "{server.url}", selector: '{{namespace="llm"}}', target_labels: [namespace, pod],
      max_concurrency: 4}}
slos:
  - {{name: chat, signal: ttft, threshold: 1s, objective: 99%, period: 7d}}
""")
        app = create_app(Settings(database_url=url, data_dir=tmp_path, config_file=config, api_request_budget=BUDGET,
                                  default_scrape_interval="1h", summary_interval="1h"))
        with serving(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            app.state.monitor.evaluate_diagnoses()  # the source's replicas become targets
            sending = _count_sends(app.state.monitor.sources.get("prod").client)
            assert client.get("/api/v1/slos").status_code == 200
            slow.set()
            sent_before, server.max_in_flight, sending.max_in_flight = len(server.received), 0, 0
            health: list[float] = []
            began = time.monotonic()

            def read(n: int) -> tuple[int, float, str]:
                t0 = time.monotonic()
                response = client.get("/api/v1/slos", params={"reader": n})
                return response.status_code, time.monotonic() - t0, response.text

            with ThreadPoolExecutor(READERS) as pool:
                answers = pool.map(read, range(READERS))
                for _ in range(5):
                    t0 = time.monotonic()
                    assert client.get("/healthz").status_code == 200
                    health.append(time.monotonic() - t0)
                    time.sleep(0.3)
                answers = list(answers)
            elapsed = time.monotonic() - began
            sent = len(server.received) - sent_before
            alone = client.get("/api/v1/slos", params={"reader": "alone"})  # the flood is over: it is answered
            assert alone.status_code == 200 and alone.json()[0]["name"] == "chat"
    statuses = sorted({status for status, _, _ in answers})
    assert set(statuses) <= {200, 503} and 503 in statuses
    assert all("LLM_LATENCY_API_REQUEST_BUDGET" in text for status, _, text in answers if status == 503)
    # the service never had more queries out than its read slots (the server may still be finishing
    # one the service stopped waiting for when its budget ran out)
    assert sending.max_in_flight == READ_SLOTS and server.max_in_flight <= READ_SLOTS + 2
    # each slot answers one query per DELAY at most (over the flood's own elapsed time, however loaded the
    # machine); 40 unbounded reads would have sent ~6 queries each
    assert sent <= READ_SLOTS * (elapsed / DELAY) + READ_SLOTS < READERS * 6
    assert max(health) < 1.0, health
    assert max(seconds for _, seconds, _ in answers) < BUDGET * 3 + 10  # every read stopped near its budget
