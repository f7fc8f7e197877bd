"""kv_transfer — prefill/decode disaggregation: moving the KV cache from the prefill worker to
the decode worker is a large part of TTFT, or transfers fail.

Symptom: with P/D disaggregation (vLLM's NIXL connector, SGLang P/D, TensorRT-LLM disaggregated
serving, llm-d, NVIDIA Dynamo) a request's first token needs prefill on one worker, the KV
transfer, then the first decode step on another. When the transfer is slow (TCP instead of
RDMA, a cross-node or congested path, too many concurrent transfers) or fails (expired or
failed transfers make the decode worker recompute or the request error), TTFT grows although
neither worker queues or computes more. Why it matters: the fix is the transport and the
placement of the two pools, not the engines' scheduler flags.

Reads the transfer-time histogram (vLLM ``vllm:nixl_xfer_time_seconds``, recorded on the
decode worker; SGLang ``kv_transfer_latency_ms``, in milliseconds; TensorRT-LLM
``trtllm_kv_transfer_latency_seconds``) and the failed/completed transfer counts. The share is mean transfer time
over the mean TTFT the worker records (bounded to 1): on a vLLM decode worker that TTFT starts
at the worker's own arrival, so it spans the transfer and the first step, not the remote
prefill. The worker's role (prefill / decode / both) comes from its configuration when the
engine exports it, else from the transfer metrics it records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    completed = (s.kv_transfers_per_second or 0.0) * s.window_seconds
    failed = (s.kv_transfer_failures_per_second or 0.0) * s.window_seconds
    if s.kv_transfer is None and not failed or completed + failed < t.kv_transfer_min_transfers:
        return None
    mean = s.kv_transfer.mean if s.kv_transfer else None
    slow = [check("KV transfer share of TTFT", s.kv_transfer_share, ">=", t.kv_transfer_share, "ratio",
                  "mean transfer / mean TTFT of this worker"),
            check("mean KV transfer time", mean, ">=", t.kv_transfer_seconds, "s")]
    failing = check("failed share of KV transfers", s.kv_transfer_failure_share, ">=", t.kv_transfer_failure_share,
                    "ratio", f"{failed:.0f} failed, {completed:.0f} completed in the window (estimated from rates)")
    is_slow = all(c.met for c in slow)
    if not is_slow and not failing.met:
        return None
    conditions = (slow if is_slow else []) + ([failing] if failing.met else [])
    evidence = conditions + [
        info("P/D role of this worker", s.pd_role or "unknown", note=s.pd_role_source or "neither its configuration, "
             "a target label nor its metrics say"),
        info("KV transfer p99", s.kv_transfer.p99 if s.kv_transfer else None, "s",
             "vLLM's transfer buckets start at 5 ms and end at 5 s"),
        info("KV transfers per second", s.kv_transfers_per_second),
        info("TTFT mean", s.ttft.mean if s.ttft else None, "s"),
        info("queue share of TTFT", s.queue_share, "ratio"),
    ]
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
        "Rebalance prefill and decode workers so transfers do not wait for decode capacity.",
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
    x.add("critical", f"({slow(t.kv_transfer_critical_share)})\nor\n({failing(t.kv_transfer_critical_failure_share)})",
          f"KV transfers dominate TTFT or fail on {e.title}",
          f"{e.who()}: KV-cache transfers took {{{{ $value | humanizeDuration }}}} on average over the last {x.w} "
          f"(critical at {human_share(t.kv_transfer_critical_share)} of mean TTFT, or when at least "
          f"{human_share(t.kv_transfer_critical_failure_share)} of them fail).")


RULE = Rule("kv_transfer", evaluate, precedence=45, colour="dark-purple", promql=promql)
