"""bandwidth_bound — decode is slow because every step must read all the weights.

Symptom: ITL high even for a single request / small batch, steady (no stalls), and
near the hardware floor ``weight_bytes / HBM bandwidth`` (:mod:`app.diagnosis.profile`).
Why it matters: no scheduler knob helps; only moving fewer bytes per token does
(quantized weights, quantized KV cache, speculative decoding) or more bandwidth
(another GPU, TP).

With a hardware profile the rule requires ITL/floor <= ``floor_ratio_max``; without
one it can only see "slow, steady, small batch" and says so with lower confidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import (
    Need,
    NotJudged,
    Rule,
    check,
    confidence,
    decided,
    gpu_with_hbm,
    info,
    kv_cache_fp8,
    probe_evidence,
    quantile_info,
    quantize_weights,
    remedies,
    unless,
)
from app.diagnosis.signals import Signals
from app.promql.text import decode_floor_text, human_seconds, instance_selector, num

if TYPE_CHECKING:
    from app.diagnosis.profile import ProfiledTarget
    from app.diagnosis.rules.base import Twin


def _steady(s: Signals, t: Thresholds) -> tuple[bool | None, str]:
    """Is decode steady (ITL p99/p50 at most ``steady_itl_ratio``)? Decided on the ratio's range
    over the two quantiles' buckets (:attr:`Signals.itl_ratio_bounds`), and only from as many
    scrapes as "steady" needs: a few scrapes after an engine start show a calm that says nothing."""
    if s.itl_ratio_bounds is not None:
        verdict = decided(*s.itl_ratio_bounds, "<=", t.steady_itl_ratio)
    else:  # quantiles without their buckets: the ratio as given
        verdict = s.itl_ratio is not None and s.itl_ratio <= t.steady_itl_ratio
    if verdict is None and s.itl_ratio_bounds is not None:
        low, high = s.itl_ratio_bounds
        return None, (f"ITL p99/p50 is between {low:.2f} and {high:.2f} over the buckets that hold them; the "
                      f"steady limit {human.given(t.steady_itl_ratio)} is inside that range")
    steps = s.itl.count if s.itl is not None else 0.0
    if verdict and (s.scrapes < t.steady_min_scrapes or steps < t.steady_min_decode_steps):
        return None, (f"decode looks steady, but from {s.scrapes} scrape(s) and {steps:.0f} decode steps; "
                      f"steadiness needs at least {t.steady_min_scrapes} scrapes and "
                      f"{human.given(t.steady_min_decode_steps)} steps (thresholds steady_min_scrapes, "
                      "steady_min_decode_steps)")
    return verdict, ""


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    itl_small = s.itl_typical
    steady, why = _steady(s, t)
    conditions = [
        check(s.itl_typical_name, itl_small, ">=", t.slow_itl_seconds, "s", "exact: _sum / _count"),
        check("mean running requests", s.running_mean, "<=", t.low_batch_running),
        check("ITL p99/p50", s.itl_ratio, "<=", t.steady_itl_ratio, "ratio",
              "steady decode, no stalls" + (f" (from {s.scrapes} scrapes)" if steady else "")),
    ]
    conditions[-1].met = bool(steady)
    if s.decode_floor_seconds is not None:
        conditions.append(check("ITL / decode floor", s.itl_over_floor, "<=", t.floor_ratio_max, "ratio",
                                f"floor {s.decode_floor_seconds * 1000:.1f} ms = weight bytes / HBM bandwidth "
                                f"({s.hardware})"))
    if steady is None and all(c.met for c in conditions[:2] + conditions[3:]):  # all but steadiness
        raise NotJudged(why)
    if not all(c.met for c in conditions):
        return None
    evidence = conditions + [
        quantile_info("ITL p50", s.itl, "p50"),
        quantile_info("ITL p99", s.itl, "p99"),
        info("generation throughput", s.generation_tokens_per_second, "tokens/s"),
    ]
    evidence += probe_evidence(s, "itl", "ITL")
    if s.decode_floor_seconds is None:
        evidence.append(info("hardware profile", "not configured",
                             note="add `hardware:` to the target to compare ITL with the bandwidth floor"))
    # nothing the target's hardware profile (or the engine's configuration) says is done already
    kv_done, hbm = kv_cache_fp8(s), gpu_with_hbm(s)
    vllm = [
        *quantize_weights(s, "Quantize the weights", "an AWQ/GPTQ INT4 checkpoint (~4x fewer bytes per step than BF16)",
                          "FP8 (--quantization fp8; FP8 tensor cores on Hopper/Ada)"),
        *unless(kv_done, "Quantize the KV cache: --kv-cache-dtype fp8 (recent GPUs) — halves KV bytes read per step."),
        "Speculative decoding (--speculative-config with a draft model, EAGLE or n-gram): several tokens per "
        "weight read; good at low concurrency, costs throughput at high concurrency.",
        "More bandwidth: --tensor-parallel-size 2+ over NVLink (each GPU reads a shard)"
        + ("." if hbm else ", or an HBM GPU instead of GDDR."),
    ]
    tgi = [
        *quantize_weights(s, "Quantize the weights", "--quantize awq / gptq / marlin (INT4)", "fp8"),
        *unless(kv_done, "Quantize the KV cache: --kv-cache-dtype fp8_e4m3 / fp8_e5m2."),
        "Speculative decoding: --speculate N (Medusa/n-gram).",
        "More bandwidth: --num-shard 2+ over NVLink" + ("." if hbm else ", or an HBM GPU."),
    ]
    sglang = [
        *quantize_weights(s, "Quantize the weights", "--quantization awq / gptq (INT4)", "--quantization fp8"),
        *unless(kv_done, "Quantize the KV cache: --kv-cache-dtype fp8_e5m2."),
        "Speculative decoding: --speculative-algorithm EAGLE.",
        "More bandwidth: --tp-size 2+ over NVLink" + ("." if hbm else ", or an HBM GPU."),
    ]
    floor_note = (f", {s.itl_over_floor:.1f}x the {s.decode_floor_seconds * 1000:.0f} ms bandwidth floor"
                  if s.itl_over_floor is not None else "")
    # without the floor, "slow and steady" could also be a slow model server: half the confidence above 0.5
    conf = confidence(conditions, s.itl.count if s.itl else 0, 4 * t.min_decode_steps,
                      reference=s.decode_floor_seconds is not None)
    return Finding(
        "bandwidth_bound", "warning" if s.decode_floor_seconds is not None else "info", conf,
        f"Decode takes {itl_small * 1000:.0f} ms per token at a small batch ({s.running_mean:.1f} running)"
        f"{floor_note}: memory bandwidth is the limit.",
        evidence, remedies(s.engine, vllm, tgi, sglang),
    )


def promql_profiled(x: Twin, target: ProfiledTarget) -> None:
    """Warning: slow, steady, small batch and within ``floor_ratio_max`` of the target's floor."""
    r, t, e = x.recorded, x.t, x.engine
    assert target.hardware is not None
    mean = r["itl_mean"]  # the exact _sum/_count, as the rule's ITL (see itl_typical)
    floor = target.hardware.decode_floor_seconds
    x.add("warning",
          x.and_(f"{mean}{instance_selector([target])} >= {num(t.slow_itl_seconds)}",
                 f"{r['running']} <= {num(t.low_batch_running)}", f"{r['itl_ratio']} <= {num(t.steady_itl_ratio)}",
                 f"{mean} / {num(floor)} <= {num(t.floor_ratio_max)}", x.gate),
          f"Decode is memory-bandwidth bound on {target.name}",
          f"{e.who()}: mean ITL is {{{{ $value | humanizeDuration }}}} over the last {x.w} (>= "
          f"{human_seconds(t.slow_itl_seconds)}), at most {human.given(t.floor_ratio_max)}x "
          f"{decode_floor_text(target.hardware)}, steady (p99/p50 <= {human.given(t.steady_itl_ratio)}) at a small "
          f"batch (<= {human.given(t.low_batch_running)} running).",
          {"target": target.name})


def promql(x: Twin) -> None:
    """Without a hardware profile: slow, steady and a small batch, at ``info`` (as the rule)."""
    r, t, e = x.recorded, x.t, x.engine
    others = instance_selector(x.hardware, negate=True)
    x.add("info",
          x.and_(f"{r['itl_mean']}{others} >= {num(t.slow_itl_seconds)}",
                 f"{r['running']} <= {num(t.low_batch_running)}", f"{r['itl_ratio']} <= {num(t.steady_itl_ratio)}",
                 x.gate),
          f"Decode slow and steady at a small batch on {e.title}",
          f"{e.who()}: mean ITL is {{{{ $value | humanizeDuration }}}} over the last {x.w} (>= "
          f"{human_seconds(t.slow_itl_seconds)}), steady (p99/p50 <= {human.given(t.steady_itl_ratio)}) with at "
          f"most {human.given(t.low_batch_running)} running: probably memory-bandwidth bound. Add a `hardware:` "
          f"profile to the target to compare with the decode floor.")


RULE = Rule("bandwidth_bound", evaluate, precedence=50, colour="blue", promql=promql,
            promql_profiled=promql_profiled, min_scrapes="steady_min_scrapes", needs=(
    Need("per-step ITL histogram", ("itl",),
         "a per-step inter-token latency histogram (vLLM inter_token_latency_seconds, SGLang "
         "inter_token_latency_seconds, TGI tgi_batch_inference_duration{method=\"decode\"}); trtllm-serve "
         "times decode per request only"),
    Need("running-requests gauge", ("running_mean",),
         "the engine's running-requests gauge (vLLM num_requests_running, SGLang num_running_reqs, TGI "
         "tgi_batch_current_size)"),
))
