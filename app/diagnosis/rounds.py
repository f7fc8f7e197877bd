"""The diagnosis round: every target evaluated, lifecycles advanced, results persisted.

Run by the scheduler every ``diagnosis.interval`` (:data:`app.runtime.scheduling.DIAGNOSIS_JOB`)
and directly by tests and benchmarks with an explicit ``now``. One transaction per round,
so a reader never sees half a round; the round reads and computes first (no write lock held
while it does), then writes every result in one short transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import flag_modified

from app import latency
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.config import DiagnosisConfig
from app.diagnosis.findings import Diagnosis
from app.diagnosis.profile import HardwareProfile
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.diagnosis.tails import buckets_needed
from app.diagnosis.telemetry import DiagnosisCollector
from app.latency import WindowSummary
from app.probe import repository as probe_repository
from app.probe.canary import latest_single_request_baseline
from app.runtime.scheduling import DIAGNOSIS_JOB, target_boundary
from app.store.models import DiagnosisRow, FindingRow, known_engine
from app.targets import repository as target_repository
from app.windows import default_windows
from app.windows.base import WindowReader

ROUND_CHUNK = 250  # targets whose windows are read and held at once (a few queries per chunk)
PAGE_SIGNALS = ("ttft", "itl", "queue_time", "prefill_time")  # the fleet table's (TGI: TTFT = queue + prefill)
PROBE_BASELINE_MAX_AGE = 3600.0  # a single-request probe older than this is not evidence any more
#: A target's diagnosis and the lifecycle transitions it caused (app.diagnosis.engine.apply_lifecycle).
RoundResult = tuple[Diagnosis, list[dict]]


@dataclass(frozen=True, slots=True)
class RoundSummaries:
    """Every evaluated target's latency summaries (all models summed by ``le``) over the last
    round's window, kept with that window: the status page's fleet table reads these instead
    of re-reading every target's samples per request."""

    start: float
    end: float
    by_target: dict[int, dict[str, WindowSummary]] = field(default_factory=dict)
    took: float = 0.0  # seconds the round ran (app.summaries.answers)


def evaluate_diagnoses(sessions: sessionmaker[Session], config: DiagnosisConfig,
                       collector: DiagnosisCollector | None = None, now: float | None = None, *,
                       windows: WindowReader | None = None,
                       keep: Callable[[RoundSummaries], None] | None = None) -> list[RoundResult]:
    """One diagnosis round over every target: evaluate, advance lifecycles, persist; the
    diagnoses (with their findings' states) replace the collector's for ``/metrics``.

    The backends discover their targets first, outside any transaction (a Prometheus source
    reads the round's windows on the way). A target without a window now (its backend could
    not answer, or it is down) is skipped, so it keeps its last verdict and none of its
    findings moves - missing data never resolves or fires anything. Gone targets (discovery
    no longer lists them) are not evaluated either. ``windows``: every backend (default: the
    built-in store alone); ``keep`` is given the round's per-target summaries
    (:class:`RoundSummaries`)."""
    began = time.monotonic()
    now = time.time() if now is None else now
    reads = windows if windows is not None else default_windows()
    reads.discover(sessions, now, config.window, DIAGNOSIS_HISTOGRAMS,
                   lambda name, engine, window: buckets_needed(window, name, engine, config.thresholds_for(name)))
    results: list[RoundResult] = []
    evaluated: list[tuple[int, Diagnosis]] = []
    summaries: dict[int, dict[str, WindowSummary]] = {}
    # Read and compute with no write transaction open (WAL: the scrape writer never waits on
    # a round); the windows in a fixed number of set-based reads per chunk of targets.
    with sessions() as session:
        # One query for which targets have probe runs at all, instead of two per target.
        probe_lookback = max(PROBE_BASELINE_MAX_AGE, config.window, config.thresholds.outside_lookback)
        probed = probe_repository.targets_with_finished_runs(session, now - probe_lookback)
        targets = [t for t in target_repository.list_targets(session) if t.gone_at is None]
        for chunk in range(0, len(targets), ROUND_CHUNK):
            members = targets[chunk:chunk + ROUND_CHUNK]
            found = reads.windows(session, members, now - config.window, now, DIAGNOSIS_HISTOGRAMS,
                                  diagnosis=True).found
            for target in members:
                if target.id not in found:
                    continue  # no numbers now (see above)
                with target_boundary(DIAGNOSIS_JOB, target.name):  # a failing target keeps its last verdict
                    overall = found[target.id].overall.histograms
                    if not any(h is not None and h.means_only for h in map(overall.get, PAGE_SIGNALS)):
                        # read means first (a source): the status page computes its quantiles when asked
                        summaries[target.id] = latency.summarize_histograms({s: overall.get(s) for s in PAGE_SIGNALS})
                    hardware = HardwareProfile.model_validate(target.hardware) if target.hardware else None
                    engine = known_engine(target) or "vllm"
                    baseline = latest_single_request_baseline(session, target.id, now - PROBE_BASELINE_MAX_AGE) \
                        if target.id in probed else None
                    # over the decode side's own window (a source's may be longer: whole scrape intervals)
                    prefill = diagnosis_engine.prefill_side(reads, session, target, found[target.id], engine,
                                                            found[target.id].start, now)
                    diagnoses = diagnosis_engine.evaluate_target(
                        session, target.id, target.name, engine, now, config.window,
                        config.thresholds_for(target.name), hardware,
                        probe_baseline=baseline, data=found[target.id], probed=target.id in probed, prefill=prefill)
                    evaluated.extend((target.id, diagnosis) for diagnosis in diagnoses)
            del found  # a chunk's samples are dropped before the next is read: bounded memory
    saved: list[dict] = []  # each diagnosis as saved, converted once (a round may hold 1,000s)
    with sessions.begin() as session:  # the results in one short write transaction
        open_rows = diagnosis_repository.all_open_findings(session)  # one query each, not one per target
        stored = diagnosis_repository.diagnosis_rows(session)
        for target_id, diagnosis in evaluated:
            transitions = diagnosis_engine.apply_lifecycle(session, target_id, diagnosis, config.thresholds,
                                                           now, open_rows.get((target_id, diagnosis.model), []),
                                                           flush=False)
            data = diagnosis.to_dict()
            diagnosis_repository.save_diagnosis(session, target_id, diagnosis.model, diagnosis.verdict, now, data,
                                                stored)
            results.append((diagnosis, transitions))
            saved.append(data)
        _same_columns(session)
        session.flush()
        states = {(name, row.model, row.regime): row.state
                  for name, row in diagnosis_repository.finding_history(session, states=("pending", "active"))}
    if keep is not None:
        keep(RoundSummaries(now - config.window, now, summaries, time.monotonic() - began))
    if collector is not None:
        collector.diagnoses = [_exported(diagnosis, data, states) for (diagnosis, _), data in zip(results, saved,
                                                                                                  strict=True)]
    return results


def _same_columns(session: Session) -> None:
    """Mark the same columns changed on every updated finding and diagnosis, so the flush sends
    one UPDATE per table with all rows (an executemany) instead of one per row: the ORM
    batches only consecutive rows whose changed columns are the same."""
    for row in list(session.dirty):
        columns = _FINDING_COLUMNS if isinstance(row, FindingRow) else \
            _DIAGNOSIS_COLUMNS if isinstance(row, DiagnosisRow) else ()
        for column in columns:
            flag_modified(row, column)


_FINDING_COLUMNS = ("state", "severity", "confidence", "is_primary", "summary", "details", "last_seen",
                    "activated_at", "resolved_at", "consecutive", "clear_count")
_DIAGNOSIS_COLUMNS = ("verdict", "evaluated_at", "details", "digest", "digest_at")


def _exported(diagnosis: Diagnosis, data: dict, states: dict[tuple[str, str, str], str]) -> dict:
    """The saved ``Diagnosis.to_dict()`` with each finding's lifecycle state (pending until stored
    otherwise); a copy, so the saved row keeps the dict it was given."""
    return {**data, "findings": [{**finding, "state": states.get((diagnosis.target, diagnosis.model,
                                                                  finding["regime"]), "pending")}
                                 for finding in data["findings"]]}
