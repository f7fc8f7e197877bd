"""The built-in SLIs, the exported rules and the Prometheus-source path agree on the same data.

Two emulated engines (healthy then queueing; healthy with bursts) are scraped on the
emulator's clock into the built-in store, where the recording round and the SLO computation
run every 30 s, and the same pages with the same timestamps are backfilled into a real
Prometheus (tests/support/backfill.py). At the end:

* Prometheus evaluates the exported recording rules' expressions (app/rules_export/slos.py): each
  window's error ratio per instance is the built-in one within the edge difference (the
  service counts whole recorded rows, ``rate`` extrapolates the samples inside the window), and
  the burn-rate alerts the rules would fire are the ones the service fires;
* a Prometheus source reading the same server (app/promsource/slo.py, ``increase`` per window
  in one query for all replicas) gives the exported rules' ratios exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.emulator.simulation import Simulation
from app.promql.client import PrometheusClient
from app.promsource.config import PrometheusSourceConfig
from app.promsource.reader import FIRST_SEEN_STEP
from app.promsource.service import SourceService
from app.promsource.slo import period_reuse, source_sums
from app.rules_export.slos import ratio_name, slo_rules
from app.slo.status import slo_statuses
from app.targets import repository as target_repository
from tests.slo.harness import RETENTION, T0, SloHarness
from tests.support.backfill import Backfill
from tests.support.prometheus import running_prometheus

ENGINES = {"burning": "healthy->queueing@600", "fine": "healthy_bursty"}
SLOS = [{"name": "chat-ttft", "signal": "ttft", "threshold": "2.5s", "objective": "99%"}]
#: The service's window edge falls on a recorded row (30 s rounds of two 15 s scrapes), Prometheus'
#: on the first sample inside the window, extrapolated: at most one scrape interval of requests
#: differs, which moves a 5 m error ratio by a few hundredths at most (a 1 h one by far less).
EDGE = 0.03


@pytest.mark.prometheus
def test_builtin_exported_rules_and_source_agree(tmp_path: Path) -> None:
    h = SloHarness(tmp_path, SLOS, {name: Simulation(spec, seed=1) for name, spec in ENGINES.items()},
                   keep_pages=True)
    try:
        builtin = list(h.run(1500, scrape_every=15.0, round_every=30.0))[-1]
        end = T0 + h.clock
        first_page = min(ts for engine in h.engines for ts, _ in engine.pages)
        backfill = Backfill()
        for engine in h.engines:
            for ts, page in engine.pages:
                backfill.add({"job": "llm", "instance": f"{engine.name}:8000", "namespace": "llm",
                              "pod": engine.name}, ts, page)
        backfill.write_tsdb(tmp_path, tmp_path / "prom" / "prometheus-data")
        (status,) = builtin
        parts = {p.target: p for p in status.targets}
        slo = h.slos[0]
        with running_prometheus(tmp_path / "prom", "scrape_configs: []") as prom:
            client = PrometheusClient(prom.url, timeout=60)
            try:
                prom_ratio: dict[tuple[str, float], float] = {}
                for rule in slo_rules(h.slos, [], ("instance",), "", "docs/runbooks/slo_burn.md"):
                    if "record" in rule and rule["record"].startswith("llm_latency_slo:sli_error"):
                        window = next(w for w in [*slo.windows(), slo.period] if ratio_name(w) == rule["record"])
                        for sample in client.query(rule["expr"], end).data:
                            prom_ratio[(sample.labels["instance"].split(":")[0], window)] = sample.value
                compared = 0
                for name, part in parts.items():
                    for window in part.windows:
                        ours = 1.0 - (window.sli or 0.0)
                        theirs = prom_ratio[(name, window.window)]
                        assert abs(ours - theirs) <= EDGE, (name, window.label, ours, theirs)
                        compared += 1
                    # the alerts: Prometheus' (long ratio / budget > factor and short ... > factor) == ours
                    for alert in part.alerts:
                        rules_fire = all(prom_ratio[(name, w)] / slo.budget > alert.factor
                                         for w in (alert.long.window, alert.short.window))
                        assert rules_fire == alert.firing, (name, alert)
                assert compared == 2 * len(slo.windows())
                assert all(a.firing for a in parts["burning"].alerts)  # not vacuous: one pages and tickets ...
                assert not any(a.firing for a in parts["fine"].alerts)  # ... the other is quiet
                assert prom_ratio[("burning", 300.0)] > 0.9 and prom_ratio[("fine", 300.0)] < 0.01

                # the same server as a Prometheus source: its replicas' SLIs by increase(), one query per window
                service = SourceService()
                service.configure([PrometheusSourceConfig(name="m", url=prom.url, selector='{namespace="llm"}',
                                                          target_labels=["namespace", "pod"])])
                try:
                    (source_round,) = service.round(h.sessions, end, 60.0, ["ttft"])
                    assert source_round.ok
                    sums, errors = source_sums(h.sessions, service, h.slos, end)
                    assert errors == {"chat-ttft": {}}
                    with h.sessions() as session:
                        names = {t.id: t.name for t in target_repository.list_targets(session)}
                        spans = [*slo.windows(), slo.period]
                        for target_id, per_span in sums["chat-ttft"].items():
                            pod = names[target_id].rsplit(".", 1)[1]
                            for span, (good, total, oldest) in zip(spans, per_span, strict=True):
                                assert total > 0
                                assert math.isclose(1 - good / total, prom_ratio[(pod, span)], rel_tol=1e-9,
                                                    abs_tol=1e-12), (pod, span)
                                # the server holds 1,500 s: a longer window covers from the first
                                # sample (seen by a 4 m subquery step: at most 240 s late), a
                                # shorter one all of itself
                                if span > end - first_page:
                                    assert first_page <= oldest <= first_page + FIRST_SEEN_STEP, (pod, span, oldest)
                                else:
                                    assert oldest == end - span, (pod, span, oldest)
                        assert len(sums["chat-ttft"]) == 2
                        # and in the SLO status next to the scraped targets: four targets, each pod twice;
                        # the period's coverage is what both stores hold (1,500 s of 28 d), and said
                        (both,) = slo_statuses(session, h.slos, end, RETENTION, sums, errors)
                        assert len(both.targets) == 4 and both.errors == ()
                        assert 1500 - FIRST_SEEN_STEP <= both.period.covered <= 1500
                        assert both.note is not None and "of the 28d period" in both.note, both.note
                        assert "what its server still holds" in both.note
                    # a reader that has not seen the layout reads every bucket; once seen, the bucket at the
                    # threshold alone: the same good and total, from a fraction of the bytes
                    fresh = SourceService()
                    fresh.configure([PrometheusSourceConfig(name="m", url=prom.url, selector='{namespace="llm"}',
                                                            target_labels=["namespace", "pod"])])
                    try:
                        reader, fresh_client = fresh.get("m").reader, fresh.get("m").client  # type: ignore[union-attr]
                        reads = []
                        for _ in range(2):
                            b0 = fresh_client.bytes_read
                            answer = reader.histograms_over("ttft", slo.windows(), end, slo.threshold)
                            reads.append((fresh_client.bytes_read - b0, [
                                {key: {model: (h.increases[h.bounds.index(slo.threshold)], h.count)
                                       for model, h in per_model.items()} for key, per_model in window.items()}
                                for window in answer]))
                        (full_bytes, full), (narrow_bytes, narrow) = reads
                        assert narrow == full and len(full[0]) == 2
                        assert narrow_bytes * 3 < full_bytes, (narrow_bytes, full_bytes)
                    finally:
                        fresh.close()
                    # the period (and where the data begins) is asked once per 5 min, the windows every round
                    before = service.get("m").client.queries  # type: ignore[union-attr]
                    again, _ = source_sums(h.sessions, service, h.slos, end + 30)
                    assert service.get("m").client.queries - before == len(slo.windows())  # type: ignore[union-attr]
                    assert [p[-1] for p in again["chat-ttft"].values()] == [p[-1] for p in sums["chat-ttft"].values()]
                    later, _ = source_sums(h.sessions, service, h.slos, end + period_reuse(slo.period))
                    assert service.get("m").client.queries - before == 2 * len(slo.windows()) + 2  # type: ignore[union-attr]
                    assert len(later["chat-ttft"]) == 2
                finally:
                    service.close()
            finally:
                client.close()
    finally:
        h.close()
