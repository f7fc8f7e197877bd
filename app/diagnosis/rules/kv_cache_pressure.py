"""kv_cache_pressure — the KV cache is full; sequences are preempted and recomputed.

Symptom: KV-cache usage near 100 %, preemptions counted, latency swings, requests
waiting while the running set stays flat (``vllm:kv_cache_usage_perc``,
``vllm:num_preemptions_total``, ``vllm:num_requests_waiting``). Why it matters: it is
a *cause* — it produces queueing (new requests cannot be admitted) and ITL spikes
(preempted sequences are recomputed) — so tuning the queue would treat the symptom.
TGI exports no preemption counter; there the evidence is usage at the budget
(``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``) with requests waiting.
A P/D decode worker shows it before anything is evicted: SGLang's reserves a request's KV memory
before the prefill worker may send it, so with the cache full requests wait in its prealloc queue
(``sglang:num_decode_prealloc_queue_reqs``; the wait is ``kv_transfer_alloc_ms``) and TTFT grows
although the link is fast - the remedy is decode memory or workers, not the transfer backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import (
    Need,
    Rule,
    check,
    confidence,
    info,
    kv_cache_fp8,
    quantize_weights,
    remedies,
    unless,
)
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    usage = check("KV-cache usage (max)", s.kv_usage_max, ">=", t.kv_usage, "%")
    if s.engine == "tgi" or s.preemptions_per_second is None:
        evicting = check("mean waiting requests", s.waiting_mean, ">=", t.kv_waiting,
                         note="no preemption metric on this engine")
    else:
        evicting = check("preemptions", s.preemptions_per_second, ">", t.preemptions_per_second, "/s")
    # a P/D decode worker (SGLang) is full before anything is evicted: arrivals wait for memory
    memory = [check("mean requests waiting for KV memory (decode prealloc queue)", s.prealloc_queue_mean, ">=",
                    t.kv_prealloc_waiting, note="P/D decode worker: a request's KV is received only once memory is "
                                                "reserved for it"),
              check("mean wait for KV memory", s.kv_alloc_mean, ">=", t.kv_alloc_seconds, "s",
                    "sglang:kv_transfer_alloc_ms") if s.kv_alloc_mean is not None else usage
              ] if s.prealloc_queue_mean is not None else []
    memory_wait = bool(memory) and not (usage.met and evicting.met) and all(c.met for c in memory)
    conditions = memory if memory_wait else [usage, evicting]
    if not all(c.met for c in conditions):
        return None
    evidence = conditions + [
        info("KV-cache usage (mean)", s.kv_usage_mean, "%"),
        info("waiting requests (mean)", s.waiting_mean),
        info("running requests (mean)", s.running_mean),
        info("ITL p99/p50", s.itl_ratio, "ratio"),
        info("cache dtype", s.config.get("cache_dtype"), note="from vllm:cache_config_info")
        if "cache_dtype" in s.config else info("num_gpu_blocks", s.config.get("num_gpu_blocks")),
    ]
    if memory_wait:
        evidence += [
            *([] if usage in conditions else [info("KV-cache usage (max)", s.kv_usage_max, "%")]),
            info("TTFT term: decode prealloc", s.pd_split.get("decode_prealloc"), "s",
                 s.pd_split.get("sources", {}).get("decode_prealloc", "")),
            info("requests whose KV is on its way (mean)", s.transfer_queue_mean),
        ]
    kv_done = kv_cache_fp8(s)  # no KV quantization advice for an FP8 cache
    vllm = [
        "Admit fewer sequences at once: lower --max-num-seqs so the running set fits the cache without preemption.",
        *unless(kv_done, "Quantize the KV cache: --kv-cache-dtype fp8 doubles the tokens that fit."),
        "Give the cache more memory: raise --gpu-memory-utilization (e.g. 0.90 -> 0.95) or use more GPUs "
        "(--tensor-parallel-size) so each holds less of the weights.",
        "Lower --max-model-len if requests never need the full context.",
    ]
    tgi = [
        "Lower --max-batch-total-tokens headroom pressure by limiting --max-total-tokens per request.",
        *unless(kv_done, "Quantize the KV cache (--kv-cache-dtype fp8_e4m3) to double the tokens that fit."),
        *quantize_weights(s, "Quantize the weights to free memory for the cache", "--quantize awq / gptq", "fp8"),
        "Raise --cuda-memory-fraction or shard over more GPUs (--num-shard).",
    ]
    sglang = [
        "Lower --max-running-requests; raise --mem-fraction-static if weights leave room.",
        *unless(kv_done, "Quantize the KV cache: --kv-cache-dtype fp8_e5m2."),
    ]
    if memory_wait:
        sglang = [
            "The decode worker's KV cache is full, not the link: add decode workers behind the router (or move a "
            "prefill worker over) so arriving transfers find memory.",
            "Give the decode workers more KV memory: raise --mem-fraction-static if the weights leave room, or shard "
            "over more GPUs (--tp-size) so each holds less of the weights.",
            "Quantize the KV cache on both workers (--kv-cache-dtype fp8_e5m2; the two layouts must match).",
            "Lower --max-running-requests on the decode worker if long outputs hold the memory new requests need.",
        ]
    trtllm = [
        "Give the KV cache more memory: raise --kv_cache_free_gpu_memory_fraction (kv_cache_config."
        "free_gpu_memory_fraction, default 0.9) if nothing else needs the GPU, or shard the weights over more GPUs "
        "(--tp_size).",
        *unless(kv_done, "Quantize the KV cache: --kv_cache_dtype fp8 (kv_cache_config.dtype) doubles the tokens "
                         "that fit."),
        "Admit fewer requests at once: lower --max_batch_size, and keep scheduler_config.capacity_scheduler_policy "
        "at GUARANTEED_NO_EVICT (the default) so admitted requests are not paused for memory.",
        "Lower --max_seq_len if requests never need the full context.",
    ]
    # the headline names the condition that fired: preemptions, or (without a preemption counter) waiting requests
    evicted = (f"{s.preemptions_per_second:.2f} preemptions/s" if evicting.name == "preemptions"
               else f"{s.waiting_mean:.1f} requests waiting")
    severity = "critical" if (s.preemptions_per_second or 0) >= t.kv_critical_preemptions_per_second else "warning"
    summary = f"The KV cache is full ({s.kv_usage_max:.0%} used, {evicted}); requests wait for memory."
    if memory_wait:
        summary = (f"The decode worker's KV cache is full: {s.prealloc_queue_mean:.1f} requests wait on average for "
                   f"memory before their KV can be received"
                   + (f", {s.kv_alloc_mean:.2f} s each" if s.kv_alloc_mean is not None else "") + ".")
    return Finding(
        "kv_cache_pressure", severity,
        confidence(conditions, s.ttft.count if s.ttft else 0, 4 * t.min_requests),
        summary, evidence, remedies(s.engine, vllm, tgi, sglang, trtllm),
    )


def promql(x: Twin) -> None:
    """Usage + preemptions (or, without a preemption counter, requests waiting); critical at
    ``kv_critical_preemptions_per_second``. TGI exports no preemption counter: warning only. An SGLang
    P/D decode worker also gets the decode-memory branch (prealloc queue and memory wait), labelled
    ``cause="decode_memory"``."""
    r, t, e = x.recorded, x.t, x.engine
    summary = f"KV cache full, sequences evicted on {e.title}"
    text = (f"{e.who()}: KV-cache usage reached {{{{ $value | humanizePercentage }}}} over the last {x.w} "
            f"(>= {human_share(t.kv_usage)}){{extra}}.")
    if r["preemptions"] is None:
        x.add("warning", x.and_(f"{r['kv_max']} >= {num(t.kv_usage)}", f"{r['waiting']} >= {num(t.kv_waiting)}",
                                x.gate), summary,
              text.replace("{extra}", f" with at least {human.given(t.kv_waiting)} request(s) waiting "
                                      f"(TGI exports no preemption counter)"))
        return
    evicting = (f"({r['preemptions']} > {num(t.preemptions_per_second)})\n"
                f"or (({r['waiting']} >= {num(t.kv_waiting)}) "
                f"unless on({e.labels}) {r['preemptions']})")
    conditions = [f"{r['kv_max']} >= {num(t.kv_usage)}", evicting, x.gate]
    x.add("warning", x.and_(*conditions), summary,
          text.replace("{extra}", f" with more than {human.given(t.preemptions_per_second)} preemptions/s (or, "
                                  f"without a preemption counter, requests waiting)"))
    x.add("critical", x.and_(*conditions, f"{r['preemptions']} >= {num(t.kv_critical_preemptions_per_second)}"),
          summary, text.replace("{extra}", f" with at least {human.given(t.kv_critical_preemptions_per_second)} "
                                           "preemption(s)/s"))
    if r.get("prealloc_queue") is not None:  # a P/D decode worker (SGLang) full before anything is evicted
        x.add("warning", x.and_(f"{r['prealloc_queue']} >= {num(t.kv_prealloc_waiting)}",
                                f"{r['kv_alloc_mean']} >= {num(t.kv_alloc_seconds)}", x.gate),
              f"Decode worker's KV cache full: requests wait for memory before their transfer on {e.title}",
              f"{e.who()}: {{{{ $value | humanize }}}} requests waited on average over the last {x.w} for KV memory "
              f"before their KV could be received (>= {human.given(t.kv_prealloc_waiting)}), each at least "
              f"{human_seconds(t.kv_alloc_seconds)} on average: the decode pool's memory, not the link.",
              extra={"cause": "decode_memory"})


RULE = Rule("kv_cache_pressure", evaluate, precedence=10, colour="red", promql=promql,
            causes=("queueing", "prefill_interference"), replicas_help=True, needs=(
    Need("KV-cache usage gauge", ("kv_usage_max",),
         "a KV-cache usage gauge (vLLM kv_cache_usage_perc, SGLang token_usage, trtllm-serve kv_cache_utilization, "
         "TGI tgi_batch_current_max_tokens with tgi_batch_max_total_tokens)"),
    Need("preemption counter or waiting-requests gauge", ("preemptions_per_second", "waiting_mean",
                                                          "prealloc_queue_mean"),
         "a preemption counter (vLLM num_preemptions_total, SGLang num_retracted_requests_total), the "
         "waiting-requests gauge, or SGLang's decode prealloc queue"),
))
