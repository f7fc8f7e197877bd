"""lora_adapter_slots — requests wait for a LoRA adapter slot: more adapters are in demand than
the engine runs at once.

Symptom: TTFT is long for the requests of some adapters (their first token waits until an adapter
slot frees, plus the adapter's load), while the KV cache has room and the running batch is small:
the adapters take turns (thrash). vLLM schedules at most ``max_lora`` distinct adapters at once
(``--max-loras``); a request whose adapter is not among them waits, whatever the memory.
Why it matters: more replicas of the same configuration see the same mix of adapters; the fix is
slots, the adapter cache and routing requests of one adapter to the same replicas.

Read per scrape from vLLM's ``vllm:lora_requests_info`` (its newest series, see
:mod:`app.sources.vllm`): the adapters with requests in flight against ``max_lora``; more of them
means the requests of at least one adapter all wait. The rule compares the share of the window's
scrapes short of slots with the waiting gauge and the KV usage. No PromQL twin (``no_promql``).
Checked: vllm 0.34.0 (wheel) vllm/v1/metrics/loggers.py (``lora_requests_info`` gauge, labels
max_lora, waiting_lora_adapters, running_lora_adapters, value ``set_to_current_time``) and
vllm/v1/metrics/stats.py (``LoRARequestStates``: both lists every adapter in flight; 0.10 wrote
running and waiting apart); flags ``--max-loras``, ``--max-cpu-loras``, ``--max-lora-rank`` in
vllm/engine/arg_utils.py.
"""

from __future__ import annotations

from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, quantile_info
from app.diagnosis.signals import Signals

NO_PROMQL = ("the engine's state is the label values of whichever lora_requests_info series has the newest "
             "timestamp, and its adapters are comma-joined names in labels: PromQL can neither pick that "
             "series per target and scrape nor count a label's list items, and the names are user content "
             "that must not be built into expressions")


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    if s.lora_slot_wait_share is None:
        return None  # no LoRA on this target (vLLM exports lora_requests_info only with --enable-lora)
    conditions = [
        check("share of scrapes with more adapters in demand than slots", s.lora_slot_wait_share, ">=",
              t.lora_slot_wait_share, "ratio", "adapters with requests in flight > max_lora: at least one "
              "adapter's requests all wait"),
        check("mean waiting requests", s.waiting_mean, ">=", t.queue_waiting),
        check("KV-cache usage (max)", s.kv_usage_max, "<=", t.kv_usage, "%", "the KV cache had room"),
    ]
    if not all(c.met for c in conditions):
        return None
    slots = s.lora_slots or 0.0
    evidence = conditions + [
        info("adapter slots (max_lora)", s.lora_slots),
        info("adapters with requests in flight (mean / max)", f"{s.lora_demand_mean or 0:.1f} / "
                                                               f"{s.lora_demand_max or 0:.0f}"),
        quantile_info("TTFT p50", s.ttft, "p50"),
        quantile_info("TTFT p99", s.ttft, "p99"),
        info("queue share of TTFT", s.queue_share, "ratio"),
        info("running requests (mean)", s.running_mean),
    ]
    demand = s.lora_demand_max or 0.0
    # Only vLLM exports the adapters in demand: the remedies are its flags (0.34 names).
    vllm = [
        f"Run more adapters at once: --max-loras {demand:.0f} (the most adapters in demand in the window; each slot "
        "takes GPU memory for its weights from the KV cache, which has room).",
        "Keep cold adapters in host memory: --max-cpu-loras (at least the number of adapters served), so a slot "
        "loads its adapter from CPU memory instead of disk.",
        "Route by adapter: send each adapter's requests to the replicas that have it loaded (the Gateway API "
        "Inference Extension's or llm-d's LoRA affinity, vLLM production-stack's router), so each replica serves "
        "no more adapters than its slots.",
        "A smaller --max-lora-rank (the largest rank among the adapters) makes each slot smaller, so more fit.",
    ]
    severity = "critical" if s.lora_slot_wait_share >= t.lora_critical_slot_wait_share else "warning"
    return Finding(
        "lora_adapter_slots", severity, confidence(conditions, s.ttft.count if s.ttft else 0, 4 * t.min_requests),
        f"In {s.lora_slot_wait_share:.0%} of the window's scrapes more LoRA adapters had requests in flight (up to "
        f"{demand:.0f}) than the {slots:.0f} slot(s) of max_lora: requests wait for an adapter slot while the KV "
        f"cache has room; {s.waiting_mean:.1f} requests waiting.",
        evidence, vllm,
    )


RULE = Rule("lora_adapter_slots", evaluate, precedence=52, colour="light-yellow", causes=("queueing",), promql=None,
            no_promql=NO_PROMQL, replicas_help=False)
