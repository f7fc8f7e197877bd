"""Every scenario shows its regime's signature in the rendered metrics; healthy ones show none.

The signatures are computed the way a monitor would: from histogram deltas between two
scrapes, quantiles interpolated in buckets like Prometheus' histogram_quantile.
"""

from __future__ import annotations

import pytest

from app.emulator import scenarios
from app.emulator.readout import Page
from app.emulator.simulation import Simulation
from tests.emulator.helpers import window

REGIMES = ("queueing", "prefill_compute", "prefill_interference", "bandwidth_bound", "kv_cache_pressure",
           "weights_offloaded")


def regimes_shown(sig: dict, floor_s: float) -> set[str]:
    """A deliberately simple reading of each regime's signature (independent of app.diagnosis)."""
    shown = set()
    if sig["queue_share"] > 0.5 and sig["waiting"] >= 5 and sig["queue_mean"] > 1.0:
        shown.add("queueing")
    if sig["ttft_p50"] > 0.8 and sig["queue_share"] < 0.3 and sig["prompt_mean"] > 4000:
        shown.add("prefill_compute")
    if sig["itl_p99_p50"] > 8:
        shown.add("prefill_interference")
    if sig["itl_p50"] > 0.04 and sig["itl_mean"] < 1.5 * floor_s:
        shown.add("bandwidth_bound")
    if sig["kv_usage"] > 0.9 or sig["preemptions"] > 0:
        shown.add("kv_cache_pressure")
    if sig["itl_mean"] > 5 * floor_s:
        shown.add("weights_offloaded")
    return shown


_CACHE: dict[str, tuple[dict, dict]] = {}


def measured(name: str) -> tuple[dict, dict]:
    if name not in _CACHE:
        sim = Simulation(name, seed=0)
        sig = window(sim, 60, 240)
        _CACHE[name] = (sig, sim.state())
    return _CACHE[name]


def test_scenario_list():
    names = scenarios.names()
    assert {"healthy", "healthy_bursty", *REGIMES} <= set(names)
    for d in scenarios.describe_all():
        assert "Signature" in d["description"], d["name"]
        assert (d["regime"] is None) == d["name"].startswith("healthy")


@pytest.mark.parametrize("name", scenarios.names())
def test_declared_signature_holds(name):
    sig, state = measured(name)
    values = {**sig, "itl_over_floor": sig["itl_mean"] / state["weight_read_floor_seconds"]}
    declared = state["signature"]
    assert declared
    for key, bound in declared.items():
        if key.endswith("_min"):
            assert values[key[:-4]] >= bound, (key, values[key[:-4]])
        elif key.endswith("_max"):
            assert values[key[:-4]] <= bound, (key, values[key[:-4]])
        else:
            assert values[key] == bound, (key, values[key])


@pytest.mark.parametrize("name", ["healthy", "healthy_bursty"])
def test_healthy_scenarios_show_no_regime(name):
    sig, state = measured(name)
    assert regimes_shown(sig, state["weight_read_floor_seconds"]) == set()
    assert sig["queue_mean"] < 0.05
    assert sig["ttft_p99"] < 0.5
    assert sig["itl_p99_p50"] < 3.5
    assert sig["kv_usage"] < 0.1
    assert sig["preemptions"] == 0
    assert sig["requests_per_s"] > 1.5


@pytest.mark.parametrize("name", REGIMES)
def test_regime_scenarios_show_their_signature(name):
    sig, state = measured(name)
    shown = regimes_shown(sig, state["weight_read_floor_seconds"])
    assert name in shown, (sig, shown)
    assert state["regime"] == name


def test_queueing_signature():
    sig, state = measured("queueing")
    assert sig["queue_share"] > 0.9
    assert sig["waiting"] > 20 and sig["running"] == 8 == state["config"]["max_num_seqs"]
    assert sig["prefill_mean"] < 0.3 and sig["itl_p50"] < 0.025
    assert regimes_shown(sig, state["weight_read_floor_seconds"]) == {"queueing"}


def test_prefill_compute_signature():
    sig, state = measured("prefill_compute")
    assert sig["ttft_p50"] > 0.8 and sig["queue_share"] < 0.15
    assert sig["prefill_mean"] > 0.8 * sig["ttft_mean"]
    assert sig["iteration_tokens_over_2048"] > 0  # the step finishing a prompt counts all of it
    assert regimes_shown(sig, state["weight_read_floor_seconds"]) == {"prefill_compute"}


def test_prefill_interference_signature():
    sig, state = measured("prefill_interference")
    assert sig["itl_p99_p50"] > 10
    assert state["config"]["enable_chunked_prefill"] is False
    assert sig["iteration_tokens_over_2048"] > 0.001


def test_bandwidth_bound_signature():
    sig, state = measured("bandwidth_bound")
    floor = state["weight_read_floor_seconds"]
    assert floor == pytest.approx(0.0409, rel=0.01)
    assert floor < sig["itl_mean"] < 1.4 * floor
    assert sig["itl_p99_p50"] < 1.5 and sig["queue_mean"] < 0.1 and sig["kv_usage"] < 0.2
    assert regimes_shown(sig, floor) == {"bandwidth_bound"}


def test_kv_cache_pressure_signature():
    sig, _ = measured("kv_cache_pressure")
    assert sig["kv_usage"] > 0.95
    assert sig["preemptions_per_s"] > 0.5


def test_weights_offloaded_signature():
    sig, state = measured("weights_offloaded")
    assert sig["itl_mean"] > 10 * state["weight_read_floor_seconds"]
    assert sig["itl_p99_p50"] < 2 and sig["kv_usage"] < 0.2 and sig["preemptions"] == 0
    assert regimes_shown(sig, state["weight_read_floor_seconds"]) == {"weights_offloaded"}


def test_tgi_pages_show_the_same_physics():
    q = window(Simulation("queueing", engine="tgi"), 60, 180, engine="tgi")
    assert q["queue_mean"] > 5 and q["queue_size"] > 20 and q["batch_size"] == 8
    i = window(Simulation("prefill_interference", engine="tgi"), 60, 180, engine="tgi")
    h = window(Simulation("healthy", engine="tgi"), 60, 180, engine="tgi")
    # long prefills pause decoding: prefill batches take far longer than a decode step
    assert i["prefill_batch_p99"] > 20 * i["decode_forward_p50"]
    assert h["prefill_batch_p99"] < 15 * h["decode_forward_p50"]
    k = window(Simulation("kv_cache_pressure", engine="tgi"), 60, 120, engine="tgi")
    assert k["kv_usage"] > 0.9 > h["kv_usage"]


def test_transition_switches_regime():
    sim = Simulation("healthy->queueing@60")
    first = window(sim, 10, 50)  # t = 10..60: healthy
    assert sim.state()["phase"] == "healthy"
    second = window(sim, 60, 120)  # t = 120..240: queueing
    assert sim.state()["phase"] == "queueing"
    floor = sim.state()["weight_read_floor_seconds"]
    assert regimes_shown(first, floor) == set()
    assert "queueing" in regimes_shown(second, floor)
    assert [p["scenario"] for p in sim.state()["phases"]] == ["healthy", "queueing"]


def test_transition_reconfigures_the_cache():
    sim = Simulation("healthy->kv_cache_pressure@20")
    sim.run_for(30)
    page = Page(sim.render_metrics())
    infos = [dict(lb) for (n, lb) in page.samples if n == "vllm:cache_config_info"]
    assert len(infos) == 1 and infos[0]["num_gpu_blocks"] == "1600"
    sim.run_for(150)
    assert Page(sim.render_metrics()).value("vllm:num_preemptions_total") > 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_restart_transition_starts_the_engine_again_from_zero(engine: str) -> None:
    """``queueing@60!``: the counters start again from zero, the requests in flight are aborted and the
    queue is gone; the switch without ``!`` keeps every counter growing."""
    restarted, switched = Simulation("healthy->queueing@60!", engine=engine), Simulation("healthy->queueing@60",
                                                                                         engine=engine)
    requests = "vllm:request_success_total" if engine == "vllm" else "sglang:num_requests_total"
    for sim in (restarted, switched):
        sim.run_for(59)
    before = Page(restarted.render_metrics()).value(requests)
    assert before == Page(switched.render_metrics()).value(requests) > 100  # ~3 req/s for 59 s
    running = len(restarted.engine.running)
    assert running > 0
    for sim in (restarted, switched):
        sim.run_for(2)
    assert Page(restarted.render_metrics()).value(requests) < 30 < before  # from zero at t = 60
    assert Page(switched.render_metrics()).value(requests) > before
    assert restarted.state()["phases"] == [{"start_s": 0.0, "scenario": "healthy", "restart": False},
                                           {"start_s": 60.0, "scenario": "queueing", "restart": True}]
    assert restarted.state()["config"]["max_num_seqs"] == 8
    assert scenarios.parse("healthy->queueing@60!->healthy@90").restarts == frozenset({1})


@pytest.mark.parametrize("bad, message", [
    ("nope", "unknown scenario 'nope'; valid: healthy"),
    ("healthy->queueing", "expected NAME@SECONDS"),
    ("healthy->queueing@60->healthy@30", "must increase"),
    ("healthy->queueing@60?", "queueing@60! for a restart"),
])
def test_bad_scenario_specs(bad, message):
    with pytest.raises(ValueError, match=message):
        Simulation(bad)
