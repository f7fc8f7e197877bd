"""unexplained: latency out of its expected range and no rule explains it; the verdict vocabulary
(healthy only when every rule was judged and latency is in range, else not_judged); the derived
numbers and the two queue-time estimates; expected ranges per target."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts.config import AlertsConfig
from app.alerts.engine import diagnosis_conditions
from app.config import DiagnosisConfig, load_config
from app.core.thresholds import Thresholds
from app.diagnosis import engine, rounds
from app.diagnosis.oneshot import EXIT_FINDING, EXIT_NOT_JUDGED, OneShotResult, format_text
from app.diagnosis.profile import HardwareProfile
from app.diagnosis.rules import queueing, unexplained
from app.diagnosis.rules.base import NotJudged, Outcome
from app.scrape.jobs import PageProcessor
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from app.telemetry import DiagnosisCollector
from tests.diagnosis.test_not_judged import EXPOSITION, T0, _scaled, replay
from tests.diagnosis.test_rules import evidence, healthy_signals, summary
from tests.support.databases import migrated_sqlite

T = Thresholds()
SGLANG_04 = "sglang-v0.4-docs-production_metrics.prom"


def no_queue_inputs(**changes):
    """Healthy numbers, but neither a queue-time histogram nor a waiting gauge: queueing cannot be judged."""
    return healthy_signals(queue_time=None, queue_share=None, waiting_mean=None, waiting_max=None, **changes)


def test_slow_with_nothing_to_explain_it_is_unexplained_with_every_rule_accounted_for() -> None:
    d = engine.diagnose(no_queue_inputs(ttft=summary(25, 60, 30.0, 300)), T)
    assert d.verdict == "unexplained" and [f.regime for f in d.findings] == ["unexplained"]
    f = d.findings[0]
    assert f.severity == "warning" and f.primary  # 30 s: 3x the range, critical from 5x
    ttft = evidence(f, "TTFT mean")
    assert (ttft.value, ttft.op, ttft.threshold, ttft.met) == (30.0, ">", 10.0, True)
    itl = evidence(f, "ITL mean")  # 13 ms, in its range: 10 x the 7.9 ms floor of the profile
    assert itl.op == "info" and itl.value == 0.013 and "in its range (at most 79.0 ms)" in itl.note
    assert "10x the decode floor 7.9 ms" in itl.note
    assert (evidence(f, "queueing").value, evidence(f, "kv_cache_pressure").value) == ("not judged", "judged, quiet")
    assert evidence(f, "queueing").note.startswith("needs queue time (a queue-time histogram, or the waiting gauge")
    # the condition each quiet rule failed, with its numbers
    assert evidence(f, "prefill_compute").note == ("conditions not met: mean prefill time = 40.0 ms (>= 500.0 ms); "
                                                   "mean prompt length = 450 tokens (>= 2,000 tokens)")
    assert evidence(f, "rules with nothing to judge here").value == ("scheduler_cpu_bound, kv_transfer, "
                                                                     "frontend_bound, speculation_ineffective, "
                                                                     "lora_adapter_slots, dp_imbalance, "
                                                                     "replica_imbalance, outside_engine")
    # what to export or configure, each once with the rules it unblocks, then the per-target range
    assert f.remedies[0].startswith("To judge queueing: export or configure a queue-time histogram (vLLM "
                                    "request_queue_time_seconds, SGLang 0.4.6+ queue_time_seconds")
    assert f.remedies[1].startswith("To judge queueing: export or configure the engine's waiting-requests gauge")
    assert f.remedies[-1] == unexplained.EXPECTED_HERE and len(f.remedies) == 3
    assert f.summary == ("Out of its expected range: TTFT mean 30.00 s above 10.00 s. No rule explains it: 5 judged "
                         "quiet, 1 not judged (queueing).")
    assert d.not_judged == [{"regime": "queueing", "reason": evidence(f, "queueing").note}]


def test_far_out_is_critical_and_a_rule_that_fires_explains_it() -> None:
    assert engine.diagnose(no_queue_inputs(ttft=summary(40, 90, 50.0, 300)), T).findings[0].severity == "critical"
    # the same TTFT with the queue it comes from: queueing names the cause, unexplained stays quiet
    d = engine.diagnose(healthy_signals(ttft=summary(40, 90, 50.0, 300), queue_time=summary(40, 90, 49.0, 300),
                                        queue_share=0.98, waiting_mean=40.0, waiting_max=60), T)
    assert [f.regime for f in d.findings] == ["queueing"] and d.verdict == "queueing"


def test_healthy_only_when_every_rule_judged_and_latency_in_range() -> None:
    assert engine.diagnose(healthy_signals(), T).verdict == "healthy"
    d = engine.diagnose(no_queue_inputs(), T)  # in range, but queueing could not be judged
    assert (d.verdict, d.findings, [n["regime"] for n in d.not_judged]) == ("not_judged", [], ["queueing"])
    result = OneShotResult("http://x/metrics", "vllm", [ScrapeRecord(1, 0.0, True, 0.1, canonical=None)], {}, [d])
    assert result.exit_code == 3  # nothing scraped: unreachable wins
    result.scrapes[0].canonical = PageProcessor("vllm").process("vllm:num_requests_running 1\n")[1]
    assert result.exit_code == EXIT_NOT_JUDGED
    assert "Diagnosis [m]: not_judged (no regime found, but not every regime could be judged: not healthy)" \
        in format_text(result)
    d = engine.diagnose(no_queue_inputs(ttft=summary(25, 60, 30.0, 300)), T)
    assert OneShotResult("http://x/metrics", "vllm", result.scrapes, {}, [d]).exit_code == EXIT_FINDING


def test_decode_time_against_the_floor_where_no_rule_can_judge_it() -> None:
    """trtllm-serve has no per-step ITL: weights_offloaded cannot be judged, and a 200 ms TPOT against a
    15.9 ms floor (an RTX 4090's 8B BF16) is out of the 10x range, below the 250 ms one."""
    s = healthy_signals("trtllm", itl=None, tpot=summary(0.2, 0.3, 0.2, 300), itl_over_floor=None,
                        decode_floor_seconds=0.0159, prompt_tokens=None, prompt_mean_counters=450.0)
    d = engine.diagnose(s, T)
    assert d.verdict == "unexplained"
    decode = evidence(d.findings[0], "TPOT mean (per request; no per-step ITL)")
    assert decode.met and decode.value == 0.2 and decode.threshold == pytest.approx(0.159)
    assert {n["regime"] for n in d.not_judged} == {"weights_offloaded", "prefill_interference", "bandwidth_bound"}
    assert any(r.startswith("To judge weights_offloaded: export or configure a hardware profile")
               for r in d.findings[0].remedies)
    # without a profile the range is 250 ms: not out of it, and not healthy either
    assert engine.diagnose(healthy_signals("trtllm", itl=None, tpot=summary(0.2, 0.3, 0.2, 300), itl_over_floor=None,
                                           decode_floor_seconds=None), T).verdict == "not_judged"


def test_end_to_end_latency_against_ttft_plus_the_output_at_the_expected_decode_time() -> None:
    inputs = "increase(generation_tokens_total) / increase(requests_total)"
    s = healthy_signals(e2e=summary(150, 300, 200.0, 300), output_mean_counters=500.0,
                        derived={"output_mean_counters": inputs})
    f = unexplained.evaluate(s, T)
    assert f is not None
    e2e = evidence(f, "end-to-end latency mean")
    assert e2e.value == 200.0 and e2e.threshold == pytest.approx(10.0 + 500 * 0.079)  # 49.5 s
    assert "mean output length 500 tokens (increase(generation_tokens_total) / increase(requests_total))" in e2e.note
    # without the output length the e2e mean is shown, not compared
    s.output_mean_counters = None
    assert unexplained.evaluate(s, T) is None
    only_e2e = healthy_signals(ttft=None, itl=None, e2e=summary(150, 300, 200.0, 300))
    with pytest.raises(NotJudged, match="no latency to compare"):
        unexplained.evaluate(only_e2e, T)


def test_an_outcome_per_rule() -> None:
    outcomes: list[Outcome] = []
    s = no_queue_inputs()
    for rule in engine.RULES:
        engine.judge(rule, s, T, outcomes)
    states = {o.regime: o.state for o in outcomes}
    assert states == {"kv_cache_pressure": "quiet", "weights_offloaded": "quiet", "prefill_interference": "quiet",
                      "prefill_compute": "quiet", "kv_transfer": "not_applicable", "frontend_bound": "not_applicable",
                      "speculation_ineffective": "not_applicable", "bandwidth_bound": "quiet",
                      "dp_imbalance": "not_applicable", "replica_imbalance": "not_applicable",
                      "queueing": "not_judged", "outside_engine": "not_applicable", "unexplained": "quiet",
                      "lora_adapter_slots": "not_applicable", "scheduler_cpu_bound": "not_applicable"}
    kv = next(o for o in outcomes if o.regime == "kv_cache_pressure")
    assert kv.detail == "conditions not met: KV-cache usage (max) = 3.0 % (>= 90.0 %); preemptions = 0 /s (> 0.01 /s)"
    queue = next(o for o in outcomes if o.regime == "queueing")
    assert len(queue.lacks) == 2 and queue.lacks[1].startswith("the engine's waiting-requests gauge (vLLM")


# ---- the two queue-time estimates --------------------------------------------------------------------------


def estimated(little: float, from_ttft: float, ttft: float = 10.0):
    return healthy_signals("sglang", queue_time=None, queue_share=None, ttft=summary(8, 20, ttft, 300),
                           waiting_mean=20.0, waiting_max=30, queue_mean_estimated=little,
                           queue_mean_from_ttft=from_ttft, prefill_expected=ttft - from_ttft,
                           queue_estimates_ratio=max(little, from_ttft) / min(little, from_ttft),
                           derived={"queue_mean_estimated": "Little's law", "prefill_expected": "the profile"})


def test_estimates_on_both_sides_of_the_thresholds_leave_queueing_not_judged() -> None:
    with pytest.raises(NotJudged) as raised:
        queueing.evaluate(estimated(9.0, 0.2), T)  # Little's law: queueing; TTFT minus prefill: 0.2 s, not
    assert raised.value.reason == ("the two queue-time estimates disagree: Little's law gives 9.00 s, which meets "
                                   "the thresholds (0.5 s and 50% of TTFT), TTFT minus the expected prefill 200.0 ms, "
                                   "which "
                                   "does not; a queue-time histogram decides")
    d = engine.diagnose(estimated(9.0, 0.2), T)
    assert d.verdict == "not_judged" and "disagree by 45.0x" in d.notes[0]


def test_estimates_that_agree_on_the_verdict_both_show_and_a_wide_gap_is_flagged() -> None:
    f = queueing.evaluate(estimated(9.0, 8.0), T)
    assert f is not None
    assert evidence(f, "mean queue time by Little's law").value == 9.0
    assert evidence(f, "mean queue time as TTFT minus the expected prefill").value == 8.0
    agree = evidence(f, "queue-time estimates apart (larger / smaller)")
    assert agree.op == "info" and agree.value == pytest.approx(9 / 8) and agree.note == "they agree within 3x"
    f = queueing.evaluate(estimated(30.0, 8.0), T)  # both say queueing, 3.75x apart: flagged, met
    flag = evidence(f, "queue-time estimates apart (larger / smaller)")
    assert (flag.op, flag.threshold, flag.met) == (">=", 3.0, True) and flag.value == pytest.approx(3.75)


def test_the_sglang_04_page_with_a_profile_shows_both_estimates_with_their_inputs(tmp_path: Path) -> None:
    # an L4: the page's 117 ms ITL at 162 running is 2.2x its 53.5 ms floor, so weights_offloaded stays quiet
    profile = HardwareProfile(gpu="L4", model="llama-3.1-8b")
    (d,), _ = replay(tmp_path, SGLANG_04, hardware=profile)
    prompt = 8.128902e6 / 11228  # 724 tokens per finished request
    prefill = 2 * 8.03e9 * prompt / (121e12 * 0.5)  # 192 ms at 50 % of the L4's 121 TFLOP/s
    assert profile.prefill_seconds(prompt) == pytest.approx(prefill)
    assert d.signals["prefill_expected"] == pytest.approx(prefill)
    assert d.signals["queue_mean_from_ttft"] == pytest.approx(2351897.9474117756 / 11008 - prefill)
    assert d.signals["derived"]["prefill_expected"].startswith("2 x parameters x mean prompt length (724 tokens, "
                                                               "increase(prompt_tokens_total) / increase(e2e _count)")
    f = d.findings[0]
    assert d.verdict == "queueing" and f.regime == "queueing"
    assert evidence(f, "mean queue time by Little's law").value == pytest.approx(2826 / 11.008)
    apart = evidence(f, "queue-time estimates apart (larger / smaller)")
    assert apart.op == "info" and apart.value == pytest.approx((2826 / 11.008) / (213.655 - prefill), rel=1e-3)


# ---- expected ranges per target ----------------------------------------------------------------------------


def _records(target_id: int, text: str, lifetime: float = 1000.0, every: float = 10.0) -> list[ScrapeRecord]:
    processor, out = PageProcessor("auto"), []
    for i in range(int(lifetime / every) - 8, int(lifetime / every) + 1):
        page, canonical, error = processor.process(_scaled(text, i * every / lifetime))
        assert error is None
        out.append(ScrapeRecord(target_id, T0 + i * every, True, 0.001, 0, page.samples_seen, page.samples_kept,
                                page.malformed, processor.engine, None, None, canonical))
    return out


def test_a_wider_range_for_some_targets_under_diagnosis_overrides(tmp_path: Path) -> None:
    """The SGLang 0.4 page without its waiting gauge on two targets: unexplained on one, not judged on the
    batch target whose TTFT range is 300 s; /metrics says the same."""
    text = "".join(line for line in (EXPOSITION / SGLANG_04).read_text().splitlines(keepends=True)
                   if "sglang:num_queue_reqs" not in line)
    sql = db.make_engine(migrated_sqlite(tmp_path / "round.db"))
    try:
        sessions = db.make_sessionmaker(sql)
        with sessions.begin() as session:
            ids = [target_repository.create_target(session, name=name, url=f"http://127.0.0.1/{name}/metrics",
                                            engine="sglang", labels={}).id for name in ("chat", "batch-7")]
        SampleWriter(sql).write([r for target_id in ids for r in _records(target_id, text)])
        config = DiagnosisConfig.model_validate({"overrides": [
            {"targets": ["batch-*"], "thresholds": {"expected_ttft_seconds": 300}}]})
        collector = DiagnosisCollector()
        rounds.evaluate_diagnoses(sessions, config, now=T0 + 1000.0)
        results = rounds.evaluate_diagnoses(sessions, config, collector, now=T0 + 1000.0)  # active after two
        with sessions() as session:
            alerts = diagnosis_conditions(session, AlertsConfig())
    finally:
        sql.dispose()
    verdicts = {d.target: d.verdict for d, _ in results}
    assert verdicts == {"chat": "unexplained", "batch-7": "not_judged"}
    chat = next(d for d, _ in results if d.target == "chat").findings[0]
    assert chat.severity == "critical" and evidence(chat, "TTFT mean").value == pytest.approx(213.65, abs=0.01)
    exported = {(s.labels["target"], s.labels["verdict"]) for family in collector.collect()
                if family.name == "llm_latency_diagnosis_verdict" for s in family.samples}
    assert exported == {("chat", "unexplained"), ("batch-7", "not_judged")}
    # an alert for the finding, none for a verdict that found nothing
    (alert,) = alerts
    assert alert.labels["alertname"] == "LLMLatencyUnexplained" and alert.labels["target"] == "chat"
    assert alert.labels["severity"] == "critical" and alert.annotations["runbook_url"].endswith("unexplained.md")
    assert "Evidence: TTFT mean = 213.65 s (> 10.00 s); expected_ttft_seconds; end-to-end latency mean = 277.53 s " \
        "(> 178.28 s); expected TTFT + mean output length 673 tokens" in alert.annotations["description"]
    assert "To judge queueing: export or configure a queue-time histogram" in alert.annotations["remedies"]


def test_overrides_are_checked_where_they_are_written(tmp_path: Path) -> None:
    path = tmp_path / "targets.yaml"
    path.write_text("targets: []\ndiagnosis:\n  overrides:\n    - targets: [a]\n      thresholds: {queue_share: 0.9}\n"
                    "    - targets: [b]\n      thresholds: {expected_itl_seconds: -1}\n")
    with pytest.raises(Exception) as raised:
        load_config(path)
    assert raised.value.problems == [  # type: ignore[attr-defined]
        f"{path}:5: diagnosis.overrides[0].thresholds: queue_share: not a per-target threshold (these are: "
        "expected_ttft_seconds, expected_itl_seconds, expected_itl_floor_factor, expected_critical_factor)",
        f"{path}:7: diagnosis.overrides[1].thresholds: expected_itl_seconds: Input should be greater than 0"]
    config = DiagnosisConfig.model_validate({"overrides": [
        {"targets": ["gpu-?", "batch-*"], "thresholds": {"expected_ttft_seconds": 60}},
        {"targets": ["batch-2"], "thresholds": {"expected_ttft_seconds": 90, "expected_itl_seconds": 1}}]})
    assert config.thresholds_for("gpu-1").expected_ttft_seconds == 60.0
    assert (config.thresholds_for("batch-2").expected_ttft_seconds,
            config.thresholds_for("batch-2").expected_itl_seconds) == (90.0, 1.0)  # the later one wins
    assert config.thresholds_for("gpu-10") is config.thresholds  # no match: the shared thresholds
