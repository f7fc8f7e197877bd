"""The outside_engine rule: client-side probe TTFT vs. the engine's over the same periods.
Firing and quiet cases with the evidence numbers; the judgement of the consistency check
the rule reads (on a real database, from stored scrapes and probe runs)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from app.alerts.config import regime_alertname
from app.core.thresholds import Thresholds
from app.diagnosis import engine
from app.diagnosis.findings import PROBE_REGIMES, REGIMES
from app.diagnosis.rules import RULES, outside_engine
from app.probe import repository as probe_repository
from app.probe.canary import ProbeBaseline
from app.probe.consistency import ConsistencyResult, period_consistency
from app.sources.base import Canonical, CanonicalHistogram
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.diagnosis.test_rules import healthy_signals, summary

T = Thresholds()


def consistency(gap: float, client: float, n: int = 4, status: str | None = None,
                other: bool = True) -> ConsistencyResult:
    server = client - gap
    return ConsistencyResult(
        target_id=1, probe_start=1000.0, probe_end=1010.0, window_start=995.0, window_end=1015.0,
        client_requests=n, client_mean=client, server_requests=40.0, server_mean=server, server_queue_mean=0.01,
        gap_seconds=gap, gap_share=gap / client, threshold_seconds=0.25, threshold_share=0.3, min_requests=3,
        finding=False, status=status or "ok", message="m", other_traffic=other, runs=(7, 9), models=("m",))


def evidence(finding, name: str):
    return next(e for e in finding.evidence if e.name == name)


def test_outside_engine_fires_on_a_large_gap_with_its_numbers() -> None:
    s = healthy_signals(probe_consistency=consistency(0.31, 0.42, status="finding"))
    f = outside_engine.evaluate(s, T)
    assert f is not None and f.regime == "outside_engine" and f.severity == "warning"
    gap = evidence(f, "client TTFT - engine TTFT")
    assert (gap.value, gap.threshold, gap.met) == (0.31, 0.25, True)
    assert evidence(f, "share of client TTFT outside the engine").value == pytest.approx(0.738, abs=1e-3)
    assert evidence(f, "probe requests compared").value == 4
    assert evidence(f, "engine TTFT mean, same periods").value == pytest.approx(0.11)
    assert evidence(f, "engine requests in those periods").note == "other traffic mixed in"
    assert "probe run(s) 7, 9" in evidence(f, "compared period").note
    assert f.summary.startswith("Clients wait 0.31 s longer for the first token than the engine records (74% of")
    assert any("--api-server-count" in r for r in f.remedies) and any("proxy_buffering" in r for r in f.remedies)
    # the weakest margin is the gap, 0.31 / 0.25 s (x1.24: log2(1.24) / 2 = 0.155 of the way to 4x), above the
    # share's (0.738 - 0.3) / 0.7 = 0.63 and the probes' log2(4 / 3) / 2 = 0.21; data: 4 probe requests of 12 wanted
    assert f.confidence == pytest.approx(0.5 + 0.49 * (math.log2(1.24) / 2) * (4 / 12), abs=0.001) == 0.525
    tgi = outside_engine.evaluate(healthy_signals("tgi", probe_consistency=s.probe_consistency), T)
    assert any("--validation-workers" in r for r in tgi.remedies)
    trtllm = outside_engine.evaluate(healthy_signals("trtllm", probe_consistency=s.probe_consistency), T)
    assert any("--num_postprocess_workers" in r for r in trtllm.remedies)
    assert not any("--api-server-count" in r for r in trtllm.remedies)
    assert not any("--api-server-count" in r for r in tgi.remedies)
    d = engine.diagnose(s, T)
    assert d.verdict == "outside_engine" and d.findings[0].primary
    assert any(n.startswith("client-side probe run(s) 7, 9 vs. the engine's TTFT: m") for n in d.notes)


@pytest.mark.parametrize(("quiet", "why"), [
    ({"ttft": summary(0.03, 0.05, 0.03, 4), "itl": summary(0.01, 0.02, 0.01, 28)},
     "4 requests and 28 decode steps in the window, need 5 requests or 50 steps"),
    ({"scrapes": 1}, "1 successful scrape(s) in the window, need 2"),
])
def test_outside_engine_is_judged_when_the_engine_side_has_too_little_traffic(quiet: dict, why: str) -> None:
    """The canary may be the engine's only traffic: too little for the engine-side rules, but
    the probe rule compares the probes over their own periods and has its own minimum."""
    # the window would also show queueing if it were judged: it must not be, on 4 requests
    busy = {"queue_time": summary(1.0, 2.0, 0.9, 4), "queue_share": 0.9, "waiting_mean": 3.0, "waiting_max": 3}
    s = healthy_signals(probe_consistency=consistency(0.31, 0.42, status="finding", other=False), **quiet, **busy)
    d = engine.diagnose(s, T)
    assert d.verdict == "outside_engine" and [f.regime for f in d.findings] == ["outside_engine"]
    assert d.findings[0].primary and d.findings[0].to_dict()["window"] == {"start": 0.0, "end": 120.0,
                                                                            "seconds": 120.0}
    assert f"engine-side rules not judged: {why}" in d.notes
    # the same window without probe data: nothing can be judged
    idle = engine.diagnose(healthy_signals(**quiet, **busy), T)
    assert (idle.verdict, idle.findings) == ("insufficient_data", [])
    assert f"engine-side rules not judged: {why}" in idle.notes
    # probe data that does not fire leaves it insufficient too (not healthy: the engine was not judged)
    agree = engine.diagnose(healthy_signals(probe_consistency=consistency(0.02, 0.12), **quiet, **busy), T)
    assert (agree.verdict, agree.findings) == ("insufficient_data", [])


@pytest.mark.parametrize(("probe", "why"), [
    (None, "no probe data"),
    (consistency(0.02, 0.12), "client and engine agree"),
    (consistency(0.3, 3.0), "0.3 s of a 3 s TTFT is 10 %: the engine is the place to look"),
    (consistency(0.3, 0.4, n=2), "two probe requests are too few"),
    (consistency(2.0, 2.5, status="unreliable"), "other traffic on a queueing engine"),
    (replace(consistency(0.3, 0.4), gap_seconds=None, gap_share=None, status="insufficient_data"),
     "no scrape after the probe yet"),
])
def test_outside_engine_is_quiet(probe: ConsistencyResult | None, why: str) -> None:
    assert outside_engine.evaluate(healthy_signals(probe_consistency=probe), T) is None, why


def test_the_regime_is_registered_with_an_alert_name() -> None:
    assert "outside_engine" in REGIMES and PROBE_REGIMES == ("outside_engine",)
    # last but the residual unexplained, which is judged from every other rule's outcome
    assert [r.regime for r in RULES][-2:] == ["outside_engine", "unexplained"]
    assert regime_alertname("outside_engine") == "LLMLatencyOutsideEngine"


# ----------------------------------------------------------------------------- the judgement

def _page(target_id: int, ts: float, count: float, total: float, queue_total: float) -> ScrapeRecord:
    """A vLLM scrape whose TTFT and queue-time histograms hold ``count`` requests in total."""
    bounds = (0.1, 0.5, 1.0, 5.0, float("inf"))
    hist = [CanonicalHistogram("ttft", "m", "", bounds, (count,) * 5, total, count),
            CanonicalHistogram("queue_time", "m", "", bounds, (count,) * 5, queue_total, count)]
    return ScrapeRecord(target_id, ts, True, 0.001, 100, 10, 10, 0, "vllm", None, None,
                        Canonical("vllm", histograms=hist))


def _run(sessions, target_id: int, start: float, end: float, ttfts: list[float]) -> int:
    """A stored probe run whose one level had these successful TTFTs (no preflight)."""
    n = len(ttfts)
    mean = sum(ttfts) / n
    summary = {"model": "m", "started_at": start, "finished_at": end, "preflight_ttfts": [],
               "levels": [{"concurrency": 1, "succeeded": n, "ttft": {"count": n, "mean": mean, "p50": mean}}]}
    with sessions.begin() as session:
        row = probe_repository.create_run(session, target="t", url="http://x", kind="canary", params={},
                                          target_id=target_id, started_at=start)
        probe_repository.finish_run(session, row.id, "done", summary=summary, finished_at=end)
        return row.id


def test_runs_are_combined_each_against_its_own_period(store) -> None:
    """Two canaries 5 minutes apart: each is compared with the engine over the scrapes around
    it, and the combination weights each run by its requests."""
    sql, sessions, target_id = store
    # engine: 2 requests at 0.1 s in [1000, 1015]; 10 at 0.2 s (queue 0.02 s) in [1300, 1315];
    # 20 at 3 s, 2.5 s of it queue, in [1600, 1615]
    pages = [(1000, 0, 0, 0), (1015, 2, 0.2, 0.01), (1300, 2, 0.2, 0.01), (1315, 12, 2.2, 0.21),
             (1600, 12, 2.2, 0.21), (1615, 32, 62.2, 50.21)]
    SampleWriter(sql).write([_page(target_id, ts, c, s, q) for ts, c, s, q in pages])
    first = _run(sessions, target_id, 1002, 1010, [0.45, 0.45])        # 0.35 s above its engine period
    second = _run(sessions, target_id, 1302, 1310, [0.5, 0.5, 0.5, 0.5])  # 0.3 s above its engine period
    with sessions() as session:
        c = period_consistency(session, target_id, 900, 1400, T)
        only_first = period_consistency(session, target_id, 900, 1100, T)
        none = period_consistency(session, target_id, 2000, 3000, T)
    queued = _run(sessions, target_id, 1602, 1610, [4.5, 4.5, 4.5])  # 1.5 s above, but on a queueing engine
    with sessions() as session:
        busy = period_consistency(session, target_id, 1500, 1700, T)
    assert c.runs == (first, second) and c.models == ("m",) and c.client_requests == 6
    assert c.client_mean == pytest.approx((2 * 0.45 + 4 * 0.5) / 6)
    assert c.server_mean == pytest.approx((2 * 0.1 + 4 * 0.2) / 6)  # each run's own period, same weights
    assert c.gap_seconds == pytest.approx((2 * 0.35 + 4 * 0.3) / 6)
    assert c.server_requests == pytest.approx(12.0) and c.other_traffic
    assert c.server_queue_mean == pytest.approx((2 * 0.005 + 4 * 0.02) / 6)
    assert (c.window_start, c.window_end) == (1000, 1315) and (c.probe_start, c.probe_end) == (1002, 1310)
    assert c.status == "finding" and c.finding and "clients wait 0.317s (66% of their TTFT)" in c.message
    assert only_first.runs == (first,) and only_first.client_requests == 2
    assert only_first.status == "insufficient_data" and "too few probe requests (need 3)" in only_first.message
    assert none is None
    assert busy.runs == (queued,) and busy.gap_seconds == pytest.approx(1.5) and busy.other_traffic
    assert busy.server_queue_mean == pytest.approx(2.5) and busy.status == "unreliable" and not busy.finding
    assert "the engine is queueing (queue 83% of its TTFT)" in busy.message


def test_runs_between_the_same_scrapes_count_the_engine_requests_once(store) -> None:
    """Three probe runs whose snapshot windows overlap ([1000, 1015], [1000, 1030], [1015, 1030]):
    the engine served exactly their 8 requests. Adding each run's count would give 5 + 8 + 3 = 16,
    report the probes' own requests as other traffic and, on an engine whose queue is most of
    its TTFT, call the comparison unreliable."""
    sql, sessions, target_id = store
    # every engine request: TTFT 0.2 s, 0.15 s of it queued (75 % of the TTFT)
    pages = [(1000, 0, 0.0, 0.0), (1015, 5, 1.0, 0.75), (1030, 8, 1.6, 1.2), (1045, 9, 1.8, 1.35)]
    SampleWriter(sql).write([_page(target_id, ts, c, s, q) for ts, c, s, q in pages])
    runs = [_run(sessions, target_id, 1002, 1005, [0.5, 0.5]),       # between the scrapes at 1000 and 1015
            _run(sessions, target_id, 1008, 1020, [0.5, 0.5, 0.5]),  # 1000 .. 1030
            _run(sessions, target_id, 1017, 1025, [0.5, 0.5, 0.5])]  # 1015 .. 1030
    separate = _run(sessions, target_id, 1032, 1040, [0.5])  # 1030 .. 1045: shares only the scrape at 1030
    with sessions() as session:
        c = period_consistency(session, target_id, 900, 1026, T)
        with_separate = period_consistency(session, target_id, 900, 1041, T)
    assert c.runs == tuple(runs) and c.client_requests == 8 and (c.window_start, c.window_end) == (1000, 1030)
    assert c.server_requests == pytest.approx(8.0) and not c.other_traffic
    assert c.server_mean == pytest.approx(0.2) and c.server_queue_mean == pytest.approx(0.15)
    assert c.gap_seconds == pytest.approx(0.3) and c.status == "finding" and c.finding
    assert "8 engine requests" not in c.message and "other traffic" not in c.message
    # a window that only touches the merged one at a scrape adds its own count: 8 + 1
    assert with_separate.runs == (*runs, separate) and with_separate.client_requests == 9
    assert with_separate.server_requests == pytest.approx(9.0) and not with_separate.other_traffic


def test_the_probe_seams_are_typed_and_the_diagnosis_json_keeps_its_shape() -> None:
    """Signals carry a ProbeBaseline and a ConsistencyResult; the JSON of the diagnosis
    (``signals.probe_baseline`` / ``signals.probe_consistency``) is what it was as plain dicts."""
    stats = {"count": 2, "p50": 0.05, "p90": 0.06, "p99": 0.07, "mean": 0.055, "min": 0.05, "max": 0.07}
    baseline = ProbeBaseline(run_id=3, target="t", kind="canary", measured_at=990.0, age_seconds=30.0,
                             prompt_tokens=64, max_tokens=16, requests=2, succeeded=2, errors={}, ttft=stats,
                             itl=None, e2e=stats, tpot=None, prompt_tokens_seen={"min": 64, "max": 64, "mean": 64.0})
    s = healthy_signals(probe_baseline=baseline, probe_consistency=consistency(0.31, 0.42, status="finding"))
    signals = json.loads(json.dumps(engine.diagnose(s, T).to_dict()["signals"]))
    assert list(signals["probe_baseline"]) == [
        "run_id", "target", "kind", "measured_at", "age_seconds", "prompt_tokens", "max_tokens", "requests",
        "succeeded", "errors", "ttft", "itl", "e2e", "tpot", "prompt_tokens_seen"]
    assert signals["probe_baseline"]["ttft"] == stats and signals["probe_baseline"]["itl"] is None
    assert signals["probe_consistency"] == consistency(0.31, 0.42, status="finding").to_dict()
    assert signals["probe_consistency"]["runs"] == [7, 9] and signals["probe_consistency"]["gap_seconds"] == 0.31
    assert baseline.p50("ttft") == 0.05 and baseline.p50("itl") is None


def test_a_round_asks_once_which_targets_have_probe_runs(store) -> None:
    """The round's one lookup: only targets with a completed run finished since ``since``
    (a running run or an older one does not count), so the others skip the per-target reads."""
    sql, sessions, target_id = store
    with sessions.begin() as session:
        other = target_repository.create_target(session, name="t2", url="http://127.0.0.1:2/metrics", engine="auto",
                                         labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
        assert probe_repository.targets_with_finished_runs(session, 0.0) == set()
    _run(sessions, target_id, 1002, 1010, [0.4])
    with sessions.begin() as session:
        probe_repository.create_run(session, target="t2", url="http://x", kind="canary", params={},
                                    target_id=other, started_at=2000)  # still running
    with sessions() as session:
        assert probe_repository.targets_with_finished_runs(session, 1010.0) == {target_id}
        assert probe_repository.targets_with_finished_runs(session, 1010.5) == set()
