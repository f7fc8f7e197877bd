"""``/metrics``: the per-target families the rounds replace are rendered once per round and
follow every replacement; the registry's own metrics are read live."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.quantiles import LatencySummary
from app.telemetry import Telemetry


def samples(body: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def summary(p99: float, count: float) -> LatencySummary:
    return LatencySummary(p99 / 4, p99 / 2, p99 * 0.8, p99, p99 / 3, count, {}, False)


def test_round_families_are_rendered_once_per_round_and_follow_each_round() -> None:
    telemetry = Telemetry()
    telemetry.derived.summaries = {("t1", "m", "ttft"): summary(2.0, 40.0)}
    first = telemetry.derived.rendered()
    assert telemetry.derived.rendered() is first  # the same round: not rendered again
    got = samples(telemetry.exposition())
    p99 = ("llm_latency_quantile_seconds", (("model", "m"), ("quantile", "0.99"), ("signal", "ttft"), ("target", "t1")))
    assert got[p99] == 2.0
    assert got[("llm_latency_observations", (("model", "m"), ("signal", "ttft"), ("target", "t1")))] == 40.0
    # the next round replaces the mapping: the next scrape shows it
    telemetry.derived.summaries = {("t1", "m", "ttft"): summary(0.5, 7.0)}
    assert samples(telemetry.exposition())[p99] == 0.5
    # live registry metrics are not cached with the round's text
    telemetry.target_up.labels("t1").set(0.0)
    assert samples(telemetry.exposition())[("llm_latency_target_up", (("target", "t1"),))] == 0.0
    telemetry.target_up.labels("t1").set(1.0)
    assert samples(telemetry.exposition())[("llm_latency_target_up", (("target", "t1"),))] == 1.0
    # each family appears once (the round collectors are not also on the registry)
    names = [f.name for f in text_string_to_metric_families(telemetry.exposition().decode())]
    assert len(names) == len(set(names)) and "llm_latency_quantile_seconds" in names
