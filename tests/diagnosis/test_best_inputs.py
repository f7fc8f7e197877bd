"""Rules take the most exact number the page has, decide thresholds on buckets, and do not fire on
fewer samples than their evidence needs.

Two classes of wrong verdict, reproduced on emulated engines and with hand-made numbers:
(a) no prompt-length histogram (SGLang pages) -> no mean prompt length -> decodes stalled 40 % of
    the time called healthy; the token and request counters give the mean exactly;
(b) a threshold compared with a quantile interpolated inside a coarse bucket (ITL 25-50 ms ->
    "37.5 ms" against 35 ms while the exact mean is 27 ms), and "steady" judged from three scrapes
    after an engine start -> a false bandwidth_bound on a healthy engine.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.core.quantiles import LatencySummary, WindowHistogram
from app.core.thresholds import Thresholds
from app.diagnosis import engine
from app.diagnosis.rules import bandwidth_bound, prefill_interference
from app.diagnosis.rules.base import NotJudged, decided
from app.diagnosis.signals import from_window
from app.emulator.engine import EngineConfig
from app.emulator.physics import Deployment
from app.emulator.scenarios import L, Scenario
from app.emulator.workload import TrafficStream
from app.window import GaugeStats, ModelWindow, TargetWindow
from tests.diagnosis.harness import OfflineTarget

T = Thresholds()
INF = math.inf
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, INF)


def itl_window(mean: float, steps: float = 2000.0, scrapes: int = 12, running: float = 2.0) -> TargetWindow:
    """Every decode step in vLLM's 25-50 ms ITL bucket, with the given exact mean."""
    counts = tuple(0.0 if b <= 0.025 else steps for b in VLLM_ITL)
    window = TargetWindow(0.0, 120.0, scrapes=scrapes)
    window.models["m"] = ModelWindow(histograms={"itl": WindowHistogram(VLLM_ITL, counts, mean * steps, steps)},
                                     gauges={"running": GaugeStats(running, running, running + 1)})
    return window


def test_decided_on_the_bucket() -> None:
    assert decided(0.025, 0.05, ">=", 0.035) is None  # the threshold is inside: it depends
    assert decided(0.05, 0.075, ">=", 0.035) is True
    assert decided(0.025, 0.05, ">=", 0.05) is False  # (0.025, 0.05]: only the edge itself would meet it
    assert decided(0.025, 0.05, "<=", 0.05) is True and decided(0.05, 0.075, "<=", 0.05) is False


def test_itl_bucket_25_50_with_exact_mean_28ms_is_not_slow_decode() -> None:
    (s,) = from_window(itl_window(0.028), "t", "vllm")
    assert s.itl is not None and s.itl.p50 == pytest.approx(0.0375)  # interpolated: above the 35 ms threshold
    assert s.itl.interval("p50") == (0.025, 0.05) and s.itl_typical == pytest.approx(0.028)
    assert bandwidth_bound.evaluate(s, T) is None  # the exact mean decides: 28 ms < 35 ms
    # the same bucket with an exact mean of 40 ms is slow decode, steady, small batch
    (slow,) = from_window(itl_window(0.040), "t", "vllm")
    finding = bandwidth_bound.evaluate(slow, T)
    assert finding is not None and finding.evidence[0].name == "ITL mean"
    assert finding.evidence[0].value == pytest.approx(0.040)


def test_three_scrapes_are_too_few_for_steady() -> None:
    (s,) = from_window(itl_window(0.060, scrapes=3), "t", "vllm")
    with pytest.raises(NotJudged, match="from 3 scrape"):
        bandwidth_bound.evaluate(s, T)
    d = engine.diagnose(s, T)
    assert d.verdict == "not_judged" and d.findings == []  # not healthy: some regimes could not be judged
    # the hand-made window has only ITL and running: the regimes needing other signals are listed as
    # missing them; bandwidth_bound had its signals and is undecided for the few scrapes alone
    not_judged = {j["regime"]: j["reason"] for j in d.not_judged}
    assert len(not_judged) == len(d.not_judged)  # one entry per regime
    assert not_judged["bandwidth_bound"].startswith("decode looks steady, but from 3 scrape(s)")
    assert all(reason.startswith("needs ") for regime, reason in not_judged.items() if regime != "bandwidth_bound")
    # with the window covered by scrapes, the same numbers are a finding
    (enough,) = from_window(itl_window(0.060, scrapes=T.steady_min_scrapes), "t", "vllm")
    assert bandwidth_bound.evaluate(enough, T) is not None


def test_threshold_inside_the_p99_bucket_is_not_judged() -> None:
    """ITL p99 in (0.075, 0.15] against the 0.1 s tail threshold, ratio clearly heavy."""
    itl = LatencySummary(0.02, None, None, 0.12, 0.03, 5000, {"p50": (0.01, 0.025), "p99": (0.075, 0.15)})
    prompts = LatencySummary(None, None, None, None, 1500.0, 100)
    s = from_window(TargetWindow(0.0, 60.0, models={"m": ModelWindow()}), "t", "vllm")[0]
    s.itl, s.prompt_tokens, s.running_mean, s.decode_stall_share = itl, prompts, 12.0, 0.05
    s.itl_ratio, s.itl_ratio_bounds = 6.0, (0.075 / 0.025, 0.15 / 0.01)
    with pytest.raises(NotJudged, match="ITL p99 lies in the bucket 0.075 – 0.15 s"):
        prefill_interference.evaluate(s, T)
    # with the p99 bucket above the threshold it is decided, and fires
    s.itl = LatencySummary(0.02, None, None, 0.2, 0.03, 5000, {"p50": (0.01, 0.025), "p99": (0.15, 0.3)})
    s.itl_ratio, s.itl_ratio_bounds = 10.0, (0.15 / 0.025, 0.3 / 0.01)
    assert prefill_interference.evaluate(s, T) is not None


def test_prompt_mean_from_counters_without_a_histogram() -> None:
    window = TargetWindow(0.0, 60.0, scrapes=12)
    window.models["m"] = ModelWindow(rates={"prompt_tokens_total": 3000.0, "requests_total": 2.0})
    (s,) = from_window(window, "t", "sglang")
    assert s.prompt_tokens is None and s.prompt_mean == 1500.0
    assert s.prompt_mean_source is not None
    assert s.prompt_mean_source.startswith("increase(prompt_tokens_total) / increase(requests_total)")


# --------------------------------------------------------------------------- on emulated engines

def _without_prompt_histogram(page: bytes) -> bytes:
    """The page an engine without a prompt-length histogram serves (SGLang's, in its token counters only)."""
    return b"\n".join(line for line in page.split(b"\n")
                      if not line.replace(b"# HELP ", b"").replace(b"# TYPE ", b"").startswith(
                          b"vllm:request_prompt_tokens")) + b"\n"


def test_stalled_decodes_found_without_a_prompt_histogram(tmp_path: Path) -> None:
    target = OfflineTarget(tmp_path, "prefill_interference", seed=1)
    render = target.sim.render_metrics
    target.sim.render_metrics = lambda: _without_prompt_histogram(render())  # type: ignore[method-assign]
    try:
        target.run(180.0)
        d = target.diagnose()
    finally:
        target.close()
    assert "prompt_tokens" not in d.signals  # the histogram really is gone
    assert d.verdict == "prefill_interference", (d.verdict, d.notes)
    prompt = next(e for e in d.findings[0].evidence if e.name == "mean prompt length")
    assert prompt.met and prompt.value >= T.interference_prompt_tokens
    assert prompt.note.startswith("increase(prompt_tokens_total) / increase(requests_total)")
    assert d.signals["decode_stall_share"] >= 0.4  # stalled 40 % of the time and more


def _calm_70b_fp8() -> Scenario:
    """Llama-3.1-70B FP8 on one H100: ITL ~27 ms at 2 users, every step in vLLM's 25-50 ms bucket."""
    stream = TrafficStream(name="users", clients=2, think_time_s=1.0, prompt=L.lognormal(300, 0.5, 16, 3000),
                           output=L.lognormal(200, 0.4, 16, 1500), max_tokens=2048)
    return Scenario("calm", Deployment.of("H100-SXM", "llama-3.1-70b", weight_dtype="fp8"),
                    EngineConfig(max_model_len=8192), (stream,), None, "healthy, just started", "m", {})


def test_healthy_engine_three_scrapes_after_start_is_not_bandwidth_bound(tmp_path: Path) -> None:
    target = OfflineTarget(tmp_path, _calm_70b_fp8(), seed=1)  # type: ignore[arg-type]
    try:
        target.run(15.0, scrape_every=5.0)  # three scrapes after the start
        d = target.diagnose(window=60.0)
    finally:
        target.close()
    itl = d.signals["itl"]
    assert itl["p50"] >= T.slow_itl_seconds > itl["mean"]  # the interpolated p50 would have tripped it
    assert itl["intervals"]["p50"] == [0.025, 0.05]
    assert "bandwidth_bound" not in [f.regime for f in d.findings]
    assert d.verdict == "healthy", (d.verdict, d.notes)  # judged (enough requests), and not bandwidth_bound
    assert d.signals["itl_ratio"] <= T.steady_itl_ratio and d.signals["running_mean"] <= T.low_batch_running
