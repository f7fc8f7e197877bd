"""The latest probe results per target, for the dashboards (a ``prometheus_client`` collector).

Register one :class:`ProbeCollector` on the service's registry and feed it finished runs -
:meth:`ProbeCollector.observe` right after a run is stored, or :meth:`ProbeCollector.refresh`
from a periodic job (it reads only runs newer than the last one it saw). Nothing touches the
database at scrape time.

Exported (labels bounded: ``target`` = monitored targets only - probes of bare URLs are not
exported -, ``kind`` in adhoc|canary|sweep, ``concurrency`` = the levels of the latest run of
that target and kind (at most :data:`MAX_LEVELS`), ``quantile`` in 0.5|0.9|0.99, ``error`` =
the runner's fixed error classes)::

    llm_latency_probe_ttft_seconds{target,kind,concurrency,quantile}     client-side TTFT of the latest run
    llm_latency_probe_itl_seconds{target,kind,concurrency,quantile}      client-side inter-token gaps
    llm_latency_probe_e2e_seconds{target,kind,concurrency,quantile}      request sent -> stream end
    llm_latency_probe_output_tokens_per_second{target,kind,concurrency}  all streams of the level together
    llm_latency_probe_requests{target,kind,concurrency}                  requests sent in the latest run
    llm_latency_probe_failed_requests{target,kind,concurrency}           ... of which failed
    llm_latency_probe_prompt_tokens{target,kind}                         the fixed input length of the latest run
    llm_latency_probe_last_run_timestamp_seconds{target,kind}            when the latest run finished
    llm_latency_probe_errors_total{target,kind,error}                    failed probe requests (counter; since start)
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from app.probe import repository as probe_repository
from app.probe.runner import ERROR_CLASSES
from app.store.models import ProbeRunRow

MAX_LEVELS = 12
MAX_SERIES_KEYS = 2000  # (target, kind) pairs kept; more targets than this is not a real fleet
_QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))


class ProbeCollector(Collector):
    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], dict] = {}  # (target, kind) -> {"id", "finished_at", "summary"}
        self.errors: dict[tuple[str, str, str], float] = {}
        self._seen: dict[int, None] = {}  # run ids already counted (insertion-ordered, capped)
        self._watermark: float | None = None  # newest finished_at seen by refresh()

    # ------------------------------------------------------------------ feeding
    def observe(self, run: ProbeRunRow) -> None:
        """A completed run of a monitored target (others are ignored: a run that could not run at
        all has no measurement). Idempotent per run id."""
        if run.target_id is None or run.state != "done" or run.id in self._seen:
            return
        self._seen[run.id] = None
        if len(self._seen) > 10_000:
            del self._seen[next(iter(self._seen))]
        self._set_latest(run)
        for level in (run.summary or {}).get("levels", []):
            for error, n in (level.get("errors") or {}).items():
                if error in ERROR_CLASSES:
                    key = (run.target, run.kind, error)
                    self.errors[key] = self.errors.get(key, 0.0) + n

    def refresh(self, session: Session) -> None:
        """Catch up from the database. The first call loads the latest run per target and kind
        without counting their errors (the counter starts with the process); later calls
        observe every run finished since."""
        if self._watermark is None:
            for run in probe_repository.latest_runs(session):
                self._seen[run.id] = None
                self._set_latest(run)
            self._watermark = probe_repository.newest_finish(session) or 0.0
            return
        for run in probe_repository.runs_finished_since(session, self._watermark - 1.0):
            self.observe(run)
            if run.finished_at is not None:
                self._watermark = max(self._watermark, run.finished_at)

    def forget_target(self, name: str) -> None:
        self.latest = {k: v for k, v in self.latest.items() if k[0] != name}
        self.errors = {k: v for k, v in self.errors.items() if k[0] != name}

    def _set_latest(self, run: ProbeRunRow) -> None:
        key = (run.target, run.kind)
        current = self.latest.get(key)
        if current is None and len(self.latest) >= MAX_SERIES_KEYS:
            return
        if current is not None and (current["finished_at"] or 0.0) > (run.finished_at or 0.0):
            return  # an older run finishing late does not replace the newer one
        self.latest[key] = {"id": run.id, "finished_at": run.finished_at, "summary": run.summary or {}}

    # ------------------------------------------------------------------ exporting
    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["target", "kind", "concurrency", "quantile"]
        fams = {name: GaugeMetricFamily(f"llm_latency_probe_{name}_seconds", doc, labels=labels) for name, doc in (
            ("ttft", "Client-side time to first token of the latest probe run."),
            ("itl", "Client-side inter-token latency (all gaps) of the latest probe run."),
            ("e2e", "Client-side end-to-end request time of the latest probe run."),
        )}
        tps = GaugeMetricFamily("llm_latency_probe_output_tokens_per_second",
                                "Tokens received per second by all streams of the level.",
                                labels=["target", "kind", "concurrency"])
        requests = GaugeMetricFamily("llm_latency_probe_requests", "Requests sent in the latest probe run.",
                                     labels=["target", "kind", "concurrency"])
        failed = GaugeMetricFamily("llm_latency_probe_failed_requests", "Failed requests in the latest probe run.",
                                   labels=["target", "kind", "concurrency"])
        prompt = GaugeMetricFamily("llm_latency_probe_prompt_tokens", "Fixed input length of the latest probe run.",
                                   labels=["target", "kind"])
        last = GaugeMetricFamily("llm_latency_probe_last_run_timestamp_seconds",
                                 "When the latest probe run finished.", labels=["target", "kind"])
        errors = CounterMetricFamily("llm_latency_probe_errors", "Failed probe requests by error class.",
                                     labels=["target", "kind", "error"])
        for (target, kind), entry in sorted(self.latest.items()):
            if entry["finished_at"] is not None:
                last.add_metric([target, kind], entry["finished_at"])
            levels = entry["summary"].get("levels", [])[:MAX_LEVELS]
            if levels:
                prompt.add_metric([target, kind], float(levels[0].get("prompt_tokens") or 0))
            seen: set[str] = set()
            for level in levels:
                conc = str(level.get("concurrency"))
                if conc in seen:  # a prompt-length sweep repeats the concurrency: export the first level only
                    continue
                seen.add(conc)
                for name, fam in fams.items():
                    stats = level.get(name) or {}
                    for key, q in _QUANTILES:
                        if stats.get(key) is not None:
                            fam.add_metric([target, kind, conc, q], stats[key])
                if level.get("output_tokens_per_second") is not None:
                    tps.add_metric([target, kind, conc], level["output_tokens_per_second"])
                requests.add_metric([target, kind, conc], float(level.get("requests", 0)))
                failed.add_metric([target, kind, conc], float(level.get("failed", 0)))
        for (target, kind, error), value in sorted(self.errors.items()):
            errors.add_metric([target, kind, error], value)
        yield from fams.values()
        yield from (tps, requests, failed, prompt, last, errors)
