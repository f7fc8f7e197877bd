"""Serve emulated engines over HTTP: ``/metrics`` plus an OpenAI-compatible API.

Each target is an aiohttp application on its own ``127.0.0.1`` port (port 0 picks a free
one); all targets of a fleet share one asyncio event loop, in a background thread for
:class:`EmulatorFleet` or in the caller's loop for :func:`start_targets`.

Time: a target's simulated clock is ``wall-clock elapsed x time_scale`` (+ the warm-up).
The histograms record SIMULATED seconds: with ``time_scale=10`` a TTFT recorded as 1 s is
seen by an HTTP client after 0.1 s of wall time. The event loop wakes up every
``TICK_S`` (0.25 s) to run the steps that became due in one batch, and at each step end only
while an HTTP request is in flight - so streamed tokens leave at the simulated time of the
step that produced them and a client's TTFT/ITL (times ``time_scale``) agree with the
server's histograms.

Endpoints per target::

    GET  /metrics               engine-format exposition (text/plain; version=0.0.4)
    POST /v1/completions        OpenAI completions, streaming (SSE) or not
    POST /v1/chat/completions   OpenAI chat completions, streaming or not
    GET  /v1/models, /health, /version (vLLM) or /info (TGI)
    GET  /emulator/state        ground truth (scenario, config, hardware, floors, counts)

Prompts given as text are counted with a deterministic tokenizer (1 token per 4
characters, rounded up); a prompt given as a list of token ids is taken token-exact. Chat
messages cost their content tokens + 4 each, + 3 for the reply primer. Generated tokens are
4-character pseudo-words, so re-tokenizing the output gives back ``completion_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from app.emulator.exposition import ENGINES
from app.emulator.scenarios import Scenario, ScenarioPlan
from app.emulator.scenarios import resolve as resolve_scenario
from app.emulator.simulation import Simulation

TICK_S = 0.25
VLLM_VERSION = {"vllm": "0.32.0", "vllm-legacy": "0.8.5", "sglang": "0.5.2", "trtllm": "1.1.0"}
TGI_VERSION = "3.3.6"

_LETTERS = "etaoinshrdlucmfwypvbgkjqxz"
WORDS = [" " + _LETTERS[i % 26] + _LETTERS[(i * 7 + 3) % 26] + _LETTERS[(i * 13 + 5) % 26] for i in range(512)]


def count_text_tokens(text: str) -> int:
    """The emulator's tokenizer: one token per 4 characters, rounded up."""
    return -(-len(text) // 4) if text else 0


def token_text(request_index: int, i: int) -> str:
    return WORDS[(request_index * 31 + i * 17) % len(WORDS)]


@dataclass
class TargetSpec:
    """One emulated server. ``scenario`` is a name, a transition chain
    ("healthy->queueing@60") or a :class:`~app.emulator.scenarios.Scenario` object (custom
    deployments for benchmarks); ``warmup_s`` simulated seconds are run offline before
    serving so the page starts with data; ``synthetic=False`` serves HTTP traffic only."""

    name: str
    scenario: str | Scenario | ScenarioPlan
    engine: str = "vllm"  # "vllm" | "vllm-legacy" | "tgi" | "sglang" | "trtllm"
    port: int = 0
    seed: int = 0
    model_name: str | None = None
    time_scale: float = 1.0
    host: str = "127.0.0.1"
    warmup_s: float = 0.0
    synthetic: bool = True
    process_metrics: bool = True

    def validate(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"target {self.name!r}: unknown engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"target {self.name!r}: time_scale must be > 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"target {self.name!r}: bad port {self.port}")
        if self.warmup_s < 0:
            raise ValueError(f"target {self.name!r}: warmup_s must be >= 0")
        resolve_scenario(self.scenario)


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, etype: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.etype = status, etype


def _error(message: str, status: int = 400, etype: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": status}}
    return web.json_response(body, status=status)


class EmulatedTarget:
    """One target: a :class:`Simulation` behind an aiohttp app, driven by the loop clock."""

    def __init__(self, spec: TargetSpec) -> None:
        spec.validate()
        self.spec = spec
        self.sim = Simulation(spec.scenario, engine=spec.engine, seed=spec.seed, model_name=spec.model_name,
                              synthetic=spec.synthetic, process_metrics=spec.process_metrics)
        self.model_name = self.sim.model_name
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._driver: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._streams: set[asyncio.Queue] = set()
        self._stopping = False
        self._t0 = 0.0
        self._sim0 = 0.0
        self._http_count = 0

    # ---- clock -------------------------------------------------------------------------
    def sim_now(self) -> float:
        return self._sim0 + (asyncio.get_running_loop().time() - self._t0) * self.spec.time_scale

    def sync(self) -> None:
        self.sim.advance(self.sim_now())

    async def _drive(self) -> None:
        scale = self.spec.time_scale
        while not self._stopping:
            self.sync()
            delay = TICK_S
            if self.sim.http_inflight:
                nxt = self.sim.next_event_time()
                if nxt is not None:
                    delay = min(TICK_S, max(0.0, (nxt - self.sim_now()) / scale))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

    # ---- lifecycle ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.spec.warmup_s:
            self.sim.advance(self.spec.warmup_s)
        self._sim0 = self.sim.clock
        self._t0 = loop.time()
        self._wake = asyncio.Event()
        app = web.Application()
        app.router.add_get("/metrics", self.h_metrics)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/v1/models", self.h_models)
        app.router.add_get("/emulator/state", self.h_state)
        app.router.add_post("/v1/completions", self.h_completions)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        if self.spec.engine == "tgi":
            app.router.add_get("/info", self.h_info)
        else:
            app.router.add_get("/version", self.h_version)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.spec.host, self.spec.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._driver = asyncio.create_task(self._drive(), name=f"emulator-driver-{self.spec.name}")

    async def stop(self) -> None:
        self._stopping = True
        for q in list(self._streams):
            q.put_nowait(("shutdown", 0.0, None))
        if self._wake is not None:
            self._wake.set()
        if self._driver is not None:
            await self._driver
            self._driver = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def state(self) -> dict:
        self.sync()
        st = self.sim.state()
        st.update(name=self.spec.name, url=self.url, time_scale=self.spec.time_scale,
                  histograms_in="simulated seconds (wall seconds x time_scale)")
        return st

    # ---- handlers ----------------------------------------------------------------------
    async def h_metrics(self, request: web.Request) -> web.Response:
        self.sync()
        return web.Response(body=self.sim.render_metrics(), headers={"Content-Type": self.sim.content_type})

    async def h_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION[self.spec.engine]})

    async def h_info(self, request: web.Request) -> web.Response:
        cfg = self.sim.engine.config
        return web.json_response({
            "model_id": self.model_name, "model_dtype": "torch.bfloat16", "router": "text-generation-router",
            "version": TGI_VERSION, "max_input_tokens": cfg.max_model_len - 1, "max_total_tokens": cfg.max_model_len,
            "max_concurrent_requests": 128, "max_batch_total_tokens": self.sim.engine.num_gpu_blocks * cfg.block_size,
        })

    async def h_models(self, request: web.Request) -> web.Response:
        owned = {"tgi": "tgi", "sglang": "sglang", "trtllm": "tensorrt_llm"}.get(self.spec.engine, "vllm")
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": owned,
            "root": self.model_name, "parent": None, "max_model_len": self.sim.engine.config.max_model_len}]})

    async def h_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _parse(self, body: dict, chat: bool) -> tuple[int, int | None]:
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise _BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        if body.get("n", 1) != 1:
            raise _BadRequest("the emulator supports n=1 only")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise _BadRequest("messages must be a non-empty list")
            prompt = 3
            for m in msgs:
                if not isinstance(m, dict):
                    raise _BadRequest("each message must be an object")
                content = m.get("content") or ""
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                if not isinstance(content, str):
                    raise _BadRequest("message content must be a string or a list of parts")
                prompt += count_text_tokens(content) + 4
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            p = body.get("prompt")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
                p = p[0]
            if isinstance(p, str):
                prompt = count_text_tokens(p)
            elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
                prompt = len(p)
            else:
                raise _BadRequest("prompt must be a string or a list of token ids (batched prompts are not supported)")
            max_tokens = body.get("max_tokens", 16)
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or max_tokens < 1):
            raise _BadRequest("max_tokens must be a positive integer")
        return prompt, max_tokens

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("request body is not valid JSON")
        try:
            prompt_tokens, max_tokens = self._parse(body, chat)
        except _BadRequest as exc:
            return _error(str(exc), exc.status, exc.etype)
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        ignore_eos = bool(body.get("ignore_eos", False))
        queue: asyncio.Queue = asyncio.Queue()

        def sink(kind: str, t: float, req) -> None:
            queue.put_nowait((kind, t, req))

        self.sync()
        try:
            req = self.sim.submit(prompt_tokens, max_tokens, ignore_eos=ignore_eos, sink=sink)
        except ValueError as exc:
            return _error(str(exc))
        index = self._http_count
        self._http_count += 1
        self._streams.add(queue)
        self._wake.set()
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        try:
            if stream:
                return await self._stream(request, queue, req, rid, created, chat, include_usage, index)
            texts: list[str] = []
            while True:
                kind, _, _ = await queue.get()
                if kind == "token":
                    texts.append(token_text(index, len(texts)))
                elif kind == "finish":
                    break
                else:
                    return _error("server shutting down", 503, "ServiceUnavailableError")
            usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + req.num_output,
                     "completion_tokens": req.num_output, "prompt_tokens_details": None}
            text = "".join(texts)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                          "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                          "stop_reason": None, "prompt_logprobs": None}
                obj = "text_completion"
            return web.json_response({"id": rid, "object": obj, "created": created, "model": self.model_name,
                                      "choices": [choice], "usage": usage})
        finally:
            self._streams.discard(queue)
            if not req.finished:
                self.sync()
                self.sim.abort(req)

    async def _stream(self, request, queue, req, rid, created, chat, include_usage, index) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        n = 0

        def chunk(choice: dict) -> bytes:
            data = {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": [choice]}
            return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

        try:
            while True:
                kind, _, _ = await queue.get()
                if kind == "shutdown":
                    return resp
                if kind == "token":
                    text = token_text(index, n)
                    n += 1
                    last = req.finished and n == req.num_output
                    reason = req.finish_reason if last else None
                    if chat:
                        out = b""
                        if n == 1:
                            out = chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None})
                        out += chunk({"index": 0, "delta": {"content": text}, "logprobs": None,
                                      "finish_reason": reason})
                    else:
                        out = chunk({"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                                     "stop_reason": None})
                    await resp.write(out)
                elif kind == "finish":
                    if include_usage:
                        usage = {"prompt_tokens": req.prompt_len, "total_tokens": req.prompt_len + req.num_output,
                                 "completion_tokens": req.num_output}
                        data = {"id": rid, "object": obj, "created": created, "model": self.model_name,
                                "choices": [], "usage": usage}
                        await resp.write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")
                    await resp.write(b"data: [DONE]\n\n")
                    await resp.write_eof()
                    return resp
        except (ConnectionResetError, ConnectionError):
            return resp


async def start_targets(specs: list[TargetSpec]) -> list[EmulatedTarget]:
    """Start targets in the running event loop (the async variant of :class:`EmulatorFleet`);
    stop each with ``await target.stop()``."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate target names: {names}")
    targets = [EmulatedTarget(s) for s in specs]
    started: list[EmulatedTarget] = []
    try:
        for t in targets:
            await t.start()
            started.append(t)
    except BaseException:
        for t in started:
            await t.stop()
        raise
    return targets


class EmulatorFleet:
    """Several emulated targets served from one background thread with its own event loop.

    >>> with EmulatorFleet([TargetSpec("a", "healthy"), TargetSpec("b", "queueing", engine="tgi")]) as fleet:
    ...     fleet.urls["a"]            # 'http://127.0.0.1:PORT'; metrics at + "/metrics"
    """

    def __init__(self, specs: list[TargetSpec], *, ready_timeout: float = 30.0) -> None:
        for s in specs:
            s.validate()
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate target names: {names}")
        self.specs = list(specs)
        self.ready_timeout = ready_timeout
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._targets: dict[str, EmulatedTarget] = {}

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("fleet already started")
        self._thread = threading.Thread(target=self._run, name="emulator-fleet", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.ready_timeout):
            self.stop()
            raise RuntimeError("emulator fleet did not start in time")
        if self._error is not None:
            err = self._error
            self._thread.join(5)
            self._thread = None
            raise err

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._ready.set()

    async def _main(self) -> None:
        self._stop_event = asyncio.Event()
        targets = await start_targets(self.specs)
        self._targets = {t.spec.name: t for t in targets}
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            for t in targets:
                await t.stop()

    def stop(self) -> None:
        """Stop every target and the thread (idempotent)."""
        thread = self._thread
        if thread is None:
            return
        loop, ev = self._loop, self._stop_event
        if loop is not None and ev is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass
        thread.join(15)
        self._thread = None

    def __enter__(self) -> EmulatorFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def urls(self) -> dict[str, str]:
        return {n: t.url for n, t in self._targets.items()}

    def call(self, name: str, fn):
        """Run ``fn(target)`` in the fleet's loop thread and return its result."""
        target = self._targets[name]

        async def run():
            return fn(target)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def state(self, name: str) -> dict:
        """Ground truth of a target (same as its ``/emulator/state``)."""
        return self.call(name, lambda t: t.state())

    def metrics(self, name: str) -> bytes:
        """The target's current ``/metrics`` page, without HTTP."""
        def render(t: EmulatedTarget) -> bytes:
            t.sync()
            return t.sim.render_metrics()
        return self.call(name, render)
