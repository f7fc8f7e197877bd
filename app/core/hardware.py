"""Hardware and model catalogue shared by the diagnosis (decode roofline floor) and the emulator.

Everything here is a plain, inspectable number with its source, so a test (or a curious
user) can recompute what the emulator does by hand. Units: bytes, bytes/s, FLOP/s; GPU
memory sizes in GiB because that is how the cards are sold (80 GB A100 = 80 GiB HBM).

GPU numbers are the vendors' datasheet peak values, dense (no 2:4 sparsity):

=========  ==================  =========================  ========  =================
GPU        memory bandwidth    BF16 tensor (FP8 tensor)    memory    host link
=========  ==================  =========================  ========  =================
A100-80G   2.039 TB/s HBM2e    312 TFLOP/s (no FP8)        80 GiB    PCIe Gen4 x16
H100-SXM   3.35 TB/s HBM3      989 TFLOP/s (1979)          80 GiB    PCIe Gen5 x16
L40S       0.864 TB/s GDDR6    362 TFLOP/s (733)           48 GiB    PCIe Gen4 x16
RTX-4090   1.008 TB/s GDDR6X   165 TFLOP/s (330)           24 GiB    PCIe Gen4 x16
L4         0.300 TB/s GDDR6    121 TFLOP/s (242)           24 GiB    PCIe Gen4 x16
=========  ==================  =========================  ========  =================

Sources: NVIDIA A100 datasheet (SXM4 80GB: 2,039 GB/s, BF16 312 TFLOPS), H100 datasheet
(SXM5: 3.35 TB/s, BF16 989 TFLOPS, FP8 1,979 TFLOPS), L40S datasheet (864 GB/s, BF16
362.05 TFLOPS, FP8 733 TFLOPS), Ada GeForce whitepaper for the RTX 4090 (1,008 GB/s;
FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS dense), L4 datasheet (300 GB/s, BF16
121 TFLOPS dense). The commonly quoted rounded A100 bandwidth (2.0e12) is replaced by the
datasheet's 2.039e12.

Host link: PCIe Gen4 x16 is 31.5 GB/s per direction on paper; pinned-memory copies reach
~25 GB/s, Gen5 roughly twice that. Weight offload reads at that effective rate.

Model presets are Llama-shaped (GQA): KV bytes per token = 2 (K and V) x layers x
kv_heads x head_dim x bytes per element. Llama-3.1-8B: 32 layers, 8 KV heads of 128 ->
128 KiB/token in BF16; Llama-3.1-70B: 80 layers -> 320 KiB/token.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator (datasheet peak numbers, dense)."""

    name: str
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # FLOP/s, dense tensor-core BF16
    fp8_flops: float | None  # FLOP/s, dense FP8; None when the card has no FP8 tensor cores
    memory_gib: float
    pcie_bandwidth: float  # effective host<->device bytes/s (what weight offload gets)
    pcie: str = "Gen4 x16"
    hbm: bool = True  # the memory is HBM (False: GDDR)

    def peak_flops(self, dtype: str) -> float:
        """Peak matmul rate for weights stored in ``dtype``: FP8 weights run FP8 GEMMs on
        cards that have them (W8A8); INT4 weight-only kernels dequantize to BF16."""
        if dtype == "fp8" and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("A100-80G", 2.039e12, 312e12, None, 80, 25e9),
        GPUSpec("H100-SXM", 3.35e12, 989e12, 1979e12, 80, 50e9, "Gen5 x16"),
        GPUSpec("L40S", 0.864e12, 362e12, 733e12, 48, 25e9, hbm=False),
        GPUSpec("RTX-4090", 1.008e12, 165e12, 330e12, 24, 25e9, hbm=False),
        GPUSpec("L4", 0.300e12, 121e12, 242e12, 24, 25e9, hbm=False),
    )
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, Llama-shaped (grouped-query attention)."""

    name: str
    params: float  # total parameters (embeddings and LM head included)
    layers: int
    hidden: int  # model width = n_heads * head_dim
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_position: int = 131072

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        """Bytes of K and V cache one token occupies across all layers."""
        return 2 * self.layers * self.n_kv_heads * self.head_dim * kv_dtype_bytes


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Llama-3.2-1B: 1.24e9 params, 16 layers, d=2048, 32 heads, 8 KV heads of 64.
        ModelSpec("llama-3.2-1b", 1.24e9, 16, 2048, 32, 8, 64),
        # Llama-3.1-8B: 8.03e9 params, 32 layers, d=4096, 32 heads, 8 KV heads of 128.
        ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128),
        # Llama-3.1-70B: 70.6e9 params, 80 layers, d=8192, 64 heads, 8 KV heads of 128.
        ModelSpec("llama-3.1-70b", 70.6e9, 80, 8192, 64, 8, 128),
    )
}

#: Bytes per weight parameter. INT4 is weight-only (AWQ/GPTQ style); the per-group scales
#: (~0.25 bit/param at group size 128) are ignored to keep the floor easy to recompute.
WEIGHT_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}

#: KV-cache dtype (vLLM ``--kv-cache-dtype``): "auto" = the model dtype (BF16).
KV_DTYPE_BYTES: dict[str, float] = {"auto": 2.0, "bfloat16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0}


def gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}") from None


def model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
