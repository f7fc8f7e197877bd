"""A probe never exceeds its request count, its concurrency or its time limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.probe.runner import LevelPlan, ProbeSpec, run_probe
from tests.probe.servers import FakeOpenAI


@pytest.fixture
def fake():
    with FakeOpenAI(gap=0.003) as server:
        yield server


def test_request_count_and_concurrency_are_never_exceeded(fake):
    spec = ProbeSpec(fake.url("ok"), prompt_tokens=16, max_tokens=12, concurrency=8, requests=40)
    result = asyncio.run(run_probe(spec))
    level = result.levels[0]
    assert result.preflight_requests == 1
    assert fake.requests["ok"] == 40 + 1  # measured from the server: preflight + exactly `requests`
    assert level.issued == level.succeeded == 40 and result.stopped_by == "done"
    assert fake.max_in_flight == 8 and level.max_in_flight == 8  # reached, never exceeded
    assert sorted(r.index for r in level.requests) == list(range(40))


def test_every_level_keeps_its_own_bounds(fake):
    spec = ProbeSpec(fake.url("ok"), prompt_tokens=16, max_tokens=6, concurrency=4, preflight=False)
    plans = [LevelPlan(1, 16, 6, 3), LevelPlan(4, 16, 6, 9), LevelPlan(2, 16, 6, 1)]
    maxima = []

    def on_request(plan, result):
        maxima.append((plan.concurrency, fake.max_in_flight))

    result = asyncio.run(run_probe(spec, plans, on_request=on_request))
    assert [lv.issued for lv in result.levels] == [3, 9, 1] and fake.requests["ok"] == 13
    assert [lv.max_in_flight for lv in result.levels] == [1, 4, 1]  # a 1-request level cannot run 2
    assert max(m for c, m in maxima if c == 1) == 1 and fake.max_in_flight == 4
    assert len(maxima) == 13


def test_the_time_limit_stops_a_probe_of_a_slow_target(fake):
    """Each answer would take 200 x 50 ms = 10 s; the probe ends at its 0.8 s limit."""
    fake.gap = 0.05
    spec = ProbeSpec(fake.url("ok"), prompt_tokens=16, max_tokens=200, concurrency=3, requests=30, time_limit=0.8,
                     preflight=False)
    t0 = time.monotonic()
    result = asyncio.run(run_probe(spec))
    elapsed = time.monotonic() - t0
    level = result.levels[0]
    assert 0.8 <= elapsed < 5.0  # 10 s if the limit were ignored; the slack is for a loaded machine
    assert result.stopped_by == "time_limit" == level.stopped_by
    assert level.issued == 3 and level.errors == {"cancelled": 3}  # the first wave, cut off; no new requests
    assert all(1 <= r.tokens <= 17 for r in level.requests)  # at most ~0.8 s / 50 ms tokens each, then cut
    assert all("time limit after token" in r.detail for r in level.requests)
    assert fake.requests["ok"] == 3
    deadline = time.monotonic() + 3
    while fake.in_flight and time.monotonic() < deadline:  # the server sees the disconnects
        time.sleep(0.02)
    assert fake.in_flight == 0


def test_levels_after_the_time_limit_are_not_started(fake):
    fake.gap = 0.05
    spec = ProbeSpec(fake.url("ok"), prompt_tokens=16, max_tokens=4, concurrency=2, time_limit=2.0, preflight=False)
    result = asyncio.run(run_probe(spec, [LevelPlan(1, 16, 4, 1), LevelPlan(2, 16, 4, 50), LevelPlan(1, 16, 4, 5)]))
    assert len(result.levels) == 2 and result.stopped_by == "time_limit"
    first, second = result.levels
    assert first.stopped_by == "done" and first.succeeded == 1
    # each request takes at least 3 x 50 ms: 50 of them, 2 at a time, need >= 3.75 s, so level 2
    # cannot finish within the 2 s limit however fast the machine; it runs waves until then
    assert second.stopped_by == "time_limit" and second.issued < 50
    assert second.succeeded >= 2 and second.errors == {"cancelled": second.issued - second.succeeded}
    assert second.issued - second.succeeded <= 2
    assert fake.requests["ok"] == 1 + second.issued


def test_bad_specs_name_the_field():
    for kw, field in [({"concurrency": 0}, "concurrency"), ({"max_tokens": -1}, "max_tokens"),
                      ({"url": "ftp://x"}, "url"), ({"time_limit": 0}, "time_limit"), ({"requests": 0}, "requests"),
                      ({"chat": True, "prompt_mode": "token_ids"}, "prompt_mode"), ({"stall_timeout": 0}, "stall")]:
        args = {"url": "http://127.0.0.1:1", **kw}
        with pytest.raises(ValueError, match=field):
            ProbeSpec(**args).validate()


@pytest.mark.parametrize("url, base", [
    ("http://h:8000", "http://h:8000"), ("http://h:8000/metrics", "http://h:8000"),
    ("http://h:8000/v1/", "http://h:8000"),
    ("https://h/llm/v1/chat/completions", "https://h/llm"), ("http://h:1/gw/v1/completions?x=1", "http://h:1/gw"),
])
def test_the_api_base_is_found_in_any_url_of_the_server(url, base):
    assert ProbeSpec(url).base_url == base
    assert ProbeSpec(url).path == "/v1/completions" and ProbeSpec(url, chat=True).path == "/v1/chat/completions"
