"""The change-events round asks a source for what its facts read and no more: each histogram's
``_sum``/``_count``, the load gauges and the request, token, prefix-cache and KV-transfer counters,
the configuration, scrapes and restarts - no bucket, no other gauge, no per-rank loads, no ITL by
batch size (that comes with the ITL histogram)."""

from __future__ import annotations

from app.attribution.rounds import ROUND_SCALARS, ROUND_SIGNALS
from app.promsource.queries import COUNTER_FAMILIES, GAUGE_FAMILIES, SourceQueries
from app.promsource.reader import SourceReader
from tests.promsource.test_hostile_answers import START, ScriptedPrometheus


class Recording(ScriptedPrometheus):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def query(self, promql: str, time: float):  # type: ignore[no-untyped-def]
        self.asked.append(promql)
        return super().query(promql, time)

    def query_range(self, promql: str, start: float, end: float, step: float):  # type: ignore[no-untyped-def]
        self.asked.append(promql)
        return super().query_range(promql, start, end, step)

    def query_samples(self, selector: str, time: float):  # type: ignore[no-untyped-def]
        self.asked.append(selector)
        return super().query_samples(selector, time)


def test_the_events_round_reads_only_what_its_facts_use() -> None:
    client = Recording()
    reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
    q = SourceQueries(("namespace", "pod"), reader.matchers)
    start, end = START, START + 120.0
    windows = reader.windows(start, end, ROUND_SIGNALS, diagnosis=True, buckets=(), scalars=ROUND_SCALARS)
    gauges = [s for s in ROUND_SCALARS if GAUGE_FAMILIES.get(s)]
    counters = [s for s in ROUND_SCALARS if COUNTER_FAMILIES.get(s)]
    assert gauges == ["running", "waiting"] and len(counters) == 6
    expected = {*(q.histogram(s, 120.0, buckets=False) for s in ROUND_SIGNALS), *(q.gauge(s, 120.0) for s in gauges),
                *(q.counter(s, 120.0) for s in counters), q.infos(), q.scrapes(120.0), q.restarts(120.0)}
    assert sorted(client.asked) == sorted(expected)
    assert not any("_bucket" in text for text in client.asked)
    good = windows[("llm", "good")]
    assert set(good.overall.gauges) == {"running", "waiting"} and good.restarts == 0 and good.scrapes == 20
    assert all(h.means_only for h in good.overall.histograms.values())
    # the diagnosis round's read of the same window asks for every gauge, the ranks and the ITL split
    client.asked.clear()
    reader.windows(start, end, [*ROUND_SIGNALS, "itl"], diagnosis=True)
    assert len(client.asked) > len(expected) + 10
    assert q.rank_gauges(120.0) in client.asked
