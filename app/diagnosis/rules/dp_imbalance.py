"""dp_imbalance — the data-parallel ranks of one engine are unevenly loaded: one rank queues
while another has room.

Symptom: an engine started with ``--data-parallel-size`` N (vLLM; SGLang ``--dp-size`` with
DP attention) looks fine or mildly queued when its ranks are summed, but one rank holds most
of the requests and queues while another idles. Typical causes: the API server's or an
external router's rank choice (sticky sessions, prefix affinity, an external load balancer
per rank with uneven weights), or skewed request lengths that a count-based balance ignores.
Why it matters: the idle rank's GPUs are paid for; routing by load, not adding ranks, fixes it.

Reads each rank's running / waiting / KV usage gauges (vLLM's ``engine`` label, SGLang's
``dp_rank``, which SGLang with DP attention also puts on its scheduler histograms) as means
over the window (and each rank's mean queue time from its own queue-time histogram, as
evidence), and compares the busiest rank with the least busy one with the
``replica_imbalance`` thresholds (the comparison is shared:
:func:`app.diagnosis.rules.replica_imbalance.compare_loads`); SGLang's own
``dp_attention_token_imbalance_ratio`` is used when per-rank gauges are missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, remedies
from app.diagnosis.rules.replica_imbalance import compare_loads
from app.diagnosis.signals import Signals
from app.promql.text import num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    compared = compare_loads(s.ranks, t, "rank")
    if compared is not None:
        conditions, ratio = compared
        if not all(c.met for c in conditions):
            return None
        busiest, idlest = s.ranks[0], s.ranks[-1]
        summary = (f"Data-parallel rank {busiest.target} holds {ratio:.1f}x the requests of rank {idlest.target} "
                   f"({busiest.waiting_mean:.1f} waiting vs {idlest.waiting_mean:.1f}): requests queue on one rank "
                   f"while another has room.")
        evidence = conditions + [
            info(f"rank {r.target}", f"running {r.running_mean:.1f}, waiting {r.waiting_mean:.1f}"
                 + (f", KV usage {s.rank_kv_usage[r.target]:.0%}" if r.target in s.rank_kv_usage else "")
                 + (f", mean queue time {human.seconds(r.queue_mean)}" if r.queue_mean is not None else ""))
            for r in s.ranks]
        critical = ratio >= t.imbalance_critical_factor * t.imbalance_load_ratio
    else:
        conditions = [
            check("token imbalance ratio between ranks (engine's own)", s.dp_token_imbalance_ratio, ">=",
                  t.dp_token_imbalance_ratio),
            check("mean waiting requests", s.waiting_mean, ">=", t.imbalance_waiting),
        ]
        if not all(c.met for c in conditions):
            return None
        summary = (f"The engine reports a token imbalance of {s.dp_token_imbalance_ratio:.1f} between its "
                   f"data-parallel ranks while {s.waiting_mean:.1f} requests wait.")
        evidence = list(conditions)
        critical = False
    evidence.append(info("data-parallel ranks", len(s.ranks) or None))
    vllm = [
        "Let vLLM balance the ranks: with one API server in front of --data-parallel-size N it routes by queue "
        "length; with an external load balancer per rank (--data-parallel-hybrid-lb / external LB) route by "
        "the ranks' waiting requests, not round-robin or session affinity.",
        "If prefix-cache affinity concentrates traffic, cap how many requests one rank takes before spilling over.",
        "Check the ranks are equal (same GPUs, same --max-num-seqs): an uneven rank needs a proportional weight.",
    ]
    sglang = [
        "Use --load-balance-method minimum_tokens (or shortest_queue) for the DP controller instead of round_robin.",
        "With DP attention, skewed prompt lengths unbalance tokens per rank: enable the router's cache-aware "
        "balance thresholds (--balance-abs-threshold / --balance-rel-threshold in sglang-router).",
    ]
    tgi = ["TGI has no data-parallel ranks: compare the replicas behind the router instead (replica_imbalance)."]
    requests = s.ttft.count if s.ttft else 0.0
    return Finding("dp_imbalance", "critical" if critical else "warning",
                   confidence(conditions, requests, 4 * t.min_requests), summary, evidence,
                   remedies(s.engine, vllm, tgi, sglang))


def promql(x: Twin) -> None:
    """Per target, its ranks (vLLM's ``engine`` label, SGLang's ``dp_rank``) as the rule compares
    them: the busiest rank's mean waiting, the least busy one's, the load ratio between them, at
    least two ranks; critical at ``imbalance_critical_factor`` times the ratio. SGLang with fewer
    than two ranks reporting: its own token imbalance ratio with requests waiting (warning,
    labelled ``basis="token_imbalance"``). An engine without ranks (TGI, trtllm-serve) has no alert."""
    r, t, e = x.recorded, x.t, x.engine
    ratio = r["rank_load_ratio"]

    def ranked(min_ratio: float) -> str:
        return x.and_(f"{ratio} >= {num(min_ratio)}", f"{r['rank_count']} >= 2",
                      f"{r['rank_busiest_waiting']} >= {num(t.imbalance_waiting)}",
                      f"{r['rank_idlest_waiting']} <= {num(t.imbalance_idle_waiting)}", x.gate)

    text = (f"{e.who()}: its busiest data-parallel rank ({e.rank_label} label) holds "
            f"{{{{ $value | printf \"%.1f\" }}}}x the requests (running + waiting) of the least busy one "
            f"over the last {x.w} (>= {{min}}x), with at least {human.given(t.imbalance_waiting)} request(s) waiting "
            f"on the busiest and at most {human.given(t.imbalance_idle_waiting)} on the least busy: route by load.")
    summary = f"Data-parallel ranks unevenly loaded on {e.title}"
    for severity, min_ratio in (("warning", t.imbalance_load_ratio),
                                ("critical", t.imbalance_critical_factor * t.imbalance_load_ratio)):
        x.add(severity, ranked(min_ratio), summary, text.replace("{min}", f"{human.given(min_ratio)}"))
    if "dp_token_imbalance" in r:
        own = x.and_(f"{r['dp_token_imbalance']} >= {num(t.dp_token_imbalance_ratio)}",
                     f"{r['waiting']} >= {num(t.imbalance_waiting)}", x.gate)
        x.add("warning", f"({own})\nunless on({e.labels}) ({r['rank_count']} >= 2)", summary,
              f"{e.who()}: the engine reports a token imbalance of {{{{ $value | printf \"%.1f\" }}}} between its "
              f"data-parallel ranks over the last {x.w} (>= {human.given(t.dp_token_imbalance_ratio)}) with at least "
              f"{human.given(t.imbalance_waiting)} request(s) waiting.",
              {"basis": "token_imbalance"})  # a label of its own: not a duplicate of the ranked warning


RULE = Rule("dp_imbalance", evaluate, precedence=54, colour="dark-orange", causes=("queueing",), promql=promql)
