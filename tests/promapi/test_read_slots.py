"""Reads and rounds share a source's connection slots, rounds first: a call made under a request
budget (an API read) takes one of ``max_concurrency // 2`` read slots before a slot of the
client, so however many readers wait, a round gets the rest; a read waits for its slot and its
answer only while its budget lasts (BudgetExceeded, the API's 503 naming the budget)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from app.core.durations import parse_duration
from app.promql.client import PrometheusClient
from app.runtime.budget import BudgetExceeded, RequestBudget, bounded
from tests.promapi.local_api import Answer, LocalAPI, Received

EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


def _gated(gate: threading.Event) -> Callable[[Received], Answer]:
    def handler(request: Received) -> Answer:
        assert gate.wait(30)
        return Answer(body=EMPTY)
    return handler


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _read(client: PrometheusClient, seconds: float, out: list[BaseException | None]) -> None:
    try:
        with bounded(RequestBudget(seconds)):
            client.query("up", 1_800_000_000)
        out.append(None)
    except BaseException as exc:
        out.append(exc)


def test_readers_hold_half_the_slots_and_a_round_gets_the_rest() -> None:
    gate = threading.Event()
    with LocalAPI(_gated(gate)) as api, PrometheusClient(api.url, timeout=20, max_concurrency=4) as client:
        assert client.read_concurrency == 2
        results: list[BaseException | None] = []
        readers = [threading.Thread(target=_read, args=(client, 30.0, results)) for _ in range(6)]
        for thread in readers:
            thread.start()
        _until(lambda: api.in_flight == 2, "two reads in flight")
        time.sleep(0.2)
        assert (api.in_flight, api.max_in_flight) == (2, 2)  # four readers wait for a read slot
        rounds = [threading.Thread(target=client.query, args=("up", 1_800_000_000)) for _ in range(2)]
        for thread in rounds:
            thread.start()
        _until(lambda: api.in_flight == 4, "the round's two queries in flight next to the reads")
        gate.set()
        for thread in [*readers, *rounds]:
            thread.join(30)
        assert results == [None] * 6 and api.max_in_flight == 4 and len(api.received) == 8
        # a read sends its remaining budget as the server's query timeout, a round the client's
        timeouts = sorted(parse_duration(r.params["timeout"][0]) for r in api.received)
        assert timeouts[-2:] == [20.0, 20.0] and all(0 < t <= 30.0 for t in timeouts[:6])


def test_a_read_stops_when_its_budget_is_spent_waiting_for_a_slot_or_an_answer() -> None:
    gate = threading.Event()
    with LocalAPI(_gated(gate)) as api, PrometheusClient(api.url, timeout=20, max_concurrency=2) as client:
        assert client.read_concurrency == 1
        held: list[BaseException | None] = []
        holder = threading.Thread(target=_read, args=(client, 30.0, held))
        holder.start()
        _until(lambda: api.in_flight == 1, "the one read slot taken")
        waited: list[BaseException | None] = []
        _read(client, 0.3, waited)  # no read slot within its budget: never sent
        assert isinstance(waited[0], BudgetExceeded) and waited[0].seconds == 0.3
        assert len(api.received) == 1
        gate.set()
        holder.join(30)
        assert held == [None]
        gate.clear()
        slow: list[BaseException | None] = []
        _read(client, 0.5, slow)  # sent, but the answer does not come within the budget
        assert isinstance(slow[0], BudgetExceeded) and len(api.received) == 2
        assert parse_duration(api.received[-1].params["timeout"][0]) <= 0.5
        gate.set()
        client.query("up", 1_800_000_000)  # a round is not bounded by any request's budget
        assert len(api.received) == 3


def test_a_round_outside_any_budget_waits_for_its_slot() -> None:
    gate = threading.Event()
    with LocalAPI(_gated(gate)) as api, PrometheusClient(api.url, timeout=20, max_concurrency=1) as client:
        first = threading.Thread(target=client.query, args=("up", 1_800_000_000))
        first.start()
        _until(lambda: api.in_flight == 1, "the only slot taken")
        second = threading.Thread(target=client.query, args=("up", 1_800_000_000))
        second.start()
        time.sleep(0.3)
        assert api.in_flight == 1 and len(api.received) == 1
        gate.set()
        first.join(30)
        second.join(30)
        assert len(api.received) == 2 and api.max_in_flight == 1


def test_the_budget_of_a_read_reaches_the_pool_that_sends_its_queries() -> None:
    """``map`` runs each call in the caller's context: its request budget bounds the pool's calls."""
    gate = threading.Event()
    with LocalAPI(_gated(gate)) as api, PrometheusClient(api.url, timeout=20, max_concurrency=4) as client:
        with bounded(RequestBudget(0.4)), pytest.raises(BudgetExceeded):
            client.map(lambda q: client.query(q, 1_800_000_000), ["a", "b", "c"])
        assert api.max_in_flight == 2  # the map's three calls shared the two read slots
        gate.set()


def test_a_read_with_too_little_budget_left_sends_nothing() -> None:
    gate = threading.Event()
    gate.set()
    with LocalAPI(_gated(gate)) as api, PrometheusClient(api.url, timeout=20, max_concurrency=4) as client:
        late: list[BaseException | None] = []
        _read(client, 0.05, late)  # free slots, but less than MIN_READ_SECONDS (0.1 s) to ask anything
        assert isinstance(late[0], BudgetExceeded) and api.received == []
        ok: list[BaseException | None] = []
        _read(client, 5.0, ok)
        assert ok == [None] and len(api.received) == 1
