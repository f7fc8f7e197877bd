"""Chunked prefill and the per-step token budget, inferred from a window.

The emulated engine's own configuration is the ground truth; its page goes through parse
-> store -> signals like a real scrape (``tests/diagnosis/harness.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.quantiles import WindowHistogram, histogram_quantile
from app.core.thresholds import Thresholds
from app.diagnosis import step_budget
from app.diagnosis.rules import prefill_interference
from app.diagnosis.step_budget import StepBudget, share_above
from app.emulator import scenarios
from tests.diagnosis.harness import OfflineTarget, profile_of


def interference(**engine_config) -> scenarios.Scenario:
    """The prefill_interference traffic (6k-token prompts among 24 decoding users) with
    another scheduler configuration."""
    sc = scenarios.get("prefill_interference")
    return replace(sc, engine=replace(sc.engine, **engine_config))


def observe(tmp_path: Path, scenario, seed: int, engine: str = "vllm", window: float = 60.0, name: str = "t"):
    target = OfflineTarget(tmp_path, scenario, engine=engine, seed=seed, hardware=profile_of(scenario), name=name)
    try:
        target.run(60 + window)
        diagnosis = target.diagnose(window)
        truth = target.sim.state()["config"]
    finally:
        target.close()
    return diagnosis, StepBudget(**diagnosis.signals["step_budget"]), truth


@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_off_512_and_2048_are_told_apart(tmp_path: Path, seed: int) -> None:
    off_diag, off, off_truth = observe(tmp_path, interference(), seed, name="off")
    big_diag, big, big_truth = observe(tmp_path, interference(enable_chunked_prefill=True), seed, name="b2048")
    small_diag, small, small_truth = observe(
        tmp_path, interference(enable_chunked_prefill=True, max_num_batched_tokens=512), seed, name="b512")
    assert (off_truth["enable_chunked_prefill"], big_truth["max_num_batched_tokens"],
            small_truth["max_num_batched_tokens"]) == (False, 2048, 512)
    # off: the longest gaps last about a whole prefill, so whole prompts ran in one step
    assert off.verdict == "whole_prompts" and off.ratio >= 0.5, off.reasoning
    assert off.budget_tokens >= 4096 and off.budget_tokens == off.step_tokens  # a lower bound: the step size
    assert off.confidence >= 0.4
    # on: gaps are a fraction of the prefill; the budget within the +/-50 % the buckets allow
    for inferred, truth in ((big, 2048), (small, 512)):
        assert inferred.verdict == "chunked" and inferred.ratio <= step_budget.CHUNKED_RATIO, inferred.reasoning
        assert truth / 2 <= inferred.budget_tokens <= truth * 2, (truth, inferred.budget_tokens)
        assert inferred.confidence >= 0.5
    assert small.budget_tokens < big.budget_tokens / 2
    # the estimate is ratio x prompt length + the decodes sharing the step
    running = big_diag.signals["running_mean"]
    assert big.budget_tokens == pytest.approx(big.ratio * big.prompt_tokens + running - 1)


def test_prefill_interference_names_the_step_budget_in_evidence_and_first_remedy(tmp_path: Path) -> None:
    off_diag, off, _ = observe(tmp_path, interference(), 0, name="off")
    big_diag, big, _ = observe(tmp_path, interference(enable_chunked_prefill=True), 0, name="b2048")
    assert off_diag.verdict == big_diag.verdict == "prefill_interference"
    off_f, big_f = off_diag.findings[0], big_diag.findings[0]
    off_e = next(e for e in off_f.evidence if e.name == "engine step budget (inferred)")
    assert off_e.value == f"whole prompts of ~{off.prompt_tokens:,.0f} tokens in one step"
    assert f"confidence {off.confidence:.2f}" in off_e.note and "chunked prefill is off" in off_e.note
    assert off_f.remedies[0].startswith(f"Steps of ~{off.step_tokens:,.0f} tokens: whole prompts run in one step")
    assert "--enable-chunked-prefill --max-num-batched-tokens 512" in off_f.remedies[0]
    big_e = next(e for e in big_f.evidence if e.name == "engine step budget (inferred)")
    assert big_e.value == f"chunked, ~{big.budget_tokens:,.0f} tokens per step"
    assert big_f.remedies[0] == (f"Prefills are chunked at ~{big.budget_tokens:,.0f} tokens per step: lower the budget "
                                 "with --max-num-batched-tokens 512 (raise it again if TTFT/throughput suffer).")
    assert not any("--enable-chunked-prefill" in r for r in big_f.remedies)  # it is on already


@pytest.mark.parametrize(("scenario", "engine", "reason"), [
    ("prefill_compute", "vllm", "requests running on average: long prefills rarely had a decode beside them"),
    ("healthy", "vllm", "falls in the prefill histogram's first bucket (<= 0.3 s)"),
    ("queueing", "vllm", "fewer than 8 prompts above 1024 tokens"),
    ("kv_cache_pressure", "vllm", "preemptions in the window"),
    ("prefill_interference", "tgi", "no per-step token histogram"),
])
def test_unknown_says_why(tmp_path: Path, scenario: str, engine: str, reason: str) -> None:
    _, inferred, _ = observe(tmp_path, scenario, 0, engine=engine)
    assert inferred.verdict == "unknown" and inferred.confidence == 0.0
    assert reason in inferred.reasoning and inferred.budget_tokens is None


def test_unknown_budget_keeps_the_generic_remedies() -> None:
    assert prefill_interference._budget_remedies(StepBudget("unknown", 0.0, "x"))[0].startswith(
        "Enable chunked prefill (--enable-chunked-prefill")
    small = StepBudget("chunked", 0.9, "x", budget_tokens=600.0)
    assert prefill_interference._budget_remedies(small) == [
        "Prefills are already chunked at ~600 tokens per step, so the step budget is not what stalls the decodes here."]


def window(bounds: tuple[float, ...], per_bucket: tuple[float, ...]) -> WindowHistogram:
    cumulative, acc = [], 0.0
    for n in per_bucket:
        acc += n
        cumulative.append(acc)
    return WindowHistogram(bounds, tuple(cumulative), 0.0, acc)


def test_share_above_inverts_histogram_quantile() -> None:
    h = window((10.0, 20.0, math.inf), (50.0, 30.0, 20.0))
    assert share_above(h, 10.0) == pytest.approx(0.5)
    assert share_above(h, 15.0) == pytest.approx(0.35)     # half of the (10, 20] bucket's 30 lies above 15
    assert share_above(h, 5.0) == pytest.approx(0.75)      # the first bucket starts at 0
    assert share_above(h, 50.0) == pytest.approx(0.2)      # inside +Inf: everything there counts
    for q in (0.2, 0.5, 0.65, 0.79):
        assert share_above(h, histogram_quantile(q, h.bounds, h.increases)) == pytest.approx(1 - q)


# A window built by hand: 1000 steps, 20 of them finish prompts of 5-10k tokens (20 of 100
# requests); decodes beside them wait 0.1-0.3 s per token while those prompts' prefill takes 0.5-0.8 s.
ITERATION = window((16.0, 4096.0, 8192.0, math.inf), (980.0, 0.0, 20.0, 0.0))
PROMPTS = window((1000.0, 5000.0, 10000.0, math.inf), (80.0, 0.0, 20.0, 0.0))
PREFILL = window((0.3, 0.5, 0.8, 1.0, math.inf), (80.0, 0.0, 20.0, 0.0, 0.0))


def test_the_arithmetic_of_a_chunked_window() -> None:
    itl = window((0.025, 0.1, 0.3, math.inf), (9600.0, 0.0, 400.0, 0.0))
    inferred = step_budget.infer(ITERATION, PROMPTS, itl, PREFILL, running_mean=25.0, preemptions_per_second=0.0)
    # threshold 4096: f = 20/1000, g = 20/100; ranks 1 - k f and 1 - k g for k = 1/4, 1/2, 3/4
    assert inferred.threshold_tokens == 4096.0 and inferred.long_steps == pytest.approx(20.0)
    assert inferred.prompt_tokens == pytest.approx(7500)                   # prompt quantile 0.9
    assert inferred.stall_seconds == pytest.approx(0.25)                   # ITL quantile 0.99
    assert inferred.prefill_seconds == pytest.approx(0.65)                 # prefill quantile 0.9
    # median of 0.275/0.725, 0.25/0.65, 0.225/0.575
    ratio = 0.25 / 0.65
    assert inferred.ratio == pytest.approx(ratio)
    assert inferred.verdict == "chunked"
    assert inferred.budget_tokens == pytest.approx(ratio * 7500 + 24)      # + the 24 decodes sharing each step
    assert inferred.confidence == pytest.approx(round(0.5 + 0.45 * abs(math.log2(ratio / 0.45)), 3))


def test_the_arithmetic_of_a_whole_prompt_window() -> None:
    # as many long gaps as long-prompt steps (2 %), each as long as the prefill: one step per prompt
    itl = window((0.025, 0.5, 0.8, math.inf), (9800.0, 0.0, 200.0, 0.0))
    inferred = step_budget.infer(ITERATION, PROMPTS, itl, PREFILL, running_mean=25.0, preemptions_per_second=0.0)
    assert inferred.verdict == "whole_prompts"
    assert inferred.stall_seconds == pytest.approx(0.65) and inferred.ratio == pytest.approx(1.0)
    assert inferred.budget_tokens == inferred.step_tokens == pytest.approx(4096 + 4096 * 0.5)  # iteration q 0.99
    assert inferred.confidence == 0.95
    # the same window with a preemption, or with one request running, cannot tell
    assert step_budget.infer(ITERATION, PROMPTS, itl, PREFILL, 25.0, 0.5).verdict == "unknown"
    assert step_budget.infer(ITERATION, PROMPTS, itl, PREFILL, 1.2, 0.0).verdict == "unknown"


def test_step_budget_is_in_the_signals_of_a_diagnosis(tmp_path: Path) -> None:
    diagnosis, inferred, _ = observe(tmp_path, interference(), 0)
    assert diagnosis.signals["step_budget"]["verdict"] == inferred.verdict == "whole_prompts"
    assert Thresholds().interference_prompt_tokens <= inferred.prompt_tokens
