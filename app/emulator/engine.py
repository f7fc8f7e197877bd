"""A continuous-batching engine model, scheduled the way vLLM schedules.

State: a waiting queue (FIFO), a running list (admission order), and a paged KV cache of
``num_gpu_blocks`` blocks of ``block_size`` tokens. Each engine step is *planned* at its
start (which requests run, how many tokens each) and *committed* at its end (tokens are
emitted with the step's end time as timestamp).

Planning, chunked prefill ON (vLLM V1 scheduler):

1. running requests first, in admission order: each gets its pending tokens (1 for a
   decode, the rest of its prompt for a partially prefilled one) within the step's token
   budget ``max_num_batched_tokens``; when the KV cache cannot hold a request's new
   tokens, the *last admitted* running request is preempted (recompute mode: its blocks
   are freed, it goes back to the front of the waiting queue with nothing computed and will
   prefill prompt + generated tokens again), repeatedly, until the allocation fits;
2. if nothing was preempted, waiting requests are admitted in FIFO order while the budget,
   ``max_num_seqs`` and the KV cache allow, a long prompt taking only a budget-sized chunk.

Planning, chunked prefill OFF, vLLM (V1 scheduler, ``enable_chunked_prefill=False``): as
above, but a waiting prompt is admitted only whole (its remaining tokens within what is
left of the budget). The long prefill shares the step with the running decodes, which
get their token only when the whole step ends: each decode waits about one prefill.

Planning, chunked prefill OFF, ``prefill_pauses_decode`` (TGI's router, and vLLM's removed
V0 scheduler): if waiting prompts can be admitted (whole, within the budget and the KV
cache), the step is a prefill-only step for them and every running decode stalls for its
duration (admission keeps 1 % of the blocks free, V0's watermark); otherwise it is a
decode step.

Prefix caching: a request may start with a shared prefix (``prefix_id``). The first
request computing it registers the prefix's full blocks in the cache; later requests
reuse them (those tokens skip compute) as long as the blocks were not evicted. Blocks of a
prefix nobody references stay cached but count as free (evicted LRU when space is
needed), as in vLLM, so ``kv usage`` counts referenced blocks only. Hits and queries are
counted in tokens at admission.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.emulator.physics import Deployment, ceil_div


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and cache knobs, named after vLLM's flags."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 2048 with chunked prefill, else max_model_len
    max_model_len: int = 32768
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    # Serving features the newer regimes read (all off by default):
    #: front-end preprocessing per request beyond tokenization (chat template, multimodal inputs), seconds;
    #: the request reaches the engine's queue this much later (vLLM 0.34 ``request_render_duration_seconds``)
    render_seconds: float = 0.0
    #: speculative decoding: draft tokens proposed per decode step (``num_speculative_tokens``) and the
    #: probability that each is accepted (position i is accepted with probability acceptance^i). The
    #: verify cost (k more tokens per decode in the step) is physics; accepted tokens are counted in the
    #: spec-decode metrics but a step still emits one token per request (the emulator does not shorten
    #: outputs), which is what an ineffective drafter looks like.
    num_speculative_tokens: int = 0
    spec_acceptance: float = 0.0
    #: P/D disaggregation, this engine the decode worker: the prompt's KV cache crosses a link of this
    #: many Gbit/s (plus 2 ms setup) before the request joins the queue (None: not disaggregated); the
    #: worker then computes only the prompt's last token (a failed transfer: the whole prompt, as vLLM's
    #: recompute policy does). On an SGLang page the request reaches both workers at once and follows
    #: SGLang's decode worker (:class:`~app.emulator.simulation.Simulation`): memory reserved first
    #: (the prealloc queue), then the prefill worker's prefill and the transfer, then the queue.
    kv_transfer_gbps: float | None = None
    kv_transfer_failure_rate: float = 0.0
    #: data-parallel ranks of the engine; the emulator serves every request on rank 0 (a router that pins
    #: all traffic to one rank), the others idle
    data_parallel_size: int = 1
    #: the scheduler's CPU time per engine step (building the batch, grammar masks, processing results,
    #: streaming output): a fixed part plus a part per request in the step. With ``overlap_schedule`` (SGLang's
    #: default) it runs while the GPU computes the previous step, so a step takes max(GPU, host); without, GPU
    #: + host. The default 0: the host keeps up (every scenario but ``scheduler_cpu_bound``).
    host_step_s: float = 0.0
    host_request_s: float = 0.0
    overlap_schedule: bool = True
    #: LoRA (vLLM ``--max-loras``): at most this many distinct adapters run at once; a waiting request
    #: whose adapter is not among them is skipped (vLLM V1 skips it and admits the next). 0: LoRA off.
    max_loras: int = 0

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.enable_chunked_prefill else max(self.max_model_len, 2048)

    def validate(self, num_gpu_blocks: int) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if not self.enable_chunked_prefill and self.token_budget < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.token_budget}) is smaller than max_model_len "
                f"({self.max_model_len}) and chunked prefill is off: long prompts could never be scheduled"
            )
        if num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache ({num_gpu_blocks} blocks x {self.block_size} = {num_gpu_blocks * self.block_size} "
                f"tokens) cannot hold one max_model_len ({self.max_model_len}) sequence"
            )


class Request:
    """One generation request and its timing (all times in simulated seconds)."""

    __slots__ = (
        "rid", "arrival", "queued", "prompt_len", "max_tokens", "target_output", "stop_reason",
        "prefix_id", "prefix_len", "stream", "sink", "num_computed", "num_output", "first_scheduled",
        "first_token", "last_token", "num_preemptions", "cached_tokens", "shared_blocks",
        "private_blocks", "prefix_ref", "finished", "finish_reason", "finish_time", "http",
        "frontend_s", "kv_transfer_s", "kv_transfer_failed", "reserved_blocks", "pd_entry", "pd_alloc", "adapter",
    )

    def __init__(self, rid: str, arrival: float, queued: float, prompt_len: int, max_tokens: int,
                 natural_output: int, ignore_eos: bool = False, prefix_id: str | None = None,
                 prefix_len: int = 0, stream=None, sink: Callable | None = None, http: bool = False) -> None:
        self.rid = rid
        self.arrival = arrival
        self.queued = queued
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        if ignore_eos or natural_output >= max_tokens:
            self.target_output, self.stop_reason = max_tokens, "length"
        else:
            self.target_output, self.stop_reason = natural_output, "stop"
        self.prefix_id = prefix_id
        self.prefix_len = prefix_len
        self.stream = stream
        self.sink = sink
        self.http = http
        self.num_computed = 0
        self.num_output = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.num_preemptions = 0
        self.cached_tokens = 0  # prefix-cache hit at first admission
        self.shared_blocks = 0
        self.private_blocks = 0
        self.prefix_ref: _Prefix | None = None
        self.finished = False
        self.finish_reason: str | None = None
        self.finish_time: float | None = None
        self.frontend_s = queued - arrival  # tokenization + rendering before the engine sees it
        self.kv_transfer_s = 0.0  # P/D: KV transfer before it joins the queue (part of queued - arrival)
        self.kv_transfer_failed = False
        self.reserved_blocks = 0  # SGLang P/D decode worker: KV blocks reserved for the transfer before admission
        self.pd_entry: float | None = None  # ... when it entered the prealloc queue
        self.pd_alloc: float | None = None  # ... when its memory was reserved (the transfer may start)
        self.adapter: str | None = None  # the LoRA adapter it asks for (None: the base model)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<Request {self.rid} prompt={self.prompt_len} out={self.num_output}/{self.target_output}>"


class _Prefix:
    __slots__ = ("pid", "blocks", "refs")

    def __init__(self, pid: str, blocks: int) -> None:
        self.pid, self.blocks, self.refs = pid, blocks, 0


class KVCache:
    """Paged KV-cache accounting with a shared-prefix cache (see module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.private = 0  # blocks owned by single requests
        self.referenced_shared = 0  # blocks of cached prefixes some request uses
        self.prefixes: dict[str, _Prefix] = {}
        self.unreferenced: OrderedDict[str, _Prefix] = OrderedDict()  # LRU of evictable cached prefixes
        self.unreferenced_blocks = 0

    @property
    def used(self) -> int:
        return self.private + self.referenced_shared

    @property
    def free(self) -> int:
        """Free blocks, counting evictable cached ones as free (vLLM's free queue)."""
        return self.num_blocks - self.used

    @property
    def usage(self) -> float:
        return min(1.0, self.used / self.num_blocks) if self.num_blocks else 0.0

    def _make_room(self, n: int) -> None:
        while self.num_blocks - self.used - self.unreferenced_blocks < n and self.unreferenced:
            pid, p = self.unreferenced.popitem(last=False)
            self.unreferenced_blocks -= p.blocks
            del self.prefixes[pid]

    def allocate(self, req: Request, n: int) -> None:
        self._make_room(n)
        self.private += n
        req.private_blocks += n

    def lookup(self, req: Request) -> _Prefix | None:
        if not (self.prefix_caching and req.prefix_id):
            return None
        return self.prefixes.get(req.prefix_id)

    def reference(self, req: Request, p: _Prefix, blocks: int) -> None:
        if p.refs == 0:
            del self.unreferenced[p.pid]
            self.unreferenced_blocks -= p.blocks
            self.referenced_shared += p.blocks
        p.refs += 1
        req.prefix_ref = p
        req.shared_blocks = blocks

    def maybe_register(self, req: Request) -> None:
        """After a step: the first request to compute a shared prefix publishes its blocks."""
        if req.prefix_ref is not None or not self.prefix_caching or not req.prefix_id:
            return
        blocks = req.prefix_len // self.block_size
        if blocks == 0 or req.num_computed < blocks * self.block_size or req.prefix_id in self.prefixes:
            return
        p = _Prefix(req.prefix_id, blocks)
        self.prefixes[p.pid] = p
        p.refs = 1
        req.prefix_ref = p
        req.shared_blocks = blocks
        req.private_blocks -= blocks
        self.private -= blocks
        self.referenced_shared += blocks

    def release(self, req: Request) -> None:
        self.private -= req.private_blocks + req.reserved_blocks
        req.private_blocks = req.reserved_blocks = 0
        p = req.prefix_ref
        if p is not None:
            p.refs -= 1
            if p.refs == 0:
                self.referenced_shared -= p.blocks
                if p.pid in self.prefixes:
                    self.unreferenced[p.pid] = p
                    self.unreferenced_blocks += p.blocks
            req.prefix_ref = None
        req.shared_blocks = 0


@dataclass
class StepPlan:
    """One planned engine step."""

    start: float
    seconds: float
    entries: list  # [(request, n_new_tokens)]
    tokens: int
    kv_tokens: int
    attention_pairs: float
    prefill_tokens: int  # tokens of entries that are not single decode tokens
    admitted: list  # requests admitted from waiting in this step
    stalled: int  # running requests that got no tokens (chunked prefill off: prefill-only step)
    running_before: int  # running batch size before admissions
    gpu_seconds: float = 0.0  # of ``seconds``, the forward pass on the GPU (the rest: the GPU waits for the host)
    host_seconds: float = 0.0  # the scheduler's CPU work for the step (overlapped with the GPU, or not)

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def is_prefill(self) -> bool:
        return self.prefill_tokens > 0


@dataclass
class EngineCounters:
    steps: int = 0
    busy_s: float = 0.0
    tokens: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    admitted: int = 0
    finished: int = 0
    aborted: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    flops: float = 0.0
    bytes_read: float = 0.0
    max_step_tokens: int = 0
    finished_by_reason: dict = field(default_factory=dict)


class Engine:
    """Scheduler + KV cache + roofline step time. The :class:`~app.emulator.simulation.Simulation`
    drives it; ``listener`` receives admission/preemption/token/finish callbacks."""

    def __init__(self, deployment: Deployment, config: EngineConfig, listener,
                 prefill_pauses_decode: bool = False) -> None:
        self.listener = listener
        self.prefill_pauses_decode = prefill_pauses_decode  # without chunked prefill (see module docstring)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = EngineCounters()
        self.kv: KVCache | None = None
        self.configure(deployment, config)

    # ---- configuration -----------------------------------------------------------------
    def configure(self, deployment: Deployment, config: EngineConfig) -> None:
        """(Re)configure; running requests keep their KV (a smaller cache preempts)."""
        blocks = config.num_gpu_blocks_override or deployment.kv_capacity_blocks(
            config.gpu_memory_utilization, config.block_size)
        config.validate(blocks)
        self.deployment = deployment
        self.config = config
        self.num_gpu_blocks = blocks
        self._budget = config.token_budget
        if self.kv is None:
            self.kv = KVCache(blocks, config.block_size, config.enable_prefix_caching)
        else:
            if config.block_size != self.kv.block_size:
                raise ValueError("block_size cannot change during a run")
            self.kv.num_blocks = blocks
            self.kv.prefix_caching = config.enable_prefix_caching

    # ---- helpers -----------------------------------------------------------------------
    def _blocks_needed(self, req: Request, n_new: int) -> int:
        need = ceil_div(req.num_computed + n_new, self.kv.block_size) - req.shared_blocks - req.private_blocks
        return need if need > 0 else 0

    def _preempt(self, victim: Request, now: float) -> None:
        self.kv.release(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)
        self.listener.on_preempt(victim, now)

    def _admit_waiting(self, entries: list, admitted: list, budget: int, whole: bool, reserve: int = 0) -> int:
        """Move waiting requests (FIFO) into the running set while slots, tokens and KV
        blocks allow; appends to ``entries``/``admitted`` and returns the budget left. With
        LoRA, a request whose adapter would exceed ``max_loras`` is skipped (it keeps its place)."""
        waiting, running, max_loras = self.waiting, self.running, self.config.max_loras
        adapters = {r.adapter for r in running if r.adapter} if max_loras else set()
        skipped: list[Request] = []
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            req = waiting[0]
            if max_loras and req.adapter and req.adapter not in adapters and len(adapters) >= max_loras:
                skipped.append(waiting.popleft())
                continue
            n = self._try_admit(req, budget, whole=whole, reserve=reserve)
            if not n:
                break
            waiting.popleft()
            running.append(req)
            admitted.append(req)
            entries.append((req, n))
            budget -= n
            if req.adapter:
                adapters.add(req.adapter)
        waiting.extendleft(reversed(skipped))
        return budget

    def _try_admit(self, req: Request, budget: int, whole: bool, reserve: int = 0) -> int:
        """Admit ``req`` if it fits (leaving ``reserve`` blocks free); returns tokens
        scheduled (0 = not admitted)."""
        kv = self.kv
        assert kv is not None
        reserved = req.reserved_blocks  # SGLang P/D: the blocks reserved for its KV become its own on admission
        kv.private -= reserved
        req.reserved_blocks = 0
        n = self._admit(req, budget, whole, reserve)
        if not n:
            kv.private += reserved
            req.reserved_blocks = reserved
        return n

    def _admit(self, req: Request, budget: int, whole: bool, reserve: int) -> int:
        kv = self.kv
        assert kv is not None
        p = kv.lookup(req)
        hit = 0
        if p is not None:
            hit = min(p.blocks * kv.block_size, ((req.num_tokens - 1) // kv.block_size) * kv.block_size)
        # P/D decode worker: the prompt's KV arrived from the prefill worker (all but the last token
        # is computed); a failed transfer, or a preempted request, computes it here (vLLM's recompute)
        remote = req.prompt_len - 1 if req.kv_transfer_s and not req.kv_transfer_failed \
            and not req.num_preemptions else 0
        base = max(hit, remote)
        n_new = req.num_tokens - base
        if whole and n_new > budget:
            return 0
        n_new = min(n_new, budget)
        hit_blocks = hit // kv.block_size
        need = ceil_div(base + n_new, kv.block_size) - hit_blocks
        extra = p.blocks if (p is not None and hit_blocks and p.refs == 0) else 0
        if need + extra + reserve > kv.free:
            return 0
        if hit_blocks:
            kv.reference(req, p, hit_blocks)
        req.num_computed = base
        kv.allocate(req, need)
        first = req.first_scheduled is None
        if kv.prefix_caching:
            self.counters.prefix_queries += req.num_tokens
            self.counters.prefix_hits += hit
        if first:
            req.cached_tokens = hit
        self.counters.admitted += 1
        self.listener.on_admit(req, self._now, hit, first)
        if first:
            req.first_scheduled = self._now
        return n_new

    # ---- planning ----------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def plan(self, now: float) -> StepPlan | None:
        self._now = now
        if not (self.running or self.waiting):
            return None
        if self.config.enable_chunked_prefill or not self.prefill_pauses_decode:
            entries, admitted, stalled = self._plan_mixed(now, whole_prompts=not self.config.enable_chunked_prefill)
        else:
            entries, admitted, stalled = self._plan_prefill_only(now)
        if not entries:
            if self.waiting and not self.running:
                # Cannot happen with a validated config; never spin: reject the head.
                req = self.waiting.popleft()
                self.finish(req, now, "error")
                return self.plan(now)
            return None
        tokens = kv_tokens = prefill_tokens = 0
        pairs = 0.0
        for req, n in entries:
            p = req.num_computed
            tokens += n
            kv_tokens += p + n
            if n == 1:
                pairs += p + 1
            else:
                pairs += n * p + n * (n + 1) / 2
                prefill_tokens += n
            if n == 1 and req.num_tokens - p > 1:  # a 1-token prefill chunk
                prefill_tokens += 1
        k = self.config.num_speculative_tokens
        if k:  # verify k draft tokens per decode in the same forward pass
            for req, n in entries:
                if n == 1 and req.num_tokens - req.num_computed == 1:
                    tokens += k
                    kv_tokens += k
                    pairs += k * (req.num_computed + 1) + k * (k + 1) / 2
        gpu = self.deployment.step_seconds(tokens, kv_tokens, pairs)
        cfg = self.config
        host = cfg.host_step_s + cfg.host_request_s * len(entries)
        seconds = max(gpu, host) if cfg.overlap_schedule else gpu + host
        return StepPlan(now, seconds, entries, tokens, kv_tokens, pairs, prefill_tokens, admitted,
                        stalled, len(self.running) - len(admitted), gpu, host)

    def _plan_mixed(self, now: float, whole_prompts: bool):
        """vLLM V1: running requests first, then waiting ones in the budget left (a prompt
        in chunks, or with ``whole_prompts`` only when all of it fits)."""
        budget = self._budget
        entries: list = []
        preempted = False
        running = self.running
        kv = self.kv
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n_new = min(req.num_tokens - req.num_computed, budget)
            need = self._blocks_needed(req, n_new)
            while need > kv.free:
                victim = running.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    break
            else:
                if need:
                    kv.allocate(req, need)
                entries.append((req, n_new))
                budget -= n_new
                i += 1
                continue
            break  # req itself was preempted: it was the last one
        admitted: list = []
        if not preempted:
            self._admit_waiting(entries, admitted, budget, whole=whole_prompts)
        return entries, admitted, 0

    def _plan_prefill_only(self, now: float):
        running, waiting, kv = self.running, self.waiting, self.kv
        admitted: list = []
        entries: list = []
        if waiting and len(running) < self.config.max_num_seqs:
            watermark = self.num_gpu_blocks // 100  # V0 keeps 1 % of the blocks free when admitting
            self._admit_waiting(entries, admitted, self._budget, whole=True, reserve=watermark)
            if entries:
                return entries, admitted, len(running) - len(admitted)
        i = 0
        while i < len(running):
            req = running[i]
            n_new = req.num_tokens - req.num_computed
            need = self._blocks_needed(req, n_new)
            while need > kv.free:
                victim = running.pop()
                self._preempt(victim, now)
                if victim is req:
                    break
            else:
                if need:
                    kv.allocate(req, need)
                entries.append((req, n_new))
                i += 1
                continue
            break
        return entries, admitted, 0

    # ---- commit ------------------------------------------------------------------------
    def commit(self, plan: StepPlan) -> None:
        """Apply a step at its end time: computed tokens, emitted tokens, finishes."""
        t = plan.end
        c = self.counters
        c.steps += 1
        c.busy_s += plan.seconds
        c.tokens += plan.tokens
        c.prefill_tokens += plan.prefill_tokens
        if plan.tokens > c.max_step_tokens:
            c.max_step_tokens = plan.tokens
        itl_groups: dict[float, int] = {}
        first_tokens: list[Request] = []
        generated = 0
        finished_any = False
        kv = self.kv
        max_len = self.config.max_model_len
        for req, n in plan.entries:
            if req.finished:  # aborted while the step ran
                continue
            req.num_computed += n
            if req.prefix_id is not None and req.prefix_ref is None:
                kv.maybe_register(req)
            if req.num_computed < req.prompt_len + req.num_output:
                continue  # a prefill chunk: no token yet
            req.num_output += 1
            generated += 1
            if req.first_token is None:
                req.first_token = t
                first_tokens.append(req)
            else:
                last = req.last_token
                itl_groups[last] = itl_groups.get(last, 0) + 1
            req.last_token = t
            if req.sink is not None:
                req.sink("token", t, req)
            if req.num_output >= req.target_output:
                self.finish(req, t, req.stop_reason, remove=False)
                finished_any = True
            elif req.prompt_len + req.num_output >= max_len:
                self.finish(req, t, "length", remove=False)
                finished_any = True
        if finished_any:
            self.running = [r for r in self.running if not r.finished]
        c.generated_tokens += generated
        self.listener.on_step(plan, t, itl_groups, first_tokens, generated)

    def finish(self, req: Request, t: float, reason: str, remove: bool = True) -> None:
        if req.finished:
            return
        req.finished = True
        req.finish_reason = reason
        req.finish_time = t
        self.kv.release(req)
        if remove:
            if req in self.running:
                self.running.remove(req)
            else:
                try:
                    self.waiting.remove(req)
                except ValueError:
                    pass
        if reason == "abort":
            self.counters.aborted += 1
        else:
            self.counters.finished += 1
        self.counters.finished_by_reason[reason] = self.counters.finished_by_reason.get(reason, 0) + 1
        self.listener.on_finish(req, t)
        if req.sink is not None:
            req.sink("finish", t, req)
