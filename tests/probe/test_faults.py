"""Servers that fail, stall or send garbage give recorded errors - never a hang, never a crash."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from app.probe.runner import ProbeSpec, run_probe
from app.probe.sse import SSEParser
from tests.probe.servers import FakeOpenAI


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAI(gap=0.002, first_delay=5.0) as server:
        yield server


def probe(url: str, **kw):
    spec = ProbeSpec(url, prompt_tokens=8, max_tokens=kw.pop("max_tokens", 8), concurrency=kw.pop("concurrency", 1),
                     requests=kw.pop("requests", 2), preflight=kw.pop("preflight", False), **kw)
    t0 = time.monotonic()
    result = asyncio.run(run_probe(spec))
    return result, time.monotonic() - t0


def test_a_well_behaved_stream_is_timed_and_counted(fake):
    result, _ = probe(fake.url("ok"), max_tokens=6, requests=3)
    level = result.levels[0]
    assert result.ok and level.errors == {} and level.succeeded == 3
    for r in level.requests:
        assert r.tokens == 6 and len(r.itl) == 5 and r.finish_reason == "length"
        assert r.usage == {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14}
        assert 0 < r.ttft < r.e2e < 1.0
        # the server sleeps 2 ms between tokens; a loaded machine may deliver two tokens in one read
        # (one short gap after a long one), so the bound is on the time to the last token
        assert r.ttft + sum(r.itl) >= 5 * 0.002 * 0.95
    assert level.itl.count == 15 and level.ttft.count == 3


def test_http_500_is_recorded_with_status_and_body(fake):
    result, elapsed = probe(fake.url("http500"), requests=3)
    level = result.levels[0]
    assert level.errors == {"http_status": 3} and level.succeeded == 0 and not result.ok
    r = level.requests[0]
    assert r.status_code == 500 and "engine crashed" in r.detail and r.ttft is None
    assert level.ttft.count == 0 and level.ttft.p50 is None
    assert elapsed < 5


def test_a_stream_that_hangs_mid_way_is_stalled_after_the_stall_timeout(fake):
    result, elapsed = probe(fake.url("stall"), requests=2, concurrency=2, stall_timeout=0.4, timeout=30)
    level = result.levels[0]
    assert level.errors == {"stalled": 2}
    assert all(r.tokens == 3 and r.ttft is not None and len(r.itl) == 2 for r in level.requests)
    assert "no data for 0.4s after token 3" in level.requests[0].detail
    assert 0.4 <= elapsed < 10.0  # the request timeout (30 s) if the stall timeout were ignored; slack for load


def test_malformed_sse_lines_are_counted_and_the_tokens_still_read(fake):
    result, _ = probe(fake.url("malformed"), max_tokens=5, requests=1)
    r = result.levels[0].requests[0]
    assert r.error == "malformed_sse" and r.malformed_lines == 3
    assert r.tokens == 5 and r.finish_reason == "length"
    assert "{not json" in r.detail and "this line is not SSE" in r.detail


@pytest.mark.parametrize("mode, detail", [("incomplete", "without [DONE] after 3 tokens"),
                                          ("reset", "")])
def test_a_stream_cut_short_is_incomplete(fake, mode, detail):
    result, elapsed = probe(fake.url(mode), max_tokens=10, requests=2)
    level = result.levels[0]
    assert level.errors == {"incomplete": 2} and elapsed < 5
    assert all(r.tokens <= 3 for r in level.requests)
    assert detail in level.requests[0].detail


def test_an_error_event_inside_the_stream_is_a_stream_error(fake):
    result, _ = probe(fake.url("error_event"), max_tokens=10, requests=1)
    r = result.levels[0].requests[0]
    assert r.error == "stream_error" and r.detail == "out of memory" and r.tokens == 2


def test_no_first_token_within_the_request_timeout_is_a_timeout(fake):
    result, elapsed = probe(fake.url("slow_first"), requests=1, timeout=0.5)
    r = result.levels[0].requests[0]
    assert r.error == "timeout" and r.tokens == 0 and "request timeout (0.5s)" in r.detail
    assert 0.5 <= elapsed < 4.5  # the first token comes after 5 s if the timeout were ignored; slack for load


def test_a_closed_port_is_a_connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        result, elapsed = probe(f"http://127.0.0.1:{port}", requests=3, concurrency=3, preflight=True)
    assert result.errors == {"connect": 3} and elapsed < 3
    assert result.preflight_requests == 1 and result.model is None


def test_preflight_finds_the_model_and_keeps_token_ids_where_accepted(fake):
    result, _ = probe(fake.url("ok"), requests=1, preflight=True, max_tokens=2)
    assert result.model == "fake" and result.preflight_requests == 1
    assert result.protocol["prompt_mode"] == "token_ids" and result.protocol["include_usage"]
    body = fake.bodies[-1]
    assert body["model"] == "fake" and body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    assert isinstance(body["prompt"], list) and len(body["prompt"]) == 8
    assert result.levels[0].prompt_tokens_seen.mean == 8


def test_preflight_drops_what_the_server_rejects_and_calibrates_text(fake):
    """A server without token-id prompts or ignore_eos gets plain text, sized from usage.prompt_tokens."""
    spec = ProbeSpec(fake.url("strict"), prompt_tokens=300, max_tokens=2, requests=2)
    result = asyncio.run(run_probe(spec))
    p = result.protocol
    assert (p["prompt_mode"], p["ignore_eos"], p["include_usage"], p["calibrated"]) == ("text", False, True, True)
    assert p["tokens_per_word"] == 1.0 and p["overhead_tokens"] == 5.0
    assert result.preflight_requests == 5  # 2 refused, 1 accepted, 2 calibration points
    assert result.ok and [r.prompt_tokens for r in result.levels[0].requests] == [300, 300]
    assert "ignore_eos" not in fake.bodies[-1] and isinstance(fake.bodies[-1]["prompt"], str)


def test_sse_parser_is_lenient_and_never_raises():
    p = SSEParser(max_line_bytes=64)
    events = []
    stream = (b'data: {"a": 1}\r\n\r\n: keep-alive\n\ndata: {"b"' b': 2}\n\ndata: {"c": 3}\ndata: {"d": 4}\n\n'
              b"event: x\nid: 7\nretry: 10\ndata: [DONE]\n\nno colon here\nfoo: bar\n"
              + b"data: " + b"x" * 100 + b"\n\xff\xfe\n" + b'data: {"e"\n' + b'data: : 5}\n\n' + b'data: {"f": 6}')
    for i in range(0, len(stream), 7):  # arbitrary chunk boundaries, even inside \r\n
        events += p.feed(stream[i:i + 7])
    events += p.close()
    assert events == ['{"a": 1}', '{"b": 2}', '{"c": 3}', '{"d": 4}', "[DONE]", '{"e"\n: 5}', '{"f": 6}']
    assert p.malformed == 4  # "no colon here", "foo: bar", the over-long line, the non-UTF-8 line
    assert p.malformed_samples[:2] == ["no colon here", "foo: bar"]
