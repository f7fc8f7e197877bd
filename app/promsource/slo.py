"""SLIs of the replicas a Prometheus source reads, computed by PromQL on its server.

Per SLO and window, one query for every replica of a source (the source's histogram query,
app/promsource/queries.py: ``sum by (<target labels>, model, le) (increase(x_bucket[w]))``
with ``_count``; once an engine's bucket layout is known, its bucket at the threshold alone,
one series of ~20), then good = the increase of the bucket at the threshold and total = the
increase of the count, summed over the replica's models. A replica whose histogram has no
bucket at the threshold gets that error and is not evaluated.

The period (28 d by default) is asked less often than the alert windows: its answer, and where
each replica's data on the server begins (``min_over_time(timestamp(x_count)[period:4m])``),
are reused for a thousandth of the period, at most 5 min - the budget of a 28 d period moves by
less than 0.02 % of the period in that time, while the query reads the whole period of every
replica. The alert windows are asked every round. Where a server holds less than a window (its
retention is shorter than the period, or the replica is new), the sums cover what it holds and
that coverage is reported, as for the built-in store.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from sqlalchemy.orm import Session, sessionmaker

from app.core.quantiles import WindowHistogram
from app.promsource.reader import FIRST_SEEN_STEP
from app.promsource.service import SourceService
from app.slo import buckets
from app.slo.config import SloObjective
from app.slo.record import matched_targets
from app.slo.status import SloErrors, SloSums
from app.store.models import SOURCE_KIND, Target
from app.targets import repository as target_repository


def source_sums(sessions: sessionmaker[Session], sources: SourceService, slos: Sequence[SloObjective],
                now: float) -> tuple[SloSums, SloErrors]:
    """Every SLO's sums over its windows and period for the replicas sources read, and the
    replicas that could not be evaluated (source down, threshold not a bound). Runs outside any
    transaction: the queries may take a while."""
    with sessions() as session:
        targets = [t for t in target_repository.list_targets(session) if t.source == SOURCE_KIND]
        session.expunge_all()
    sums: SloSums = {}
    errors: SloErrors = {}
    for slo in slos:
        chosen = matched_targets(session, slo, targets)
        if not chosen:
            continue
        windows = list(slo.windows())
        found, failed = sources.histograms_over(chosen, slo.signal, windows, now, slo.threshold)
        ids = tuple(sorted(t.id for t in chosen))
        asked_at, (period_found, period_failed, first_seen) = sources.reused(
            ("slo period", slo.name, slo.signal, slo.period, ids), now, period_reuse(slo.period),
            partial(_period, sources, chosen, slo, now), keep=lambda answer: not answer[1])
        mine, wrong = sums.setdefault(slo.name, {}), errors.setdefault(slo.name, {})
        for target in chosen:
            if target.id in failed or target.id in period_failed:
                wrong[target.id] = "its Prometheus source could not answer"
                continue
            per_span = []
            answers = [*zip(windows, found.get(target.id, []), strict=True),
                       (slo.period, period_found.get(target.id, {}))]
            for i, (span, by_model) in enumerate(answers):
                end = asked_at if i == len(windows) else now
                good = total = 0.0
                for model, histogram in sorted(by_model.items()):
                    index = buckets.bound_index(histogram.bounds, slo.threshold)
                    if index is None:
                        wrong[target.id] = (buckets.not_a_bound(histogram.bounds, slo.threshold,
                                                                f"{target.name}'s {slo.signal} histogram"
                                                                f"{f' (model {model})' if model else ''}")
                                            or "") + " - this target is not evaluated"
                        break
                    if histogram.count == histogram.count:  # NaN: no _count series in the answer
                        good, total = good + histogram.increases[index], total + histogram.count
                per_span.append((good, total, _oldest(end - span, first_seen.get(target.id))
                                 if total > 0 else None))
            if target.id not in wrong and per_span:
                mine[target.id] = per_span
    return sums, errors


def period_reuse(period: float) -> float:
    """How long a period's answer is reused: a thousandth of the period, at most 5 min."""
    return min(300.0, period / 1000.0)


def _period(sources: SourceService, chosen: Sequence[Target], slo: SloObjective, now: float
            ) -> tuple[dict[int, dict[str, WindowHistogram]], set[int], dict[int, float]]:
    """The period's histograms and where each replica's data begins, and who could not answer."""
    found, failed = sources.histograms_over(chosen, slo.signal, [slo.period], now, slo.threshold)
    first_seen, unknown = sources.first_seen(chosen, slo.signal, slo.period, now)
    return {k: v[0] for k, v in found.items()}, failed | unknown, first_seen


def _oldest(start: float, first_seen: float | None) -> float:
    """Where a window's data begins: its start, or the replica's first sample if that is later
    by more than the step it is known to (a replica older than the window covers all of it)."""
    if first_seen is None or first_seen <= start + FIRST_SEEN_STEP:
        return start
    return first_seen
