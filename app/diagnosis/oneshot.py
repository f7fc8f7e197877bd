"""``llm-latency diagnose URL``: a one-shot check of a live engine, nothing deployed.

Scrapes the engine at the start and the end of the window (and every ``interval`` in
between, so gauges such as waiting requests are sampled), keeps the samples in a
throw-away SQLite database, and runs the same signals and rules as the service. With a
``baseline``, it watches that long first and says what changed between the two parts of its
watch (:mod:`app.attribution`: the service's attribution, the configuration changes seen
between scrapes as its events).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from app.attribution import explain, reads
from app.attribution.events import ChangeEvent, config_changes, config_of
from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.findings import Diagnosis, runbook_link
from app.diagnosis.profile import HardwareProfile
from app.latency import report_from_window, request_set_notes
from app.scrape.client import PageFetcher
from app.scrape.jobs import ScrapeSpec, TargetScraper
from app.sources import trtllm
from app.sources.base import HISTOGRAM_SIGNALS
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from app.windows import default_windows

EXIT_HEALTHY, EXIT_FINDING, EXIT_UNREACHABLE, EXIT_INSUFFICIENT = 0, 1, 3, 4  # 2 = usage error (click)
#: Nothing fired, but some regime could not be judged (its signals are not on this engine's page, or
#: its numbers could not decide): the verdict ``not_judged``, not the same as healthy, so not 0.
EXIT_NOT_JUDGED = 5
#: The server answered, but not with an engine's metrics page: a 404, an HTML page, other metrics,
#: trtllm-serve's JSON iteration statistics.
_WRONG_PAGE = ("http_status", "parse_error", "no_engine_metrics", "wrong_endpoint")


@dataclass
class OneShotResult:
    url: str
    engine: str | None
    scrapes: list[ScrapeRecord]
    latency: dict
    diagnoses: list[Diagnosis]
    changes: dict | None = None  # the attribution of the watch's last part against its first (baseline)

    @property
    def exit_code(self) -> int:
        if not any(s.up and s.canonical is not None for s in self.scrapes):
            return EXIT_UNREACHABLE
        if any(d.findings for d in self.diagnoses):
            return EXIT_FINDING
        if all(d.verdict == "insufficient_data" for d in self.diagnoses):
            return EXIT_INSUFFICIENT
        if any(d.verdict == "not_judged" for d in self.diagnoses):
            return EXIT_NOT_JUDGED
        return EXIT_HEALTHY

    @property
    def hint(self) -> str | None:
        """``http://host:8000`` answers 404 or HTML where ``http://host:8000/metrics`` is the
        engine's page, and trtllm-serve's ``/metrics`` answers JSON where ``/prometheus/metrics``
        is its page: name the URL that was probably meant. Nothing listening: ask whether the
        engine runs there."""
        parts = urlsplit(self.url)
        last = self.scrapes[-1] if self.scrapes else None
        if self.exit_code == EXIT_UNREACHABLE and last is not None and last.error_class == "connect":
            return f"is the engine running, and does it serve its metrics on {parts.netloc}?"
        if self.exit_code != EXIT_UNREACHABLE or last is None or last.error_class not in _WRONG_PAGE:
            return None
        if last.error_class == "wrong_endpoint":
            return (f"did you mean {trtllm.prometheus_url(self.url)}? (trtllm-serve serves it with "
                    "return_perf_metrics: true)")
        if parts.path.rstrip("/").endswith("/metrics"):
            return None
        return f"did you mean {urlunsplit((parts.scheme, parts.netloc, '/metrics', '', ''))}?"

    def to_dict(self) -> dict:
        last = self.scrapes[-1] if self.scrapes else None
        return {"url": self.url, "engine": self.engine, "exit_code": self.exit_code, "hint": self.hint,
                "scrapes": len(self.scrapes), "failed_scrapes": sum(1 for s in self.scrapes if not s.up),
                "last_error": (last.error_class, last.error) if last and last.error_class else None,
                "latency": self.latency, "diagnoses": [d.to_dict() for d in self.diagnoses],
                **({"changes": self.changes} if self.changes is not None else {})}


async def _scrape_window(url: str, engine: str, window: float, interval: float, timeout: float) -> list[ScrapeRecord]:
    records: list[ScrapeRecord] = []
    async with PageFetcher(max_concurrency=1) as fetcher:
        scraper = TargetScraper(ScrapeSpec(1, "target", url, engine, interval, timeout), fetcher, records.append)
        started = time.monotonic()
        await scraper.run()
        if not records[-1].up or records[-1].error_class == "no_engine_metrics":
            return records  # unreachable or not an engine: do not wait out the window
        while True:
            remaining = window - (time.monotonic() - started)
            if remaining <= 0:
                break
            await asyncio.sleep(min(interval, remaining))
            await scraper.run()
    return records


def _config_events(records: list[ScrapeRecord]) -> list[ChangeEvent]:
    """Configuration labels that changed between two successive scrapes of the watch."""
    events: list[ChangeEvent] = []
    previous: dict[str, str] | None = None
    for record in records:
        if record.canonical is None:
            continue
        config = config_of(record.canonical.infos)
        if previous is not None and config:
            events += config_changes(previous, config, record.ts)
        previous = config or previous
    return events


def run(url: str, window: float = 60.0, interval: float = 5.0, engine: str = "auto", timeout: float = 10.0,
        hardware: HardwareProfile | None = None, thresholds: Thresholds | None = None,
        baseline: float | None = None) -> OneShotResult:
    """Watch ``url`` for ``window`` (after ``baseline`` more, when given) and diagnose the window."""
    thresholds = thresholds or Thresholds()
    records = asyncio.run(_scrape_window(url, engine, window + (baseline or 0.0), interval, timeout))
    detected = next((r.engine for r in reversed(records) if r.engine), None)
    if not any(r.up and r.canonical is not None for r in records):
        return OneShotResult(url, detected, records, {}, [])  # nothing to diagnose: the scrape problem says why
    with tempfile.TemporaryDirectory(prefix="llm-latency-diagnose-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'oneshot.db'}"
        db.upgrade(db_url)
        sql = db.make_engine(db_url)
        try:
            sessions = db.make_sessionmaker(sql)
            with sessions.begin() as session:
                target = target_repository.create_target(session, name="target", url=url, engine=engine, labels={})
            for record in records:
                record.target_id = target.id
            SampleWriter(sql).write(records)
            end = records[-1].ts
            start = records[0].ts if not baseline else max(records[0].ts, end - window)
            changes = None
            with sessions() as session:
                seconds = max(end - start, 1e-3)
                report = report_from_window(default_windows().window(session, target, end - seconds, end,
                                                                     HISTOGRAM_SIGNALS)) if len(records) > 1 else {}
                diagnoses = diagnosis_engine.evaluate_target(
                    session, target.id, url, detected or "vllm", end, seconds, thresholds, hardware)
                if baseline and len(records) > 2:
                    first = records[0].ts
                    chosen = reads.ComparedWindows("previous", start, end, first, start)
                    before, after, parts = reads.read(default_windows(), session, target, chosen)
                    changes = explain.attribute(
                        before, after, parts, _config_events(records), "previous",
                        hardware.prefill_seconds(1.0) if hardware else None).to_dict()
        finally:
            sql.dispose()
    return OneShotResult(url, detected, records, report, diagnoses, changes)


#: What a verdict that names no regime means, after it in the headline.
HEADLINE_NOTES = {
    "healthy": " (every regime judged, none found, latency in its expected range)",
    "not_judged": " (no regime found, but not every regime could be judged: not healthy)",
}


def format_text(result: OneShotResult, runbook_base: str = "") -> str:
    """The human-readable report; runbooks are linked under ``runbook_base`` (the monitor's
    external URL) when it is given, else as their path on a monitor (``/runbooks/<name>``)."""
    lines = [f"{result.url}  engine: {result.engine or 'unknown'}  scrapes: {len(result.scrapes)}"]
    failed = [s for s in result.scrapes if s.error_class]
    if failed:
        lines.append(f"  scrape problem: {failed[-1].error_class}: {failed[-1].error}")
    if result.hint:
        lines.append(f"  {result.hint}")
    r = result.latency

    def cell(block: str, key: str) -> str:
        """A quantile as the buckets know it (``< 0.3 s`` in the lowest bucket), the mean exact."""
        summary = r.get(block) or {}
        if key == "mean":
            return f"{human.seconds(summary.get('mean')):>10}"
        return f"{human.summary_quantile(summary, key):>10}"

    if r:
        lines.append(f"  window {r['window_seconds']:.0f} s        "
                     f"{'p50':>10} {'p99':>10} {'mean':>10} {'count':>8}")
        for block, label in (("ttft", "TTFT"), ("queue_time", "  queue"), ("prefill_time", "  prefill"),
                             ("itl", "ITL"), ("e2e", "end-to-end")):
            if block in r:
                derived = " (derived: mean exact, quantiles bounded)" if r[block].get("derived") else ""
                count = human.count(r[block].get("count") or 0, bool(r[block].get("count_estimate")))
                lines.append(f"  {label:<18}{cell(block, 'p50')} {cell(block, 'p99')} {cell(block, 'mean')} "
                             f"{count:>8}{derived}")
        if any((r.get(b) or {}).get("count_estimate") for b in ("ttft", "itl", "queue_time", "e2e")):
            lines.append(f"  ≈: {human.ESTIMATE_NOTE}")
        lines.extend(f"  note: {note}" for note in request_set_notes(r, ("p50", "p99")))
    if result.changes is not None:
        lines.append(f"\nWhat changed: {result.changes['summary']}")
        for driver in result.changes["drivers"][:5]:
            if driver["significant"]:
                shown = "  ".join(f"{signal} {human.seconds(seconds)}"
                                  for signal, seconds in driver["explains"].items())
                before, after = (explain.value_text(driver[k], driver["unit"]) for k in ("before", "after"))
                lines.append(f"  - {driver['label']}: {before} -> {after} {driver['unit']}"
                             + (f"  explains {shown}" if shown else "") + (f"  ({driver['note']})" if driver["note"]
                                                                          else ""))
    for d in result.diagnoses:
        model = f" [{d.model}]" if d.model else ""
        lines.append(f"\nDiagnosis{model}: {d.verdict}{HEADLINE_NOTES.get(d.verdict, '')}")
        for note in d.notes:
            lines.append(f"  note: {note}")
        for item in d.not_judged:
            lines.append(f"  not judged: {item['regime']}: {item['reason']}")
        for f in d.findings:
            role = "PRIMARY" if f.primary else (f"caused by {f.caused_by}" if f.caused_by else "also")
            lines.append(f"  [{role}] {f.regime} ({f.severity}, confidence {f.confidence * 100:.0f} %): {f.summary}")
            for e in f.evidence:
                lines.append(f"      - {e.text()}")
            for remedy in f.remedies:
                lines.append(f"      > {remedy}")
            lines.append(f"      runbook: {runbook_link(f.regime, runbook_base)}")
    return "\n".join(lines)
