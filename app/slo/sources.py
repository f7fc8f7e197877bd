"""SLIs of the replicas a Prometheus source reads, computed by PromQL on its server.

Per SLO and window, one query for every replica of a source (the source's histogram query,
app/promsource/queries.py: ``sum by (<target labels>, model, le) (increase(x_bucket[w]))``
with ``_count``), then good = the increase of the bucket at the threshold and total = the
increase of the count, summed over the replica's models. A replica whose histogram has no
bucket at the threshold gets that error and is not evaluated. Windows longer than what the
server keeps are answered over what it holds (``increase`` over a partial range), which the
SLO's note says.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from app.promsource.service import SOURCE_KIND, SourceService
from app.slo import buckets
from app.slo.config import SloObjective
from app.slo.record import matched_targets
from app.store import repository

#: per SLO name: per target id, (good, total, oldest) per span
Sums = dict[str, dict[int, list[tuple[float, float, float | None]]]]
Errors = dict[str, dict[int, str]]


def source_sums(sessions: sessionmaker[Session], sources: SourceService, slos: Sequence[SloObjective],
                now: float) -> tuple[Sums, Errors]:
    """Every SLO's sums over its windows and period for the replicas sources read, and the
    replicas that could not be evaluated (source down, threshold not a bound). Runs outside any
    transaction: the queries may take a while."""
    with sessions() as session:
        targets = [t for t in repository.list_targets(session) if t.source == SOURCE_KIND]
        session.expunge_all()
    sums: Sums = {}
    errors: Errors = {}
    for slo in slos:
        chosen = matched_targets(session, slo, targets)
        if not chosen:
            continue
        spans = [*slo.windows(), slo.period]
        found, failed = sources.histograms_over(chosen, slo.signal, spans, now)
        mine, wrong = sums.setdefault(slo.name, {}), errors.setdefault(slo.name, {})
        for target in chosen:
            if target.id in failed:
                wrong[target.id] = "its Prometheus source could not answer"
                continue
            per_span = []
            for span, by_model in zip(spans, found.get(target.id, []), strict=True):
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
                # coverage of a source's data is not known from one instant query: taken as the span
                per_span.append((good, total, now - span if total > 0 else None))
            if target.id not in wrong and per_span:
                mine[target.id] = per_span
    return sums, errors
