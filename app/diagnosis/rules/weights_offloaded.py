"""weights_offloaded — part of the model is read from CPU memory every step.

Symptom: everything slow; decode far above the GPU's bandwidth floor even at a small
batch (the floor of :mod:`app.diagnosis.profile`). Why it matters: PCIe is ~50-100x
slower than HBM, so the only fix is making the model fit on the GPU(s). vLLM exports
weight offload only as the ``cpu_offload_gb`` label of ``cache_config_info`` (older
releases) or as ``engine_sleep_state{sleep_state="weights_offloaded"}`` (sleep mode), so
with neither, the evidence is ITL / floor from the target's hardware profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Need, Rule, check, confidence, info, quantize_weights, remedies
from app.diagnosis.signals import Signals
from app.promql.text import decode_floor_text, human_seconds, instance_selector, num

if TYPE_CHECKING:
    from app.diagnosis.profile import ProfiledTarget
    from app.diagnosis.rules.base import Twin


def _offload_gb(s: Signals) -> float:
    try:
        return float(s.config.get("cpu_offload_gb", "0") or 0)
    except ValueError:
        return 0.0


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    offload_gb = _offload_gb(s)
    sleeping = s.config.get("sleep_state") == "weights_offloaded"
    itl_small = s.itl_typical  # exact means, not a p50 interpolated inside a coarse bucket
    conditions = []
    if s.decode_floor_seconds is not None:
        conditions.append(check("ITL / decode floor", s.itl_over_floor, ">=", t.offload_floor_ratio, "ratio",
                                f"floor {s.decode_floor_seconds * 1000:.1f} ms ({s.hardware})"))
    config_says = offload_gb > 0 or sleeping
    if not conditions and not config_says:
        return None  # neither a floor to compare with nor a config that says so: stay quiet
    if conditions and not all(c.met for c in conditions):
        return None
    conditions.append(check(f"slow decode ({s.itl_typical_name})", itl_small, ">=", t.slow_itl_seconds, "s"))
    if not conditions[-1].met:
        return None
    evidence = conditions + [
        info("cpu_offload_gb", offload_gb if offload_gb else None, "GB", "from vllm:cache_config_info"),
        info("engine sleep state", s.config.get("sleep_state")),
        info("running requests (mean)", s.running_mean),
    ]
    # quantization advice only with formats smaller than the weights of the target's hardware profile
    vllm = [
        *quantize_weights(s, "Drop --cpu-offload-gb and quantize the weights so the model fits in GPU memory",
                          "an AWQ/GPTQ INT4 checkpoint", "--quantization fp8"),
        "Shard across GPUs: --tensor-parallel-size 2+ so each GPU holds its part of the weights.",
        "Use a GPU with more memory.",
    ]
    if sleeping:
        vllm.insert(0, "The engine is in sleep mode with weights offloaded: wake it up (POST /wake_up).")
    tgi = [*quantize_weights(s, "Quantize the weights so the model fits without CPU offload",
                             "--quantize awq / gptq", "fp8"),
           "Shard across GPUs: --num-shard 2+; avoid CPU offload."]
    sglang = [*quantize_weights(s, "Quantize the weights so the model fits without --cpu-offload-gb",
                                "--quantization awq / gptq", "--quantization fp8"),
              "Shard across GPUs: --tp-size 2+; avoid --cpu-offload-gb."]
    # the headline names what fired: the floor ratio of the profile, else the engine's own configuration
    if s.itl_over_floor is not None:
        why = (f" = {s.itl_over_floor:.1f}x the {s.decode_floor_seconds * 1000:.0f} ms HBM floor: part of the "
               "weights is read over PCIe")
    elif sleeping:
        why = ": the engine is asleep with its weights offloaded (sleep mode)"
    else:
        why = f": the engine offloads {human.number(offload_gb)} GB of weights to the CPU (cpu_offload_gb)"
    return Finding(
        "weights_offloaded", "critical", confidence(conditions, s.itl.count if s.itl else 0, 4 * t.min_decode_steps),
        f"Decode takes {itl_small * 1000:.0f} ms per token{why}.",
        evidence, remedies(s.engine, vllm, tgi, sglang),
    )


def promql_profiled(x: Twin, target: ProfiledTarget) -> None:
    """Critical: slow decode at least ``offload_floor_ratio`` times the target's floor."""
    r, t, e = x.recorded, x.t, x.engine
    assert target.hardware is not None
    mean = r["itl_mean"]  # the exact _sum/_count, as the rule's ITL (see itl_typical)
    floor = target.hardware.decode_floor_seconds
    x.add("critical",
          x.and_(f"{mean}{instance_selector([target])} >= {num(t.slow_itl_seconds)}",
                 f"{mean} / {num(floor)} >= {num(t.offload_floor_ratio)}", x.gate),
          f"Decode far above the bandwidth floor on {target.name}: weights offloaded?",
          f"{e.who()}: mean ITL is {{{{ $value | humanizeDuration }}}} over the last {x.w}, at least "
          f"{human.given(t.offload_floor_ratio)}x {decode_floor_text(target.hardware)}: part of the weights is read "
          "over PCIe.",
          {"target": target.name})


#: vLLM's info and sleep-state series that say the weights are offloaded (label matchers).
OFFLOAD_CONFIGURED = '{cpu_offload_gb=~"[0-9.]+", cpu_offload_gb!~"0*\\\\.?0*"}'
OFFLOAD_SLEEPING = '{sleep_state="weights_offloaded"}'


def promql(x: Twin) -> None:
    """Without a hardware profile (vLLM only): slow decode and the engine reports offloaded
    weights (``cpu_offload_gb > 0`` or the ``weights_offloaded`` sleep state). TGI reports neither."""
    r, t, e = x.recorded, x.t, x.engine
    if e.name != "vllm":
        return
    offloaded = e.select("vllm:cache_config_info", OFFLOAD_CONFIGURED)
    sleeping = e.select("vllm:engine_sleep_state", OFFLOAD_SLEEPING)
    offload_config = f"count by ({e.target_by}) ({offloaded})\nor count by ({e.target_by}) ({sleeping} > 0)"
    others = instance_selector(x.hardware, negate=True)
    expr = (f"({r['itl_mean']}{others} >= {num(t.slow_itl_seconds)})\nand on({e.target_by}) ({offload_config})\n"
            f"and on({e.labels}) ({x.gate})")
    x.add("critical", expr, f"Weights offloaded to CPU memory on {e.title}",
          f"{e.who()}: mean ITL is {{{{ $value | humanizeDuration }}}} over the last {x.w} (>= "
          f"{human_seconds(t.slow_itl_seconds)}) and the engine reports offloaded weights (cpu_offload_gb > 0 "
          f"in vllm:cache_config_info, or sleep state weights_offloaded).")


RULE = Rule("weights_offloaded", evaluate, precedence=20, colour="dark-red", promql=promql,
            promql_profiled=promql_profiled, causes=("bandwidth_bound", "queueing", "prefill_compute"), needs=(
    Need("per-step ITL with a hardware profile (the decode floor), or offload configuration from the engine",
         ("itl_over_floor", "config"),
         "a hardware profile for the target (targets YAML hardware: {gpu: ..., model: ...}, or diagnose --gpu "
         "--model) on an engine that exports per-step ITL, so ITL is compared with its decode floor"),
))
