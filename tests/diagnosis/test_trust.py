"""What makes a finding trustworthy to read: a confidence defined by numbers (docs/diagnosis.md#confidence),
a headline naming the condition that fired, and no remedy the target's hardware profile (or the engine's
own configuration) says is done already."""

from __future__ import annotations

import math

import pytest

from app.diagnosis.findings import Evidence
from app.diagnosis.rules import (
    bandwidth_bound,
    kv_cache_pressure,
    prefill_compute,
    prefill_interference,
    queueing,
    speculation_ineffective,
    weights_offloaded,
)
from app.diagnosis.rules.base import CONFIDENCE_CEILING, CONFIDENCE_FLOOR, confidence, margin
from tests.diagnosis.test_rules import T, evidence, healthy_signals, summary

# ----------------------------------------------------------------------------- confidence


def met(value: float, op: str, threshold: float, unit: str = "", interval: list | None = None) -> Evidence:
    return Evidence("x", value, op, threshold, unit, True, "", interval)


def test_a_margin_counts_doublings_past_the_threshold_or_the_room_to_100_percent_for_a_share() -> None:
    assert margin(met(0.5, ">=", 0.5, "s")) == 0.0  # on the threshold
    assert margin(met(1.0, ">=", 0.5, "s")) == 0.5  # twice past: one doubling of two
    assert margin(met(2.0, ">=", 0.5, "s")) == 1.0 == margin(met(20.0, ">=", 0.5, "s"))  # 4x and beyond
    assert margin(met(2.0, "<=", 8.0)) == 1.0 and margin(met(4.0, "<=", 8.0)) == 0.5  # an upper limit
    # a share compared upward with a threshold below 1 can never be 4x past it: the room up to 100 %
    assert margin(met(0.975, ">=", 0.95, "%")) == pytest.approx(0.5)
    assert margin(met(1.0, ">=", 0.95, "%")) == 1.0 == margin(met(1.0, ">=", 0.5, "ratio"))
    assert margin(met(0.75, ">=", 0.5, "ratio")) == 0.5
    # decided on a bucket: from the bucket's edge nearest the threshold (the value could be that low)
    assert margin(met(4.8, ">=", 1.0, "s", [2.0, 5.0])) == 0.5
    assert margin(met(0.03, "<=", 0.08, "s", [0.01, 0.04])) == pytest.approx(math.log2(2) / 2)
    # nothing to measure: a threshold of 0 (any value counts alike), text, information only
    assert margin(met(3.0, ">", 0.0, "/s")) is None and margin(met(1.0, "info", 0.5)) is None
    assert margin(Evidence("x", "steady", ">=", 1.0)) is None
    assert margin(Evidence("x", 0.4, ">=", 0.5, "s", met=False)) == 0.0


def test_confidence_runs_from_0_5_on_the_threshold_to_0_99_far_past_it_with_enough_data() -> None:
    far = [met(2.0, ">=", 0.5, "s"), met(1.0, ">=", 0.5, "ratio")]
    assert (CONFIDENCE_FLOOR, CONFIDENCE_CEILING) == (0.5, 0.99)
    assert confidence(far, 400, 400) == 0.99
    assert confidence(far + [met(1.0, ">=", 1.0)], 400, 400) == 0.5  # the weakest condition sits on its threshold
    assert confidence([met(1.0, ">=", 0.5, "s")], 400, 400) == round(0.5 + 0.49 * 0.5, 3) == 0.745
    assert confidence(far, 100, 400) == round(0.5 + 0.49 * 0.25, 3) == 0.623  # a quarter of the data wanted
    assert confidence(far, 4000, 400) == 0.99  # more data than wanted adds nothing
    assert confidence(far, 400, 400, reference=False) == round(0.5 + 0.49 * 0.5, 3)  # half as far above 0.5
    assert confidence([], 400, 400) == round(0.5 + 0.49 * 0.5, 3)  # no condition with two numbers: midway


def test_a_critical_finding_whose_second_condition_just_holds_is_confident_at_0_5_never_below() -> None:
    """The effect is large (a queue 8x its threshold: critical), one condition of the pattern only just holds
    (one request waiting, the threshold): severity says the first, confidence the second."""
    s = healthy_signals(queue_time=summary(4, 5, 4.0, 400), ttft=summary(4.1, 5, 4.1, 400), queue_share=0.98,
                        waiting_mean=T.queue_waiting)
    f = queueing.evaluate(s, T)
    assert f is not None and f.severity == "critical" and f.confidence == 0.5
    clear = queueing.evaluate(healthy_signals(queue_time=s.queue_time, ttft=s.ttft, queue_share=1.0,
                                              waiting_mean=4 * T.queue_waiting), T)
    assert clear is not None and clear.severity == "critical" and clear.confidence == 0.99


# ----------------------------------------------------------------------------- headlines


def test_prefill_interference_is_headlined_by_the_condition_that_fired() -> None:
    """A stall share under its threshold (13 % < 20 %) with a heavy ITL tail: the rule fired on p99/p50, so
    the headline says so, not "13 % of decode time is stalled"."""
    tail = dict(itl=summary(0.018, 0.19, 0.03, 30000), itl_ratio=10.3, decode_stall_share=0.13, running_mean=10.0,
                prompt_tokens=summary(1500, 4000, 1772, 300))
    f = prefill_interference.evaluate(healthy_signals(**tail), T)
    assert f is not None and evidence(f, "stalled share of decode time").op == "info"  # shown, not needed
    assert f.summary.startswith("ITL p99 is 10.3x p50 (ITL p99 190.0 ms) while 1,772-token prompts arrive")
    stalled = prefill_interference.evaluate(healthy_signals(**{**tail, "decode_stall_share": 0.3}), T)
    assert stalled is not None and stalled.summary.startswith("30% of decode time is stalled (ITL p99 190.0 ms)")


def test_kv_cache_pressure_and_speculation_name_what_fired() -> None:
    tgi = kv_cache_pressure.evaluate(healthy_signals("tgi", kv_usage_max=1.0, waiting_mean=5.6,
                                                     preemptions_per_second=None), T)
    assert tgi is not None and tgi.summary == ("The KV cache is full (100% used, 5.6 requests waiting); requests "
                                               "wait for memory.")
    vllm = kv_cache_pressure.evaluate(healthy_signals(kv_usage_max=1.0, waiting_mean=5.6,
                                                      preemptions_per_second=1.61), T)
    assert vllm is not None and "(100% used, 1.61 preemptions/s)" in vllm.summary
    # the acceptance rate is low (10 % <= 30 %), the tokens per step are not (2.5 > 1.5): only the rate is said
    spec = dict(spec_accept_rate=0.1, spec_accept_length=2.5, spec_draft_length=4.0, spec_drafts=6000.0)
    f = speculation_ineffective.evaluate(healthy_signals(**spec), T)
    assert f is not None and "only 10% of draft tokens are accepted" in f.summary
    assert "tokens on average" not in f.summary
    both = speculation_ineffective.evaluate(healthy_signals(**{**spec, "spec_accept_length": 1.2}), T)
    assert both is not None
    assert "only 10% of draft tokens are accepted, a verification step emits 1.20 tokens" in both.summary


def test_weights_offloaded_without_a_profile_names_the_configuration_that_says_so() -> None:
    slow = dict(itl=summary(0.175, 0.23, 0.18, 4000), itl_ratio=1.3, running_mean=3.7, decode_floor_seconds=None,
                itl_over_floor=None)
    offload = weights_offloaded.evaluate(healthy_signals(**slow, config={"cpu_offload_gb": "4"}), T)
    assert offload is not None and offload.summary == ("Decode takes 180 ms per token: the engine offloads 4 GB of "
                                                       "weights to the CPU (cpu_offload_gb).")
    asleep = weights_offloaded.evaluate(healthy_signals(**slow, config={"sleep_state": "weights_offloaded"}), T)
    assert asleep is not None and "asleep with its weights offloaded" in asleep.summary
    assert "PCIe" not in asleep.summary


# ----------------------------------------------------------------------------- remedies that fit the deployment

BANDWIDTH = dict(itl=summary(0.062, 0.075, 0.06, 5000), itl_ratio=1.2, running_mean=3.9, decode_floor_seconds=0.0409,
                 itl_over_floor=1.53)


def bandwidth_remedies(engine: str = "vllm", **profile: object) -> list[str]:
    f = bandwidth_bound.evaluate(healthy_signals(engine, **{**BANDWIDTH, **profile}), T)
    assert f is not None
    return f.remedies


def test_no_weight_quantization_advice_for_weights_the_profile_says_are_int4() -> None:
    bf16 = bandwidth_remedies(gpu="L40S", weight_dtype="bf16")
    assert bf16[0] == ("Quantize the weights: an AWQ/GPTQ INT4 checkpoint (~4x fewer bytes per step than BF16) or "
                       "FP8 (--quantization fp8; FP8 tensor cores on Hopper/Ada).")
    fp8 = bandwidth_remedies(gpu="L40S", weight_dtype="fp8")  # INT4 still halves the bytes; FP8 is there already
    assert fp8[0] == "Quantize the weights: an AWQ/GPTQ INT4 checkpoint (~4x fewer bytes per step than BF16)."
    for engine in ("vllm", "tgi", "sglang"):
        int4 = bandwidth_remedies(engine, gpu="L40S", weight_dtype="int4")
        assert not any("INT4" in r or "Quantize the weights" in r or "awq" in r for r in int4), (engine, int4)
        assert len(int4) == len(bandwidth_remedies(engine, gpu="L40S", weight_dtype="bf16")) - 1
    # without a profile nothing is known: every remedy stays
    assert any("INT4" in r for r in bandwidth_remedies(gpu=None, weight_dtype=None))


def test_no_kv_quantization_for_an_fp8_cache_and_no_hbm_advice_on_an_hbm_gpu() -> None:
    gddr = bandwidth_remedies(gpu="L40S", weight_dtype="bf16")
    assert any("--kv-cache-dtype fp8" in r for r in gddr) and gddr[-1].endswith("or an HBM GPU instead of GDDR.")
    hbm = bandwidth_remedies(gpu="H100-SXM", weight_dtype="bf16", config={"cache_dtype": "fp8_e4m3"})
    assert not any("--kv-cache-dtype" in r for r in hbm)
    assert hbm[-1] == "More bandwidth: --tensor-parallel-size 2+ over NVLink (each GPU reads a shard)."
    kv = dict(kv_usage_max=1.0, kv_usage_mean=0.97, preemptions_per_second=1.7, waiting_mean=5.4)
    full = kv_cache_pressure.evaluate(healthy_signals(**kv), T)
    assert full is not None and any("--kv-cache-dtype fp8" in r for r in full.remedies)
    fp8_cache = kv_cache_pressure.evaluate(healthy_signals(**kv, config={"cache_dtype": "fp8"}), T)
    assert fp8_cache is not None and not any("--kv-cache-dtype" in r for r in fp8_cache.remedies)
    assert len(fp8_cache.remedies) == len(full.remedies) - 1


def test_no_fp8_compute_advice_on_a_gpu_without_fp8_tensor_cores_or_for_fp8_weights() -> None:
    long = dict(prefill_per_request=1.4, prefill_share=0.95, prompt_tokens=summary(13000, 16000, 13036, 300),
                queue_time=summary(0.15, 0.3, 0.01, 300))
    for gpu, dtype, fp8_advice in (("H100-SXM", "bf16", True), ("A100-80G", "bf16", False),
                                   ("H100-SXM", "fp8", False)):
        for engine, flag in (("vllm", "--quantization fp8"), ("tgi", "--quantize fp8"),
                             ("sglang", "--quantization fp8"), ("trtllm", "FP8-quantized checkpoint")):
            f = prefill_compute.evaluate(healthy_signals(engine, gpu=gpu, weight_dtype=dtype, **long), T)
            assert f is not None
            assert any(flag in r for r in f.remedies) == fp8_advice, (gpu, dtype, engine, f.remedies)


def test_offload_advice_quantizes_only_to_formats_smaller_than_the_profile() -> None:
    slow = dict(itl=summary(0.175, 0.23, 0.18, 4000), itl_ratio=1.3, running_mean=3.7, decode_floor_seconds=0.0159,
                itl_over_floor=11.0)
    bf16 = weights_offloaded.evaluate(healthy_signals(**slow, gpu="RTX-4090", weight_dtype="bf16"), T)
    assert bf16 is not None and bf16.remedies[0] == ("Drop --cpu-offload-gb and quantize the weights so the model "
                                                     "fits in GPU memory: an AWQ/GPTQ INT4 checkpoint or "
                                                     "--quantization fp8.")
    int4 = weights_offloaded.evaluate(healthy_signals(**slow, gpu="RTX-4090", weight_dtype="int4"), T)
    assert int4 is not None and int4.remedies[0].startswith("Shard across GPUs")
    assert not any("quantiz" in r.lower() for r in int4.remedies)
