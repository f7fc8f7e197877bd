"""The simulation: an :class:`~app.emulator.engine.Engine` + synthetic traffic + HTTP
requests + the metrics exporter, on a simulated clock.

Offline (tests, benchmarks of the physics): ``Simulation("queueing").run_for(300)`` runs
300 simulated seconds as fast as the CPU allows and returns :class:`RunStats`;
``render_metrics()`` gives the ``/metrics`` page at that point.

Online (:mod:`app.emulator.server`): the server calls :meth:`Simulation.advance` with
"simulated now" = wall-clock x time_scale, and :meth:`submit` for HTTP requests, which join
the same waiting queue as synthetic traffic. Between two calls every engine step whose end
is due is committed in a batch - each still observes its own ITL / iteration samples -
so the event loop only wakes up per step while an HTTP stream needs per-token timing.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from app.emulator.engine import Engine, Request, StepPlan
from app.emulator.exposition import PD_BOOTSTRAP_S, make_exporter
from app.emulator.physics import ceil_div
from app.emulator.scenarios import Scenario, ScenarioPlan, resolve
from app.emulator.workload import StreamRuntime

#: Frontend tokenization/validation before a request enters the engine queue (seconds):
#: fixed part + per prompt token. Part of TTFT and e2e, not of queue time (as in vLLM).
TOKENIZE_BASE_S = 0.0003
TOKENIZE_PER_TOKEN_S = 2e-7
#: SGLang P/D decode worker: the decode tokens reserved per running request for its growth before new
#: transfers get memory (SGLang's ``num_reserved_decode_tokens``, default 512; here at most what the request
#: still generates); the handshake before memory is reserved is ``exposition.PD_BOOTSTRAP_S``
PD_RESERVED_DECODE_TOKENS = 512


@dataclass
class RequestRecord:
    """Ground truth of one finished request (simulated seconds)."""

    rid: str
    http: bool
    arrival: float
    queued: float
    first_scheduled: float
    first_token: float
    finish: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int
    finish_reason: str

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def queue_time(self) -> float:
        return self.first_scheduled - self.queued

    @property
    def prefill_time(self) -> float:
        return self.first_token - self.first_scheduled

    @property
    def tpot(self) -> float:
        return (self.finish - self.first_token) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass
class RunStats:
    """What happened in a run (or since the start), from the simulation's own bookkeeping."""

    sim_seconds: float
    steps: int
    busy_fraction: float
    arrived: int
    finished: int
    aborted: int
    preemptions: int
    generated_tokens: int
    prefill_tokens: int
    max_step_tokens: int
    running: int
    waiting: int
    kv_usage: float
    records: list = field(repr=False, default_factory=list)
    itl: dict = field(repr=False, default_factory=dict)  # value -> count (when record_itl)

    def itl_quantile(self, q: float) -> float:
        """Exact ITL quantile from the recorded samples (needs ``record_itl=True``)."""
        items = sorted(self.itl.items())
        total = sum(n for _, n in items)
        if not total:
            return float("nan")
        rank, acc = q * total, 0
        for v, n in items:
            acc += n
            if acc >= rank:
                return v
        return items[-1][0]

    @property
    def itl_mean(self) -> float:
        total = sum(self.itl.values())
        return sum(v * n for v, n in self.itl.items()) / total if total else float("nan")


class Simulation:
    """One emulated engine (one target)."""

    def __init__(self, scenario: str | Scenario | ScenarioPlan = "healthy", *, engine: str = "vllm", seed: int = 0,
                 model_name: str | None = None, synthetic: bool = True, process_metrics: bool = False,
                 mfu_metrics: bool = True, record_itl: bool = False, keep_records: int = 100_000) -> None:
        self.plan = resolve(scenario)
        self.engine_flavor = engine
        self.seed = seed
        self.synthetic = synthetic
        first = self.plan.phases[0][1]
        self.scenario: Scenario = first
        self.model_name = model_name or first.model_name
        self.engine = Engine(first.deployment, first.engine, self, prefill_pauses_decode=engine == "tgi")
        self._process_metrics, self._mfu_metrics = process_metrics, mfu_metrics
        self.exporter = make_exporter(engine, self.model_name, first.deployment, first.engine,
                                      self.engine.num_gpu_blocks, process_metrics=process_metrics,
                                      mfu_metrics=mfu_metrics)
        self.clock = 0.0  # simulated "now" as seen from outside
        self._event_time = 0.0  # time of the last processed engine event
        self._inflight: StepPlan | None = None
        self._heap: list = []
        self._seq = itertools.count()
        self._rid = itertools.count()
        self._streams: list[StreamRuntime] = []
        self._phase = 0
        self._http_rng = random.Random(f"{seed}/http")
        self._kv_rng = random.Random(f"{seed}/kv-transfer")
        self._http_inflight = 0
        self._prealloc: deque[Request] = deque()  # SGLang P/D decode worker: waiting for KV memory
        self._transferring = 0  # ... memory reserved, KV on its way (prefill worker's prefill + the transfer)
        self.arrived = 0
        self.records: deque[RequestRecord] = deque(maxlen=keep_records)
        self.record_itl = record_itl
        self._itl: dict[float, int] = {}
        self._start_phase(first, 0.0)

    # ---- phases / workload -------------------------------------------------------------
    def _start_phase(self, sc: Scenario, t: float) -> None:
        for s in self._streams:
            s.active = False
        self._streams = []
        if not self.synthetic:
            return
        for i, stream in enumerate(sc.workload):
            rt = StreamRuntime(stream, self.seed, self._phase * 100 + i, t, sc.engine.max_model_len)
            self._streams.append(rt)
            if stream.closed_loop:
                for ts in rt.initial_client_times():
                    self._push_synthetic(rt, ts)
            else:
                self._push_synthetic(rt, rt.next_open_loop_arrival())

    def _apply_transition(self, t: float) -> None:
        self._phase += 1
        sc = self.plan.phases[self._phase][1]
        self.scenario = sc
        if self._phase in self.plan.restarts:
            self._restart(sc, t)
        else:
            self.engine.configure(sc.deployment, sc.engine)
            self.exporter.on_config(sc.deployment, sc.engine, self.engine.num_gpu_blocks)
        self._start_phase(sc, t)

    def _restart(self, sc: Scenario, t: float) -> None:
        """The engine process restarted with the phase's deployment and flags: the requests in it are
        aborted (their clients see the connection end), then a new engine and exporter start empty -
        every counter from zero, no queue, nothing in the prefix cache."""
        for s in self._streams:
            s.active = False  # a closed-loop client whose request was aborted waits for the new phase
        for req in [*self.engine.running, *self.engine.waiting]:
            self.engine.finish(req, t, "abort")
        self._prealloc.clear()
        self._transferring = 0
        self.engine = Engine(sc.deployment, sc.engine, self, prefill_pauses_decode=self.engine_flavor == "tgi")
        self.exporter = make_exporter(self.engine_flavor, self.model_name, sc.deployment, sc.engine,
                                      self.engine.num_gpu_blocks, process_metrics=self._process_metrics,
                                      mfu_metrics=self._mfu_metrics)

    def _next_transition(self) -> float | None:
        if self._phase + 1 < len(self.plan.phases):
            return self.plan.phases[self._phase + 1][0]
        return None

    def _frontend_seconds(self, prompt_tokens: int) -> float:
        """Tokenization plus the scenario's rendering cost, before the engine sees the request."""
        return TOKENIZE_BASE_S + TOKENIZE_PER_TOKEN_S * prompt_tokens + self.scenario.engine.render_seconds

    @property
    def sglang_pd(self) -> bool:
        """An SGLang P/D decode worker: requests follow SGLang's decode side (see :meth:`_preallocate`)."""
        return self.engine_flavor == "sglang" and self.scenario.engine.kv_transfer_gbps is not None

    def _transfer(self, req: Request) -> None:
        """P/D decode worker: the prompt's KV cache arrives over the link before the request queues
        (on SGLang, once memory is reserved and the prefill worker has prefilled: :meth:`_preallocate`)."""
        cfg = self.scenario.engine
        if cfg.kv_transfer_gbps is None:
            return
        kv_bytes = req.prompt_len * self.engine.deployment.kv_bytes_per_token
        req.kv_transfer_s = 0.002 + kv_bytes * 8 / (cfg.kv_transfer_gbps * 1e9)
        req.kv_transfer_failed = self._kv_rng.random() < cfg.kv_transfer_failure_rate
        if not self.sglang_pd:
            req.queued += req.kv_transfer_s

    def _preallocate(self, now: float) -> None:
        """SGLang's decode worker (``disaggregation/decode.py``): a request reaches it and the prefill
        worker at once; after the handshake (``PD_BOOTSTRAP_S``) it reserves its prompt's KV blocks,
        first come first served, keeping each running request's remaining growth (up to
        ``PD_RESERVED_DECODE_TOKENS``) free; only then may the prefill worker prefill it (its pool keeps
        up: no queue there) and send the KV, which arrives ``prefill + transfer`` later and joins the queue."""
        kv = self.engine.kv
        assert kv is not None
        bs = kv.block_size
        while self._prealloc:
            req = self._prealloc[0]
            if req.finished:  # aborted while waiting
                self._prealloc.popleft()
                continue
            growth = sum(ceil_div(min(r.target_output - r.num_output, PD_RESERVED_DECODE_TOKENS), bs)
                         for r in self.engine.running)
            need = ceil_div(req.prompt_len, bs)
            if need + growth > kv.free:
                return
            self._prealloc.popleft()
            kv.private += need
            req.reserved_blocks = need
            assert req.pd_entry is not None
            req.pd_alloc = alloc = max(now, req.pd_entry + PD_BOOTSTRAP_S)
            prefill = self.engine.deployment.prefill_s(req.prompt_len)
            req.queued = alloc + prefill + req.kv_transfer_s
            self._transferring += 1
            self.exporter.on_preallocated(req, req.pd_entry, alloc)
            heapq.heappush(self._heap, (req.queued, next(self._seq), req))

    def _push_synthetic(self, rt: StreamRuntime, arrival: float) -> None:
        d = rt.draw()
        req = Request(f"{rt.stream.name}-{next(self._rid)}", arrival,
                      arrival + self._frontend_seconds(d.prompt_tokens),
                      d.prompt_tokens, d.max_tokens, d.natural_output, rt.stream.ignore_eos,
                      d.prefix_id, d.prefix_tokens, stream=rt)
        req.adapter = d.adapter
        self._transfer(req)
        heapq.heappush(self._heap, (req.queued, next(self._seq), req))

    def _pull_arrivals(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, req = heapq.heappop(heap)
            if req.pd_alloc is not None:  # SGLang P/D: its KV arrived (or failed)
                self._kv_arrived(req)
                continue
            rt = req.stream
            if rt is not None:
                if not rt.active:
                    continue
                if not rt.stream.closed_loop:
                    self._push_synthetic(rt, rt.next_open_loop_arrival())
            if req.finished:  # aborted before it reached the engine
                continue
            self.arrived += 1
            if self.sglang_pd and req.kv_transfer_s:
                req.pd_entry = req.queued
                self._prealloc.append(req)
                continue
            self.exporter.on_arrival(req, req.queued)
            self.engine.waiting.append(req)
        if self._prealloc:
            self._preallocate(now)

    def _kv_arrived(self, req: Request) -> None:
        """SGLang P/D: the transfer ended; the request queues for its first step, or (failed) ends in
        an error with its memory released, as SGLang's decode worker aborts it."""
        self._transferring -= 1
        self.exporter.on_kv_arrived(req, req.pd_alloc, req.queued)
        if req.finished:  # aborted while its KV was on its way
            assert self.engine.kv is not None
            self.engine.kv.release(req)
            return
        if req.kv_transfer_failed:
            self.engine.finish(req, req.queued, "error", remove=False)
            return
        self.exporter.on_arrival(req, req.queued)
        self.engine.waiting.append(req)

    # ---- HTTP side ---------------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int | None = None, *, ignore_eos: bool = False, sink=None,
               natural_output: int | None = None, prefix_id: str | None = None, prefix_tokens: int = 0) -> Request:
        """Add a request arriving now (``clock``). ``sink(kind, t, req)`` is called with
        kind "token" for every emitted token and "finish" at the end. Raises ValueError for
        a request a real server would reject."""
        max_len = self.scenario.engine.max_model_len
        if prompt_tokens < 1:
            raise ValueError("the prompt must have at least one token")
        if prompt_tokens >= max_len:
            raise ValueError(f"This model's maximum context length is {max_len} tokens. However, your "
                             f"request has {prompt_tokens} input tokens.")
        if max_tokens is None:
            max_tokens = max_len - prompt_tokens
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if prompt_tokens + max_tokens > max_len:
            raise ValueError(f"This model's maximum context length is {max_len} tokens. However, you requested "
                             f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                             f"{max_tokens} in the completion).")
        if natural_output is None:
            dist = self.scenario.workload[0].output if self.scenario.workload else None
            natural_output = dist.sample(self._http_rng) if dist else max_tokens
        arrival = self.clock
        req = Request(f"http-{next(self._rid)}", arrival, arrival + self._frontend_seconds(prompt_tokens),
                      prompt_tokens, max_tokens, natural_output, ignore_eos, prefix_id, prefix_tokens,
                      sink=sink, http=True)
        self._transfer(req)
        heapq.heappush(self._heap, (req.queued, next(self._seq), req))
        self._http_inflight += 1
        return req

    def abort(self, req: Request) -> None:
        """The client went away: the request leaves the engine (finished_reason "abort")."""
        if req.finished:
            return
        e = self.engine
        if req in e.running or req in e.waiting:
            e.finish(req, self.clock, "abort")
        else:  # still in the arrival heap (tokenizing): dropped when popped
            req.finished = True
            req.finish_reason = "abort"
            if req.http:
                self._http_inflight -= 1

    @property
    def http_inflight(self) -> int:
        return self._http_inflight

    # ---- the clock ---------------------------------------------------------------------
    def next_event_time(self) -> float | None:
        """When something happens next: the running step's end or the next arrival."""
        if self._inflight is not None:
            return self._inflight.end
        cands = []
        if self._heap:
            cands.append(self._heap[0][0])
        nt = self._next_transition()
        if nt is not None:
            cands.append(nt)
        return min(cands) if cands else None

    def advance(self, until: float) -> None:
        """Process every event up to simulated time ``until`` (steps that start before it
        are planned; a step is committed once its end is <= ``until``)."""
        while True:
            nt = self._next_transition()
            if self._inflight is not None:
                end = self._inflight.end
                if end > until:
                    break
                plan, self._inflight = self._inflight, None
                self._event_time = end
                self.engine.commit(plan)
                if nt is not None and nt <= end:
                    self._apply_transition(nt)
                self._pull_arrivals(end)
                self._inflight = self.engine.plan(end)
                continue
            t = self._heap[0][0] if self._heap else None
            if nt is not None and (t is None or nt <= t) and nt <= until:
                self._event_time = max(self._event_time, nt)
                self._apply_transition(nt)
                continue
            if t is None or t > until:
                break
            self._event_time = max(self._event_time, t)
            self._pull_arrivals(self._event_time)
            self._inflight = self.engine.plan(self._event_time)
        if until > self.clock:
            self.clock = until

    def run_for(self, seconds: float) -> RunStats:
        """Offline: simulate ``seconds`` more as fast as possible."""
        self.advance(self.clock + seconds)
        return self.stats()

    # ---- engine listener ---------------------------------------------------------------
    def on_admit(self, req: Request, t: float, hit: int, first: bool) -> None:
        self.exporter.on_admit(req, t, hit, first, self.engine.kv.prefix_caching)

    def on_preempt(self, req: Request, t: float) -> None:
        self.exporter.on_preempt(req, t)

    def on_step(self, plan: StepPlan, t: float, itl_groups: dict, first_tokens: list, generated: int) -> None:
        self.exporter.on_step(plan, t, itl_groups, first_tokens, generated, self.engine.deployment)
        if self.record_itl:
            itl = self._itl
            for last, n in itl_groups.items():
                v = t - last
                itl[v] = itl.get(v, 0) + n

    def on_finish(self, req: Request, t: float) -> None:
        self.exporter.on_finish(req, t)
        if req.http:
            self._http_inflight -= 1
        if req.first_token is not None and req.finish_reason not in ("abort", "error"):
            self.records.append(RequestRecord(
                req.rid, req.http, req.arrival, req.queued, req.first_scheduled, req.first_token, t,
                req.prompt_len, req.num_output, req.cached_tokens, req.num_preemptions, req.finish_reason))
        rt = req.stream
        if rt is not None and rt.active and rt.stream.closed_loop:
            self._push_synthetic(rt, t + rt.think())

    # ---- read-outs ---------------------------------------------------------------------
    def refresh_gauges(self) -> None:
        e = self.engine
        bs = e.kv.block_size
        self.exporter.set_state(len(e.running), len(e.waiting), e.kv.usage, e.kv.used * bs, e.num_gpu_blocks * bs)
        if self.sglang_pd:
            pending = sum(r.reserved_blocks for r in e.waiting) + self._reserved_in_transfer()
            self.exporter.set_pd_state(len(self._prealloc), self._transferring, pending / e.num_gpu_blocks)

        if e.config.max_loras:
            self.exporter.set_lora([r.adapter for r in e.running if r.adapter],
                                   [r.adapter for r in e.waiting if r.adapter], e.config.max_loras, self.clock)

    def _reserved_in_transfer(self) -> int:
        return sum(req.reserved_blocks for _, _, req in self._heap if req.pd_alloc is not None)

    def render_prefill_metrics(self) -> bytes:
        """The ``/metrics`` page of the prefill worker paired with this SGLang P/D decode worker."""
        if not self.sglang_pd:
            raise ValueError("only an SGLang P/D decode worker (engine sglang, kv_transfer_gbps set) has a prefill "
                             "worker's page")
        self.exporter.set_prefill_state(self._transferring)
        return self.exporter.render_prefill()

    def render_metrics(self) -> bytes:
        self.refresh_gauges()
        return self.exporter.render()

    @property
    def content_type(self) -> str:
        return self.exporter.content_type

    def stats(self) -> RunStats:
        c = self.engine.counters
        return RunStats(
            sim_seconds=self.clock, steps=c.steps, busy_fraction=c.busy_s / self.clock if self.clock else 0.0,
            arrived=self.arrived, finished=c.finished, aborted=c.aborted, preemptions=c.preemptions,
            generated_tokens=c.generated_tokens, prefill_tokens=c.prefill_tokens, max_step_tokens=c.max_step_tokens,
            running=len(self.engine.running), waiting=len(self.engine.waiting), kv_usage=self.engine.kv.usage,
            records=list(self.records), itl=dict(self._itl))

    def state(self) -> dict:
        """Ground truth for ``/emulator/state``."""
        e, sc, dep = self.engine, self.scenario, self.engine.deployment
        c = e.counters
        return {
            "scenario": self.plan.name,
            "phase": sc.name,
            "regime": sc.regime,
            "signature": sc.signature,
            "phases": [{"start_s": t, "scenario": s.name, "restart": i in self.plan.restarts}
                       for i, (t, s) in enumerate(self.plan.phases)],
            "engine": self.engine_flavor,
            "model_name": self.model_name,
            "seed": self.seed,
            "sim_time_s": self.clock,
            "config": {
                "max_num_seqs": e.config.max_num_seqs,
                "max_num_batched_tokens": e.config.token_budget,
                "max_model_len": e.config.max_model_len,
                "enable_chunked_prefill": e.config.enable_chunked_prefill,
                "enable_prefix_caching": e.config.enable_prefix_caching,
                "block_size": e.config.block_size,
                "num_gpu_blocks": e.num_gpu_blocks,
                "gpu_memory_utilization": e.config.gpu_memory_utilization,
                "cpu_offload_gb": dep.cpu_offload_gb,
            },
            "hardware": dep.describe(),
            "decode_floor_seconds": dep.decode_floor_s(0),
            "weight_read_floor_seconds": dep.weight_read_floor_s,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "kv_cache_usage": e.kv.usage,
            "kv_blocks_used": e.kv.used,
            "http_inflight": self._http_inflight,
            "counts": {
                "arrived": self.arrived,
                "finished": c.finished,
                "finished_by_reason": dict(c.finished_by_reason),
                "aborted": c.aborted,
                "preemptions": c.preemptions,
                "steps": c.steps,
                "busy_s": c.busy_s,
                "generated_tokens": c.generated_tokens,
                "prefill_tokens_computed": c.prefill_tokens,
                "prefix_cache_queries": c.prefix_queries,
                "prefix_cache_hits": c.prefix_hits,
                "max_step_tokens": c.max_step_tokens,
            },
        }
