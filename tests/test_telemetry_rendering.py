"""``/metrics``: the per-target families the rounds replace are rendered once per round and
follow every replacement; the registry's own metrics are read live."""

from __future__ import annotations

import subprocess

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.core.quantiles import LatencySummary
from app.telemetry import Telemetry
from tests.support.components import require_binary


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
    # scrape state is not cached with the round's text
    telemetry.record_scrape("t1", False, "timeout", 5.0, 0, 0, 0, 1_700_000_000.0)
    assert samples(telemetry.exposition())[("llm_latency_target_up", (("target", "t1"),))] == 0.0
    telemetry.record_scrape("t1", True, None, 0.1, 100, 10, 0, 1_700_000_015.0)
    assert samples(telemetry.exposition())[("llm_latency_target_up", (("target", "t1"),))] == 1.0
    # each family appears once (the round collectors are not also on the registry)
    helps = [line.split()[2] for line in telemetry.exposition().splitlines() if line.startswith(b"# HELP")]
    assert len(helps) == len(set(helps)) and {b"llm_latency_quantile_seconds", b"llm_latency_target_up"} <= set(helps)


SCRAPES = [  # (target, up, error class, bytes, kept, malformed, ts); names that need escaping included
    ("a", True, None, 250_000, 1_500, 0, 1_700_000_000.0),
    ('b"q\\x', False, "timeout", 0, 0, 0, 1_700_000_001.5),
    ("a", True, "no_engine_metrics", 900, 0, 3, 1_700_000_015.0),
    ("c", False, None, 0, 0, 0, 1_700_000_016.0),
    ("a", True, None, 251_000, 1_501, 0, 1_700_000_030.25),
    ('b"q\\x', False, "timeout", 0, 0, 0, 1_700_000_031.5),
]


def library_rendering(scrapes) -> bytes:
    """The same scrapes as labelled prometheus_client metrics on a registry (how they were kept)."""
    r = CollectorRegistry()
    attempts = Counter("llm_latency_scrapes", "Scrape attempts by target and result.", ["target", "result"], registry=r)
    gauges = [Gauge(name, help_text, ["target"], registry=r) for name, help_text in (
        ("llm_latency_target_up", "1 if the last scrape of the target succeeded."),
        ("llm_latency_target_last_scrape_timestamp_seconds", "Time of the last scrape."),
        ("llm_latency_target_scrape_bytes", "Size of the last page."),
        ("llm_latency_target_samples_kept", "Samples kept from the last page."),
        ("llm_latency_target_malformed_lines", "Malformed lines on the last page."))]
    for target, up, error_class, size, kept, malformed, ts in scrapes:
        attempts.labels(target, "ok" if up and not error_class else (error_class or "down")).inc()
        for gauge, value in zip(gauges, (1.0 if up else 0.0, ts, size, kept, malformed), strict=True):
            gauge.labels(target).set(value)
    return generate_latest(r)


def without_created(body: bytes) -> dict[tuple[str, tuple], float]:
    return {k: v for k, v in samples(body).items() if not k[0].endswith("_created")}


def sections(body: bytes) -> list[tuple[bytes, list[bytes]]]:
    """(HELP and TYPE lines, sorted sample lines with a _created line's time masked) per section."""
    out: list[tuple[bytes, list[bytes]]] = []
    for line in body.splitlines():
        if line.startswith(b"# HELP"):
            out.append((line, []))
        elif line.startswith(b"#"):
            out[-1] = (out[-1][0] + b"\n" + line, out[-1][1])
        else:
            out[-1][1].append(line.rsplit(b" ", 1)[0] + b" <time>" if b"_created{" in line else line)
    return [(header, sorted(lines)) for header, lines in out]


def test_scrape_families_render_what_the_librarys_labelled_metrics_render() -> None:
    telemetry = Telemetry()
    for target, up, error_class, size, kept, malformed, ts in SCRAPES:
        telemetry.record_scrape(target, up, error_class, 0.05, size, kept, malformed, ts)
    ours, theirs = telemetry.targets.exposition(), library_rendering(SCRAPES)
    assert without_created(ours) == without_created(theirs)
    assert len(without_created(ours)) == 4 + 5 * 3  # 4 (target, result) counts, 5 gauges x 3 targets
    assert samples(ours)[("llm_latency_scrapes_total", (("result", "timeout"), ("target", 'b"q\\x')))] == 2.0
    created = {k for k in samples(ours) if k[0].endswith("_created")}
    assert created == {k for k in samples(theirs) if k[0].endswith("_created")} and len(created) == 4
    # the same sections (HELP and TYPE lines, a counter's _created as a section of its own) in the
    # same order, each with the same lines byte for byte but the _created times (ordered by target
    # here, by first appearance there)
    assert sections(ours) == sections(theirs)
    assert [len(lines) for _, lines in sections(ours)] == [4, 4, 3, 3, 3, 3, 3]
    # in /metrics once each, beside the registry's own families
    helps = [line.split()[2] for line in telemetry.exposition().splitlines() if line.startswith(b"# HELP")]
    assert len(helps) == len(set(helps)) and {b"llm_latency_scrapes_total", b"llm_latency_target_up",
                                              b"llm_latency_scrape_duration_seconds"} <= set(helps)


def test_a_sources_view_sets_up_and_time_and_a_forgotten_target_leaves() -> None:
    telemetry = Telemetry()
    telemetry.targets.record("prod.a", up=False, ts=1_700_000_000.0)  # a Prometheus source's replica
    telemetry.record_scrape("t1", True, None, 0.05, 100, 10, 0, 1_700_000_005.0)
    got = samples(telemetry.exposition())
    assert got[("llm_latency_target_up", (("target", "prod.a"),))] == 0.0
    assert got[("llm_latency_target_last_scrape_timestamp_seconds", (("target", "prod.a"),))] == 1_700_000_000.0
    assert not any(labels == (("target", "prod.a"),) for name, labels in got
                   if name in ("llm_latency_target_scrape_bytes", "llm_latency_target_samples_kept"))
    assert not any(("target", "prod.a") in labels for name, labels in got if name.startswith("llm_latency_scrapes"))
    telemetry.forget_target("t1")
    got = samples(telemetry.exposition())
    assert not any(("target", "t1") in labels for _, labels in got)
    assert got[("llm_latency_target_up", (("target", "prod.a"),))] == 0.0


def test_promtool_finds_nothing_to_lint_in_the_scrape_families(tmp_path) -> None:
    promtool = require_binary("promtool", "linting /metrics")
    telemetry = Telemetry()
    for target, up, error_class, size, kept, malformed, ts in SCRAPES:
        telemetry.record_scrape(target, up, error_class, 0.05, size, kept, malformed, ts)
    telemetry.targets.record("prod.a", up=True, ts=1_700_000_040.0)
    result = subprocess.run([promtool, "check", "metrics"], input=telemetry.exposition(), capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
