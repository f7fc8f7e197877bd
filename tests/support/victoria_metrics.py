"""Run a real, throw-away VictoriaMetrics single node (Debian's ``victoria-metrics``).

::

    sd = FileSD(tmp_path / "targets.json")
    sd.set({"a": fleet.urls["a"]}, namespace="llm")
    with running_victoria_metrics(tmp_path, sd.scrape_configs(refresh_interval=None)) as vm:
        vm.wait_for_samples('vllm:num_requests_running{pod="a"}', 3)
        vm.query("sum(vllm:num_requests_running)", time=...)

The handle is a :class:`~tests.support.prometheus.PrometheusHandle` (same HTTP API, same
``query``/``wait_for_samples``/``stop``/``start``). Flags that make it behave like a test
needs, not like a production node:

* ``-search.latencyOffset=0s``: otherwise the last 30 s are hidden from queries;
* ``-search.disableCache``: no answer comes from a cache filled before the data arrived;
* ``-promscrape.fileSDCheckInterval=1s``: a rewritten target file is seen within a second
  (VictoriaMetrics ignores ``refresh_interval`` in ``file_sd_configs``);
* ``-promscrape.config.strictParse=false``: fields it does not know are skipped;
* ``-maxLabelsPerTimeseries=100``: the default 30 drops labels (``pod`` too) of vLLM's info series.

Newly scraped series become visible to queries after up to ~10 s (its ingestion buffers):
wait with :meth:`wait_for_samples` and a generous timeout.

Readiness is ``/health``. Stopped by PID; a missing binary follows
:func:`tests.support.components.require_binary` (skip locally, fail under ``CI=true``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.components import require_binary
from tests.support.prometheus import PrometheusHandle, serving

VICTORIA_METRICS_BINARY = "/usr/bin/victoria-metrics"


@contextlib.contextmanager
def running_victoria_metrics(
    tmp_path: Path,
    scrape_configs_yaml: str,
    scrape_interval: str = "1s",
    extra_args: Sequence[str] = (),
    *,
    binary: str = VICTORIA_METRICS_BINARY,
    ready_timeout: float = 30.0,
) -> Iterator[PrometheusHandle]:
    """Start VictoriaMetrics on a free 127.0.0.1 port scraping ``scrape_configs_yaml``
    (a ``scrape_configs:`` section, e.g. :meth:`FileSD.scrape_configs`); yield its handle.

    Config, data and log live in ``tmp_path/victoria-metrics*``.
    """
    exe = require_binary(binary, "a real VictoriaMetrics single node (Prometheus-compatible query API)")
    base = Path(tmp_path)
    base.mkdir(parents=True, exist_ok=True)
    config_path = base / "victoria-metrics.yml"
    log_path = base / "victoria-metrics.log"
    text = scrape_configs_yaml.strip("\n")
    if not text.lstrip().startswith("scrape_configs:"):
        text = "scrape_configs:\n" + text
    config_path.write_text(f"global:\n  scrape_interval: {scrape_interval}\n{text}\n")
    data_path = base / "victoria-metrics-data"
    with serving(
        "victoria-metrics", log_path, config_path,
        lambda port: [
            exe,
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={data_path}",
            f"-promscrape.config={config_path}",
            "-promscrape.config.strictParse=false",
            "-promscrape.fileSDCheckInterval=1s",
            "-search.latencyOffset=0s",
            "-search.disableCache",
            "-retentionPeriod=1d",
            "-maxLabelsPerTimeseries=100",  # vLLM's cache_config_info has ~40 labels
            *extra_args,
        ],
        ready_path="/health", ready_timeout=ready_timeout,
    ) as handle:
        yield handle
