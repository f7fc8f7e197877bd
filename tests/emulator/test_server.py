"""HTTP targets: /metrics, the OpenAI API, and client-side timing that agrees with the server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from app.emulator.exposition import CONTENT_TYPE
from app.emulator.readout import Page, signature
from app.emulator.server import EmulatorFleet, TargetSpec, count_text_tokens, start_targets
from app.emulator.workload import LengthDist
from tests.emulator.helpers import single_stream
from tests.support.emulated_timing import CLIENT_LAG_S, check_span

SOLO_SCALE = 1.0


@pytest.fixture(scope="module")
def fleet():
    specs = [
        TargetSpec("solo", "healthy", synthetic=False, time_scale=SOLO_SCALE, model_name="solo-model"),
        TargetSpec("busy", "healthy", time_scale=5.0, warmup_s=60, seed=1),
        TargetSpec("tgi", "queueing", engine="tgi", time_scale=5.0, warmup_s=30),
        TargetSpec("legacy", "bandwidth_bound", engine="vllm-legacy", time_scale=5.0),
    ]
    with EmulatorFleet(specs) as f:
        yield f
    assert not any(t.name == "emulator-fleet" for t in threading.enumerate())


async def _stream(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """Send a streaming request; return client-side timings (wall seconds) and the chunks."""
    t0 = time.perf_counter()
    times, texts, usage, reasons = [], [], None, []
    async with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            data = json.loads(payload)
            if data.get("usage"):
                usage = data["usage"]
            for ch in data["choices"]:
                text = ch.get("text") if "text" in ch else ch["delta"].get("content")
                if text:
                    times.append(time.perf_counter() - t0)
                    texts.append(text)
                if ch.get("finish_reason"):
                    reasons.append(ch["finish_reason"])
    return {"ttft": times[0], "gaps": [b - a for a, b in zip(times, times[1:])], "texts": texts, "usage": usage,
            "reasons": reasons}


def test_client_timing_matches_server_histograms(fleet):
    """Three concurrent 3-4k-token requests: the histograms hold exactly the engine's own
    times of these requests (its records, simulated seconds), and the client sees each first
    and last token after the engine emitted it, within the lag a busy machine adds
    (tests/support/emulated_timing.py)."""
    url = fleet.urls["solo"]
    before = Page(httpx.get(url + "/metrics").content)
    seen = {r.rid for r in fleet.call("solo", lambda t: list(t.sim.records))}

    async def main():
        async with httpx.AsyncClient(timeout=30) as client:
            bodies = [{"model": "solo-model", "prompt": list(range(3000 + 500 * i)), "max_tokens": 40,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                      for i in range(3)]
            return await asyncio.gather(*(_stream(client, url + "/v1/completions", b) for b in bodies))

    results = asyncio.run(main())
    after = Page(httpx.get(url + "/metrics").content)
    records = {r.prompt_tokens: r for r in fleet.call("solo", lambda t: list(t.sim.records)) if r.rid not in seen}
    assert sorted(records) == [3000, 3500, 4000]
    for i, r in enumerate(results):
        assert len(r["texts"]) == 40 and r["reasons"] == ["length"]
        assert r["usage"] == {"prompt_tokens": 3000 + 500 * i, "completion_tokens": 40, "total_tokens": 3040 + 500 * i}
    ttft = after.hist("vllm:time_to_first_token_seconds").minus(before.hist("vllm:time_to_first_token_seconds"))
    itl = after.hist("vllm:inter_token_latency_seconds").minus(before.hist("vllm:inter_token_latency_seconds"))
    assert ttft.count == 3 and itl.count == 3 * 39
    assert ttft.sum == pytest.approx(sum(r.ttft for r in records.values()), rel=1e-9)
    assert itl.sum == pytest.approx(sum(r.finish - r.first_token for r in records.values()), rel=1e-9)
    assert 0.25 < ttft.mean < 2.0 and 0.009 < itl.mean < 0.03  # 3-4k-token prefills, 8B decode steps
    for i, r in enumerate(results):
        engine = records[3000 + 500 * i]
        check_span(r["ttft"] * SOLO_SCALE, (r["ttft"] + sum(r["gaps"])) * SOLO_SCALE, engine.ttft,
                   engine.finish - engine.arrival, SOLO_SCALE, f"request {i}")
    # so the client's mean ITL is the engine's within one token's lag over 39 gaps
    client_itl = sum(sum(r["gaps"]) for r in results) / (3 * 39) * SOLO_SCALE
    assert abs(client_itl - itl.mean) <= CLIENT_LAG_S * SOLO_SCALE / 39


def test_client_timing_on_a_busy_target(fleet):
    """With synthetic traffic in the same scheduler, an HTTP request sees the same ITL regime."""
    url = fleet.urls["busy"]
    before = Page(httpx.get(url + "/metrics").content)

    async def main():
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 60, "ignore_eos": True,
                    "stream": True}
            return await asyncio.gather(*(_stream(client, url + "/v1/chat/completions", body) for _ in range(2)))

    results = asyncio.run(main())
    sig = signature(httpx.get(url + "/metrics").content, before)
    client_itl = sum(sum(r["gaps"]) for r in results) / sum(len(r["gaps"]) for r in results) * 5.0
    assert client_itl == pytest.approx(sig["itl_mean"], rel=0.35)
    assert all(len(r["texts"]) == 60 for r in results)


def test_non_streaming_completions_and_chat(fleet):
    url = fleet.urls["solo"]
    with httpx.Client(timeout=30) as c:
        r = c.post(url + "/v1/completions", json={"prompt": "a" * 400, "max_tokens": 12, "ignore_eos": True})
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "text_completion" and body["model"] == "solo-model"
        assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112,
                                 "prompt_tokens_details": None}
        assert count_text_tokens(body["choices"][0]["text"]) == 12
        assert body["choices"][0]["finish_reason"] == "length"
        r = c.post(fleet.urls["busy"] + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2000})
        body = r.json()
        assert body["object"] == "chat.completion"
        assert body["usage"]["prompt_tokens"] == 3 + 4 + 2
        msg = body["choices"][0]["message"]
        assert msg["role"] == "assistant"
        # without ignore_eos the answer ends at the model's end-of-sequence: finish reason "stop"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert count_text_tokens(msg["content"]) == body["usage"]["completion_tokens"] < 2000


def test_chat_stream_format(fleet):
    url = fleet.urls["solo"]
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True,
                            "ignore_eos": True}) as resp:
            lines = [ln for ln in resp.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert [ch["choices"][0]["finish_reason"] for ch in chunks] == [None, None, None, "length"]
    assert all(len(ch["choices"][0]["delta"]["content"]) == 4 for ch in chunks[1:])


@pytest.mark.parametrize("path, body, status, needle", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": list(range(40000))}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": [["a"], ["b"]]}, 400, "batched"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
])
def test_bad_requests(fleet, path, body, status, needle):
    url = fleet.urls["solo"] + path
    r = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]


def test_metadata_endpoints(fleet):
    with httpx.Client(timeout=10) as c:
        solo = fleet.urls["solo"]
        r = c.get(solo + "/metrics")
        assert r.headers["content-type"] == CONTENT_TYPE
        assert "process_cpu_seconds_total" in r.text  # like a real server's default collectors
        assert c.get(solo + "/health").status_code == 200
        assert c.get(solo + "/version").json() == {"version": "0.32.0"}
        models = c.get(solo + "/v1/models").json()
        assert models["data"][0]["id"] == "solo-model" and models["data"][0]["max_model_len"] == 32768
        st = c.get(solo + "/emulator/state").json()
        assert st["scenario"] == "healthy" and st["engine"] == "vllm" and st["time_scale"] == SOLO_SCALE
        assert st["decode_floor_seconds"] == pytest.approx(0.0113, rel=0.02)
        assert st["hardware"]["gpu"] == "A100-80G"
        assert st == {**st, **fleet.state("solo"), "sim_time_s": st["sim_time_s"], "counts": st["counts"]}
        tgi = fleet.urls["tgi"]
        info = c.get(tgi + "/info").json()
        assert info["version"].startswith("3.") and info["max_total_tokens"] == 32768
        tgi_page = Page(c.get(tgi + "/metrics").content)
        assert tgi_page.value("tgi_queue_size") > 10  # queueing scenario, warmed up
        legacy = Page(c.get(fleet.urls["legacy"] + "/metrics").content)
        assert "vllm:gpu_cache_usage_perc" in legacy.types
        assert c.get(fleet.urls["legacy"] + "/version").json() == {"version": "0.8.5"}


def test_client_disconnect_aborts_the_request(fleet):
    name = "solo"
    url = fleet.urls[name]
    aborted = fleet.state(name)["counts"]["aborted"]
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}) as resp:
            it = resp.iter_lines()
            got = [ln for _, ln in zip(range(6), it) if ln]
            assert got
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = fleet.state(name)
        if st["counts"]["aborted"] > aborted and st["http_inflight"] == 0:
            break
        time.sleep(0.05)
    st = fleet.state(name)
    assert st["counts"]["aborted"] == aborted + 1 and st["running"] == 0
    page = Page(fleet.metrics(name))
    assert page.value("vllm:request_success_total", finished_reason="abort") >= 1


def test_async_targets_and_clean_stop():
    async def main():
        sc = single_stream(LengthDist.fixed(64), 8, gpu="L4")  # a custom Scenario object works too
        targets = await start_targets([TargetSpec("a", sc, time_scale=20.0, process_metrics=False, synthetic=False)])
        t = targets[0]
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(t.url + "/v1/completions", json={"prompt": "x" * 40, "max_tokens": 5,
                                                                        "ignore_eos": True})
                assert r.json()["usage"]["completion_tokens"] == 5
                page = (await client.get(t.url + "/metrics")).text
                assert "process_cpu_seconds_total" not in page
                assert 'model_name="test-model"' in page
                assert Page(page).hist("vllm:e2e_request_latency_seconds").count == 1
                state = (await client.get(t.url + "/emulator/state")).json()
                assert state["hardware"]["gpu"] == "L4" and state["counts"]["finished"] == 1
        finally:
            await t.stop()
        return t.port

    port = asyncio.run(main())
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_fleet_rejects_bad_specs():
    with pytest.raises(ValueError, match="unknown engine"):
        EmulatorFleet([TargetSpec("x", "healthy", engine="lmdeploy")])
    with pytest.raises(ValueError, match="unknown scenario"):
        EmulatorFleet([TargetSpec("x", "nope")])
    with pytest.raises(ValueError, match="duplicate"):
        EmulatorFleet([TargetSpec("x", "healthy"), TargetSpec("x", "queueing")])
    threads = set(threading.enumerate())
    with socket.socket() as s:  # a port in use: start() raises, nothing is left running
        s.bind(("127.0.0.1", 0))
        s.listen()
        fleet = EmulatorFleet([TargetSpec("x", "healthy", port=s.getsockname()[1])])
        with pytest.raises(OSError):
            fleet.start()
    assert set(threading.enumerate()) <= threads
