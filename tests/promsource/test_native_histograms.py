"""A source whose Prometheus holds a histogram as a native histogram alone (what Prometheus 3's
``convert_classic_histograms_to_nhcb`` does to a classic one): the service reads the classic
``_bucket``/``_sum``/``_count`` series, so that histogram is not read - and ``GET /api/v1/sources``
says so, per histogram and replica count, and the status page's banner too, instead of the
replica silently lacking it.

Prometheus 2.42 stores native histograms scraped in the protobuf exposition with
``--enable-feature=native-histograms`` (exponential buckets: NHCB's custom buckets are 3.x, but a
native histogram's series looks the same to a query): one replica exposes its TTFT that way and
its ITL as a classic histogram in the same protobuf page, another its TTFT in the text format.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

from app.core.quantiles import WindowHistogram
from app.promsource.reader import SourceTargets
from app.promsource.service import native_alone
from app.window import ModelWindow, TargetWindow
from tests.api.conftest import make_service
from tests.support import protobuf_pages as pb
from tests.support.pages import StaticPageServer
from tests.support.prometheus import FileSD, running_prometheus
from tests.support.sources import source_config

WINDOW = 10
STARTED = time.time()
MODEL = {"model_name": "m"}


def _requests() -> int:
    return 1 + int((time.time() - STARTED) * 2)  # two requests a second


def native_page() -> bytes:
    n = _requests()
    return pb.page([
        pb.family("vllm:num_requests_running", pb.GAUGE, [pb.gauge(MODEL, 1.0)]),
        # schema 0: bucket i holds (2^(i-1), 2^i]; offset -3, two buckets: (1/16, 1/8] and (1/8, 1/4]
        pb.family("vllm:time_to_first_token_seconds", pb.HISTOGRAM,
                  [pb.native_histogram(MODEL, 3 * n, 0.5 * n, 0, [(-3, 2)], [n, 2 * n])]),
        pb.family("vllm:inter_token_latency_seconds", pb.HISTOGRAM,
                  [pb.classic_histogram(MODEL, 10 * n, 0.2 * n, [(0.01, 4 * n), (0.05, 10 * n)])]),
    ])


def classic_page() -> str:
    n = _requests()
    return (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m"}} 1\n'
            f'# TYPE vllm:time_to_first_token_seconds histogram\n'
            f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="0.1"}} {n}\n'
            f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="1.0"}} {2 * n}\n'
            f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {2 * n}\n'
            f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {0.6 * n}\n'
            f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {2 * n}\n')


def test_a_histogram_held_as_a_native_histogram_alone_is_named_not_silently_missing(
        migrated_url: str, tmp_path: Path) -> None:
    with StaticPageServer(native_page, content_type=pb.PROTOBUF_EXPOSITION) as native, \
            StaticPageServer(classic_page) as classic:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"n": native.url, "c": classic.url}, namespace="llm")
        with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s"),
                                extra_args=["--enable-feature=native-histograms"]) as prom:
            prom.wait_for_samples('vllm:inter_token_latency_seconds_count{pod="n"}', WINDOW + 2, timeout=90)
            prom.wait_for_samples('vllm:time_to_first_token_seconds_count{pod="c"}', WINDOW + 2, timeout=90)
            # the setup is what it claims: n's TTFT is one native-histogram series, with no classic series
            stored = prom.query('vllm:time_to_first_token_seconds{pod="n"}')["result"]
            assert len(stored) == 1 and "histogram" in stored[0] and float(stored[0]["histogram"][1]["count"]) > 0
            assert prom.query('vllm:time_to_first_token_seconds_count{pod="n"}')["result"] == []
            config = source_config(tmp_path / "t.yaml", prom.url, WINDOW)
            for svc in make_service(migrated_url, tmp_path, config_file=config):
                c, monitor = svc.client, svc.monitor
                now = time.time()
                monitor.evaluate_diagnoses(now=now)
                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "ok" and source["targets"] == 2, source
                # one replica lacks its TTFT for that reason; c's TTFT and n's classic ITL are read
                assert source["native_histograms"] == {"vllm:time_to_first_token_seconds": 1}, source
                banner = re.search(r'<section class="banner window-notes[^>]*>(.*?)</section>', c.get("/").text, re.S)
                assert banner is not None and "Not judged · source prod:</strong> histograms held as native " \
                    "histograms alone are not read (vllm:time_to_first_token_seconds on 1 replica): keep their " \
                    "classic series (always_scrape_classic_histograms: true)." in banner.group(1), banner

                params = {"window": f"{WINDOW}s", "end": now}
                n_latency = c.get("/api/v1/targets/prod.llm.n/latency", params=params).json()
                assert n_latency.get("ttft") is None, n_latency
                expected = prom.query(f'histogram_quantile(0.99, sum by (le) (increase('
                                      f'vllm:inter_token_latency_seconds_bucket{{pod="n"}}[{WINDOW}s])))', time=now)
                assert math.isclose(n_latency["itl"]["p99"], float(expected["result"][0]["value"][1]), rel_tol=1e-9)
                c_latency = c.get("/api/v1/targets/prod.llm.c/latency", params=params).json()
                assert c_latency["ttft"]["count"] > 0


def test_only_engines_lacking_a_histogram_are_counted() -> None:
    """A replica whose classic series sit beside the native one has the histogram read (not counted);
    a series of a pod that is no engine counts for no replica; a name that carries two signals (TGI's
    batch inference duration: ITL and prefill) counts where either is missing."""
    ttft = WindowHistogram((0.1, math.inf), (1.0, 2.0), 0.3, 2.0)
    both = TargetWindow(0.0, 10.0, overall=ModelWindow(histograms={"ttft": ttft}))
    tgi_half = TargetWindow(0.0, 10.0, overall=ModelWindow(histograms={"itl": ttft}))
    found = SourceTargets(engines={("a",): "vllm", ("b",): "vllm", ("t",): "tgi"},
                          native={("a",): {"vllm:time_to_first_token_seconds"},
                                  ("b",): {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"},
                                  ("x",): {"vllm:time_to_first_token_seconds"},
                                  ("t",): {"tgi_batch_inference_duration"}})
    counted = native_alone(found, {("a",): both, ("b",): TargetWindow(0.0, 10.0), ("t",): tgi_half})
    assert counted == {"tgi_batch_inference_duration": 1, "vllm:e2e_request_latency_seconds": 1,
                       "vllm:time_to_first_token_seconds": 1}
