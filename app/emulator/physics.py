"""Engine-step time from a roofline: the physics every latency regime comes out of.

One engine step (a forward pass over every token scheduled in it) takes::

    t_step = max(t_compute, t_memory) + t_offload + t_overhead

    t_compute = FLOPs / (peak FLOP/s x compute_efficiency)
        FLOPs = 2 x params x tokens_in_step                      (the matmuls)
              + 4 x layers x hidden x attention_pairs             (QK^T and AV)
    t_memory  = (weight bytes on the GPU + KV bytes touched) / (HBM bandwidth x memory_efficiency)
    t_offload = weight bytes offloaded to the CPU / effective PCIe bandwidth
    t_overhead = fixed per-step cost (scheduling, kernel launches, sampling)

``attention_pairs`` counts (query token, key token) pairs: a decode token at context c
adds c + 1, a prefill chunk of m new tokens after p cached ones adds m*p + m(m+1)/2.
"KV bytes touched" is the KV cache read for those contexts plus the KV written for the
new tokens, i.e. kv_bytes_per_token x sum(p + m).

Consequences the scenarios rely on (and the tests check):

* a single decoding stream is memory-bound: its ITL is ~ weight bytes / bandwidth plus the
  overhead - :attr:`Deployment.weight_read_floor_s` is the spec-sheet floor
  (weight bytes / peak bandwidth) and :meth:`Deployment.decode_floor_s` the floor this
  model actually produces (with efficiencies and overhead);
* prefill is compute-bound, so TTFT of a lone request grows ~linearly with prompt length
  (slope 2 x params / effective FLOP/s, plus a small quadratic attention term);
* batching decodes is nearly free until compute catches up with the weight read
  (the ridge point, ``ridge_tokens``);
* offloaded weights cross PCIe every step, so ITL sits far above the HBM floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.core.hardware import (
    KV_DTYPE_BYTES,
    WEIGHT_DTYPE_BYTES,
    GiB,
    GPUSpec,
    ModelSpec,
)
from app.core.hardware import (
    gpu as _gpu,
)
from app.core.hardware import (
    model as _model,
)


@dataclass(frozen=True)
class StepCost:
    """What one engine step costs, with the ground truth of why."""

    seconds: float
    compute_s: float
    memory_s: float
    offload_s: float
    overhead_s: float
    flops: float
    bytes_read: float
    bytes_written: float

    @property
    def bound(self) -> str:
        if self.offload_s > max(self.compute_s, self.memory_s):
            return "offload"
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class Deployment:
    """A model on some GPUs with the free parameters of the roofline.

    ``compute_efficiency`` is the achieved fraction of peak FLOP/s in prefill GEMMs (MFU;
    0.5-0.6 is typical for vLLM prefill), ``memory_efficiency`` the achieved fraction of
    peak HBM bandwidth in decode (80-90 % is typical). ``cpu_offload_gb`` mirrors vLLM's
    ``--cpu-offload-gb`` (GiB of weights kept in host memory and streamed over PCIe
    every step). ``activation_reserve_gib`` is the per-GPU memory vLLM's profiling run
    keeps for activations and CUDA graphs, subtracted before sizing the KV cache.
    """

    gpu: GPUSpec
    model: ModelSpec
    weight_dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    tensor_parallel: int = 1
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.85
    step_overhead_s: float = 0.002
    tp_overhead_s: float = 0.0005  # per step, all-reduce latency, only when tensor_parallel > 1
    cpu_offload_gb: float = 0.0
    activation_reserve_gib: float = 2.0
    _cache: dict = field(default_factory=dict, init=False, compare=False, repr=False, hash=False)

    @classmethod
    def of(cls, gpu: str, model: str, **kw) -> Deployment:
        return cls(gpu=_gpu(gpu), model=_model(model), **kw)

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"unknown weight dtype {self.weight_dtype!r}; known: {sorted(WEIGHT_DTYPE_BYTES)}")
        if self.kv_cache_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"unknown kv cache dtype {self.kv_cache_dtype!r}; known: {sorted(KV_DTYPE_BYTES)}")
        if self.tensor_parallel < 1:
            raise ValueError("tensor_parallel must be >= 1")
        if not (0 < self.compute_efficiency <= 1 and 0 < self.memory_efficiency <= 1):
            raise ValueError("efficiencies must be in (0, 1]")
        if self.offloaded_weight_bytes > self.weight_bytes:
            raise ValueError("cpu_offload_gb exceeds the model's weight size")
        c = self._cache
        c["flops"] = self.peak_flops * self.compute_efficiency
        c["bw"] = self.hbm_bandwidth * self.memory_efficiency
        c["fixed"] = self.offload_s + self.step_overhead_s + (self.tp_overhead_s if self.tensor_parallel > 1 else 0.0)
        c["two_p"] = 2.0 * self.model.params
        c["attn"] = 4.0 * self.model.layers * self.model.hidden
        c["kvb"] = self.kv_bytes_per_token

    # ---- static quantities -------------------------------------------------------------
    @property
    def weight_bytes(self) -> float:
        return self.model.params * WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def offloaded_weight_bytes(self) -> float:
        return self.cpu_offload_gb * GiB

    @property
    def gpu_weight_bytes(self) -> float:
        return self.weight_bytes - self.offloaded_weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.model.kv_bytes_per_token(KV_DTYPE_BYTES[self.kv_cache_dtype])

    @property
    def hbm_bandwidth(self) -> float:
        return self.gpu.hbm_bandwidth * self.tensor_parallel

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops(self.weight_dtype) * self.tensor_parallel

    @property
    def gpu_memory_bytes(self) -> float:
        return self.gpu.memory_gib * GiB * self.tensor_parallel

    @property
    def offload_s(self) -> float:
        return self.offloaded_weight_bytes / self.gpu.pcie_bandwidth if self.offloaded_weight_bytes else 0.0

    @property
    def weight_read_floor_s(self) -> float:
        """Spec-sheet decode floor: every weight byte read once per token at peak HBM
        bandwidth (what a monitor can compute from the datasheet)."""
        return self.weight_bytes / self.hbm_bandwidth

    @property
    def ridge_tokens(self) -> float:
        """Tokens per step at which the matmul compute time equals the weight read time."""
        return (self.gpu_weight_bytes / self._cache["bw"]) * self._cache["flops"] / self._cache["two_p"]

    def decode_floor_s(self, context: int = 0) -> float:
        """The single-stream ITL this deployment produces at a given context length."""
        return self.step_cost(1, context + 1, context + 1).seconds

    def prefill_s(self, prompt_tokens: int, chunk: int | None = None) -> float:
        """Time to prefill one prompt alone, in chunks of ``chunk`` tokens (None = one step)."""
        chunk = chunk or prompt_tokens
        total, done = 0.0, 0
        while done < prompt_tokens:
            m = min(chunk, prompt_tokens - done)
            total += self.step_cost(m, done + m, m * done + m * (m + 1) / 2).seconds
            done += m
        return total

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        """KV blocks vLLM would allocate: the memory share left after weights and the
        activation reserve, divided by the block size in bytes."""
        usable = (
            self.gpu_memory_bytes * gpu_memory_utilization
            - self.gpu_weight_bytes
            - self.activation_reserve_gib * GiB * self.tensor_parallel
        )
        return max(0, int(usable // (block_size * self.kv_bytes_per_token)))

    # ---- the roofline ------------------------------------------------------------------
    def step_seconds(self, tokens: int, kv_tokens: float, attention_pairs: float) -> float:
        """Fast path of :meth:`step_cost` (seconds only)."""
        c = self._cache
        compute = (c["two_p"] * tokens + c["attn"] * attention_pairs) / c["flops"]
        memory = (self.gpu_weight_bytes + c["kvb"] * kv_tokens) / c["bw"]
        return (compute if compute > memory else memory) + c["fixed"]

    def step_cost(self, tokens: int, kv_tokens: float, attention_pairs: float) -> StepCost:
        """Cost of a step with ``tokens`` new tokens, ``kv_tokens`` KV entries read or
        written, and ``attention_pairs`` (query, key) pairs."""
        c = self._cache
        flops = c["two_p"] * tokens + c["attn"] * attention_pairs
        read = self.gpu_weight_bytes + c["kvb"] * max(0.0, kv_tokens - tokens)
        written = c["kvb"] * tokens
        compute = flops / c["flops"]
        memory = (self.gpu_weight_bytes + c["kvb"] * kv_tokens) / c["bw"]
        overhead = c["fixed"] - self.offload_s
        return StepCost(
            seconds=max(compute, memory) + c["fixed"],
            compute_s=compute,
            memory_s=memory,
            offload_s=self.offload_s,
            overhead_s=overhead,
            flops=flops,
            bytes_read=read + self.offloaded_weight_bytes,
            bytes_written=written,
        )

    def describe(self) -> dict:
        """Ground truth for ``/emulator/state``."""
        return {
            "gpu": self.gpu.name,
            "tensor_parallel": self.tensor_parallel,
            "model": self.model.name,
            "weight_dtype": self.weight_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "params": self.model.params,
            "weight_bytes": self.weight_bytes,
            "gpu_weight_bytes": self.gpu_weight_bytes,
            "offloaded_weight_bytes": self.offloaded_weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "hbm_bandwidth_bytes_per_s": self.hbm_bandwidth,
            "peak_flops": self.peak_flops,
            "pcie_bandwidth_bytes_per_s": self.gpu.pcie_bandwidth,
            "compute_efficiency": self.compute_efficiency,
            "memory_efficiency": self.memory_efficiency,
            "step_overhead_s": self.step_overhead_s,
            "weight_read_floor_s": self.weight_read_floor_s,
            "decode_floor_s": self.decode_floor_s(0),
            "ridge_tokens": self.ridge_tokens,
            "prefill_s_per_1k_tokens": self.prefill_s(1024),
        }


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

