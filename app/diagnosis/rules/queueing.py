"""queueing — requests wait for the scheduler; TTFT is mostly queue time.

Symptom: TTFT fine alone, grows with concurrency; queue time is a large share of TTFT;
requests are waiting (``vllm:request_queue_time_seconds``, ``vllm:num_requests_waiting``).
Why it matters: the fix is capacity or scheduler limits, not the model or the prompt —
shortening prompts will not help.
Queue share is computed from means (``increase(_sum)/increase(_count)``), which stay
exact although vLLM's queue histogram has no bucket below 300 ms. Pages without a queue-time
histogram (SGLang 0.4.0-0.4.3) are judged from the gauges: the mean queue time is estimated by
Little's law (mean waiting requests / first tokens per second), its share of TTFT capped at 1,
and the evidence says it is an estimate. Where TTFT minus the expected prefill (the engine's
prefill histogram, or a hardware profile) gives a second estimate, both are in the evidence;
when they fall on both sides of the thresholds, queueing is not judged rather than decided by
whichever is chosen.
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
    info,
    probe_evidence,
    quantile_info,
    queue_estimates,
    remedies,
)
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def _estimated_share(queue_mean: float | None, ttft_mean: float | None) -> float | None:
    """An estimate over mean TTFT: the two come from different request sets, so a share above 1
    says only "all of it"."""
    return None if queue_mean is None or not ttft_mean else min(1.0, queue_mean / ttft_mean)


def _cross_check(s: Signals, t: Thresholds, little_says: bool) -> None:
    """Raise :class:`NotJudged` when TTFT minus the expected prefill decides the queue-time
    conditions the other way than Little's law does."""
    other = s.queue_mean_from_ttft
    if other is None:
        return
    other_says = other >= t.queue_seconds and (_estimated_share(other, s.ttft.mean if s.ttft else None)
                                               or 0.0) >= t.queue_share
    if other_says != little_says:
        which = "meets" if little_says else "does not meet"
        raise NotJudged(f"the two queue-time estimates disagree: Little's law gives "
                        f"{human.seconds(s.queue_mean_estimated)}, which {which} the thresholds "
                        f"({human.given(t.queue_seconds)} s and {t.queue_share:.0%} of TTFT), "
                        f"TTFT minus the expected prefill {human.seconds(other)}, which does"
                        f"{' not' if little_says else ''}; a queue-time histogram decides")


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    estimated = s.queue_time is None
    queue_mean = s.queue_mean_estimated if estimated else s.queue_time.mean if s.queue_time else None
    share = s.queue_share
    ttft_mean = s.ttft.mean if s.ttft else None
    if estimated:
        share = _estimated_share(queue_mean, ttft_mean)
    how = "estimated: mean waiting requests / first tokens per second (Little's law); this engine exports " \
          "no queue-time histogram" if estimated else ""
    conditions = [
        check("queue share of TTFT", share, ">=", t.queue_share, "ratio",
              "at most 1" if estimated else s.share_notes.get("queue_share", "")),
        check("mean queue time", queue_mean, ">=", t.queue_seconds, "s", how),
        check("mean waiting requests", s.waiting_mean, ">=", t.queue_waiting),
    ]
    if estimated and conditions[2].met:
        _cross_check(s, t, conditions[0].met and conditions[1].met)
    if not all(c.met for c in conditions):
        return None
    evidence = conditions + queue_estimates(s, t) + [
        info("TTFT mean", s.ttft.mean if s.ttft else None, "s", "derived: queue + prefill" if s.ttft_derived else ""),
        quantile_info("TTFT p99", s.ttft, "p99"),
        info("running requests (mean / max)", f"{s.running_mean or 0:.1f} / {s.running_max or 0:.0f}"),
        info("waiting requests (max)", s.waiting_max),
        info("KV-cache usage (max)", s.kv_usage_max, "%"),
    ]
    evidence += probe_evidence(s, "ttft", "TTFT")
    kv_low = s.kv_usage_max is not None and s.kv_usage_max < 0.8
    running = f"{s.running_max:.0f}" if s.running_max is not None else "the limit"
    vllm = [
        f"The batch is full at {running} running requests"
        + (" while the KV cache has room: raise --max-num-seqs" if kv_low else ": add capacity"),
        "Add replicas behind the load balancer (the queue drains only with more service rate).",
        "Raise --max-num-batched-tokens if prefills are queued behind a small token budget.",
        "Make sure a continuous-batching engine (not a plain framework loop) serves this traffic.",
    ]
    tgi = [
        "Raise --max-concurrent-requests / --max-batch-total-tokens if memory allows"
        if kv_low else "Add capacity: the batch token budget is used up",
        "Add replicas (TGI has no request-level parallelism beyond its batch).",
        "Lower --max-waiting-tokens so waiting requests are merged into the running batch sooner.",
    ]
    sglang = [
        "Raise --max-running-requests" + (" (the KV pool has room)" if kv_low else ""),
        "Add replicas or data-parallel workers (--dp-size).",
    ]
    trtllm = [
        f"The batch is full at {running} running requests"
        + (" while the KV cache has room: raise trtllm-serve's --max_batch_size" if kv_low else ": add capacity"),
        "Raise --max_num_tokens if prefills are queued behind a small per-iteration token budget.",
        ("The KV cache has room: the default scheduler_config.capacity_scheduler_policy GUARANTEED_NO_EVICT "
         "reserves a request's whole sequence before admitting it; MAX_UTILIZATION (in the "
         "--extra_llm_api_options YAML) admits more at the risk of pausing some."
         if kv_low else "Add replicas behind the load balancer (the queue drains only with more service rate)."),
        "For MoE models on several GPUs, attention data parallelism (enable_attention_dp: true in the "
        "--extra_llm_api_options YAML) raises the batch each GPU can take.",
    ]
    severity = "critical" if (queue_mean or 0) >= t.queue_critical_factor * t.queue_seconds else "warning"
    return Finding(
        "queueing", severity, confidence(conditions, s.ttft.count if s.ttft else 0, 4 * t.min_requests),
        f"Requests wait {queue_mean:.2f} s in the queue on average"
        + (" (estimated from the waiting gauge)" if estimated else "")
        + f", {share:.0%} of TTFT; {s.waiting_mean:.1f} requests waiting.",
        evidence, remedies(s.engine, vllm, tgi, sglang, trtllm),
    )


def promql(x: Twin) -> None:
    """Warning at ``queue_seconds``, critical at ``queue_critical_factor`` times it."""
    r, t, e = x.recorded, x.t, x.engine

    def expr(min_queue: float) -> str:
        return x.and_(f"{r['queue_mean']} >= {num(min_queue)}", f"{r['queue_share']} >= {num(t.queue_share)}",
                      f"{r['waiting']} >= {num(t.queue_waiting)}", x.gate)

    text = (f"{e.who()}: requests wait {{{{ $value | humanizeDuration }}}} for the scheduler on average over "
            f"the last {x.w} (mean queue time >= {{min}}), at least {human_share(t.queue_share)} of mean TTFT, "
            f"with at least {human.given(t.queue_waiting)} request(s) waiting on average.")
    for severity, min_queue in (("warning", t.queue_seconds), ("critical", t.queue_critical_factor * t.queue_seconds)):
        x.add(severity, expr(min_queue), f"Requests queue for the scheduler on {e.title}",
              text.replace("{min}", human_seconds(min_queue)))


RULE = Rule("queueing", evaluate, precedence=60, colour="orange", promql=promql, replicas_help=True, needs=(
    Need("queue time (a queue-time histogram, or the waiting gauge with TTFT counts)",
         ("queue_time", "queue_mean_estimated"),
         "a queue-time histogram (vLLM request_queue_time_seconds, SGLang 0.4.6+ queue_time_seconds, TGI "
         "tgi_request_queue_duration, trtllm-serve request_queue_time_seconds), or the waiting gauge and TTFT"),
    Need("waiting-requests gauge", ("waiting_mean",),
         "the engine's waiting-requests gauge (vLLM num_requests_waiting, SGLang num_queue_reqs, TGI "
         "tgi_queue_size, trtllm-serve num_requests_waiting)"),
    Need("TTFT", ("ttft",), "a TTFT histogram (time_to_first_token_seconds; TGI: its queue and prefill "
                            "histograms)"),
))
