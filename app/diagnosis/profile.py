"""Optional hardware profile of a target: what the decode roofline floor is.

Every decode step reads all the weights (one shard per GPU under tensor parallelism)
from HBM, so a single sequence can never produce tokens faster than
``weight_bytes / (bandwidth x TP)``. Observed ITL divided by this floor is the evidence
that separates ``bandwidth_bound`` (ratio near 1: the hardware is the limit) from
``weights_offloaded`` (ratio far above 1: something slower than HBM, such as PCIe, is in
the path).

Example (targets YAML)::

    hardware: {gpu: A100-80G, model: llama-3.1-8b, weight_dtype: bf16, tensor_parallel: 1}
    hardware: {hbm_bandwidth: 8.64e11, params: 7.06e10, weight_dtype: int4}
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.hardware import GPUS, MODELS, WEIGHT_DTYPE_BYTES
from app.core.limits import MAX_TEXT_LENGTH

#: The share of peak FLOP/s a prefill achieves, for the expected prefill time of a prompt: vLLM
#: and SGLang reach 40-60 % on prompts of a few hundred tokens and more (the emulator uses 60 %).
#: It feeds a cross-check with a 3x tolerance (``queue_estimates_disagree``), not a threshold.
PREFILL_MFU = 0.5


class HardwareProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: str | None = Field(None, max_length=MAX_TEXT_LENGTH, description=f"one of {', '.join(sorted(GPUS))}")
    hbm_bandwidth: float | None = Field(None, gt=0, description="bytes/s per GPU; overrides the GPU preset")
    peak_flops: float | None = Field(None, gt=0, description="dense FLOP/s per GPU; overrides the GPU preset")
    model: str | None = Field(None, max_length=MAX_TEXT_LENGTH, description=f"one of {', '.join(sorted(MODELS))}")
    params: float | None = Field(None, gt=0, description="parameter count; overrides the model preset")
    weight_dtype: str = Field("bf16", max_length=MAX_TEXT_LENGTH, description=f"one of {', '.join(WEIGHT_DTYPE_BYTES)}")
    tensor_parallel: int = Field(1, ge=1, le=64)

    @model_validator(mode="after")
    def _complete(self) -> HardwareProfile:
        if self.gpu is not None and self.gpu not in GPUS:
            raise ValueError(f"unknown gpu {self.gpu!r}; known: {', '.join(sorted(GPUS))}")
        if self.model is not None and self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(sorted(MODELS))}")
        if self.weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"unknown weight_dtype {self.weight_dtype!r}; known: {', '.join(WEIGHT_DTYPE_BYTES)}")
        if self.gpu is None and self.hbm_bandwidth is None:
            raise ValueError("give gpu or hbm_bandwidth")
        if self.model is None and self.params is None:
            raise ValueError("give model or params")
        return self

    @property
    def bandwidth(self) -> float:
        return self.hbm_bandwidth or GPUS[self.gpu].hbm_bandwidth  # type: ignore[index]

    @property
    def parameter_count(self) -> float:
        return self.params or MODELS[self.model].params  # type: ignore[index]

    @property
    def weight_bytes(self) -> float:
        return self.parameter_count * WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def decode_floor_seconds(self) -> float:
        """Lower bound of one decode step: every GPU reads its weight shard once."""
        return self.weight_bytes / (self.bandwidth * self.tensor_parallel)

    @property
    def flops(self) -> float:
        """Dense FLOP/s per GPU for this weight type: the override, else the GPU preset's."""
        return self.peak_flops or GPUS[self.gpu].peak_flops(self.weight_dtype)  # type: ignore[index]

    def prefill_seconds(self, prompt_tokens: float) -> float:
        """Expected compute time of one prompt's prefill: 2 FLOPs per parameter and token over
        the GPUs' FLOP/s at :data:`PREFILL_MFU` (attention's quadratic term left out: small below
        ~8k tokens, so this errs short, and TTFT minus it errs long)."""
        return 2.0 * self.parameter_count * prompt_tokens / (self.flops * self.tensor_parallel * PREFILL_MFU)

    def describe(self) -> str:
        gpu = self.gpu or f"{self.bandwidth / 1e9:.0f} GB/s"
        model = self.model or f"{self.parameter_count / 1e9:.1f}B params"
        tp = f" x TP{self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return f"{model} {self.weight_dtype} on {gpu}{tp}"


def prefill_seconds_per_token(hardware: dict | None) -> float | None:
    """The compute per prompt token of a stored hardware profile (a target's ``hardware``); None
    without one, or for one this release no longer accepts."""
    if not hardware:
        return None
    try:
        return HardwareProfile(**hardware).prefill_seconds(1.0)
    except ValueError:
        return None


class ProfiledTarget(Protocol):
    """A target with the hardware profile its decode floor comes from (a ``TargetConfig`` of the
    targets YAML, which sits above the diagnosis)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def hardware(self) -> HardwareProfile | None: ...
