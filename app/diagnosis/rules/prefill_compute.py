"""prefill_compute — long prompts make the first token slow even without a queue.

Symptom: TTFT high even for a single request; prompts are long; little queue wait
(``vllm:request_prefill_time_seconds`` is most of the TTFT). Why it matters: prefill work
grows with prompt length, so the fix is fewer/shorter input tokens or reusing their KV
(prefix caching), not scheduling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import (
    PROMPT_MEAN,
    Need,
    Rule,
    check,
    confidence,
    gpu_without_fp8,
    info,
    probe_evidence,
    quantile_info,
    remedies,
    unless,
    weights_at_most,
)
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    queue_mean = s.queue_time.mean if s.queue_time else 0.0
    prefill_mean = s.prefill_per_request
    prompt_mean = s.prompt_mean  # the histogram's _sum/_count, or the token and request counters
    conditions = [
        check("mean prefill time", prefill_mean, ">=", t.prefill_seconds, "s"),
        check("prefill share of TTFT", s.prefill_share, ">=", t.prefill_share, "ratio",
              s.share_notes.get("prefill_share", "")),
        check("mean prompt length", prompt_mean, ">=", t.long_prompt_tokens, "tokens", s.prompt_mean_source or ""),
    ]
    if not all(c.met for c in conditions):
        return None
    caching = s.config.get("enable_prefix_caching")
    hit_rate = s.prefix_cache_hit_rate
    evidence = conditions + [
        info("TTFT per 1k prompt tokens", s.ttft_per_1k_prompt_tokens, "s"),
        quantile_info("TTFT p99", s.ttft, "p99"),
        info("mean queue time", queue_mean, "s"),
        info("prefix-cache hit rate", hit_rate, "%"),
        info("enable_prefix_caching", caching, note="from vllm:cache_config_info" if caching else ""),
    ]
    evidence += probe_evidence(s, "ttft", "TTFT")
    # FP8 compute only where it is not there already and the profile's GPU has FP8 tensor cores
    no_fp8 = weights_at_most(s, "fp8") or gpu_without_fp8(s)
    vllm = [
        "Shorten the inputs: fewer RAG chunks, truncated chat history, shorter system prompts.",
        ("Enable prefix caching (--enable-prefix-caching) if requests share a prefix (system prompt, documents)"
         if caching == "False" else
         f"Prefix caching is on (hit rate {hit_rate:.0%}); put the shared part of prompts first so it is reused"
         if hit_rate is not None else "Use prefix caching for shared prompt prefixes (--enable-prefix-caching)."),
        "More compute per request for long contexts: --tensor-parallel-size 2+ on NVLink-connected GPUs, "
        "or a faster GPU.",
        *unless(no_fp8, "FP8 weights/activations (--quantization fp8 on Hopper/Ada) cut prefill FLOP time."),
    ]
    tgi = [
        "Shorten the inputs (fewer RAG chunks, truncated history).",
        "Prefix caching is on by default in TGI v3 (PREFIX_CACHING=1); keep shared prefixes at the start of prompts.",
        "More compute: --num-shard 2+ on NVLink GPUs" + ("." if no_fp8 else ", or --quantize fp8."),
    ]
    sglang = [
        "Shorten the inputs; keep the radix cache on (do not pass --disable-radix-cache) and shared prefixes first.",
        "More compute: --tp-size 2+ on NVLink GPUs" + ("." if no_fp8 else ", or --quantization fp8."),
    ]
    trtllm = [
        "Shorten the inputs: fewer RAG chunks, truncated chat history, shorter system prompts.",
        "Reuse shared prefixes: keep kv_cache_config.enable_block_reuse on (the default; --extra_llm_api_options "
        "YAML) and put the shared part of prompts (system prompt, documents) first.",
        "More compute per request for long contexts: --tp_size 2+ on NVLink-connected GPUs, or a faster GPU"
        + ("." if no_fp8 else "; an FP8-quantized checkpoint cuts prefill FLOP time on Hopper/Blackwell."),
        "Give long prefills their own GPUs: disaggregated serving (trtllm-serve disaggregated -c <config> with "
        "context_servers and generation_servers).",
    ]
    severity = "critical" if (prefill_mean or 0) >= t.prefill_critical_factor * t.prefill_seconds else "warning"
    return Finding(
        "prefill_compute", severity, confidence(conditions, s.ttft.count if s.ttft else 0, 4 * t.min_requests),
        f"Prefill of {human.number(prompt_mean)}-token prompts takes {prefill_mean:.2f} s on average "
        f"({s.prefill_share:.0%} of TTFT) with little queueing.",
        evidence, remedies(s.engine, vllm, tgi, sglang, trtllm),
    )


def promql(x: Twin) -> None:
    """Warning at ``prefill_seconds``, critical at ``prefill_critical_factor`` times it."""
    r, t, e = x.recorded, x.t, x.engine

    def expr(min_prefill: float) -> str:
        return x.and_(f"{r['prefill_mean']} >= {num(min_prefill)}", f"{r['prefill_share']} >= {num(t.prefill_share)}",
                      f"{r['prompt_mean']} >= {num(t.long_prompt_tokens)}", x.gate)

    text = (f"{e.who()}: prefill takes {{{{ $value | humanizeDuration }}}} per request on average over the "
            f"last {x.w} (>= {{min}}), at least {human_share(t.prefill_share)} of mean TTFT, with prompts of "
            f"at least {human.given(t.long_prompt_tokens)} tokens on average.")
    for severity, min_prefill in (("warning", t.prefill_seconds),
                                  ("critical", t.prefill_critical_factor * t.prefill_seconds)):
        x.add(severity, expr(min_prefill), f"Long prompts make the first token slow on {e.title}",
              text.replace("{min}", human_seconds(min_prefill)))


RULE = Rule("prefill_compute", evaluate, precedence=40, colour="yellow", promql=promql, needs=(
    Need("prefill time", ("prefill_per_request",),
         "a prefill-time histogram (vLLM request_prefill_time_seconds, SGLang 0.5 "
         "per_stage_req_latency_seconds{stage=\"prefill_forward\"}, TGI tgi_batch_inference_duration{method="
         "\"prefill\"}, trtllm-serve request_prefill_time_seconds)"), PROMPT_MEAN,
))
