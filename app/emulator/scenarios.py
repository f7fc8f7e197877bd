"""Named scenarios: a deployment + scheduler config + traffic that produce one latency regime.

Every scenario's docstring states the *signature* it is built to show in the metrics
(the regime ids are those of :data:`app.diagnosis.findings.REGIMES`); ``tests/emulator`` checks each
one from histogram deltas of the rendered page, and that the healthy ones show none. The
numbers quoted are measured over simulated t = 60..300 s with seed 0 (vLLM page,
quantiles interpolated from buckets the way Prometheus' ``histogram_quantile`` does; ITL
buckets start at 10 ms, so a ~12 ms ITL reads as p50 ~18 ms).

Transitions: ``"healthy->queueing@60"`` runs ``healthy`` and switches to ``queueing`` at
simulated t = 60 s (deployment, scheduler and traffic all switch; requests in flight
continue). Chains work too: ``"healthy->kv_cache_pressure@60->healthy@180"``. A ``!`` after
the time restarts the engine into the next phase, as a redeploy with new flags does:
``"healthy->queueing@60!"`` (counters from zero, the queue and the prefix cache lost, requests
in flight aborted).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.emulator.engine import EngineConfig
from app.emulator.physics import Deployment
from app.emulator.workload import Burst, LengthDist, TrafficStream

L = LengthDist


@dataclass(frozen=True)
class Scenario:
    name: str
    deployment: Deployment
    engine: EngineConfig
    workload: tuple[TrafficStream, ...]
    regime: str | None  # domain regime id; None = healthy
    summary: str
    model_name: str
    # The intended signature, machine-readable: "<metric>_min" / "<metric>_max" bound a key of
    # app.emulator.readout.signature() over a window (or "itl_over_floor" = ITL mean / weight-read
    # floor); a bare key must equal the value.
    signature: dict = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class ScenarioPlan:
    """A scenario, or a chain of them switching at given simulated times."""

    name: str
    phases: tuple[tuple[float, Scenario], ...]
    restarts: frozenset[int] = frozenset()  # indices of the phases entered by a restart of the engine


_REGISTRY: dict[str, Callable[[], Scenario]] = {}


def scenario(fn: Callable[[], Scenario]) -> Callable[[], Scenario]:
    name = fn.__name__.lstrip("_")
    _REGISTRY[name] = fn
    return fn


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> Scenario:
    try:
        fn = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(_REGISTRY)}") from None
    sc = fn()
    doc = " ".join((fn.__doc__ or "").split())
    return replace(sc, name=name, description=doc)


_PHASE = re.compile(r"^(?P<name>[A-Za-z0-9_]+)@(?P<t>\d+(?:\.\d+)?)(?P<restart>!)?$")


def parse(spec: str) -> ScenarioPlan:
    """``name`` or ``a->b@T1->c@T2`` (T in simulated seconds, increasing; ``c@T2!``: by a restart)."""
    parts = [p.strip() for p in spec.split("->")]
    if not parts or not parts[0]:
        raise ValueError(f"empty scenario in {spec!r}")
    phases = [(0.0, get(parts[0]))]
    restarts = set()
    for p in parts[1:]:
        m = _PHASE.match(p)
        if not m:
            raise ValueError(f"bad transition {p!r} in {spec!r}: expected NAME@SECONDS, e.g. queueing@60 "
                             f"(or queueing@60! for a restart)")
        t = float(m["t"])
        if t <= phases[-1][0]:
            raise ValueError(f"transition times must increase in {spec!r}")
        if m["restart"]:
            restarts.add(len(phases))
        phases.append((t, get(m["name"])))
    return ScenarioPlan(spec, tuple(phases), frozenset(restarts))


def resolve(spec: str | Scenario | ScenarioPlan) -> ScenarioPlan:
    if isinstance(spec, ScenarioPlan):
        return spec
    if isinstance(spec, Scenario):
        return ScenarioPlan(spec.name, ((0.0, spec),))
    return parse(spec)


def describe_all() -> list[dict]:
    out = []
    for n in _REGISTRY:
        sc = get(n)
        out.append({"name": n, "regime": sc.regime, "summary": sc.summary, "description": sc.description,
                    "gpu": sc.deployment.gpu.name, "model": sc.deployment.model.name,
                    "weight_dtype": sc.deployment.weight_dtype, "signature": sc.signature})
    return out


# ---- building blocks ----------------------------------------------------------------------
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B_AWQ = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"


def _a100_8b(**kw) -> Deployment:
    return Deployment.of("A100-80G", "llama-3.1-8b", **kw)


def _chat(rate: float = 3.0, **kw) -> TrafficStream:
    """Chat traffic: a shared system prompt, short-to-medium questions and answers."""
    base = dict(name="chat", rate=rate, prompt=L.lognormal(300, 0.6, 8, 4000),
                output=L.lognormal(180, 0.6, 4, 1500), max_tokens=2048,
                prefix_tokens=256, prefix_share=0.8, num_prefixes=4)
    base.update(kw)
    return TrafficStream(**base)


# ---- scenarios ----------------------------------------------------------------------------
@scenario
def _healthy() -> Scenario:
    """Llama-3.1-8B BF16 on one A100-80G, chunked prefill (2048-token budget), prefix
    caching, Poisson chat traffic at 3 req/s (system prompt shared by 80 %). Signature:
    none. Measured: queue time ~7 ms (half a step: a request waits for the running step to
    end), TTFT p50 37 ms / p99 0.2 s, ITL mean 12.6 ms (1.6x the 7.9 ms weight-read floor),
    ITL p99/p50 ~2.5 (bucket-interpolated; prefill chunks make the odd step longer), KV
    usage < 1 %, no preemptions, prefix-cache hit rate ~0.37."""
    return Scenario("healthy", _a100_8b(), EngineConfig(), (_chat(),), None,
                    "8B on A100, moderate chat load", LLAMA_8B,
                    {"queue_mean_max": 0.05, "ttft_p99_max": 0.5, "itl_p99_p50_max": 3.5, "kv_usage_max": 0.1,
                     "preemptions": 0})


@scenario
def _healthy_bursty() -> Scenario:
    """Like ``healthy`` but noisy: 2 req/s base with 3x bursts for 5 s every 30 s and
    heavier-tailed prompt/answer lengths. Signature: none - the request rate swings 2-6 req/s
    and TTFT/ITL wobble, but queue time stays ~10 ms, TTFT p99 ~0.25 s, ITL p99/p50 ~2.8,
    KV usage ~1 %, no preemptions."""
    stream = _chat(rate=2.0, prompt=L.lognormal(300, 0.9, 8, 6000), output=L.lognormal(160, 0.9, 4, 2000),
                   burst=Burst(period_s=30, duration_s=5, multiplier=3.0, offset_s=10))
    return Scenario("healthy_bursty", _a100_8b(), EngineConfig(), (stream,), None,
                    "8B on A100, bursty chat load", LLAMA_8B,
                    {"queue_mean_max": 0.05, "ttft_p99_max": 0.5, "itl_p99_p50_max": 3.5, "kv_usage_max": 0.1,
                     "preemptions": 0})


@scenario
def _queueing() -> Scenario:
    """8B on A100 with ``--max-num-seqs 8`` and 48 closed-loop users (1 s think time):
    offered load is far above what 8 slots serve, so most users wait. Signature: queue
    time is > 99 % of TTFT (mean ~16 s, TTFT p50 15 s while prefill takes ~40 ms),
    ``num_requests_waiting`` ~36, ``num_requests_running`` pinned at 8, ~2.4 req/s served;
    ITL stays healthy (~12 ms, small batch) and KV usage ~1 %."""
    stream = TrafficStream(name="users", clients=48, think_time_s=1.0, prompt=L.lognormal(400, 0.5, 16, 4000),
                           output=L.lognormal(250, 0.4, 16, 1500), max_tokens=2048)
    return Scenario("queueing", _a100_8b(), EngineConfig(max_num_seqs=8), (stream,), "queueing",
                    "8B on A100, max_num_seqs=8, 48 concurrent users", LLAMA_8B,
                    {"queue_share_min": 0.9, "waiting_min": 20})


@scenario
def _prefill_compute() -> Scenario:
    """8B on A100, long-document prompts (~12k tokens, 4k-30k) from one user (a batch job
    or a RAG client) with 2 s think time, no shared prefix. Signature: TTFT p50 ~1.5 s
    although nothing waits (queue share 0), prefill time = TTFT (1.4 s mean), mean prompt
    ~13k tokens, ``iteration_tokens_total`` observations > 8k (the step finishing a prompt
    counts its full length), ITL normal (p99/p50 ~1.4), KV usage ~4 %."""
    stream = TrafficStream(name="documents", clients=1, think_time_s=2.0, prompt=L.lognormal(12000, 0.3, 4000, 30000),
                           output=L.lognormal(150, 0.4, 16, 1000), max_tokens=1024)
    return Scenario("prefill_compute", _a100_8b(), EngineConfig(), (stream,), "prefill_compute",
                    "8B on A100, ~12k-token prompts, low concurrency", LLAMA_8B,
                    {"ttft_p50_min": 0.8, "queue_share_max": 0.15, "prompt_mean_min": 8000})


@scenario
def _prefill_interference() -> Scenario:
    """8B on A100 with chunked prefill OFF: 24 chat users decoding while long prompts
    (~6k tokens, 2k-24k) arrive at 0.8 req/s. Each long prompt's whole prefill runs in one
    ~0.6 s step (vLLM: together with the running decodes, which get their token only when
    it ends; TGI: a prefill batch that pauses them). Signature (vLLM page): ITL p99/p50 ~33
    (p50 ~18 ms, p99 ~0.59 s), ITL mean 3.3x the weight-read floor, ~1.7 % of
    ``iteration_tokens_total`` observations above 2048 tokens, TTFT p99 ~2.5 s; the same
    traffic with chunked prefill on (2048-token budget) has ITL p99 ~0.25 s, and ~0.07 s
    with a 512-token budget."""
    chat = TrafficStream(name="chat", clients=24, think_time_s=1.0, prompt=L.lognormal(200, 0.5, 8, 2000),
                         output=L.lognormal(300, 0.4, 16, 2000), max_tokens=2048)
    docs = TrafficStream(name="documents", rate=0.8, prompt=L.lognormal(6000, 0.3, 2000, 24000),
                         output=L.lognormal(100, 0.4, 8, 500), max_tokens=512)
    return Scenario("prefill_interference", _a100_8b(), EngineConfig(enable_chunked_prefill=False),
                    (chat, docs), "prefill_interference",
                    "8B on A100, chunked prefill off, long prompts among decodes", LLAMA_8B,
                    {"itl_p99_p50_min": 10.0})


@scenario
def _bandwidth_bound() -> Scenario:
    """Llama-3.1-70B (AWQ INT4, 35 GB) on one L40S (864 GB/s GDDR6), 4 users. Each decode
    step reads all 35 GB of weights: ITL mean ~52 ms for a batch of 1-4, 1.28x the 41 ms
    weight-read floor (weight bytes / bandwidth; the model floor with 85 % achieved
    bandwidth and 2 ms overhead is 50 ms). Signature: ITL high (> 40 ms) and near the floor,
    ITL p99/p50 ~1.2, no queue (~30 ms), KV usage ~7 %, TTFT p50 ~0.2 s."""
    dep = Deployment.of("L40S", "llama-3.1-70b", weight_dtype="int4")
    stream = TrafficStream(name="users", clients=4, think_time_s=1.0, prompt=L.lognormal(300, 0.5, 16, 3000),
                           output=L.lognormal(400, 0.4, 16, 1500), max_tokens=2048)
    return Scenario("bandwidth_bound", dep, EngineConfig(max_model_len=16384), (stream,), "bandwidth_bound",
                    "70B INT4 on one L40S, low concurrency", LLAMA_70B_AWQ,
                    {"itl_p50_min": 0.04, "itl_over_floor_max": 1.5})


@scenario
def _kv_cache_pressure() -> Scenario:
    """8B on A100 with a KV cache of only 1600 blocks (25.6k tokens, e.g.
    ``--gpu-memory-utilization`` set low / ``--num-gpu-blocks-override``) and 16 users
    with ~1.5k-token prompts and ~1.5k-token answers. Running sequences outgrow the cache;
    the newest is preempted and recomputed. Signature: ``kv_cache_usage_perc`` ~0.99,
    ``num_preemptions_total`` rising ~2/s, ~8 requests waiting while ~8 run (queue share
    of TTFT > 0.9 as a consequence), ITL p99/p50 ~10 (recomputed prefills stall decodes),
    TTFT p50 ~14 s."""
    stream = TrafficStream(name="writers", clients=16, think_time_s=1.0, prompt=L.lognormal(1500, 0.4, 64, 6000),
                           output=L.lognormal(1500, 0.3, 64, 4000), max_tokens=4096)
    cfg = EngineConfig(max_model_len=16384, num_gpu_blocks_override=1600)
    return Scenario("kv_cache_pressure", _a100_8b(), cfg, (stream,), "kv_cache_pressure",
                    "8B on A100, tiny KV cache, long outputs", LLAMA_8B,
                    {"kv_usage_min": 0.95, "preemptions_per_s_min": 0.5})


@scenario
def _weights_offloaded() -> Scenario:
    """Llama-3.1-8B BF16 on an RTX 4090 (24 GiB) with ``--cpu-offload-gb 4``: 4 GiB of
    weights cross PCIe Gen4 (~25 GB/s) in every step. Signature: ITL ~0.19 s, about 12x the
    16 ms weight-read floor of the card and flat across batch sizes (p99/p50 ~1.3); TTFT
    p50 ~0.36 s; no real queue (~90 ms = half a step), KV usage ~3 %, no preemptions. (vLLM >= 0.20
    exposes no offload metric; the legacy page shows ``cpu_offload_gb`` in ``vllm:cache_config_info``.)"""
    dep = Deployment.of("RTX-4090", "llama-3.1-8b", cpu_offload_gb=4)
    stream = TrafficStream(name="users", clients=4, think_time_s=2.0, prompt=L.lognormal(300, 0.5, 16, 3000),
                           output=L.lognormal(150, 0.4, 16, 1000), max_tokens=1024)
    return Scenario("weights_offloaded", dep, EngineConfig(), (stream,), "weights_offloaded",
                    "8B BF16 on RTX 4090 with 4 GiB of weights offloaded", LLAMA_8B,
                    {"itl_over_floor_min": 5.0})


@scenario
def _kv_transfer() -> Scenario:
    """The decode worker of a prefill/decode-disaggregated 8B deployment on A100s whose NIXL
    transfers fell back to TCP over a shared 5 Gbit/s path: RAG prompts of ~2k tokens (256 MB of KV
    each) take ~0.45 s to arrive, 2 % of transfers fail. 3 req/s. Signature:
    ``vllm:nixl_xfer_time_seconds`` mean ~0.45 s, about half of TTFT (~0.9 s), failed
    transfers ~2 % (those prompts are recomputed on the decode worker); no queue, the first
    step short (the worker computes only the prompt's last token), ITL normal."""
    stream = _chat(rate=3.0, prompt=L.lognormal(2000, 0.3, 500, 6000), output=L.lognormal(150, 0.5, 8, 1000),
                   prefix_share=0.0)
    cfg = EngineConfig(kv_transfer_gbps=5.0, kv_transfer_failure_rate=0.02)
    return Scenario("kv_transfer", _a100_8b(), cfg, (stream,), "kv_transfer",
                    "8B P/D decode worker, KV over 5 Gbit/s TCP", LLAMA_8B,
                    {"kv_transfer_mean_min": 0.3, "kv_transfer_share_min": 0.6, "kv_transfer_failed_share_min": 0.01,
                     "queue_share_max": 0.2})


def _rag(rate: float = 3.0) -> TrafficStream:
    """RAG traffic of ~2k-token prompts without a shared prefix (the P/D scenarios' workload)."""
    return _chat(rate=rate, prompt=L.lognormal(2000, 0.3, 500, 6000), output=L.lognormal(150, 0.5, 8, 1000),
                 prefix_share=0.0)


@scenario
def _healthy_pd_fast_link() -> Scenario:
    """The ``kv_transfer`` deployment with the KV crossing RDMA at 100 Gbit/s and no transfer failing:
    ~2k-token prompts take ~24 ms to arrive. Signature: none - transfer ~24 ms (about half of a vLLM
    decode worker's 45 ms TTFT, a tenth of an SGLang decode worker's 0.24 s, which also holds the prefill
    worker's ~0.19 s prefill), no queue, ITL normal."""
    cfg = EngineConfig(kv_transfer_gbps=100.0)
    return Scenario("healthy_pd_fast_link", _a100_8b(), cfg, (_rag(),), None,
                    "8B P/D decode worker, KV over 100 Gbit/s RDMA", LLAMA_8B,
                    {"kv_transfer_mean_max": 0.05, "queue_mean_max": 0.05, "preemptions": 0})


@scenario
def _kv_prealloc_full() -> Scenario:
    """A P/D decode worker whose KV pool is too small for its load (2,400 blocks = 38k tokens, e.g. a low
    ``--mem-fraction-static``), fed over a fast link by 32 users with ~2k-token prompts and ~600-token
    answers: every running request holds ~2.5k tokens, ~15 fit. Arrivals wait for memory before their KV
    can be received - SGLang's prealloc queue (``sglang:num_decode_prealloc_queue_reqs`` ~17, the memory
    wait ``kv_transfer_alloc_ms`` ~10 s of a ~10 s TTFT) while the transfer itself stays ~24 ms; on a vLLM
    page the same requests wait in its queue for blocks and running ones are preempted. Signature: KV usage
    > 0.9, requests waiting, the transfer a small share of TTFT."""
    stream = TrafficStream(name="rag", clients=32, think_time_s=1.0, prompt=L.lognormal(2000, 0.3, 500, 6000),
                           output=L.lognormal(600, 0.3, 64, 2000), max_tokens=2048)
    cfg = EngineConfig(kv_transfer_gbps=100.0, max_model_len=16384, num_gpu_blocks_override=2400)
    return Scenario("kv_prealloc_full", _a100_8b(), cfg, (stream,), "kv_cache_pressure",
                    "8B P/D decode worker, KV pool too small for its load", LLAMA_8B,
                    {"kv_usage_min": 0.9, "kv_transfer_share_max": 0.1})


@scenario
def _pd_decode_queueing() -> Scenario:
    """A P/D decode worker capped at 8 running requests (``--max-running-requests 8``, vLLM
    ``--max-num-seqs 8``) under 32 users, the KV arriving fast: requests wait in the decode worker's
    own queue after their KV arrived. Signature: queue share of TTFT > 0.8 (queue ~5 s), ~20 waiting,
    the transfer ~22 ms - the decode-side queue, not the transfer, is slow."""
    stream = TrafficStream(name="rag", clients=32, think_time_s=1.0, prompt=L.lognormal(2000, 0.3, 500, 6000),
                           output=L.lognormal(300, 0.3, 32, 1500), max_tokens=2048)
    cfg = EngineConfig(kv_transfer_gbps=100.0, max_num_seqs=8)
    return Scenario("pd_decode_queueing", _a100_8b(), cfg, (stream,), "queueing",
                    "8B P/D decode worker, 8 running slots, fast link", LLAMA_8B,
                    {"queue_share_min": 0.8, "waiting_min": 10, "kv_transfer_mean_max": 0.05})


@scenario
def _speculation_ineffective() -> Scenario:
    """8B on A100 with a draft proposing 5 tokens per step that the traffic rarely accepts
    (10 % per position: a drafter trained on chat meeting code and tool calls), 8 users.
    Signature: acceptance rate ~2 %, ~1.1 tokens per verification step, each decode step
    verifies 6 tokens per request (ITL a little above the healthy engine's); no queue."""
    stream = TrafficStream(name="users", clients=8, think_time_s=1.0, prompt=L.lognormal(400, 0.5, 16, 4000),
                           output=L.lognormal(250, 0.4, 16, 1500), max_tokens=2048)
    cfg = EngineConfig(num_speculative_tokens=5, spec_acceptance=0.1)
    return Scenario("speculation_ineffective", _a100_8b(), cfg, (stream,), "speculation_ineffective",
                    "8B on A100, 5 draft tokens per step, ~2 % accepted", LLAMA_8B,
                    {"spec_accept_rate_max": 0.05, "spec_accept_length_max": 1.2, "queue_mean_max": 0.05})


@scenario
def _dp_imbalance() -> Scenario:
    """8B on two data-parallel A100 ranks (``--data-parallel-size 2``) behind a router that pins
    every client to rank 0: 48 closed-loop users on rank 0's 8 slots (``--max-num-seqs 8``),
    rank 1 idle. Signature: rank 0 ~8 running and ~36 waiting, rank 1 nothing; summed over the
    ranks the engine shows queueing (queue share > 0.9)."""
    stream = TrafficStream(name="users", clients=48, think_time_s=1.0, prompt=L.lognormal(400, 0.5, 16, 4000),
                           output=L.lognormal(250, 0.4, 16, 1500), max_tokens=2048)
    return Scenario("dp_imbalance", _a100_8b(), EngineConfig(max_num_seqs=8, data_parallel_size=2), (stream,),
                    "dp_imbalance", "8B on 2 DP ranks, all traffic on rank 0", LLAMA_8B, {"waiting_min": 20})


@scenario
def _frontend_bound() -> Scenario:
    """8B on A100 serving multimodal chat: each request spends ~0.3 s in the API server
    (chat template, image decoding and resizing) before the engine sees it; 3 req/s. Signature:
    ``vllm:request_render_duration_seconds`` mean ~0.3 s, ~85 % of TTFT (~0.35 s); no queue,
    prefill short, ITL normal."""
    cfg = EngineConfig(render_seconds=0.3)
    return Scenario("frontend_bound", _a100_8b(), cfg, (_chat(),), "frontend_bound",
                    "8B on A100, 0.3 s of front-end preprocessing per request", LLAMA_8B,
                    {"render_mean_min": 0.25, "render_share_min": 0.6, "queue_mean_max": 0.05})


@scenario
def _scheduler_cpu_bound() -> Scenario:
    """Llama-3.1-8B BF16 on one H100 behind a scheduler short of CPU: ~48 agents decode JSON-schema
    constrained answers, and the scheduler spends 9.5 ms per step plus 130 us per request (grammar masks,
    detokenizing and streaming every token; a container CPU limit slows all of it), ~15.7 ms, while the
    GPU computes the step in ~9.3 ms: even overlapped with the GPU (SGLang's default) the scheduler sets
    the pace. 64 closed-loop users with short prompts and answers. Signature: ITL ~16 ms, ~3.4x the
    4.8 ms weight-read floor with no long prompt, no queue (~8 ms) and KV usage ~3 %; on the SGLang page
    the GPU is idle ~42 % of the scheduler's busy time while its process uses a full CPU-second per
    second."""
    stream = TrafficStream(name="json-agents", clients=64, think_time_s=0.5, prompt=L.lognormal(200, 0.4, 16, 1000),
                           output=L.lognormal(100, 0.4, 8, 400), max_tokens=512)
    cfg = EngineConfig(host_step_s=0.0095, host_request_s=130e-6)
    return Scenario("scheduler_cpu_bound", Deployment.of("H100-SXM", "llama-3.1-8b"), cfg, (stream,),
                    "scheduler_cpu_bound", "8B on H100, 9.5 ms + 130 us/request of scheduler CPU per step", LLAMA_8B,
                    {"itl_over_floor_min": 2.5, "queue_mean_max": 0.05, "kv_usage_max": 0.2})


@scenario
def _lora_adapter_slots() -> Scenario:
    """8B on A100 serving 8 LoRA adapters with ``--max-loras 2``: 24 chat users, each request for one of
    the 8 adapters at random. At most 2 adapters run at once, so the requests of the other 6 wait until
    every running request of an adapter has finished and freed its slot: the adapters take turns.
    Signature: ~8 adapters with requests in flight against 2 slots in every scrape, ~15-19 requests
    waiting (``deferred``) while 3-10 run, queue time ~7 s, ~98 % of TTFT (p50 ~6 s, p99 ~36 s), KV usage
    ~1 % (room to spare); ITL normal (~12 ms)."""
    stream = TrafficStream(name="tenants", clients=24, think_time_s=1.0, prompt=L.lognormal(400, 0.5, 16, 4000),
                           output=L.lognormal(200, 0.5, 16, 1500), max_tokens=2048, adapters=8)
    return Scenario("lora_adapter_slots", _a100_8b(), EngineConfig(max_loras=2), (stream,), "lora_adapter_slots",
                    "8B on A100, 8 LoRA adapters, --max-loras 2", LLAMA_8B,
                    {"queue_share_min": 0.5, "waiting_min": 5, "kv_usage_max": 0.1})
