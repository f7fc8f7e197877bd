"""Downsampled levels answer windows exactly: the same WindowHistogram / rate as the raw
samples (and as Prometheus 2.42 over the same samples), across counter resets, engine
restarts, gaps and samples on interval boundaries."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

import pytest

from app.core import quantiles
from app.core.quantiles import HistogramSnapshot
from app.sources.base import Canonical, CanonicalHistogram, CanonicalScalar
from app.store import levels, reads, repository, retention
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter

BOUNDS = (0.1, 0.5, 1.0, 2.5, math.inf)
HOUR = 3600.0


@dataclass
class History:
    snapshots: list[HistogramSnapshot]
    tokens: list[tuple[float, float]]


def make_history(t0: float, hours: float, seed: int = 7) -> History:
    """15 s scrapes (the first hour exactly on the grid, so samples fall on 5 min and 1 h
    boundaries; later with millisecond jitter), two engine restarts, one bucket that drops
    on its own (a per-series reset), and a 10-minute gap (engine down)."""
    rng = random.Random(seed)
    counts = [0.0] * len(BOUNDS)
    total, tokens = 0.0, 0.0
    snaps, toks = [], []
    restarts = {int(1.5 * 240), int(4.2 * 240)}
    n = int(hours * 240)
    for i in range(n):
        if 2 * 240 + 10 <= i < 2 * 240 + 50:
            continue  # down
        ts = t0 + i * 15.0 + (0.0 if i < 240 else rng.randint(0, 900) / 1000)
        if i in restarts:
            counts, total, tokens = [0.0] * len(BOUNDS), 0.0, 0.0
        new = [rng.randint(0, 5) for _ in BOUNDS]
        running = 0.0
        for b in range(len(BOUNDS)):
            running += new[b]
            counts[b] += running
        total += sum(new) * rng.uniform(0.05, 2.0)
        tokens += rng.randint(100, 900)
        snap_counts = list(counts)
        if i == 3 * 240 + 7:
            snap_counts[1] = 0.0  # one bucket series drops alone (Prometheus: a reset of that series)
        snaps.append(HistogramSnapshot(ts, tuple(snap_counts), total, snap_counts[-1]))
        toks.append((ts, tokens))
    return History(snaps, toks)


def vector(s: HistogramSnapshot) -> tuple[float, ...]:
    return (*s.counts, s.sum, s.count)


def in_memory_timeline(raw: list[levels.Chunk], rows: dict[int, dict[int, levels.Chunk]],
                       segments: list[levels.Segment]) -> levels.Timeline:
    """What repository.timelines reads, from memory."""
    out: list[levels.Chunk] = []
    for seg in segments:
        if seg.level == 0:
            out.extend(c for c in raw if seg.lo_ms <= c.first_ms and (c.first_ms < seg.hi_ms
                                                                       or (seg.closed and c.first_ms == seg.hi_ms)))
        else:
            level_rows = rows[seg.level]
            out.extend(level_rows[b] for b in sorted(level_rows) if seg.lo_ms <= b and (
                b < seg.hi_ms or (seg.closed and b == seg.hi_ms)))
    return levels.Timeline(out)


def test_level_windows_equal_raw_windows_bit_for_bit() -> None:
    t0 = 1_700_006_400.0
    history = make_history(t0, 6)
    raw = levels.chunks_from_samples((s.ts, vector(s)) for s in history.snapshots)
    rows = {300: levels.downsample(raw, 300)}
    rows[3600] = levels.downsample([rows[300][b] for b in sorted(rows[300])], 3600)
    done = {300: t0 + 6 * HOUR, 3600: t0 + 6 * HOUR}
    rng = random.Random(1)
    windows = [(t0, t0 + 6 * HOUR), (t0 + 300, t0 + 5 * HOUR), (t0 + 299.5, t0 + 4 * HOUR + 0.25)]
    windows += [(a, a + rng.uniform(60, 5 * HOUR)) for a in (t0 + rng.uniform(0, HOUR) for _ in range(300))]
    windows += [(t0 + k * 300, t0 + k * 300 + m * 300) for k in range(0, 48, 5) for m in (1, 3, 12, 25)]
    coarse_reads = 0
    for start, end in windows:
        plan = levels.plan(start, end, None, done)
        timeline = in_memory_timeline(raw, rows, plan)
        selection = timeline.select(quantiles.to_millis(start), quantiles.to_millis(end))
        assert selection.exact
        ours = levels.histogram(BOUNDS, selection.chunk, quantiles.to_millis(start), quantiles.to_millis(end))
        assert ours == quantiles.window_histogram(BOUNDS, history.snapshots, start, end), (start - t0, end - t0)
        coarse_reads += len(timeline.chunks) < 40 < (end - start) / 15
    assert coarse_reads > 100  # long windows really were read from few rows


def test_old_edges_are_exact_on_interval_boundaries_and_bounded_otherwise() -> None:
    """Raw samples only for the last hour: a window whose old edges are on 5-minute
    boundaries is still exact; one that is not leaves out the straddling intervals (flagged)
    and undercounts by at most their increase."""
    t0 = 1_700_006_400.0
    history = make_history(t0, 6)
    raw_all = levels.chunks_from_samples((s.ts, vector(s)) for s in history.snapshots)
    rows = {300: levels.downsample(raw_all, 300)}
    rows[3600] = levels.downsample([rows[300][b] for b in sorted(rows[300])], 3600)
    raw_since = t0 + 5 * HOUR
    raw = [c for c in raw_all if c.first_ms >= raw_since * 1000]
    done = {300: t0 + 6 * HOUR, 3600: t0 + 6 * HOUR}
    for start, end in ((t0 + 600, t0 + 6 * HOUR - 7.5), (t0 + 300, t0 + 3 * HOUR), (t0, t0 + HOUR)):
        plan = levels.plan(start, end, raw_since, done)
        sel = in_memory_timeline(raw, rows, plan).select(quantiles.to_millis(start), quantiles.to_millis(end))
        assert sel.exact
        ours = levels.histogram(BOUNDS, sel.chunk, quantiles.to_millis(start), quantiles.to_millis(end))
        assert ours == quantiles.window_histogram(BOUNDS, history.snapshots, start, end)
    start, end = t0 + 450.0, t0 + 2 * HOUR + 130.0
    plan = levels.plan(start, end, raw_since, done)
    sel = in_memory_timeline(raw, rows, plan).select(quantiles.to_millis(start), quantiles.to_millis(end))
    assert not sel.exact
    ours = levels.histogram(BOUNDS, sel.chunk, quantiles.to_millis(start), quantiles.to_millis(end))
    exact = quantiles.window_histogram(BOUNDS, history.snapshots, start, end)
    inner = quantiles.window_histogram(BOUNDS, history.snapshots, t0 + 600, t0 + 2 * HOUR)
    assert ours is not None and exact is not None and inner is not None
    # samples used are those of the whole 5-minute intervals inside; the error is below the
    # increase of the two partial intervals (< 5 min of the window at each end)
    assert inner.count <= exact.count and ours.count >= inner.count
    edges = (quantiles.window_histogram(BOUNDS, history.snapshots, t0 + 300, t0 + 600).count
             + quantiles.window_histogram(BOUNDS, history.snapshots, t0 + 2 * HOUR, t0 + 2 * HOUR + 300).count)
    assert abs(ours.count - exact.count) <= edges * 1.2


# --------------------------------------------------------------------------- through the store


def write_history(engine, target_id: int, history: History) -> None:
    records = []
    for snap, (ts, tokens) in zip(history.snapshots, history.tokens):
        canonical = Canonical(engine="vllm")
        canonical.histograms.append(CanonicalHistogram("ttft", "m", "0", BOUNDS, snap.counts, snap.sum, snap.count))
        canonical.scalars.append(CanonicalScalar("generation_tokens_total", "counter", "m", "0", tokens))
        canonical.scalars.append(CanonicalScalar("kv_usage", "gauge", "m", "0", (ts % 97) / 100))
        records.append(ScrapeRecord(target_id, ts, True, 0.002, 1000, 40, 30, 0, "vllm", None, None, canonical))
    writer = SampleWriter(engine)
    for i in range(0, len(records), 200):
        assert writer.write(records[i:i + 200]) == len(records[i:i + 200])


def test_store_windows_from_levels_equal_raw_and_survive_raw_pruning(store) -> None:
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 8 * HOUR
    history = make_history(t0, 6)
    write_history(engine, target_id, history)
    written = retention.downsample(sessions, now=t0 + 7 * HOUR)
    intervals = len({s.ts // 300 for s in history.snapshots})
    assert intervals == 71  # the gap empties one 5-minute interval
    assert written == {300: 3 * intervals, 3600: 3 * 6}
    windows = [(t0, t0 + 6 * HOUR), (t0 + 1234.567, t0 + 5 * HOUR + 17.25), (t0 + 1800, t0 + 4 * HOUR)]
    before = {}
    with sessions() as session:
        for start, end in windows:
            stored = reads.load_windows(session, [target_id], ("ttft", "generation_tokens_total", "kv_usage"),
                                          start, end)
            rows_read = sum(len(t.chunks) for t in stored.timelines.values())
            assert rows_read < 0.2 * 3 * (end - start) / 15  # a fraction of the raw samples
            window = reads.store_window(session, [target_id], start, end)
            raw = quantiles.window_histogram(BOUNDS, history.snapshots, start, end)
            assert window.overall.histograms["ttft"] == raw
            assert window.overall.rates["generation_tokens_total"] == quantiles.rate(history.tokens, start, end)
            values = [(ts % 97) / 100 for ts, _ in history.tokens if start <= ts <= end]
            gauge = window.overall.gauges["kv_usage"]
            assert (gauge.last, gauge.max) == (values[-1], max(values))
            assert gauge.mean == pytest.approx(sum(values) / len(values), rel=1e-12)
            before[(start, end)] = window.overall.histograms["ttft"]
        series = reads.quantile_series(session, [target_id], "ttft", 0.99, 5 * HOUR, 300.0, HOUR, t0 + 6 * HOUR)
    assert len(series) == 61
    for point in series:
        window = quantiles.window_histogram(BOUNDS, history.snapshots, point["ts"] - HOUR, point["ts"])
        expected = quantiles.histogram_quantile(0.99, BOUNDS, window.increases) if window else None
        assert point["value"] == expected and point["count"] == (window.count if window else None)
    # raw samples go after raw_retention; the aligned windows read the levels alone, same numbers
    deleted = retention.prune(sessions, 7 * 86400.0, now=t0 + 7 * HOUR, raw_retention=HOUR)
    with sessions() as session:
        raw_since, done = repository.level_progress(session)
        assert raw_since == t0 + 6 * HOUR and done == {300: t0 + 7 * HOUR - 300, 3600: t0 + 6 * HOUR}
        if engine.dialect.name == "sqlite":
            assert deleted["scrape_samples"] == len(history.snapshots)
            assert repository.histogram_snapshots(session, list(range(1, 10)), 0, 2 * t0) == {}
        for start, end in ((t0, t0 + 6 * HOUR), (t0 + 1800, t0 + 4 * HOUR)):
            assert reads.store_window(session, [target_id], start, end).overall.histograms["ttft"] == before[
                (start, end)]


def test_pruning_never_holds_the_writer_for_long(store) -> None:
    """Retention on SQLite deletes at most ``batch_rows`` rows per statement and transaction
    (a waiting scrape batch waits for one small statement); PostgreSQL deletes no sample
    row at all, it drops the expired hour partitions."""
    engine, sessions, target_id = store
    t0 = 1_700_006_400.0  # a UTC midnight
    history = make_history(t0, 1)
    write_history(engine, target_id, history)
    statements: list[tuple[str, tuple]] = []
    from sqlalchemy import event

    @event.listens_for(engine, "before_cursor_execute")
    def spy(conn, cursor, statement, parameters, context, executemany):
        if "scrape_samples" in statement and (statement.startswith(("DELETE", "DROP"))):
            statements.append((statement, parameters))

    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            from app.store import partitions
            partitions.ensure_ahead(conn, t0)  # the samples move from the default partition to their hour's
        deleted = repository.prune_samples(engine, t0 + 86400, t0 + 86400)
        assert deleted["scrape_samples_partitions"] == 24  # the hours of the day before the cut-off
        assert [s for s, _ in statements] == [f'DROP TABLE "scrape_samples_h20231115{h:02d}"' for h in range(24)] + [
            "DELETE FROM \"scrape_samples_default\" WHERE ts < %(b)s"]
        return
    deleted = repository.prune_samples(engine, t0, t0 + HOUR + 1, raw_batch_rows=50)
    assert deleted["scrape_samples"] == 240
    assert len(statements) == 5
    for statement, (low, high, cutoff) in statements:
        assert statement.startswith("DELETE FROM scrape_samples WHERE rowid > ? AND rowid <= ?")
        assert high - low <= 50 and cutoff == t0 + HOUR + 1


# --------------------------------------------------------------------------- Prometheus 2.42 as the oracle

PROM_T0 = math.floor(time.time() / HOUR) * HOUR - 8 * HOUR  # recent: inside Prometheus' default retention


def exposition(snap: HistogramSnapshot, tokens: float) -> str:
    lines = [f'ttft_bucket{{le="{"+Inf" if math.isinf(b) else repr(b)}"}} {c!r}' for b, c in zip(BOUNDS, snap.counts)]
    return "\n".join([*lines, f"ttft_sum {snap.sum!r}", f"ttft_count {snap.count!r}", f"tokens_total {tokens!r}"])


@pytest.fixture(scope="module")
def prometheus_over_history(tmp_path_factory: pytest.TempPathFactory):
    from app.promql.client import PrometheusClient
    from tests.support.backfill import Backfill
    from tests.support.prometheus import running_prometheus

    history = make_history(PROM_T0, 6)
    backfill = Backfill()
    for snap, (_, tokens) in zip(history.snapshots, history.tokens):
        backfill.add({"job": "engines", "instance": "t1"}, snap.ts, exposition(snap, tokens))
    tmp = tmp_path_factory.mktemp("levels-prometheus")
    backfill.write_tsdb(tmp, tmp / "prom" / "prometheus-data")
    with running_prometheus(tmp / "prom", "scrape_configs: []") as prom:
        client = PrometheusClient(prom.url, timeout=60)
        try:
            yield history, client
        finally:
            client.close()


def test_levels_answer_what_prometheus_answers(store, prometheus_over_history) -> None:
    """The same history in Prometheus 2.42 (promtool backfill) and in the store with its raw
    samples pruned: windows on 5-minute boundaries read from the levels alone give
    Prometheus' per-bucket increase(), histogram_quantile and rate()."""
    history, prom = prometheus_over_history
    engine, sessions, target_id = store
    t0 = PROM_T0
    write_history(engine, target_id, history)
    retention.downsample(sessions, now=t0 + 7 * HOUR)
    retention.prune(sessions, 7 * 86400.0, now=t0 + 7 * HOUR, raw_retention=HOUR)
    checked = 0
    with sessions() as session:
        for start, end in ((t0, t0 + 6 * HOUR), (t0 + 1800, t0 + 4 * HOUR), (t0 + HOUR, t0 + 5 * HOUR + 900)):
            window = reads.store_window(session, [target_id], start, end)
            ours = window.overall.histograms["ttft"]
            assert ours is not None
            w = f"{round(end - start)}s"
            theirs = {s.labels["le"]: s.value for s in prom.query(f"increase(ttft_bucket[{w}])", end).data}
            for bound, value in zip(BOUNDS, ours.increases):
                assert value == pytest.approx(theirs["+Inf" if math.isinf(bound) else repr(bound)], rel=1e-12)
                checked += 1
            (count,) = prom.query(f"increase(ttft_count[{w}])", end).data
            assert ours.count == pytest.approx(count.value, rel=1e-12)
            (p99,) = prom.query(f"histogram_quantile(0.99, sum by (le) (increase(ttft_bucket[{w}])))", end).data
            assert quantiles.histogram_quantile(0.99, BOUNDS, ours.increases) == pytest.approx(p99.value, rel=1e-12)
            (tokens,) = prom.query(f"rate(tokens_total[{w}])", end).data
            assert window.overall.rates["generation_tokens_total"] == pytest.approx(tokens.value, rel=1e-12)
    assert checked == 15


def test_migration_0007_converts_existing_samples_and_builds_levels(database_url: str) -> None:
    """Data written under 0006 (counts as comma-joined text) is converted to the binary
    encoding and (0012) to one row a scrape, PostgreSQL's tables become partitioned, the
    levels are built from it and answer windows as the raw samples do; the downgrade gives
    the rows and the text back."""
    import sqlalchemy as sa

    from app.store import db

    db.upgrade(database_url, "0006")
    engine = db.make_engine(database_url)
    t0 = math.floor(time.time() / HOUR) * HOUR - 5 * HOUR
    history = make_history(t0, 3)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO targets (id, name, url, engine, labels, source, created_at, updated_at) "
                             "VALUES (1, 't1', 'http://127.0.0.1:1/metrics', 'vllm', '{}', 'api', 0, 0)"))
        conn.execute(sa.text("INSERT INTO series (id, target_id, signal, kind, model, rank, bounds) VALUES "
                             "(1, 1, 'ttft', 'histogram', 'm', '0', :b), "
                             "(2, 1, 'generation_tokens_total', 'counter', 'm', '0', '')"),
                     {"b": repository.encode_floats(BOUNDS)})
        conn.execute(sa.text("INSERT INTO histogram_samples (series_id, ts, counts, sum, count) "
                             "VALUES (1, :ts, :counts, :sum, :count)"),
                     [{"ts": s.ts, "counts": ",".join(map(repr, s.counts)), "sum": s.sum, "count": s.count}
                      for s in history.snapshots])
        conn.execute(sa.text("INSERT INTO scalar_samples (series_id, ts, value) VALUES (2, :ts, :v)"),
                     [{"ts": ts, "v": v} for ts, v in history.tokens])
    db.upgrade(database_url)
    sessions = db.make_sessionmaker(engine)
    with sessions() as session:
        stored = repository.histogram_snapshots(session, [1], 0, 2 * t0)[1]
        assert [(p.ts, p.counts, p.sum) for p in stored] == [(s.ts, s.counts, s.sum) for s in history.snapshots]
        _, done = repository.level_progress(session)
        assert done[300] >= t0 + 3 * HOUR and done[3600] >= t0 + 3 * HOUR
        levels_rows = session.execute(sa.text("SELECT count(*) FROM sample_levels WHERE level = 300")).scalar()
        assert levels_rows == 2 * len({s.ts // 300 for s in history.snapshots})
        start, end = t0 + 600, t0 + 3 * HOUR
        stored_windows = reads.load_windows(session, [1], ("ttft", "generation_tokens_total"), start, end)
        ref = next(s for s in stored_windows.series if s.signal == "ttft")
        assert stored_windows.window(ref, start, end) == quantiles.window_histogram(
            BOUNDS, history.snapshots, start, end)
        assert sum(len(t.chunks) for t in stored_windows.timelines.values()) < 40
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            kinds = dict(conn.execute(sa.text("SELECT relname, relkind FROM pg_class WHERE relname IN "
                                              "('scrape_samples', 'sample_levels')")).all())
        assert kinds == {"scrape_samples": "p", "sample_levels": "p"}
    engine.dispose()
    db.downgrade(database_url, "0006")
    engine = db.make_engine(database_url)
    with engine.connect() as conn:
        texts = [row[0] for row in conn.execute(sa.text("SELECT counts FROM histogram_samples ORDER BY ts"))]
        tokens = conn.execute(sa.text("SELECT ts, value FROM scalar_samples WHERE series_id = 2 ORDER BY ts")).all()
    assert texts == [",".join(map(repr, map(float, s.counts))) for s in history.snapshots]
    assert [tuple(row) for row in tokens] == history.tokens  # through 0012's one row a scrape and back
    engine.dispose()


def test_a_late_write_reopens_the_levels_it_falls_in(store) -> None:
    """Samples written after their interval was downsampled (a batch kept through an outage)
    move the levels' progress back, reads use raw samples there until the round rebuilds
    them, and the rebuilt levels include the late samples."""
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 5 * HOUR
    history = make_history(t0, 3)
    late = [i for i, s in enumerate(history.snapshots) if t0 + 3000 <= s.ts < t0 + 3300]
    on_time = History([s for i, s in enumerate(history.snapshots) if i not in late],
                      [p for i, p in enumerate(history.tokens) if i not in late])
    write_history(engine, target_id, on_time)
    retention.downsample(sessions, now=t0 + 4 * HOUR)
    write_history(engine, target_id, History([history.snapshots[i] for i in late], [history.tokens[i] for i in late]))
    with sessions() as session:
        _, done = repository.level_progress(session)
        assert done == {300: t0 + 3000, 3600: t0}
        window = reads.store_window(session, [target_id], t0, t0 + 3 * HOUR)
        assert window.overall.histograms["ttft"] == quantiles.window_histogram(BOUNDS, history.snapshots, t0,
                                                                               t0 + 3 * HOUR)
    retention.downsample(sessions, now=t0 + 4 * HOUR)
    with sessions() as session:
        _, done = repository.level_progress(session)
        assert done == {300: t0 + 4 * HOUR - 300, 3600: t0 + 3 * HOUR}
        stored = reads.load_windows(session, [target_id], ("ttft",), t0, t0 + 3 * HOUR)
        assert sum(len(t.chunks) for t in stored.timelines.values()) == 3  # the hourly rows alone
        assert stored.window(stored.series[0], t0, t0 + 3 * HOUR) == quantiles.window_histogram(
            BOUNDS, history.snapshots, t0, t0 + 3 * HOUR)


# --------------------------------------------------------------------------- the finest level built at write time

LEVEL_COLUMNS = "series_id, level, bucket, n, first_ts, first, last_ts, last, resets, total, peak"


def stored_levels(engine) -> dict[tuple[int, int, float], tuple]:
    """Every sample_levels row by (series, level, bucket), blobs as bytes."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {LEVEL_COLUMNS} FROM sample_levels"))
        return {tuple(row[:3]): tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows}


def rebuilt_levels(engine, sessions, now: float) -> dict[tuple[int, int, float], tuple]:
    """The rows a round builds from raw samples alone (no row from a writer)."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sample_levels"))
        conn.execute(text("DELETE FROM level_progress"))
    retention.downsample(sessions, now=now)
    return stored_levels(engine)


def scrape(target_id: int, snap: HistogramSnapshot, tokens: float, i: int) -> ScrapeRecord:
    """One scrape of the history, with a gauge that is sometimes -0.0 (SQLite reads it back as 0.0)."""
    canonical = Canonical(engine="vllm")
    canonical.histograms.append(CanonicalHistogram("ttft", "m", "0", BOUNDS, snap.counts, snap.sum, snap.count))
    canonical.scalars.append(CanonicalScalar("generation_tokens_total", "counter", "m", "0", tokens))
    canonical.scalars.append(CanonicalScalar("kv_usage", "gauge", "m", "0", -0.0 if i % 3 == 0 else (i % 7) / 10))
    return ScrapeRecord(target_id, snap.ts, True, 0.002, 1000, 40, 30, 0, "vllm", None, None, canonical)


def scrapes(target_id: int, history: History) -> list[ScrapeRecord]:
    return [scrape(target_id, s, tokens, i) for i, (s, (_, tokens)) in enumerate(zip(history.snapshots,
                                                                                      history.tokens))]


def with_edge_samples(history: History, t0: float) -> History:
    """The history plus a sample 0.4 ms before a 5-minute boundary (it rounds onto the boundary:
    the later interval), one 0.6 ms before another (the earlier interval), and a second sample
    in the same millisecond as an existing one (the first is kept)."""
    snaps, toks = list(history.snapshots), list(history.tokens)

    def insert_after(index: int, ts: float) -> None:
        s = snaps[index]
        snaps.insert(index + 1, HistogramSnapshot(ts, tuple(c + 1 for c in s.counts), s.sum + 0.5, s.count + 1))
        toks.insert(index + 1, (ts, toks[index][1] + 7))

    for boundary, offset in ((t0 + 5400, -0.0004), (t0 + 6000, -0.0006)):
        i = max(k for k, s in enumerate(snaps) if s.ts < boundary + offset)
        insert_after(i, boundary + offset)
    i = next(k for k, s in enumerate(snaps) if s.ts > t0 + 4000)
    insert_after(i, snaps[i].ts + 0.0002)
    assert quantiles.to_millis(snaps[i].ts) == quantiles.to_millis(snaps[i + 1].ts)
    return History(snaps, toks)


def test_a_run_fed_sample_by_sample_is_the_combined_chunk() -> None:
    """What the writer accumulates (``Run.append`` per raw sample) is ``combine`` of the raw
    chunks, interval by interval, resets and restarts included."""
    t0 = 1_700_006_400.0
    raw = levels.chunks_from_samples((s.ts, vector(s)) for s in make_history(t0, 5).snapshots)
    by_interval: dict[int, list[levels.Chunk]] = {}
    for c in raw:
        by_interval.setdefault(c.first_ms // 300_000, []).append(c)
    with_resets = 0
    for group in by_interval.values():
        run = levels.Run()
        for c in group:
            run.append(c.first_ms, c.first)
        assert run.chunk() == levels.combine(group)
        with_resets += bool(run.resets)
    assert with_resets == 2  # a restart and the bucket that drops alone (the other restart is on a boundary)


def test_write_time_rows_equal_the_rows_built_from_raw_samples(store) -> None:
    """Counter resets, engine restarts, a gap, samples on and next to 5-minute boundaries and
    two in one millisecond: every row a writer put in is the row the round builds from the
    raw samples, bit for bit, and after the round every row is."""
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 6 * HOUR
    history = with_edge_samples(make_history(t0, 5), t0)
    records = scrapes(target_id, history)
    writer = SampleWriter(engine)
    for i in range(0, len(records), 37):
        writer.write(records[i:i + 37])
    from_writer = stored_levels(engine)
    # every interval but the open last one and the one before the gap (a writer leaves that one to the round)
    assert len(from_writer) == 3 * (len({quantiles.to_millis(s.ts) // 300_000 for s in history.snapshots}) - 2)
    now = t0 + 6 * HOUR
    retention.downsample(sessions, now=now)
    after_round = stored_levels(engine)
    rebuilt = rebuilt_levels(engine, sessions, now)
    assert after_round == rebuilt
    assert {key: rebuilt[key] for key in from_writer} == from_writer
    # the boundary samples are where Python puts them, in SQL too (else the round would rebuild)
    with engine.connect() as conn:
        counts = repository.raw_counts(conn, [target_id], 300, t0 + 5100, t0 + 6300)
    assert {ms / 1000 - t0: n for (_, ms), n in counts.items()} == {5100: 20, 5400: 21, 5700: 21, 6000: 20}


def test_a_hand_over_within_an_interval_is_rebuilt_exactly(store) -> None:
    """Two replicas' writers write the same series in turns (a target handed over and back
    inside 5-minute intervals): each writer's rows miss the other's samples, the round sees
    the counts differ and rebuilds them."""
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR
    records = scrapes(target_id, make_history(t0, 1.5))
    writers = [SampleWriter(engine), SampleWriter(engine)]
    for turn, i in enumerate(range(0, len(records), 7)):
        assert writers[turn % 2].write(records[i:i + 7]) == len(records[i:i + 7])
    partial = [row for row in stored_levels(engine).values() if row[3] < 20]
    assert partial  # the scenario really left rows holding part of an interval
    now = t0 + 3 * HOUR
    written = retention.downsample(sessions, now=now)
    assert written[300] == 3 * 18
    assert stored_levels(engine) == rebuilt_levels(engine, sessions, now)


def test_a_late_batch_leaves_exact_rows(store) -> None:
    """Older samples written after newer ones (a batch kept through an outage), before and
    after the round passed them: the writer drops what it held, the round rebuilds."""
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 4 * HOUR
    records = scrapes(target_id, make_history(t0, 2.5))
    late = records[100:130] + records[300:310]
    on_time = [r for r in records if r not in late]
    writer = SampleWriter(engine)
    on_time_a = [r for r in on_time if r.ts < t0 + 5000]
    writer.write(on_time_a)
    retention.downsample(sessions, now=t0 + 5000)  # the intervals of records[100:130] are done by now
    writer.write([r for r in on_time if r.ts >= t0 + 5000][:40])
    writer.write(late)
    writer.write([r for r in on_time if r.ts >= t0 + 5000][40:])
    before_round = stored_levels(engine)
    now = t0 + 4 * HOUR
    retention.downsample(sessions, now=now)
    after_round = stored_levels(engine)
    assert sum(1 for key in after_round if key[1] == 300) == 3 * 29  # the gap empties one interval
    rebuilt = rebuilt_levels(engine, sessions, now)
    assert after_round == rebuilt
    # a writer's row is exact or holds part of its interval's samples, never a late one
    partial = [key for key, row in before_round.items() if row != rebuilt[key]]
    assert partial and all(before_round[key][3] < rebuilt[key][3] for key in partial)


def test_the_round_reads_no_raw_sample_when_the_writer_rows_are_complete(store) -> None:
    """Every interval's row is in from the writer with all its samples: the round counts
    samples in SQL and reads no raw sample row; it rebuilds none."""
    from tests.api.conftest import counted_statements

    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR
    records = scrapes(target_id, make_history(t0, 2))
    writer = SampleWriter(engine)
    for i in range(0, len(records), 50):
        writer.write(records[i:i + 50])
    from_writer = stored_levels(engine)
    assert len(from_writer) == 3 * 23  # the last interval is still open
    with counted_statements(engine) as statements:
        written = retention.downsample(sessions, now=t0 + 2 * HOUR - 300 + levels.GRACE_SECONDS)
    assert written == {300: 3 * 23, 3600: 3 * 1}
    raw_reads = [s for s in statements if "_samples" in s and "count(*)" not in s]
    assert raw_reads == ["SELECT min(scrape_samples.ts) AS min_1 \nFROM scrape_samples"]
    assert [s.split()[0] for s in statements if "sample_levels" in s].count("DELETE") == 1  # the hourly slice's
    assert {k: v for k, v in stored_levels(engine).items() if k[1] == 300} == from_writer


def test_a_writer_puts_in_no_row_for_an_interval_long_past(store) -> None:
    """A replica that wrote part of an interval, handed the target over and writes it again a
    day later (the interval's row long built by the round, maybe pruned) adds no row for it."""
    engine, sessions, target_id = store
    t0 = math.floor(time.time() / HOUR) * HOUR - 30 * HOUR
    records = scrapes(target_id, make_history(t0, 0.1))
    writer = SampleWriter(engine)
    writer.write(records[:5])
    writer.write([replace(records[5], ts=records[5].ts + 86400)])
    assert stored_levels(engine) == {}
    writer.write([replace(records[6], ts=records[6].ts + 86400), replace(records[20], ts=records[20].ts + 86400)])
    assert [key[2] - t0 for key in stored_levels(engine)] == [86400.0] * 3  # the next interval's row is in
