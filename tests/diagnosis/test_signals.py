"""Diagnosis signals computed from stored data whose answer is known exactly.

The scrapes below are written through the real writer into SQLite; the window is aligned
with the first and last scrape, so Prometheus-style increases need no extrapolation and
every expected value is plain arithmetic on the numbers written.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.diagnosis import signals
from app.sources.base import Canonical, CanonicalHistogram, CanonicalInfo, CanonicalScalar
from app.store import db, reads
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.support.databases import migrated_sqlite

T0 = 1_700_000_000.0
STEP = 10.0
SCRAPES = 7  # window [T0, T0 + 60]: six scrape intervals
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, math.inf)
ITERATION_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, math.inf)
TTFT_BOUNDS = (0.1, 0.5, 1.0, math.inf)
PROMPT_BOUNDS = (100, 1000, 2000, 5000, math.inf)

#: running requests at each scrape: three intervals at 1, one from 1 to 10 (mean 5.5), two at 10
RUNNING = (1, 1, 1, 1, 10, 10, 10)
#: per interval: (ITL observations, their sum) -> mean ITL 20 ms alone, 30 ms in transition, 50 ms at 10
ITL_STEPS = ((10, 0.2), (10, 0.2), (10, 0.2), (20, 0.6), (50, 2.5), (50, 2.5))


class Cumulative:
    """A cumulative histogram the way an engine exports it: observations only ever add."""

    def __init__(self, bounds: tuple[float, ...], start: dict[float, float] | None = None, start_sum: float = 0.0):
        self.bounds = bounds
        self.per_bucket = {b: 0.0 for b in bounds}
        for bound, n in (start or {}).items():
            self.per_bucket[bound] += n
        self.sum = start_sum

    def observe(self, bound: float, n: float, total: float) -> None:
        self.per_bucket[bound] += n
        self.sum += total

    def canonical(self, signal: str, model: str = "m") -> CanonicalHistogram:
        counts, acc = [], 0.0
        for bound in self.bounds:
            acc += self.per_bucket[bound]
            counts.append(acc)
        return CanonicalHistogram(signal, model, "0", self.bounds, tuple(counts), self.sum, acc)


@pytest.fixture
def stored(tmp_path: Path):
    url = migrated_sqlite(tmp_path / "signals.db")
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    with sessions.begin() as session:
        target_id = target_repository.create_target(session, name="t", url="http://127.0.0.1:1/metrics", engine="auto",
                                             labels={}).id
    # history before the window: a 6000-token step and slow requests that must not count
    itl = Cumulative(ITL_BOUNDS, {0.01: 100, math.inf: 3}, 40.0)
    iteration = Cumulative(ITERATION_BOUNDS, {16: 500, 8192: 3}, 30000.0)
    ttft = Cumulative(TTFT_BOUNDS, {math.inf: 7}, 70.0)
    prompt = Cumulative(PROMPT_BOUNDS, {math.inf: 7}, 70000.0)
    queries, hits, preemptions = 1000.0, 200.0, 5.0
    writer = SampleWriter(engine)
    for i in range(SCRAPES):
        if i:
            n, total = ITL_STEPS[i - 1]
            itl.observe(0.025 if total / n <= 0.025 else 0.05, n, total)
            iteration.observe(16, 20, 200)      # decode steps of ~10 tokens
            iteration.observe(512, 4, 1600)     # steps finishing ~400-token prompts
            iteration.observe(2048, 1, 1500)    # one step finishing a 1.5k-token prompt
            ttft.observe(0.5, 5, 1.5)           # 5 requests, TTFT 0.3 s each
            prompt.observe(5000, 5, 10000)      # ... with 2000-token prompts
            queries, hits, preemptions = queries + 600, hits + 150, preemptions + 3
        canonical = Canonical(engine="vllm")
        canonical.histograms += [itl.canonical("itl"), iteration.canonical("iteration_tokens"),
                                 ttft.canonical("ttft"), prompt.canonical("prompt_tokens")]
        canonical.scalars += [
            CanonicalScalar("running", "gauge", "m", "0", RUNNING[i]),
            CanonicalScalar("prefix_cache_queries_total", "counter", "m", "0", queries),
            CanonicalScalar("prefix_cache_hits_total", "counter", "m", "0", hits),
            CanonicalScalar("preemptions_total", "counter", "m", "0", preemptions),
        ]
        canonical.infos += [
            CanonicalInfo("cache_config", "m", "0", {"enable_prefix_caching": "True", "block_size": "16",
                                                     "num_gpu_blocks": "1600", "cache_dtype": "fp8_e4m3",
                                                     "gpu_memory_utilization": "0.9"}),
            CanonicalInfo("cache_config", "other", "0", {"enable_prefix_caching": "False", "block_size": "32"}),
            CanonicalInfo("sleep_state", "m", "0", {"sleep_state": "weights_offloaded"}),
        ]
        writer.write([ScrapeRecord(target_id, T0 + STEP * i, True, 0.001, 0, 0, 0, 0, "vllm", None, None, canonical)])
    with sessions() as session:
        yield session, target_id
    engine.dispose()


def compute(stored) -> signals.Signals:
    session, target_id = stored
    (s,) = signals.compute(session, target_id, "t", "vllm", T0, T0 + STEP * (SCRAPES - 1))
    return s


def test_itl_conditioned_on_the_running_batch(stored) -> None:
    s = compute(stored)
    assert [(g["running"], g["steps"], g["intervals"]) for g in s.itl_by_batch] == [
        ("1-2", 30, 3), ("3-8", 20, 1), ("9-32", 100, 2)]
    assert [g["itl_mean"] for g in s.itl_by_batch] == pytest.approx([0.02, 0.03, 0.05])
    assert [g["running_mean"] for g in s.itl_by_batch] == pytest.approx([1.0, 5.5, 10.0])
    # the single-request view: intervals with <= 2 running, at least 20 steps
    assert s.itl_low_batch == pytest.approx(0.02) and s.itl_low_batch_running == 1.0
    # the window-wide ITL mixes all of them: (0.6 + 0.6 + 5.0) / 150
    assert s.itl.mean == pytest.approx(6.2 / 150) and s.itl.count == 150


def test_itl_low_batch_needs_twenty_single_request_steps(stored) -> None:
    session, target_id = stored
    # [T0 + 10, T0 + 60]: only two intervals at running 1, 20 steps -> still enough
    (s,) = signals.compute(session, target_id, "t", "vllm", T0 + 10, T0 + 60)
    assert s.itl_low_batch == pytest.approx(0.02) and s.itl_by_batch[0]["steps"] == 20
    # [T0 + 20, T0 + 60]: one interval of 10 steps: too few to call it the single-request ITL
    (s,) = signals.compute(session, target_id, "t", "vllm", T0 + 20, T0 + 60)
    assert s.itl_by_batch[0] == pytest.approx({"running": "1-2", "itl_mean": 0.02, "steps": 10, "intervals": 1,
                                               "running_mean": 1.0})
    assert s.itl_low_batch is None and s.itl_low_batch_running is None


def test_prefix_cache_hit_rate_ttft_per_1k_prompt_tokens_and_preemption_rate(stored) -> None:
    s = compute(stored)
    assert s.prefix_cache_hit_rate == pytest.approx(900 / 3600)     # hits / queries, both in tokens
    assert s.ttft.mean == pytest.approx(0.3) and s.prompt_tokens.mean == pytest.approx(2000)
    assert s.ttft_per_1k_prompt_tokens == pytest.approx(0.15)      # 0.3 s per 2000 tokens
    assert s.preemptions_per_second == pytest.approx(18 / 60)
    assert s.running_mean == pytest.approx(34 / 7) and s.running_max == 10


def test_largest_engine_step_counts_only_steps_in_the_window(stored) -> None:
    s = compute(stored)
    # the 8192-bucket steps happened before the window; in it, the largest bucket used is (1024, 2048]
    assert s.max_step_tokens == 2048.0
    assert s.large_step_fraction == pytest.approx(6 / 150)          # steps above 512 tokens


def test_engine_config_from_info_metrics(stored) -> None:
    s = compute(stored)
    # the model's own cache_config (not the other model's), only the keys the rules read, plus sleep mode
    assert s.config == {"enable_prefix_caching": "True", "block_size": "16", "num_gpu_blocks": "1600",
                        "cache_dtype": "fp8_e4m3", "sleep_state": "weights_offloaded"}


def test_the_diagnosis_json_is_what_asdict_gives(tmp_path: Path) -> None:
    """``plain_json`` (asdict without deep copies, in one pass) converts signals and findings to
    the values asdict gives, nested dataclasses, tuples and lists included, with tuples as lists
    and every non-finite float as null (as JSON holds them)."""
    import math
    from dataclasses import asdict

    def json_form(value: object) -> object:  # what asdict's values are in JSON
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: json_form(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [json_form(v) for v in value]
        return value

    from app.core.thresholds import Thresholds
    from app.diagnosis import engine as diagnosis_engine
    from app.diagnosis.findings import plain_json
    from tests.diagnosis.harness import T0 as HARNESS_T0
    from tests.diagnosis.harness import OfflineTarget, profile_of

    target = OfflineTarget(tmp_path, "prefill_interference", seed=1, hardware=profile_of("prefill_interference"))
    try:
        target.run(180)
        end = round(HARNESS_T0 + target.sim.clock, 3)
        with target.sessions() as session:
            window = reads.store_window(session, [target.target_id], end - 120, end, signals.DIAGNOSIS_HISTOGRAMS,
                                        diagnosis=True)
            (s,) = signals.from_window(window, "t", "vllm", target.hardware)
        diagnosis = diagnosis_engine.diagnose(s, Thresholds())
    finally:
        target.close()
    assert s.step_budget is not None and s.itl_by_batch and s.ttft is not None  # nested values present
    assert plain_json(s) == json_form(asdict(s))
    assert diagnosis.findings and all(plain_json(f) == json_form(asdict(f)) for f in diagnosis.findings)
    assert plain_json({"edges": (1.0, math.inf), "ratio": math.nan}) == {"edges": [1.0, None], "ratio": None}
