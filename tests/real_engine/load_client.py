"""The real-engine tests' streaming client, run as a process of its own.

``python -m tests.real_engine.load_client <base url> <model> <index> ...`` sends one streaming
completion per index, all at once, and prints each stream's client-side TTFT, end-to-end time
and completion tokens as JSON. In its own process its clock reads the first SSE chunk when it
arrives, whatever the test process' threads are doing.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass

import httpx

PROMPT_WORDS = 150      # ~150 prompt tokens (the tokenizer was trained on these words)
MAX_TOKENS = 128        # per stream, ignore_eos: every stream decodes exactly this many
LOAD_DEADLINE_S = 180   # every request loop here stops by itself

_WORDS = ("the server waits for the scheduler and the queue grows while every token request "
          "in the batch takes its time before the first answer").split()


def prompt(index: int) -> str:
    """A distinct prompt per request (distinct first words: no prefix-cache hits between streams)."""
    rng = random.Random(index)
    return f"request {index} " + " ".join(rng.choice(_WORDS) for _ in range(PROMPT_WORDS - 2))


@dataclass
class StreamResult:
    ttft: float | None  # client side: request sent -> first streamed token
    e2e: float
    tokens: int  # completion tokens, from the final usage chunk
    error: str | None = None


async def _one_stream(client: httpx.AsyncClient, base_url: str, model: str, index: int) -> StreamResult:
    body = {"model": model, "prompt": prompt(index), "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return StreamResult(None, time.perf_counter() - started, 0, f"HTTP {response.status_code}: "
                                                                            f"{response.text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("choices"):
                    # A chunk per token step; its text may be empty (a byte-level token that
                    # ends mid UTF-8 character), it is still the token's arrival.
                    if first is None:
                        first = time.perf_counter() - started
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        return StreamResult(first, time.perf_counter() - started, tokens, f"{type(exc).__name__}: {exc}")
    return StreamResult(first, time.perf_counter() - started, tokens)


def run_streams(base_url: str, model: str, indices: list[int]) -> list[StreamResult]:
    """All of ``indices`` at once, each its own streaming request; bounded by LOAD_DEADLINE_S."""

    async def main() -> list[StreamResult]:
        limits = httpx.Limits(max_connections=len(indices) + 2, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(LOAD_DEADLINE_S, connect=10), limits=limits) as client:
            return await asyncio.wait_for(
                asyncio.gather(*(_one_stream(client, base_url, model, i) for i in indices)), LOAD_DEADLINE_S)

    return asyncio.run(main())


def main(argv: list[str]) -> int:
    base_url, model, *indices = argv
    json.dump([asdict(r) for r in run_streams(base_url, model, [int(i) for i in indices])], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
