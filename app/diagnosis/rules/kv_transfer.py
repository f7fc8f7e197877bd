"""kv_transfer — prefill/decode disaggregation: moving the KV cache from the prefill worker to
the decode worker is a large part of TTFT, or transfers fail.

Symptom: with P/D disaggregation (vLLM's NIXL connector, SGLang P/D, TensorRT-LLM disaggregated
serving, llm-d, NVIDIA Dynamo) a request's first token needs prefill on one worker, the KV
transfer, then the first decode step on another. When the transfer is slow (TCP instead of
RDMA, a cross-node or congested path, too many concurrent transfers) or fails (expired or
failed transfers make the decode worker recompute or the request error), TTFT grows although
neither worker queues or computes more. Why it matters: the fix is the transport and the
placement of the two pools, not the engines' scheduler flags.

Reads the transfer term of the worker's TTFT: its own transfer-time histogram (vLLM
``vllm:nixl_xfer_time_seconds`` and TensorRT-LLM ``trtllm_kv_transfer_latency_seconds``, recorded on the
decode worker; SGLang ``kv_transfer_latency_ms``, in milliseconds, recorded on the *prefill* worker),
and on a decode worker the split of its TTFT (:func:`app.latency.pd_terms`: decode-side prealloc,
prefill queue, prefill, transfer, decode queue, first step), which for SGLang takes the transfer from
the paired prefill worker (``llm_latency_prefill_target``, a source's ``pd_pair_labels``) or, without
its transfer histogram, the decode worker's KV wait less the prefill worker's queue and prefill. The
rule fires on the transfer term only: a slow decode-side queue is ``queueing``, a decode worker
waiting for KV memory (its prealloc queue) is ``kv_cache_pressure``.

An SGLang decode worker alone cannot separate the transfer: it reserves the memory first, and the
prefill worker queues and prefills only then, so its wait for the KV (stage ``decode_transferred``,
else its transfer queue by Little's law) spans the prefill side as well. That wait bounds the
transfer from above: below the thresholds the transfer is judged fast; above them the regime is not
judged (pair the workers), never "healthy" and never a transfer finding the numbers do not support.

The share is the transfer term over the mean TTFT the worker records (bounded to 1); failed and
completed transfers come from the worker's counters (SGLang's decode worker: its KV arrivals). The
worker's role (prefill / decode / both) comes from its configuration when the engine exports it,
else from the transfer metrics it records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app import latency
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import NotJudged, Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    completed = (s.kv_transfers_per_second or 0.0) * s.window_seconds
    failed = (s.kv_transfer_failures_per_second or 0.0) * s.window_seconds
    mean, bound = s.kv_transfer_mean, s.kv_wait_bound
    if mean is None and bound is None and not failed or completed + failed < t.kv_transfer_min_transfers:
        return None
    ttft_mean = s.ttft.mean if s.ttft else None
    slow = [check("KV transfer share of TTFT", s.kv_transfer_share, ">=", t.kv_transfer_share, "ratio",
                  "mean transfer / mean TTFT of this worker"),
            check("mean KV transfer time", mean, ">=", t.kv_transfer_seconds, "s", s.kv_transfer_source or "")]
    failing = check("failed share of KV transfers", s.kv_transfer_failure_share, ">=", t.kv_transfer_failure_share,
                    "ratio", f"{failed:.0f} failed, {completed:.0f} completed in the window (estimated from rates)")
    is_slow = all(c.met for c in slow)
    bound_evidence = []
    if mean is None and bound is not None:  # only the decode worker's KV wait: the transfer is at most that
        bound_share = min(1.0, bound / ttft_mean) if ttft_mean else None
        bound_evidence = [
            check("KV wait share of TTFT (upper bound of the transfer's)", bound_share, ">=", t.kv_transfer_share,
                  "ratio"),
            check("mean KV wait (upper bound of the transfer)", bound, ">=", t.kv_transfer_seconds, "s",
                  s.pd_split.get("sources", {}).get("kv_wait", ""))]
        if all(c.met for c in bound_evidence) and not failing.met:
            raise NotJudged(f"this decode worker waits {bound:.3f} s for its KV ({bound_share:.0%} of TTFT), which "
                            "holds the prefill worker's queue and prefill as well as the transfer: pair it with its "
                            "prefill worker (label llm_latency_prefill_target, or a source's pd_pair_labels) to "
                            "separate the transfer")
    if not is_slow and not failing.met:
        return None
    conditions = (slow if is_slow else []) + ([failing] if failing.met else [])
    split = s.pd_split
    evidence = conditions + bound_evidence + [
        info("P/D role of this worker", s.pd_role or "unknown", note=s.pd_role_source or "neither its configuration, "
             "a target label nor its metrics say"),
        info("KV transfer p99", s.kv_transfer.p99 if s.kv_transfer else None, "s",
             "vLLM's transfer buckets start at 5 ms and end at 5 s"),
        info("KV transfers per second", s.kv_transfers_per_second),
        info("TTFT mean", ttft_mean, "s"),
        info("queue share of TTFT", s.queue_share, "ratio"),
    ]
    if split:  # the decode worker's TTFT, term by term, each with what it was read from
        names = ", ".join(s.pd_prefill_targets) or "not paired"
        evidence += [info(f"TTFT term: {term.replace('_', ' ')}", split.get(term), "s",
                          split["sources"].get(term, "")) for term in latency.PD_TERMS
                     if split.get(term) is not None or term != "decode_prealloc"]
        evidence += [info("KV wait on the decode worker", split.get("kv_wait"), "s",
                          split["sources"].get("kv_wait", "")),
                     info("prefill worker(s) paired", names)]
    if not is_slow:
        evidence += [c for c in slow if c.value is not None]
    vllm = [
        "Check the NIXL transport: UCX must use RDMA (UCX_TLS including rc/cuda_ipc; `ucx_info -d`), not a TCP "
        "fallback; put prefill and decode workers on the same fabric (same node or rail-optimised network).",
        "Failed or expired transfers (vllm:nixl_num_failed_transfers, nixl_num_kv_expired_reqs): raise "
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT only if decode workers are slow to pull; check that both sides run the "
        "same block size, TP layout and KV dtype.",
        "Balance the pools: a decode pool that cannot keep up leaves transfers waiting; add decode workers or "
        "reduce the prefill:decode ratio.",
        "For short prompts the transfer costs more than it saves: route them to a worker that prefills locally "
        "(the router's disaggregation threshold).",
    ]
    sglang = [
        "Check the transfer backend (--disaggregation-transfer-backend mooncake/nixl) uses RDMA "
        "(--disaggregation-ib-device), and sglang:kv_transfer_speed_gb_s against the link's bandwidth.",
        "Failed transfers (sglang:num_transfer_failed_reqs): check bootstrap reachability between the pools and "
        "matching TP/page sizes.",
        "The transfer is timed on the prefill worker (sglang:kv_transfer_latency_ms, kv_transfer_speed_gb_s): "
        "compare its speed with the link's; requests waiting on the decode worker for KV memory are its prealloc "
        "queue (sglang:num_decode_prealloc_queue_reqs), not the link.",
    ]
    trtllm = [
        "Check the cache transceiver: cache_transceiver_config.backend (NIXL, UCX or MPI) must move KV over "
        "RDMA/NVLink, not a TCP fallback (UCX_TLS, `ucx_info -d`); put context and generation servers on the same "
        "fabric.",
        "Set cache_transceiver_config.max_tokens_in_buffer at or above the longest prompt: a smaller transfer "
        "buffer splits transfers and can stall them under load.",
        "Balance the pools in the disaggregated config (trtllm-serve disaggregated -c): add generation_servers if "
        "decode cannot keep up with the transfers, or move a context server over.",
        "For short prompts the transfer costs more than it saves: prefill them on the generation server "
        "(conditional_disagg_config.max_local_prefill_length in the disaggregated config).",
    ]
    tgi = ["TGI has no prefill/decode disaggregation; check the router or gateway that splits the phases."]
    critical = ((s.kv_transfer_failure_share or 0.0) >= t.kv_transfer_critical_failure_share
                or (is_slow and (s.kv_transfer_share or 0.0) >= t.kv_transfer_critical_share))
    if is_slow:
        summary = (f"KV transfers take {mean:.3f} s on average, {s.kv_transfer_share:.0%} of TTFT"
                   + (f", and {s.kv_transfer_failure_share:.1%} of them fail" if failing.met else "") + ".")
    else:
        summary = f"{s.kv_transfer_failure_share:.1%} of KV transfers fail ({failed:.0f} in the window)."
    return Finding("kv_transfer", "critical" if critical else "warning",
                   confidence(conditions, completed + failed, 4 * t.kv_transfer_min_transfers),
                   summary + f" Worker role: {s.pd_role or 'unknown'}.", evidence,
                   remedies(s.engine, vllm, tgi, sglang, trtllm))


def promql(x: Twin) -> None:
    """Slow (mean and share) or failing transfers, on every engine that records a transfer-time
    histogram (vLLM NIXL, SGLang P/D, TensorRT-LLM under Dynamo), over at least
    ``kv_transfer_min_transfers`` completed + failed transfers like :func:`evaluate`."""
    r, t, e = x.recorded, x.t, x.engine
    if r.get("kv_transfer_mean") is None:
        return
    mean, attempts = r["kv_transfer_mean"], r["kv_transfer_attempts"]
    enough = f"{attempts} >= {num(t.kv_transfer_min_transfers)}"

    def slow(share: float) -> str:
        return x.and_(f"{mean} >= {num(t.kv_transfer_seconds)}", f"{r['kv_transfer_share']} >= {num(share)}",
                      enough)

    def failing(share: float) -> str:
        return x.and_(f"{mean} and ({r['kv_transfer_failure_share']} >= {num(share)})", enough)

    # both branches carry the mean transfer time, the alert's {{ $value }}
    x.add("warning", f"({slow(t.kv_transfer_share)})\nor\n({failing(t.kv_transfer_failure_share)})",
          f"KV transfers are slow or failing on {e.title}",
          f"{e.who()}: KV-cache transfers took {{{{ $value | humanizeDuration }}}} on average over the last {x.w} "
          f"(fires at {human_seconds(t.kv_transfer_seconds)} and {human_share(t.kv_transfer_share)} of mean TTFT, "
          f"or when at least {human_share(t.kv_transfer_failure_share)} of them fail).")
    if r.get("kv_wait_mean") is not None:  # a decode worker with no transfer time (SGLang): its failures alone
        for severity, share in (("warning", t.kv_transfer_failure_share),
                                ("critical", t.kv_transfer_critical_failure_share)):
            failing_only = x.and_(f"{r['kv_transfer_failure_share']} >= {num(share)}", enough)
            x.add(severity, f"({failing_only})\nunless on({e.labels}) {mean}",
                  f"KV transfers fail on {e.title}",
                  f"{e.who()}: {{{{ $value | humanizePercentage }}}} of the KV transfers to this decode worker failed "
                  f"over the last {x.w} (fires at {human_share(share)}); its page times no transfer (the prefill "
                  f"worker does), only its wait for the KV, which holds the prefill too.",
                  extra={"cause": "decode_failures"})
    x.add("critical", f"({slow(t.kv_transfer_critical_share)})\nor\n({failing(t.kv_transfer_critical_failure_share)})",
          f"KV transfers dominate TTFT or fail on {e.title}",
          f"{e.who()}: KV-cache transfers took {{{{ $value | humanizeDuration }}}} on average over the last {x.w} "
          f"(critical at {human_share(t.kv_transfer_critical_share)} of mean TTFT, or when at least "
          f"{human_share(t.kv_transfer_critical_failure_share)} of them fail).")


RULE = Rule("kv_transfer", evaluate, precedence=45, colour="dark-purple", promql=promql)
