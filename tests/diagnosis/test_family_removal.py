"""A property that keeps "never healthy when slow" true: removing metric families from a recorded
page never turns its verdict into ``healthy``.

Every engine page recorded in ``tests/fixtures/exposition`` is replayed as in
``test_not_judged`` (the end of a run that started at zero: counters and histograms grow linearly
to the page's values, gauges hold them), and diagnosed once whole and once per variant with a
subset of the families the engine's adapter reads removed: every subset where there are at most
256, else every single family, every family but one, and 64 subsets drawn with a fixed seed. A
family is removed from the parsed page, right before the adapter, so each variant goes through
adapter -> store -> signals -> rules like a scrape of an engine that never exported it.

The property: when the whole page is not ``healthy`` (a finding, ``not_judged`` or too little
traffic), no variant is; and where every subset is tried, removing one more family from a
variant that is not healthy never makes it healthy. A rule that loses its inputs is not judged,
and the latency it would have explained is ``unexplained`` when out of range: the verdict can
only get less certain, never better.

SGLang and TGI export no offload configuration, so without a hardware profile
``weights_offloaded`` is never judged there and no variant could be ``healthy`` anyway; their
pages are also tried with a profile whose decode floor is a third of the page's mean ITL
(``weights_offloaded`` judged and quiet), where ``healthy`` is reachable.
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest

from app.core.thresholds import Thresholds
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.profile import HardwareProfile
from app.scrape.jobs import PageProcessor
from app.sources import ADAPTERS
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.diagnosis.test_not_judged import EXPOSITION, T0, _scaled
from tests.support.databases import migrated_sqlite

EVERY, WINDOW = 10.0, 60.0
ALL_SUBSETS_UP_TO = 256
SAMPLED = 64

#: page -> (lifetime of the replayed run in seconds, verdict of the whole page). The SGLang 0.4 docs
#: page is the end of a ~1,000 s run (see test_not_judged); the constructed pages hold a couple of
#: minutes of traffic. The real vLLM docs pages hold too few requests for any window (insufficient_data).
PAGES = {
    "sglang-v0.4-docs-production_metrics.prom": (1000.0, "queueing"),
    "vllm-0.32-cpu-real.prom": (120.0, "healthy"),
    "vllm-v1-docs-design-metrics.prom": (120.0, "insufficient_data"),
    "vllm-v1-docs-usage-metrics.prom": (120.0, "insufficient_data"),
    "sglang-0.3-name-label-constructed.prom": (120.0, "queueing"),
    "sglang-0.5-pd-constructed.prom": (120.0, "prefill_interference"),
    "tgi-3.3-constructed.prom": (120.0, "not_judged"),
    "trtllm-serve-constructed.prom": (120.0, "speculation_ineffective"),
    "vllm-0.10.2-dp2-constructed.prom": (120.0, "not_judged"),
    "vllm-0.6-v0-constructed.prom": (120.0, "queueing"),
}


#: page -> verdict of the whole page with a hardware profile fitted to it (:func:`fitted_profile`)
FITTED = {
    "sglang-v0.4-docs-production_metrics.prom": "queueing",
    "sglang-0.3-name-label-constructed.prom": "queueing",
    "sglang-0.5-pd-constructed.prom": "prefill_interference",
    "tgi-3.3-constructed.prom": "healthy",
}


def fitted_profile(filename: str) -> HardwareProfile:
    """An 8B-parameter BF16 profile whose decode floor is a third of the page's mean ITL: ITL / floor
    = 3, between bandwidth_bound's 2 and weights_offloaded's 4, so both are judged and quiet."""
    _, canonical, _ = PageProcessor("auto").process((EXPOSITION / filename).read_text())
    assert canonical is not None
    itl = next(h for h in canonical.histograms if h.signal == "itl")
    return HardwareProfile(params=8e9, hbm_bandwidth=3 * 16e9 / (itl.sum / itl.count), peak_flops=312e12)


def subsets(families: list[str], seed: int = 36) -> list[frozenset[str]]:
    """The removals tried: every subset (the empty one is the whole page) when there are at most
    :data:`ALL_SUBSETS_UP_TO`, else the empty one, each family alone, each family but one and a
    seeded sample."""
    if 2 ** len(families) <= ALL_SUBSETS_UP_TO:
        return [frozenset(c) for n in range(len(families) + 1) for c in combinations(families, n)]
    everything = frozenset(families)
    chosen = {frozenset(), *(frozenset([f]) for f in families), *(everything - {f} for f in families)}
    rng = random.Random(seed)
    while len(chosen) < 1 + 2 * len(families) + SAMPLED:
        chosen.add(frozenset(f for f in families if rng.random() < 0.5))
    return sorted(chosen, key=lambda s: (len(s), sorted(s)))


def verdicts(tmp_path: Path, filename: str, lifetime: float, hardware: HardwareProfile | None = None,
             tried: list[frozenset[str]] | None = None) -> dict[frozenset[str], str]:
    """The verdict of every variant of the page (``tried``, default :func:`subsets`; per model, the
    first that is not healthy), diagnosed over the last :data:`WINDOW` seconds of the run."""
    text = (EXPOSITION / filename).read_text()
    processor = PageProcessor("auto")
    # the window's scrapes and two before it: what the window reads of a run scraped every EVERY s
    times = [lifetime - WINDOW - 2 * EVERY + i * EVERY for i in range(int(WINDOW / EVERY) + 3)]
    pages = []
    for ts in times:
        page, _, error = processor.process(_scaled(text, ts / lifetime))
        assert error is None, error
        pages.append((ts, page))
    engine = processor.engine or ""
    adapter = ADAPTERS[engine]
    tried = tried if tried is not None else subsets(sorted(pages[-1][1].families))
    sql = db.make_engine(migrated_sqlite(tmp_path / "variants.db"))
    try:
        sessions = db.make_sessionmaker(sql)
        with sessions.begin() as session:
            ids = [target_repository.create_target(session, name=f"v{i}", url=f"http://127.0.0.1/{i}/metrics",
                                            engine=engine, labels={}).id for i in range(len(tried))]
        records = []
        for target_id, removed in zip(ids, tried, strict=True):
            for ts, page in pages:
                kept = replace(page, families={k: f for k, f in page.families.items() if k not in removed}, memo=None)
                records.append(ScrapeRecord(target_id, T0 + ts, True, 0.001, 0, page.samples_seen, page.samples_kept,
                                            page.malformed, engine, None, None, adapter.to_canonical(kept)))
        SampleWriter(sql).write(records)
        out = {}
        with sessions() as session:
            for target_id, removed in zip(ids, tried, strict=True):
                found = [d.verdict for d in diagnosis_engine.evaluate_target(
                    session, target_id, f"v{target_id}", engine, T0 + lifetime, WINDOW, Thresholds(), hardware)]
                out[removed] = next((v for v in found if v != "healthy"), "healthy")
    finally:
        sql.dispose()
    return out


@pytest.mark.parametrize(("filename", "fitted"), [*((f, False) for f in sorted(PAGES)),
                                                 *((f, True) for f in sorted(FITTED))])
def test_removing_families_never_makes_a_verdict_healthy(tmp_path: Path, filename: str, fitted: bool) -> None:
    lifetime, whole = PAGES[filename]
    if fitted:
        whole = FITTED[filename]
    found = verdicts(tmp_path, filename, lifetime, fitted_profile(filename) if fitted else None)
    assert found[frozenset()] == whole
    healthy = sorted(sorted(removed) for removed, verdict in found.items() if verdict == "healthy")
    if whole != "healthy":
        assert healthy == [], f"{filename} ({whole}) becomes healthy without {healthy[:3]}"
    families = sorted(set().union(*found))
    if 2 ** len(families) <= ALL_SUBSETS_UP_TO:  # every subset: one more removal never makes it healthy
        assert len(found) == 2 ** len(families)
        better = [(sorted(removed), f) for removed, verdict in found.items() if verdict != "healthy"
                  for f in families if f not in removed and found[removed | {f}] == "healthy"]
        assert better == [], better[:3]
    else:
        assert len(found) == 1 + 2 * len(families) + SAMPLED


def test_the_sglang_04_page_without_its_waiting_gauge_is_unexplained(tmp_path: Path) -> None:
    """2,826 waiting and a 213.6 s mean TTFT: queueing from the gauges; without the gauge, queueing and
    kv_cache_pressure cannot be judged and the latency is out of range: unexplained, never healthy."""
    no_waiting, no_ttft = frozenset({"sglang:num_queue_reqs"}), frozenset({"sglang:time_to_first_token_seconds",
                                                                           "sglang:e2e_request_latency_seconds"})
    found = verdicts(tmp_path, "sglang-v0.4-docs-production_metrics.prom", 1000.0,
                     tried=[frozenset(), no_waiting, no_ttft, no_waiting | no_ttft])
    assert found[frozenset()] == "queueing" and found[no_waiting] == "unexplained"
    # without TTFT and e2e the ITL (117 ms mean) is in its range, and queueing cannot be judged
    assert found[no_ttft] == found[no_waiting | no_ttft] == "not_judged"
