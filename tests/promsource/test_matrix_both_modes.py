"""The diagnosis matrix in both modes: every regime scenario (and healthy) gets the same verdict
and the same numbers whether its samples are read from the built-in store or, through a
Prometheus source, from a real Prometheus 2.42 holding the very same samples.

Each scenario runs offline on the emulator's clock (tests/diagnosis/harness.py); its pages are
written to the store and backfilled, with their timestamps, into a Prometheus TSDB
(tests/support/backfill.py), one ``pod`` per scenario. The Prometheus side is the production
path: :class:`app.promsource.reader.SourceReader` over :class:`app.promql.client.PrometheusClient`,
one query per signal for all pods at once.

The same recording is also imported, with its timestamps, into a real VictoriaMetrics single
node (``/api/v1/import/prometheus``): there the verdicts and findings must be the store's too,
but only the numbers that must agree are compared (its ``increase`` never extrapolates and its
range windows are left-open).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app import latency
from app.api.disaggregation import add_disaggregation
from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.core.thresholds import Thresholds
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS, from_window
from app.diagnosis.tails import buckets_needed
from app.promql.client import PrometheusClient
from app.promsource.config import PrometheusSourceConfig
from app.promsource.mirror import HOLDABLE
from app.promsource.reader import SourceReader
from app.promsource.service import SourceService
from app.sources.base import HISTOGRAM_SIGNALS
from app.store import db, reads
from app.store.record import ScrapeRecord
from app.targets import repository as target_repository
from app.window import TargetWindow, merge_windows
from app.windows import WindowError, Windows
from app.windows.memory import MemoryWindows
from app.windows.prometheus import PrometheusWindows
from app.windows.store import StoreWindows
from tests.api.conftest import make_service
from tests.diagnosis.harness import T0, OfflineTarget, profile_of
from tests.support.backfill import Backfill
from tests.support.prometheus import running_prometheus
from tests.support.victoria_metrics import running_victoria_metrics

REGIMES = ["queueing", "prefill_compute", "prefill_interference", "bandwidth_bound", "kv_cache_pressure",
           "weights_offloaded"]
# the regimes whose signals only vLLM's page carries among the emulated formats
SERVING_REGIMES = ["kv_transfer", "speculation_ineffective", "dp_imbalance", "frontend_bound"]
# SGLang's scheduler time; its speculation gauges, 0 with speculation off, must not read as speculation
CASES = [(s, "vllm") for s in ["healthy", "healthy_bursty", *REGIMES, *SERVING_REGIMES]] + \
    [("healthy", "tgi"), ("queueing", "tgi"), ("scheduler_cpu_bound", "sglang")]
RUN_S, WINDOW_S, SCRAPE_S = 180.0, 120.0, 5.0
# Two services of two replicas each: one queueing next to an idle one, and two without a queue.
SERVICES = {"queueing-vllm": "imbalanced", "healthy-vllm": "imbalanced",
            "healthy_bursty-vllm": "balanced", "prefill_compute-vllm": "balanced"}
# One P/D deployment as llm-d labels it (``llm-d.ai/role``, relabelled): the kv_transfer scenario is
# its decode worker, two prefill-heavy replicas its prefill pool; queueing-vllm shares the deployment
# label but says nothing of its role (and vLLM's metrics do not say it prefills): never paired.
PD_LABELS = {"kv_transfer-vllm": {"deployment": "rag", "llm_d_ai_role": "decode"},
             "prefill_compute-vllm": {"deployment": "rag", "llm_d_ai_role": "prefill"},
             "healthy-vllm": {"deployment": "rag", "llm_d_ai_role": "prefill"},
             "queueing-vllm": {"deployment": "rag"}}


@dataclass
class Case:
    scenario: str
    engine: str
    target: OfflineTarget
    end: float
    records: list[ScrapeRecord] = field(default_factory=list)  # every scrape, as the store was given them

    @property
    def pod(self) -> str:
        return f"{self.scenario}-{self.engine}"


def _run(target: OfflineTarget, backfill: Backfill, pod: str, records: list[ScrapeRecord]) -> float:
    """OfflineTarget.run, keeping each page for the backfill and each scrape in ``records`` as well."""
    end = target.sim.clock + RUN_S
    while target.sim.clock + 1e-9 < end:
        target.sim.run_for(min(SCRAPE_S, end - target.sim.clock))
        text = target.sim.render_metrics()
        page, canonical, error = target.processor.process(text)
        assert error is None
        ts = round(T0 + target.sim.clock, 3)
        record = ScrapeRecord(target.target_id, ts, True, 0.001, 0, page.samples_seen, page.samples_kept,
                              page.malformed, target.processor.engine, None, None, canonical)
        target.writer.write([record])
        records.append(record)
        labels = {"namespace": "llm", "pod": pod, "service": SERVICES.get(pod, pod), **PD_LABELS.get(pod, {})}
        backfill.add(labels, ts, text if isinstance(text, str) else text.decode())
    return round(T0 + target.sim.clock, 3)


@dataclass
class Recording:
    cases: dict[str, Case]
    backfill: Backfill
    tmp: Path


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    """Every case run once on the emulator's clock: pages in each case's store and in one backfill."""
    tmp = tmp_path_factory.mktemp("matrix")
    backfill = Backfill()
    cases: dict[str, Case] = {}
    try:
        for scenario, engine in CASES:
            target = OfflineTarget(tmp, scenario, engine=engine, seed=1, hardware=profile_of(scenario),
                                   name=f"{scenario}-{engine}")
            case = Case(scenario, engine, target, 0.0)
            cases[case.pod] = case
            case.end = _run(target, backfill, case.pod, case.records)
        yield Recording(cases, backfill, tmp)
    finally:
        for case in cases.values():
            case.target.close()


@pytest.fixture(scope="module")
def matrix(recording: Recording) -> Iterator[tuple[dict[str, Case], PrometheusClient]]:
    """A real Prometheus 2.42 on a TSDB backfilled with the recording (promtool)."""
    recording.backfill.write_tsdb(recording.tmp, recording.tmp / "prom" / "prometheus-data")
    with running_prometheus(recording.tmp / "prom", "scrape_configs: []") as prom:
        client = PrometheusClient(prom.url, timeout=60)
        try:
            yield recording.cases, client
        finally:
            client.close()


@pytest.fixture(scope="module")
def vm_matrix(recording: Recording) -> Iterator[tuple[dict[str, Case], PrometheusClient, float]]:
    """A real VictoriaMetrics single node holding the recording, imported with its timestamps moved
    ``shift`` whole seconds into the present (it refuses samples outside its retention)."""
    shift = float(math.floor(time.time() - 3600 - T0))
    with running_victoria_metrics(recording.tmp / "vm", "scrape_configs: []") as vm:
        imported = recording.backfill.import_victoria_metrics(vm.url, shift)
        assert imported == len(recording.backfill.lines) > 10_000
        client = PrometheusClient(vm.url, timeout=60)
        try:
            # every imported series answers (force_flush made them searchable)
            (count,) = client.query('count(up{namespace="llm"})', max(c.end for c in recording.cases.values())
                                    + shift).data
            assert count.value == len(CASES)
            yield recording.cases, client, shift
        finally:
            client.close()


def _scratch_store(path: Path) -> tuple[Any, Any]:
    """A migrated SQLite database of its own: (engine, sessionmaker), for a source's target rows."""
    url = f"sqlite:///{path}"
    db.upgrade(url)
    engine = db.make_engine(url)
    return engine, db.make_sessionmaker(engine)


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Numbers agree to ``rel``; the structured parts of a summary (each quantile's bucket
    ``intervals``/``bounds``, flags, the derivation text) agree field by field, element by element."""
    if a is None or b is None:
        return a is b
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(_close(a[k], b[k], rel) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_close(x, y, rel) for x, y in zip(a, b)))
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


@pytest.mark.parametrize(("scenario", "engine"), CASES)
def test_same_verdict_and_numbers_in_both_modes(matrix: tuple[dict[str, Case], PrometheusClient],
                                                scenario: str, engine: str) -> None:
    cases, client = matrix
    case = cases[f"{scenario}-{engine}"]
    end = case.end
    thresholds = Thresholds()
    with case.target.sessions() as session:
        (store_diagnosis,) = diagnosis_engine.evaluate_target(
            session, case.target.target_id, case.pod, engine, end, WINDOW_S, thresholds, case.target.hardware)
        reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
        windows = reader.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
        (prom_diagnosis,) = diagnosis_engine.evaluate_target(
            session, case.target.target_id, case.pod, engine, end, WINDOW_S, thresholds, case.target.hardware,
            data=windows[("llm", case.pod)])
    expected = "healthy" if scenario.startswith("healthy") else scenario
    assert store_diagnosis.verdict == expected
    assert prom_diagnosis.verdict == store_diagnosis.verdict, [(f.regime, f.summary) for f in prom_diagnosis.findings]
    assert [f.regime for f in prom_diagnosis.findings] == [f.regime for f in store_diagnosis.findings]
    store_signals, prom_signals = store_diagnosis.signals, prom_diagnosis.signals
    # Every histogram-derived number agrees to 1e-9: same samples, same increase(), same quantile.
    for name in ("ttft", "itl", "queue_time", "prefill_time", "e2e", "prompt_tokens", "generation_tokens"):
        assert (name in store_signals) == (name in prom_signals), name
        if name in store_signals:
            assert prom_signals[name].keys() == store_signals[name].keys(), name
            for key, value in store_signals[name].items():
                assert _close(prom_signals[name][key], value), (name, key, prom_signals[name][key], value)
    for name in ("queue_share", "prefill_share", "itl_ratio", "decode_stall_share", "max_step_tokens",
                 "large_step_fraction", "running_mean", "running_max", "waiting_mean", "waiting_max",
                 "kv_usage_mean", "kv_usage_max", "preemptions_per_second", "requests_per_second",
                 "generation_tokens_per_second", "scrapes", "kv_transfer_share", "kv_transfers_per_second",
                 "kv_transfer_failures_per_second", "kv_transfer_failure_share", "spec_accept_rate",
                 "spec_accept_length", "spec_draft_length", "render_share", "scheduler_cpu_share",
                 "scheduler_busy_share", "gpu_idle_share"):
        assert _close(prom_signals.get(name), store_signals.get(name)), (name, prom_signals.get(name),
                                                                         store_signals.get(name))
    assert prom_signals.get("config") == store_signals.get("config")
    assert prom_signals.get("pd_role") == store_signals.get("pd_role")
    # each data-parallel rank's load, from the per-rank query and from the store's per-rank series
    prom_ranks, store_ranks = prom_signals.get("ranks", []), store_signals.get("ranks", [])
    assert [r["target"] for r in prom_ranks] == [r["target"] for r in store_ranks]
    for p, q in zip(prom_ranks, store_ranks):
        assert _close(p["running_mean"], q["running_mean"]) and _close(p["waiting_mean"], q["waiting_mean"]), (p, q)
        assert _close(p.get("queue_mean"), q.get("queue_mean")), (p, q)  # each rank's own queue histogram
    if scenario == "scheduler_cpu_bound":  # the scheduler's time read by rate() as the store reads it
        assert 0.35 < prom_signals["gpu_idle_share"] < 0.5 and "spec_accept_rate" not in prom_signals
    if scenario == "dp_imbalance":
        assert [r["target"] for r in prom_signals["ranks"]] == ["0", "1"]
        busy, idle = prom_signals["ranks"]
        # rank 0 takes all the traffic and queues; no request reached rank 1, so it has no queue mean
        assert busy["queue_mean"] > 1.0 and idle.get("queue_mean") is None


def test_latency_equals_prometheus_histogram_quantile(matrix: tuple[dict[str, Case], PrometheusClient]) -> None:
    """/latency of a source target is Prometheus' own histogram_quantile over the same range."""
    cases, client = matrix
    case = cases["queueing-vllm"]
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    window = reader.windows(case.end - WINDOW_S, case.end, HISTOGRAM_SIGNALS, only=("llm", case.pod))
    report = latency.report_from_window(window[("llm", case.pod)])
    checked = 0
    for signal, metric in (("ttft", "vllm:time_to_first_token_seconds"), ("itl", "vllm:inter_token_latency_seconds"),
                           ("e2e", "vllm:e2e_request_latency_seconds"),
                           ("queue_time", "vllm:request_queue_time_seconds")):
        for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            promql = (f'histogram_quantile({q}, sum by (le) (increase({metric}_bucket{{pod="{case.pod}"}}'
                      f'[{int(WINDOW_S)}s])))')
            (sample,) = client.query(promql, case.end).data
            assert math.isclose(report[signal][key], sample.value, rel_tol=1e-9), (signal, key)
            # the bucket that holds it, from the bounds the source read: Prometheus' value lies inside
            lower, upper = report[signal]["intervals"][key]
            assert lower <= sample.value <= (math.inf if upper is None else upper), (signal, key)
            checked += 1
    assert checked == 12
    with case.target.sessions() as session:
        store_report = reads.latency_report(session, [case.target.target_id], WINDOW_S, case.end)
    assert math.isclose(store_report["ttft"]["p99"], report["ttft"]["p99"], rel_tol=1e-9)
    assert store_report["ttft"]["intervals"] == report["ttft"]["intervals"]  # both sources carry the same bucket
    assert math.isclose(store_report["rates"]["requests_per_second"], report["rates"]["requests_per_second"],
                        rel_tol=1e-9)


def test_services_are_diagnosed_whole_and_replica_imbalance_is_found(
        matrix: tuple[dict[str, Case], PrometheusClient], tmp_path: Path) -> None:
    """The production round: replicas grouped by ``service_labels``, each service diagnosed with its
    replicas summed by ``le``; one replica queueing while the other idles is ``replica_imbalance``."""
    cases, client = matrix
    end = cases["queueing-vllm"].end
    engine, sessions = _scratch_store(tmp_path / 'services.db')
    service = SourceService()
    service.configure([PrometheusSourceConfig(name="m", url=client.url, selector='{namespace="llm"}',
                                              target_labels=["namespace", "pod"], service_labels=["service"])])
    try:
        (round_,) = service.round(sessions, end, WINDOW_S, DIAGNOSIS_HISTOGRAMS)
        assert round_.ok
        by_name = {t.name: t for t in round_.targets}
        assert {"m.svc.imbalanced", "m.svc.balanced", "m.llm.queueing-vllm"} <= set(by_name)
        (status,) = service.statuses()
        assert status.targets == len(CASES) and status.services == len(CASES) - 2
        # the round's means came from the raw samples kept (one series per replica and metric name)
        assert status.held_series > 30 * len(CASES) and status.held_note == "" and status.held_refreshed_at
        imbalanced = by_name["m.svc.imbalanced"].window
        assert imbalanced is not None and set(imbalanced.replicas) == {"m.llm.queueing-vllm", "m.llm.healthy-vllm"}
        # The service's histograms are its replicas' summed by le: the request counts add up.
        parts = [by_name[f"m.llm.{p}"].window for p in ("queueing-vllm", "healthy-vllm")]
        assert math.isclose(imbalanced.overall.histograms["ttft"].count,
                            sum(w.overall.histograms["ttft"].count for w in parts if w is not None), rel_tol=1e-12)
        with sessions() as session:
            verdicts = {}
            for name in ("m.svc.imbalanced", "m.svc.balanced"):
                (d,) = diagnosis_engine.evaluate_target(session, by_name[name].id, name, "vllm", end, WINDOW_S,
                                                        Thresholds(), data=by_name[name].window)
                verdicts[name] = d
        # the configuration both replicas report is the service's (a label they differ in is not), so
        # the rules that need it judge the service as they judge its replicas
        for name in ("m.svc.imbalanced", "m.svc.balanced"):
            window = by_name[name].window
            assert window is not None
            first, second = (next(i for i in w.infos if i.name == "cache_config") for w in window.replicas.values())
            (shared,) = [i for i in window.infos if i.name == "cache_config"]
            assert shared.labels == {k: v for k, v in first.labels.items() if second.labels.get(k) == v}
            assert {"block_size", "enable_prefix_caching"} <= set(shared.labels)
            assert "weights_offloaded" not in {n["regime"] for n in verdicts[name].not_judged}
        imbalance = verdicts["m.svc.imbalanced"]
        assert imbalance.verdict == "replica_imbalance", [(f.regime, f.summary) for f in imbalance.findings]
        finding = imbalance.findings[0]
        assert finding.primary and all(e.met for e in finding.evidence if e.op != "info")
        replicas = [e for e in finding.evidence if e.name.startswith("replica ")]
        assert [e.name for e in replicas] == ["replica m.llm.queueing-vllm", "replica m.llm.healthy-vllm"]
        queued = next(f for f in imbalance.findings if f.regime == "queueing") if any(
            f.regime == "queueing" for f in imbalance.findings) else None
        assert queued is None or queued.caused_by == "replica_imbalance"
        assert "replica_imbalance" not in [f.regime for f in verdicts["m.svc.balanced"].findings]
    finally:
        service.close()
        engine.dispose()


@pytest.mark.parametrize("pod", ["queueing-vllm", "healthy-tgi"])
def test_both_backends_answer_the_window_interface_alike(matrix: tuple[dict[str, Case], PrometheusClient],
                                                         tmp_path: Path, pod: str) -> None:
    """The contract of app.windows.base.WindowReader, on the same recorded engine history: the
    built-in store, a Prometheus source and the in-memory backend give the same window, windows,
    histograms, fleet summaries and quantile series (to 1e-9); a source that cannot answer raises
    WindowError (unavailable: 502, not configured: 503) and reports its targets as failed in a
    batch read."""
    cases, client = matrix
    case = cases[pod]
    end = case.end
    start = end - WINDOW_S
    engine, sessions = _scratch_store(tmp_path / 'contract.db')
    sources = SourceService()
    sources.configure([PrometheusSourceConfig(name="m", url=client.url, selector='{namespace="llm"}',
                                              target_labels=["namespace", "pod"])])
    memory = MemoryWindows()
    with case.target.sessions() as session:
        held = target_repository.get_target(session, case.pod)
        assert held is not None
        memory.add(held.id, held.name, case.records)
    backends = {"store": (StoreWindows(), case.target.sessions), "prometheus": (PrometheusWindows(sources), sessions),
                "memory": (memory, case.target.sessions)}
    try:
        sources.round(sessions, end, WINDOW_S, DIAGNOSIS_HISTOGRAMS)
        answers: dict[str, dict[str, Any]] = {}
        for name, (backend, its_sessions) in backends.items():
            with its_sessions() as session:
                held_name = f"m.llm.{case.pod}" if name == "prometheus" else case.pod
                target = target_repository.get_target(session, held_name)
                assert target is not None
                window = backend.window(session, target, start, end, HISTOGRAM_SIGNALS)
                batch = backend.windows(session, [target], start, end, HISTOGRAM_SIGNALS)
                assert batch.failed == set() and latency.report_from_window(batch.found[target.id]) == \
                    latency.report_from_window(window)
                histograms = backend.histograms(session, [target], start, end, ["ttft", "itl", "queue_time"])
                assert histograms.failed == set()
                for signal, histogram in histograms.found[target.id].items():
                    assert histogram == window.overall.histograms.get(signal), (name, signal)
                answers[name] = {
                    "report": latency.report_from_window(window),
                    "histograms": {s: dataclasses.asdict(h) if h else None
                                   for s, h in sorted(histograms.found[target.id].items())},
                    "fleet": latency.summaries_dict(backend.fleet_summaries(session, [target], start, end)[target.id]),
                    "series": backend.quantile_series(session, target, "ttft", 0.99, WINDOW_S, 30.0, 60.0, end, None),
                }
                # the status page's charts: each line's windows at evenly spaced ends, in one read per line
                history = backend.history(session, target, ("ttft", "itl", "queue_time", "prefill_time"),
                                          end - WINDOW_S, end)
                ends = [end - 90.0 + 15.0 * k for k in range(7)]
                answers[name]["history"] = {
                    "signals": sorted(history.signals),
                    "windows": {s: [dataclasses.asdict(h) if h else None for h in history.windows(s, ends, 30.0)]
                                for s in sorted(history.signals)},
                    "merged": {s: dataclasses.asdict(h) if (h := history.merged(end - 45.0, end, s)) else None
                               for s in sorted(history.signals)}}
                answers[name]["first"] = history.first_sample(("ttft", "queue_time"))
        store, prometheus, in_memory = answers["store"], answers["prometheus"], answers["memory"]
        for part in ("report", "histograms", "fleet", "series", "history"):
            assert _close(prometheus[part], store[part]), (part, prometheus[part], store[part])
            assert _close(in_memory[part], store[part]), (part, in_memory[part], store[part])
        assert store["report"]["ttft" if "ttft" in store["report"] else "queue_time"]["count"] > 0
        windows = store["history"]["windows"]["queue_time"]
        assert len(windows) == 7 and sum(w is not None and w["count"] > 0 for w in windows) >= 5, windows
        # where the chart's span begins: the source sees the first sample on a step of span / 120
        assert in_memory["first"] == store["first"] is not None
        assert store["first"] <= prometheus["first"] <= store["first"] + max(15.0, WINDOW_S / 120)
        # the same window and targets again (the status page refreshed within a round): no query
        with sessions() as session:
            target = target_repository.get_target(session, f"m.llm.{case.pod}")
            assert target is not None
            queries = sources.sources["m"].client.queries
            again = backends["prometheus"][0].fleet_summaries(session, [target], start, end)
            assert sources.sources["m"].client.queries == queries
            assert latency.summaries_dict(again[target.id]) == prometheus["fleet"]

        # a source that cannot answer: WindowError with the classified kind, failed in a batch
        down = SourceService()
        down.configure([PrometheusSourceConfig(name="m", url="http://127.0.0.1:1", target_labels=["namespace", "pod"],
                                               query_timeout=2)])
        unreachable = PrometheusWindows(down)
        with sessions() as session:
            target = target_repository.get_target(session, f"m.llm.{case.pod}")
            assert target is not None
            with pytest.raises(WindowError) as caught:
                unreachable.window(session, target, start, end, HISTOGRAM_SIGNALS)
            assert caught.value.status == 502 and caught.value.message.startswith("source 'm' could not answer: "
                                                                                  "unreachable")
            assert unreachable.windows(session, [target], start, end, HISTOGRAM_SIGNALS).failed == {target.id}
            assert unreachable.histograms(session, [target], start, end, ["ttft"]).failed == {target.id}
            with pytest.raises(WindowError) as caught:
                PrometheusWindows(SourceService()).window(session, target, start, end, HISTOGRAM_SIGNALS)
            assert caught.value.status == 503 and caught.value.message == "source 'm' is not configured"
        down.close()
    finally:
        sources.close()
        engine.dispose()


def test_a_source_assembles_a_pd_deployments_ttft_as_the_store_does(
        matrix: tuple[dict[str, Case], PrometheusClient], tmp_path: Path) -> None:
    """A source's ``pd_pair_labels`` pair a decode replica with the prefill replicas of its
    deployment (roles from ``pd_role_label`` here: vLLM's metrics do not say a worker prefills);
    the split is the one a scraped decode target gets, from the same numbers of the store."""
    cases, client = matrix
    end = cases["kv_transfer-vllm"].end
    start = end - WINDOW_S
    engine, sessions = _scratch_store(tmp_path / 'pd.db')
    service = SourceService()
    service.configure([PrometheusSourceConfig(
        name="m", url=client.url, selector='{namespace="llm"}', target_labels=["namespace", "pod"],
        service_labels=["deployment", "llm_d_ai_role"], pd_pair_labels=["deployment"],
        pd_role_label="llm_d_ai_role")])
    windows = Windows(StoreWindows(), PrometheusWindows(service))
    try:
        (round_,) = service.round(sessions, end, WINDOW_S, DIAGNOSIS_HISTOGRAMS)
        by_name = {t.name: t for t in round_.targets}
        decode_window = by_name["m.llm.kv_transfer-vllm"].window
        assert decode_window is not None
        with sessions() as session:
            (d,) = diagnosis_engine.evaluate_target(session, by_name["m.llm.kv_transfer-vllm"].id,
                                                    "m.llm.kv_transfer-vllm", "vllm", end, WINDOW_S, Thresholds(),
                                                    data=decode_window)
            assert d.verdict == "kv_transfer"
            assert (d.signals["pd_role"], d.signals["pd_role_source"]) == (
                "decode", "target label llm_d_ai_role=decode (the engine's metrics do not say)")
            rows = {t.name: t for t in target_repository.list_targets(session)}
            decode = rows["m.llm.kv_transfer-vllm"]
            window = service.window(decode, start, end)
            report = latency.report_from_window(window)
            add_disaggregation(session, windows, decode, report, window.infos, start, end)
            # a prefill replica gets its role and no split; one whose role nothing states gets neither
            prefill_report = latency.report_from_window(service.window(rows["m.llm.healthy-vllm"], start, end))
            add_disaggregation(session, windows, rows["m.llm.healthy-vllm"], prefill_report,
                               service.window(rows["m.llm.healthy-vllm"], start, end).infos, start, end)
            unknown = latency.report_from_window(service.window(rows["m.llm.queueing-vllm"], start, end))
            add_disaggregation(session, windows, rows["m.llm.queueing-vllm"], unknown,
                               service.window(rows["m.llm.queueing-vllm"], start, end).infos, start, end)
        assert report["pd_role"]["role"] == "decode"
        assert prefill_report["pd_role"]["role"] == "prefill" and "disaggregation" not in prefill_report
        assert "pd_role" not in unknown and "disaggregation" not in unknown
        split = report["disaggregation"]
        assert split["prefill_targets"] == ["m.llm.healthy-vllm", "m.llm.prefill_compute-vllm"]
        # the store's answer: the decode worker's own report, its prefill pool's two replicas summed by le
        stored = {}
        for pod in ("kv_transfer-vllm", "healthy-vllm", "prefill_compute-vllm"):
            case = cases[pod]
            with case.target.sessions() as session:
                stored[pod] = reads.store_window(session, [case.target.target_id], start, end)
        pool = merge_windows({p: stored[p] for p in ("healthy-vllm", "prefill_compute-vllm")}, start, end)
        expected = latency.pd_split(latency.report_from_window(stored["kv_transfer-vllm"]),
                                    latency.report_from_window(pool, per_model=False), split["prefill_targets"])
        parts = ("prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_step", "ttft_mean")
        assert all(expected[k] is not None for k in parts)
        for key in parts:
            assert _close(split[key], expected[key]), (key, split[key], expected[key])
        # the pool's prefill mean is the two replicas' prefill time over their requests, not a mean of means
        h = [stored[p].overall.histograms["prefill_time"] for p in ("healthy-vllm", "prefill_compute-vllm")]
        assert _close(split["prefill"], sum(x.sum for x in h if x) / sum(x.count for x in h if x))
        assert split["kv_transfer"] > 0.3  # the scenario's slow transfers (~0.45 s)
    finally:
        service.close()
        engine.dispose()


def test_a_source_decode_replica_shows_its_split_in_the_api_and_on_the_status_page(
        matrix: tuple[dict[str, Case], PrometheusClient], migrated_url: str, tmp_path: Path) -> None:
    """The running service: a source with ``pd_pair_labels`` answers a decode replica's latency
    with its role and split, and its status page shows the same table, as for a scraped target."""
    cases, client = matrix
    end = cases["kv_transfer-vllm"].end
    config = tmp_path / "targets.yaml"
    config.write_text(f"""
targets: []
diagnosis: {{interval: 1h, window: {int(WINDOW_S)}s}}
sources:
  - name: m
    url: {client.url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    service_labels: [deployment, llm_d_ai_role]
    pd_pair_labels: [deployment]
    pd_role_label: llm_d_ai_role
""")
    for svc in make_service(migrated_url, tmp_path, config_file=config):
        svc.monitor.evaluate_diagnoses(now=end)
        params = {"start": end - WINDOW_S, "end": end}
        body = svc.client.get("/api/v1/targets/m.llm.kv_transfer-vllm/latency", params=params).json()
        assert body["pd_role"] == {"role": "decode",
                                   "source": "target label llm_d_ai_role=decode (the engine's metrics do not say)"}
        split = body["disaggregation"]
        assert split["prefill_targets"] == ["m.llm.healthy-vllm", "m.llm.prefill_compute-vllm"]
        assert split["kv_transfer"] == pytest.approx(body["kv_transfer_time"]["mean"], rel=1e-12)
        assert split["decode_queue"] == pytest.approx(body["queue_time"]["mean"], rel=1e-12)
        parts = [split[k] for k in ("prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_step")]
        assert split["ttft_mean"] == pytest.approx(sum(parts), rel=1e-12)
        prefill = svc.client.get("/api/v1/targets/m.llm.healthy-vllm/latency", params=params).json()
        assert prefill["pd_role"]["role"] == "prefill" and "disaggregation" not in prefill
        page = svc.client.get("/targets/m.llm.kv_transfer-vllm", params={"window": f"{int(WINDOW_S)}s",
                                                                          "end": end}).text
        assert 'data-role="decode"' in page and "target label llm_d_ai_role=decode" in page
        assert 'href="/targets/m.llm.healthy-vllm"' in page and 'href="/targets/m.llm.prefill_compute-vllm"' in page
        row = page[page.index('data-part="ttft_mean"'):]
        assert float(row.split('data-value="')[1].split('"')[0]) == pytest.approx(split["ttft_mean"], rel=1e-9)


@pytest.mark.parametrize(("scenario", "engine"), CASES)
def test_same_verdict_from_victoria_metrics(vm_matrix: tuple[dict[str, Case], PrometheusClient, float],
                                            scenario: str, engine: str) -> None:
    """VictoriaMetrics gives every regime (and healthy) the verdict and findings the store gives.

    Its numbers differ from Prometheus' by design, so only those that must agree are compared:
    its range ``[w]`` is left-open, ``(end - w, end]``, where Prometheus 2.42's is closed, so its
    gauges and scrape count are the store's over ``(start, end]``; and a histogram's count is the
    same, since samples lie on both window edges (no extrapolation either way, VM never does).
    """
    cases, client, shift = vm_matrix
    case = cases[f"{scenario}-{engine}"]
    end, start = case.end, case.end - WINDOW_S
    thresholds = Thresholds()
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    windows = reader.windows(start + shift, end + shift, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    # back on the recording's clock, so the store's other evidence (consistency) lines up
    vm_window = dataclasses.replace(windows[("llm", case.pod)], start=start, end=end)
    with case.target.sessions() as session:
        (store_diagnosis,) = diagnosis_engine.evaluate_target(
            session, case.target.target_id, case.pod, engine, end, WINDOW_S, thresholds, case.target.hardware)
        (vm_diagnosis,) = diagnosis_engine.evaluate_target(
            session, case.target.target_id, case.pod, engine, end, WINDOW_S, thresholds, case.target.hardware,
            data=vm_window)
        left_open = reads.store_window(session, [case.target.target_id], start + 0.001, end, DIAGNOSIS_HISTOGRAMS,
                                         diagnosis=True)
    expected = "healthy" if scenario.startswith("healthy") else scenario
    assert store_diagnosis.verdict == expected
    assert vm_diagnosis.verdict == store_diagnosis.verdict, [(f.regime, f.summary) for f in vm_diagnosis.findings]
    assert [f.regime for f in vm_diagnosis.findings] == [f.regime for f in store_diagnosis.findings]
    assert [f.severity for f in vm_diagnosis.findings] == [f.severity for f in store_diagnosis.findings]

    assert vm_window.scrapes == left_open.scrapes == store_diagnosis.signals["scrapes"] - 1 == 24
    compared = 0
    assert vm_window.models.keys() == left_open.models.keys()
    for model, vm_model in vm_window.models.items():
        store_gauges = left_open.models[model].gauges
        assert vm_model.gauges.keys() == store_gauges.keys(), model
        for signal, stats in vm_model.gauges.items():
            for stat in ("last", "mean", "max"):
                assert _close(getattr(stats, stat), getattr(store_gauges[signal], stat)), (model, signal, stat)
                compared += 1
    assert compared >= 9  # running, waiting and KV usage at least, three numbers each
    store_signals, vm_signals = store_diagnosis.signals, vm_diagnosis.signals
    for name in ("ttft", "itl", "queue_time", "prefill_time", "e2e", "prompt_tokens", "generation_tokens"):
        assert (name in store_signals) == (name in vm_signals), name
        if name in store_signals:
            assert store_signals[name]["count"] > 0
            assert _close(vm_signals[name]["count"], store_signals[name]["count"]), name


def _means_first_agrees(client: PrometheusClient, cases: dict[str, Case], case: Case, shift: float = 0.0,
                        mirror_lag: float | None = None, hold: tuple[str, ...] = HOLDABLE) -> int:
    """The round's means-first read of every case (app/diagnosis/tails.py says whose buckets)
    against one full read: the same verdict, findings (evidence included) and not-judged list
    for ``case``, and each number of its signals the same; the histograms read means first keep
    their mean and count and lose only their quantiles. ``mirror_lag``: the round reads from a
    mirror of the raw samples (``hold``: the buckets it keeps too). Returns how many histograms of
    ``case`` were read means first."""
    end, start = case.end, case.end - WINDOW_S
    thresholds = Thresholds()
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    rounds = reader if mirror_lag is None else \
        SourceReader(client, ["namespace", "pod"], '{namespace="llm"}', mirror_lag=mirror_lag, hold_buckets=hold)
    engines = {c.pod: c.engine for c in cases.values()}
    full = reader.windows(start + shift, end + shift, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    if rounds is not reader:  # a running service knows the bucket layouts (the stall probe's) from earlier reads
        rounds.windows(start + shift, end + shift, DIAGNOSIS_HISTOGRAMS)
    lean = rounds.round_windows(start + shift, end + shift, DIAGNOSIS_HISTOGRAMS,
                                lambda key, w: buckets_needed(w, key[1], engines[key[1]], thresholds))
    assert mirror_lag is None or (rounds.mirror is not None and rounds.mirror.refreshes == 1)
    key = ("llm", case.pod)
    assert full.keys() == lean.keys()
    diagnoses = []
    for read in (full, lean):
        window = dataclasses.replace(read[key], start=start, end=end)
        with case.target.sessions() as session:
            (diagnosis,) = diagnosis_engine.evaluate_target(
                session, case.target.target_id, case.pod, case.engine, end, WINDOW_S, thresholds,
                case.target.hardware, data=window)
        diagnoses.append(diagnosis)
    whole, means_first = diagnoses
    assert means_first.verdict == whole.verdict
    assert [f.to_dict() for f in means_first.findings] == [f.to_dict() for f in whole.findings]
    assert means_first.not_judged == whole.not_judged and means_first.notes == whole.notes
    thin = {s for m in lean[key].models.values() for s, h in m.histograms.items() if h.means_only}
    for name, value in whole.signals.items():
        if name in thin or name in ("kv_transfer", "render") and f"{name}_time" in thin:
            assert value.keys() >= means_first.signals[name].keys() >= {"mean", "count"}
            assert _close(means_first.signals[name]["mean"], value["mean"]) and \
                _close(means_first.signals[name]["count"], value["count"]), name
        elif name not in ("step_budget", "max_step_tokens", "large_step_fraction", "decode_stall_share",
                          "itl_ratio", "itl_ratio_bounds", "pd_split") or "itl" not in thin:
            assert _close(means_first.signals.get(name), value), (name, means_first.signals.get(name), value)
    return len(thin)


@pytest.mark.parametrize(("mirror_lag", "hold"), [(None, ()), (0.0, ("ttft", "itl")), (0.0, ())],
                         ids=["queried", "mirror", "mirror-without-buckets"])
def test_a_round_reads_means_first_and_concludes_what_a_full_read_does(
        matrix: tuple[dict[str, Case], PrometheusClient], mirror_lag: float | None, hold: tuple[str, ...]) -> None:
    """Every case of the matrix, from Prometheus 2.42: the round's read (``_sum``/``_count`` of
    every histogram, buckets only where a distribution can matter) diagnoses as the full read,
    queried or from the raw samples kept (the means series, and the TTFT and ITL buckets unless
    ``hold_buckets`` is empty)."""
    cases, client = matrix
    thin = {pod: _means_first_agrees(client, cases, case, mirror_lag=mirror_lag, hold=hold)
            for pod, case in cases.items()}
    # healthy: every histogram means first (11 on vLLM's page); prefill_compute and queueing all but
    # TTFT, whose p99 their findings show; prefill_interference, bandwidth_bound and the regimes whose
    # ITL has stalls or a slow p99 also the ITL, prompt, step and prefill buckets
    assert thin == {"bandwidth_bound-vllm": 7, "dp_imbalance-vllm": 10, "frontend_bound-vllm": 10, "healthy-tgi": 4,
                    "healthy-vllm": 11, "healthy_bursty-vllm": 11, "kv_cache_pressure-vllm": 6,
                    "kv_transfer-vllm": 11, "prefill_compute-vllm": 10, "prefill_interference-vllm": 7,
                    "queueing-tgi": 4, "queueing-vllm": 10, "scheduler_cpu_bound-sglang": 7,
                    "speculation_ineffective-vllm": 11, "weights_offloaded-vllm": 7}, thin


def test_a_round_reads_means_first_from_victoria_metrics(
        vm_matrix: tuple[dict[str, Case], PrometheusClient, float]) -> None:
    """The same from VictoriaMetrics (its own numbers, the same conclusions both ways)."""
    cases, client, shift = vm_matrix
    thin = {pod: _means_first_agrees(client, cases, case, shift) for pod, case in cases.items()}
    assert thin["healthy-vllm"] == 11 and thin["prefill_compute-vllm"] == 10


def _tail_filter_is_exact(client: PrometheusClient, start: float, end: float) -> tuple[int, int, int]:
    """An SLO read narrowed to the targets whose quantile may be above the threshold (the buckets
    around the threshold first) leaves out only targets whose full read has that quantile at or
    below it, and gives the others the full read's quantile, its bucket, count and sum exactly -
    from the few buckets where they tell it, else from all; for thresholds on every bucket bound
    and between two. Returns (targets left out, told by the few buckets, read in full)."""
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    full = reader.histograms(["ttft", "itl"], start, end)  # also tells the reader the bucket layout
    left_out = few = whole = 0
    for signal, by_target in full.items():
        bounds = sorted({b for per_model in by_target.values() for h in per_model.values() for b in h.bounds
                         if b != math.inf})
        for threshold in [*bounds, *((a + b) / 2 for a, b in zip(bounds, bounds[1:]))]:
            for q in (0.5, 0.99):
                narrowed = reader.histograms([signal], start, end, {signal: [(q, threshold)]})[signal]
                assert narrowed.keys() <= by_target.keys()
                for key, per_model in by_target.items():
                    merged = quantiles.merge(per_model[m] for m in sorted(per_model))
                    assert merged is not None
                    value = quantiles.bucket_quantile(q, merged.bounds, merged.increases)
                    if key not in narrowed:
                        left_out += 1
                        assert not value[0] > threshold, (signal, q, threshold, key, value)
                        continue
                    got = quantiles.merge(narrowed[key][m] for m in sorted(narrowed[key]))
                    assert got is not None and value[0] > threshold
                    assert quantiles.bucket_quantile(q, got.bounds, got.increases) == value, (signal, q, threshold)
                    assert _close((got.count, got.sum), (merged.count, merged.sum))
                    few, whole = (few + 1, whole) if got.bounds != merged.bounds else (few, whole + 1)
        # two objectives of one signal at once (thresholds a bound apart): each quantile above its
        # threshold is the full read's, one at or below it stays at or below it
        for low, high in zip(bounds, bounds[2:]):
            limits = [(0.5, low), (0.99, high)]
            narrowed = reader.histograms([signal], start, end, {signal: limits})[signal]
            for key, per_model in by_target.items():
                merged = quantiles.merge(per_model[m] for m in sorted(per_model))
                assert merged is not None
                values = [quantiles.bucket_quantile(q, merged.bounds, merged.increases) for q, _ in limits]
                breached = [value[0] > threshold for value, (_, threshold) in zip(values, limits, strict=True)]
                assert (key in narrowed) == any(breached), (signal, limits, key, values)
                if key in narrowed:
                    got = quantiles.merge(narrowed[key][m] for m in sorted(narrowed[key]))
                    assert got is not None
                    for value, over, (q, threshold) in zip(values, breached, limits, strict=True):
                        mine = quantiles.bucket_quantile(q, got.bounds, got.increases)
                        assert mine == value if over else not mine[0] > threshold, (signal, q, threshold, key)
    return left_out, few, whole


def test_an_slo_read_skips_the_buckets_of_targets_within_the_objective_exactly(
        matrix: tuple[dict[str, Case], PrometheusClient]) -> None:
    cases, client = matrix
    end = max(case.end for case in cases.values())
    left_out, few, whole = _tail_filter_is_exact(client, end - WINDOW_S, end)
    # told by a few buckets: the ones around the threshold (208), or those from L up where the
    # quantile lies above U (880); in full where no bucket lies below L (thresholds at the lowest
    # bounds) or the target's layout differs
    assert (left_out, few, whole) == (3936, 1088, 948), (left_out, few, whole)


def test_the_production_round_reads_means_first_and_judges_services_as_a_full_read(
        matrix: tuple[dict[str, Case], PrometheusClient], tmp_path: Path) -> None:
    """The round as the service runs it, replicas grouped into services: read means first (buckets
    where a replica or a service needs them) it gives every replica and every service the verdict,
    findings and not-judged list a full read gives, with fewer bytes (read by queries: the
    mirror of raw samples is tests/promsource/test_mirror.py's)."""
    cases, client = matrix
    end = cases["queueing-vllm"].end
    thresholds = Thresholds()
    rounds, read = {}, {}
    for name, needs in (("full", None), ("means first", lambda target, engine, window: buckets_needed(
            window, target, engine, thresholds))):
        engine, sessions = _scratch_store(tmp_path / f"{name}.db")
        service = SourceService(mirror_lag=None)
        service.configure([PrometheusSourceConfig(name="m", url=client.url, selector='{namespace="llm"}',
                                                  target_labels=["namespace", "pod"], service_labels=["service"])])
        try:
            (round_,) = service.round(sessions, end, WINDOW_S, DIAGNOSIS_HISTOGRAMS, needs)
            assert round_.ok
            rounds[name] = {t.name: t for t in round_.targets}
            (status,) = service.statuses()
            assert status.held_series == 0 and status.held_note == "off: every window is queried"
            read[name] = (status.bytes_last_round, status.buckets_last_round)
        finally:
            service.close()
            engine.dispose()
    full, lean = rounds["full"], rounds["means first"]
    assert full.keys() == lean.keys() and {"m.svc.imbalanced", "m.svc.balanced"} <= full.keys()
    for target, whole in full.items():
        assert whole.window is not None and lean[target].window is not None
        pairs = zip(from_window(whole.window, target, whole.engine), from_window(lean[target].window, target,
                                                                                  whole.engine), strict=True)
        for a, b in pairs:
            expected, got = diagnosis_engine.diagnose(a, thresholds), diagnosis_engine.diagnose(b, thresholds)
            assert got.verdict == expected.verdict, target
            assert [f.to_dict() for f in got.findings] == [f.to_dict() for f in expected.findings], target
            assert got.not_judged == expected.not_judged, target
    # a first round knows no bucket layout yet, so every stall probe reads its ITL buckets: 57 % of the bytes
    assert read["full"][1] == {} and read["means first"][0] < 0.6 * read["full"][0], read


def test_one_target_is_read_in_a_few_requests_as_the_fleet_read_reads_it(
        matrix: tuple[dict[str, Case], PrometheusClient]) -> None:
    """A read of one target (a status page, the latency API, an attribution's windows) sends its
    instant queries in one request, tagged by query and split back: every case's window equals
    its window in the read of every target, from 2 requests (3 with the ITL by batch size)
    instead of one per query (all queried: no mirror)."""
    cases, client = matrix
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    end = max(case.end for case in cases.values())
    fleet_queries = client.queries
    fleet = reader.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    fleet_queries = client.queries - fleet_queries
    assert fleet_queries > 30
    for case in cases.values():
        key = ("llm", case.pod)
        before = client.queries
        (one,) = reader.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True, only=key).values()
        assert client.queries - before == 3  # the instant queries, the TGI KV samples, the ITL by batch size
        assert one == fleet[key], case.pod


def _numbers(window: TargetWindow) -> dict[tuple[str, ...], float]:
    """Every number a means-first window holds, by where it is (model, kind, signal, what)."""
    out: dict[tuple[str, ...], float] = {("scrapes",): float(window.scrapes or 0),
                                         ("restarts",): float(window.restarts or 0)}
    for model, m in window.models.items():
        for signal, h in m.histograms.items():
            out[(model, "histogram", signal, "sum")], out[(model, "histogram", signal, "count")] = h.sum, h.count
        for signal, g in m.gauges.items():
            for stat in ("last", "mean", "max"):
                out[(model, "gauge", signal, stat)] = getattr(g, stat)
        for signal, value in m.rates.items():
            out[(model, "rate", signal)] = value
        for rank, means in m.ranks.items():
            for signal, value in means.items():
                out[(model, "rank", rank, signal)] = value
        for n, interval in enumerate(m.itl_intervals):
            for what in ("itl_sum", "itl_count", "running"):
                out[(model, "itl by batch", str(n), what)] = getattr(interval, what)
    return out


def test_the_mirror_of_raw_samples_gives_the_queries_numbers(
        matrix: tuple[dict[str, Case], PrometheusClient]) -> None:
    """The means-first read computed from the raw samples held (app/promsource/mirror.py) equals
    the one Prometheus computes, for every case's replica, bit for bit: at a refresh, at an earlier
    end inside what is held, and for a subset of targets; a window longer than what is held
    is queried, and an end past the lag refreshes."""
    cases, client = matrix
    queried = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    mirrored = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}', mirror_lag=0.0)
    mirror = mirrored.mirror
    assert mirror is not None
    end = max(case.end for case in cases.values())
    some = {("llm", case.pod) for case in list(cases.values())[:3]}
    for at, keys in ((end - 30.0, None), (end - 45.0, None), (end - 30.0, some)):
        before = (client.queries, mirror.refreshes)
        lean = mirrored.windows(at - WINDOW_S, at, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=(), keys=keys)
        asked = client.queries - before[0]
        full = queried.windows(at - WINDOW_S, at, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=(), keys=keys)
        assert lean.keys() == full.keys() and len(full) == len(keys or cases)
        compared = 0
        for key, window in full.items():
            expected, got = _numbers(window), _numbers(lean[key])
            assert expected.keys() == got.keys(), key
            for where, value in expected.items():
                mine = got[where]
                assert mine == value or (math.isnan(value) and math.isnan(mine)), (key, where, mine, value)
                compared += 1
            assert lean[key].infos == window.infos
        assert compared > 30 * len(full)
        # the first read refreshes once (8 minutes of every held series, in 4 pieces for each of the
        # means series, the TTFT buckets and the ITL buckets), an earlier end none; the configuration
        # (info series) is still queried
        assert mirror.refreshes == 1 and asked == (1 + 3 * 4 if at == end - 30.0 and keys is None else 1), asked
    assert mirror.time is not None and mirror.time >= end - 30.0
    assert not mirror.covers(end - 1000.0, end - 30.0)  # longer than what is held: queried
    refreshes = mirror.refreshes
    assert mirror.covers(end - WINDOW_S, end) and mirror.refreshes == refreshes + 1  # past the lag
    # within the lag: no refresh, and the window is the one that ends at the refresh (not cut short)
    mirror.lag = 20.0
    lean = mirrored.windows(end + 10.0 - WINDOW_S, end + 10.0, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=())
    full = queried.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=())
    assert mirror.refreshes == refreshes + 1 and lean.keys() == full.keys()
    for key, window in full.items():
        expected, got = _numbers(window), _numbers(lean[key])
        assert expected.keys() == got.keys() and all(
            got[k] == v or (math.isnan(v) and math.isnan(got[k])) for k, v in expected.items()), key

    # the SLO alerts' read, buckets not held: queried over the window that ends at the refresh,
    # once per refresh (the next alert round within the lag asks nothing), the queried numbers
    limits = {"ttft": [(0.99, 2.0)], "itl": [(0.99, 0.15)]}
    mirrored = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}', mirror_lag=20.0, hold_buckets=())
    mirror = mirrored.mirror
    assert mirror is not None and mirror.covers(end - WINDOW_S, end) and mirror.buckets == frozenset()
    mirrored.windows(end - WINDOW_S, end, ["ttft", "itl"])  # the bucket layouts, known to a running service
    refreshes = mirror.refreshes
    before = client.queries
    first = mirrored.histograms(["ttft", "itl"], end + 10.0 - 300.0, end + 10.0, limits)
    sent = client.queries - before
    again = mirrored.histograms(["ttft", "itl"], end + 15.0 - 300.0, end + 15.0, limits)
    assert sent >= 2 and client.queries == before + sent and again is first and mirror.refreshes == refreshes
    every = queried.histograms(["ttft", "itl"], mirror.time - 300.0, mirror.time)  # each target's, in full
    for signal, ((q, threshold),) in limits.items():
        above = set()
        for key, per_model in every[signal].items():
            merged = quantiles.merge(per_model[m] for m in sorted(per_model))
            if merged is not None and quantiles.histogram_quantile(q, merged.bounds, merged.increases) > threshold:
                above.add(key)
                got = quantiles.merge(first[signal][key][m] for m in sorted(first[signal][key]))
                assert got is not None and math.isclose(
                    quantiles.histogram_quantile(q, got.bounds, got.increases),
                    quantiles.histogram_quantile(q, merged.bounds, merged.increases), rel_tol=1e-12), (signal, key)
        assert above and above <= first[signal].keys(), signal


def _same_histogram(got: WindowHistogram | None, expected: WindowHistogram | None) -> bool:
    """Two window histograms agree: the same bounds, every increase, sum and count, bit for bit."""
    if got is None or expected is None:
        return got is expected
    return got.bounds == expected.bounds and got.means_only == expected.means_only and all(
        a == b or (math.isnan(a) and math.isnan(b))
        for a, b in zip((*got.increases, got.sum, got.count), (*expected.increases, expected.sum, expected.count),
                        strict=True))


def test_the_buckets_held_give_the_queries_histograms(matrix: tuple[dict[str, Case], PrometheusClient]) -> None:
    """The TTFT and ITL buckets the mirror holds (``hold_buckets``) give every case's histograms
    as Prometheus' ``increase`` does, bit for bit: in a window read (the other histograms' buckets
    still queried), in the SLO alerts' 5-minute read (every target's, with no query; the targets
    the buckets around the thresholds keep have the same quantiles) and in the stall probe (the
    same targets)."""
    cases, client = matrix
    queried = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    mirrored = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}', mirror_lag=0.0)
    end = max(case.end for case in cases.values()) - 30.0
    full = queried.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    lean = mirrored.windows(end - WINDOW_S, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    assert lean.keys() == full.keys() and len(full) == len(cases)
    compared = Counter[str]()
    for key, window in full.items():
        assert lean[key].models.keys() == window.models.keys(), key
        for name, m in window.models.items():
            got = lean[key].models[name].histograms
            assert got.keys() == m.histograms.keys(), (key, name)
            for signal, h in m.histograms.items():
                assert _same_histogram(got[signal], h), (key, name, signal, got[signal], h)
                compared[signal] += len(h.bounds) if h is not None else 0
    assert compared["ttft"] > 100 and compared["itl"] > 100 and compared["prefill_time"] > 100, compared

    # the SLO alerts' read: every target's TTFT and ITL from the samples held, no query
    limits = {"ttft": [(0.99, 2.0)], "itl": [(0.99, 0.15)]}
    before = client.queries
    held = mirrored.histograms(["ttft", "itl"], end - 300.0, end, limits)
    assert client.queries == before
    every = queried.histograms(["ttft", "itl"], end - 300.0, end)
    kept = queried.histograms(["ttft", "itl"], end - 300.0, end, limits)
    for signal, (q, threshold) in ((s, limit[0]) for s, limit in limits.items()):
        assert held[signal].keys() == every[signal].keys() and len(every[signal]) > 10, signal
        for key, per_model in every[signal].items():
            assert per_model.keys() == held[signal][key].keys(), (signal, key)
            assert all(_same_histogram(held[signal][key][m], h) for m, h in per_model.items()), (signal, key)
        above = set()
        for key, per_model in held[signal].items():
            merged = quantiles.merge(per_model[m] for m in sorted(per_model))
            assert merged is not None
            value = quantiles.histogram_quantile(q, merged.bounds, merged.increases)
            if value > threshold:
                above.add(key)
                mine = quantiles.merge(kept[signal][key][m] for m in sorted(kept[signal][key]))
                assert mine is not None
                assert math.isclose(quantiles.histogram_quantile(q, mine.bounds, mine.increases), value,
                                    rel_tol=1e-9), (signal, key)
        assert above == set(kept[signal]) and 0 < len(above) < len(cases), (signal, above)

    # the stall probe: the targets whose ITL may stall are the ones the buckets around the bounds tell
    probe = [(1.0, 0.5), (0.99, 0.05)]
    for keys in (None, set(list(full)[:5])):
        assert mirrored.at_most("itl", end - WINDOW_S, end, probe, keys) == \
            queried.at_most("itl", end - WINDOW_S, end, probe, keys)
