"""A replica restarts between two rounds, in a real Prometheus 2.42: its counters and histograms
start again from zero. The round's means-first read (``_sum``/``_count`` of every histogram,
buckets where the diagnosis needs them, app/diagnosis/tails.py) and the SLO filter (3 buckets a
replica first) give, over a window holding the reset, exactly what a full read gives and what
Prometheus' own ``increase`` gives: the reset is Prometheus' to handle, in every query alike."""

from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path

import httpx

from app.core import quantiles
from app.core.thresholds import Thresholds
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.diagnosis.tails import buckets_needed
from app.emulator.server import EmulatorFleet, TargetSpec
from app.promql.client import PrometheusClient
from app.promsource.reader import SourceReader
from tests.support.pages import StaticPageServer
from tests.support.prometheus import FileSD, running_prometheus

WINDOW = 20.0
_SAMPLE = re.compile(r"^(\S+?)(\{.*\})? (\S+)$")
_CUMULATIVE = ("_bucket", "_sum", "_count", "_total")


class Restarting:
    """An engine's page whose counters start again from zero at :meth:`restart` (a new process
    behind the same pod): every cumulative sample is served minus its value at the restart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.at_restart: dict[str, float] = {}
        self.lock = threading.Lock()

    def _samples(self) -> list[tuple[str, str, float]]:
        out = []
        for line in httpx.get(self.url, timeout=5).text.splitlines():
            m = _SAMPLE.match(line)
            if m and not line.startswith("#"):
                out.append((m[1], m[1] + (m[2] or ""), float(m[3])))
        return out

    def restart(self) -> None:
        with self.lock:
            self.at_restart = {series: value for name, series, value in self._samples() if name.endswith(_CUMULATIVE)}

    def page(self) -> str:
        with self.lock:
            base = dict(self.at_restart)
        lines = [(series, max(0.0, value - base.get(series, 0.0)) if name.endswith(_CUMULATIVE) else value)
                 for name, series, value in self._samples()]
        return "".join(f"{series} {value!r}\n" for series, value in lines)


def _agrees(reader: SourceReader, prom: PrometheusClient, end: float) -> dict[str, int]:
    """One round at ``end``: the means-first windows against a full read, the SLO filter against
    the full histograms; returns how many histograms of each replica were read means first."""
    thresholds = Thresholds()
    full = reader.windows(end - WINDOW, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    lean = reader.round_windows(end - WINDOW, end, DIAGNOSIS_HISTOGRAMS,
                                lambda key, w: buckets_needed(w, f"prod.{key[1]}", "vllm", thresholds))
    assert lean.keys() == full.keys() == {("llm", "r"), ("llm", "h")}
    thin: dict[str, int] = {}
    for key, window in full.items():
        thin[key[1]] = 0
        for model, m in window.models.items():
            assert lean[key].models[model].gauges == m.gauges and lean[key].models[model].rates == m.rates
            for signal, h in m.histograms.items():
                read = lean[key].models[model].histograms[signal]
                assert (read.sum, read.count) == (h.sum, h.count), (key, signal)
                if read.means_only:
                    thin[key[1]] += 1
                else:
                    assert read == h, (key, signal)
    # the mean of the restarted replica's TTFT is Prometheus' own over the window
    answer = prom.query('sum(increase(vllm:time_to_first_token_seconds_sum{pod="r"}[20s])) / '
                        'sum(increase(vllm:time_to_first_token_seconds_count{pod="r"}[20s]))', end)
    (ttft,) = [m.histograms["ttft"] for m in lean[("llm", "r")].models.values()]
    assert math.isclose(ttft.sum / ttft.count, answer.data[0].value, rel_tol=1e-9)
    histograms = reader.histograms(["ttft", "itl"], end - WINDOW, end)
    for signal, by_target in histograms.items():
        bounds = sorted({b for per_model in by_target.values() for h in per_model.values() for b in h.bounds})[:-1]
        for threshold in bounds:
            narrowed = reader.histograms([signal], end - WINDOW, end, {signal: [(0.9, threshold)]})[signal]
            for key, per_model in by_target.items():
                (h,) = per_model.values()
                value = quantiles.bucket_quantile(0.9, h.bounds, h.increases)
                if key in narrowed:  # the buckets around the threshold, or all: the same quantile and bucket
                    (got,) = narrowed[key].values()
                    assert quantiles.bucket_quantile(0.9, got.bounds, got.increases) == value and value[0] > threshold
                    assert (got.sum, got.count) == (h.sum, h.count)
                else:
                    assert not value[0] > threshold
    return thin


def _mirror_agrees(mirrored: SourceReader, reader: SourceReader, end: float) -> int:
    """The means-first windows from the mirror's raw samples equal the queried ones bit for bit
    (sums, counts, gauges, rates, scrapes, restarts); returns the restarts of replica r."""
    lean = mirrored.windows(end - WINDOW, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=())
    full = reader.windows(end - WINDOW, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True, buckets=())
    assert lean.keys() == full.keys() == {("llm", "r"), ("llm", "h")}
    for key, window in full.items():
        got = lean[key]
        assert (got.scrapes, got.restarts) == (window.scrapes, window.restarts), key
        for model, m in window.models.items():
            mine = got.models[model]
            assert mine.histograms.keys() == m.histograms.keys() and mine.rates.keys() == m.rates.keys()
            pairs = [(mine.histograms[s].sum, h.sum) for s, h in m.histograms.items()]
            pairs += [(mine.histograms[s].count, h.count) for s, h in m.histograms.items()]
            pairs += [(mine.rates[s], v) for s, v in m.rates.items()]
            pairs += [(getattr(mine.gauges[s], stat), getattr(g, stat)) for s, g in m.gauges.items()
                      for stat in ("last", "mean", "max")]
            for a, b in pairs:
                assert a == b or (math.isnan(a) and math.isnan(b)), (key, a, b)
    return lean[("llm", "r")].restarts or 0


def test_a_restart_between_rounds_reads_as_prometheus_counts_it(tmp_path: Path) -> None:
    specs = [TargetSpec("r", "queueing", time_scale=10.0, warmup_s=60, seed=2),
             TargetSpec("h", "healthy", time_scale=10.0, warmup_s=60, seed=1)]
    with EmulatorFleet(specs) as fleet:
        restarting = Restarting(fleet.urls["r"] + "/metrics")
        with StaticPageServer(restarting.page) as page:
            sd = FileSD(tmp_path / "targets.json")
            sd.set({"r": page.url, "h": fleet.urls["h"]}, namespace="llm", service="chat")
            with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s")) as prom:
                prom.wait_for_samples('vllm:num_requests_running{namespace="llm"}', int(WINDOW) + 2, timeout=60)
                client = PrometheusClient(prom.url, timeout=30)
                try:
                    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
                    mirrored = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}', mirror_lag=0.0,
                                            hold_buckets=("ttft", "itl"))
                    first = time.time() - 1.0
                    before = _agrees(reader, client, first)
                    _mirror_agrees(mirrored, reader, first)
                    restarting.restart()
                    restarted = time.time()
                    time.sleep(WINDOW / 2)
                    end = time.time() - 1.0
                    # the window holds the restart: r's counters went down once in it
                    resets = client.query('resets(vllm:time_to_first_token_seconds_count{pod="r"}[20s])', end)
                    assert [s.value for s in resets.data] == [1.0] and end - WINDOW < restarted < end
                    after = _agrees(reader, client, end)
                    # the mirror read the samples since its first refresh only, the reset among them
                    assert _mirror_agrees(mirrored, reader, end) == 1
                finally:
                    client.close()
    # the healthy replica needs no distribution: every histogram of vLLM's page means first
    assert before["h"] == after["h"] == 11
    assert before["r"] < 11 and after["r"] < 11  # a queueing replica's finding shows its TTFT p99
