"""replica_imbalance — the replicas of one service are unevenly loaded: one queues while
another has room.

Symptom: the service's summed numbers look fine or mildly queued, but one replica holds most
of the requests and makes its clients wait, while another replica of the same service sits
nearly idle. Typical causes: a round-robin Kubernetes Service with HTTP keep-alive (kube-proxy
balances connections, not requests, so a few long-lived client connections pin their traffic
to one pod), session or prefix-cache affinity that concentrates traffic, or replicas of
unequal capacity behind equal weights. Why it matters: adding replicas does not help until
requests are routed by load; the idle capacity is already paid for.

Judged on a service (``service_labels`` of a Prometheus source: its replicas summed by ``le``
are diagnosed as a whole, and each replica's own load is kept next to it). Load is the
requests in a replica, running + waiting, as means over the window.
"""

from __future__ import annotations

from app.core.thresholds import Thresholds
from app.diagnosis.findings import Evidence, Finding
from app.diagnosis.rules.base import Rule, check, confidence, info
from app.diagnosis.signals import ReplicaLoad, Signals

IDLE_FLOOR = 0.1  # requests: a replica with less load than this counts as this much (no division by zero)


def _describe(r: ReplicaLoad) -> str:
    rate = "?" if r.requests_per_second is None else f"{r.requests_per_second:.2f}"
    ttft = "?" if r.ttft_mean is None else f"{r.ttft_mean:.3f} s"
    return (f"running {r.running_mean:.1f}, waiting {r.waiting_mean:.1f}, {rate} req/s, "
            f"TTFT mean {ttft}")


def compare_loads(loads: list[ReplicaLoad], t: Thresholds, what: str) -> tuple[list[Evidence], float] | None:
    """The busiest and least busy of ``loads`` (busiest first) compared with the ``imbalance_*``
    thresholds: the conditions, and the load ratio. Shared by the replicas of a service and the
    data-parallel ranks of one engine (``dp_imbalance``); ``what`` names the unit ("replica", "rank")."""
    if len(loads) < 2:
        return None
    busiest, idlest = loads[0], loads[-1]
    ratio = busiest.load / max(idlest.load, IDLE_FLOOR)
    conditions = [
        check(f"mean waiting requests on the busiest {what}", busiest.waiting_mean, ">=", t.imbalance_waiting, "",
              busiest.target),
        check(f"mean waiting requests on the least busy {what}", idlest.waiting_mean, "<=", t.imbalance_idle_waiting,
              "", idlest.target),
        check(f"load of the busiest / least busy {what}", ratio, ">=", t.imbalance_load_ratio, "x",
              "load = running + waiting requests"),
    ]
    return conditions, ratio


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    compared = compare_loads(s.replicas, t, "replica")
    if compared is None:
        return None
    conditions, ratio = compared
    busiest, idlest = s.replicas[0], s.replicas[-1]
    if not all(c.met for c in conditions):
        return None
    evidence = conditions + [info(f"replica {r.target}", _describe(r)) for r in s.replicas]
    remedies = [
        "Route by load, not round-robin: a least-outstanding-requests or queue-aware balancer (the Gateway API "
        "Inference Extension's endpoint picker, llm-d's router, Envoy least_request) sends new requests to the "
        "replicas with room.",
        "Behind a plain Kubernetes Service, HTTP keep-alive pins each client connection to one pod (kube-proxy "
        "balances connections, not requests): balance per request at a proxy or gateway, or have clients open "
        "more, shorter-lived connections.",
        "Check session affinity and prefix-cache-aware routing weights: affinity that concentrates traffic trades "
        "TTFT for cache hits.",
        "Give replicas of unequal capacity (GPU type, batch limits such as vLLM's --max-num-seqs or trtllm-serve's "
        "--max_batch_size, tensor parallelism) proportional weights.",
    ]
    severity = "critical" if ratio >= t.imbalance_critical_factor * t.imbalance_load_ratio else "warning"
    requests = s.ttft.count if s.ttft else 0.0
    return Finding(
        "replica_imbalance", severity, confidence(conditions, requests, 4 * t.min_requests),
        f"Replica {busiest.target} holds {ratio:.1f}x the requests of {idlest.target} "
        f"({busiest.waiting_mean:.1f} waiting vs {idlest.waiting_mean:.1f}): requests queue on one replica "
        f"while another has room.",
        evidence, remedies,
    )


RULE = Rule("replica_imbalance", evaluate, precedence=55, colour="light-orange", causes=("queueing",), promql=None,
            no_promql="compares the replicas of a service, which only a Prometheus source's service_labels "
                      "grouping provides; the exported rules are per target")
