"""Emulated engines whose cause of a latency change is switched at a known simulated time.

Each case is a :class:`ScenarioPlan` of two phases of the ``healthy`` chat deployment (8B on an
A100, chunked prefill, prefix caching), the second switched on at :data:`CHANGE_AT`; the pages go
through the production path (parse, adapter, store) on the emulator's clock (no HTTP, no
sleeping: tests/diagnosis/harness.py).
"""

from __future__ import annotations

from dataclasses import replace

from app.emulator import scenarios
from app.emulator.scenarios import Scenario, ScenarioPlan
from app.emulator.workload import LengthDist, TrafficStream

#: simulated seconds at which the cause is switched on; the attribution compares the 10 minutes
#: after it with the 10 minutes before
CHANGE_AT = 1500.0
WINDOW = 600.0
SCRAPE_S = 5.0
ROUND_S = 30.0

_HEALTHY = scenarios.get("healthy")
_CHAT = _HEALTHY.workload[0]


def _phase(name: str, *, stream: TrafficStream = _CHAT, **engine: object) -> Scenario:
    config = replace(_HEALTHY.engine, **engine) if engine else _HEALTHY.engine
    return replace(_HEALTHY, name=name, engine=config, workload=(stream,), regime=None)


def _neighbour() -> Scenario:
    """Another process on the GPU takes HBM bandwidth: the decode step reads the weights at
    45 % of peak instead of 85 %."""
    return replace(_phase("neighbour"), deployment=replace(_HEALTHY.deployment, memory_efficiency=0.45))


#: a service whose batch is capped (--max-num-seqs 12): 3 req/s of chat runs ~8 at once, 6 req/s needs more
CAPPED = _phase("capped", max_num_seqs=12)
#: RAG traffic whose 1,500-token system prompt is shared by 90 % of the requests
RAG = replace(_CHAT, prefix_tokens=1500, prefix_share=0.9, num_prefixes=2)



def _plan(name: str, first: Scenario, second: Scenario, restart: bool = False) -> ScenarioPlan:
    return ScenarioPlan(name, ((0.0, first), (CHANGE_AT, second)), frozenset({1}) if restart else frozenset())


CHAT = _phase("chat")
CASES: dict[str, tuple[ScenarioPlan, str]] = {  # name: (plan, the driver that is the cause)
    "load step": (_plan("load step", CAPPED, replace(CAPPED, name="capped, 6 req/s",
                                                     workload=(replace(_CHAT, rate=6.0),))), "load"),
    "prompt-length step": (_plan("prompt-length step", CHAT, _phase("long prompts", stream=replace(
        _CHAT, prompt=LengthDist.lognormal(3000, 0.4, 500, 12000)))), "prompt_length"),
    "restart with lower max_num_seqs": (_plan("restart", CHAT, _phase("max_num_seqs 4", max_num_seqs=4),
                                              restart=True), "capacity"),
    "prefix caching turned off": (_plan("prefix caching off", _phase("rag", stream=RAG), _phase(
        "rag, no prefix caching", stream=RAG, enable_prefix_caching=False), restart=True), "prefix_cache"),
    "neighbour stealing decode bandwidth": (_plan("neighbour", CHAT, _neighbour()), "step_time"),
}
#: the events each case must produce after the change: (kind, subject), found within ``DETECT_S``
EXPECTED_EVENTS = {
    "load step": {("step", "request_rate")},
    "prompt-length step": {("step", "prompt_length"), ("step", "prefix_cache_hit_rate")},
    "restart with lower max_num_seqs": {("restart", "engine")},
    "prefix caching turned off": {("restart", "engine"), ("config", "cache_config.enable_prefix_caching"),
                                  ("step", "prefix_cache_hit_rate")},
    "neighbour stealing decode bandwidth": set(),  # nothing the engine exports changes but its latency
}
DETECT_S = 4 * ROUND_S
STEADY = ScenarioPlan("steady", ((0.0, CHAT),))
#: the replica case (a service of two replicas; one is removed and its traffic goes to the other)
REPLICA = _phase("replica", max_num_seqs=12)
REPLICA_DOUBLE = replace(REPLICA, name="replica, all traffic", workload=(replace(_CHAT, rate=6.0),))

__all__ = ["CASES", "CHANGE_AT", "DETECT_S", "EXPECTED_EVENTS", "REPLICA", "REPLICA_DOUBLE",
           "ROUND_S", "SCRAPE_S", "STEADY", "WINDOW"]
