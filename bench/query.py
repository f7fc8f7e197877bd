"""Query benchmark: windows over days of history, ours against Prometheus 2.42 in the same run.

Not a test. Builds ``--days`` of 15 s history for ``--targets`` targets through the service's
write path (``SampleWriter.write`` of the canonical samples of the real vLLM 0.32 page, with
simulated timestamps, counters growing and one engine restart per target per day), runs the
downsampling round, prunes raw samples older than the raw period (``--raw-hours``, the
default 24 h), then times, on SQLite and PostgreSQL:

* ``latency`` (``app.store.reads.latency_report``, every signal, per model) at 5m / 1h / 24h / 7d,
* ``series`` TTFT q=0.99 over 24h and 7d at step 5m and 1h (lookback 5m, the API's default),
* fleet latency (all targets summed by ``le``) at 1h / 24h,

p50 and p99 over ``--repeats`` calls each. The baseline is Debian's Prometheus 2.42 holding
the same samples (``promtool tsdb create-blocks-from openmetrics``, canonical metric names)
asked the same questions over HTTP: for a ``latency`` answer, the bucket increases of every
histogram signal, the rate of every counter and avg/max/last of every gauge (20 queries, as a
dashboard asks them); for ``series`` one ``query_range``. Storage: bytes per target-day of
the sample tables in the steady state of the default retention (raw samples for the raw
period, levels for 7 days) and of Prometheus' data directory (blocks + index).

The status page is not measured here (it reads the summaries of the rounds; bench/load.py).

    python -m bench.query --quick            # 3 targets x 2 days, Prometheus over the same history
    python -m bench.query                    # 20 targets x 7 days (long: tens of minutes on 2 cores)
    python -m bench.query --skip-postgres --skip-prometheus
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.exposition.parser import PageParser  # noqa: E402
from app.sources import ADAPTERS  # noqa: E402
from app.sources.base import Canonical, CanonicalHistogram, CanonicalScalar  # noqa: E402
from app.store import reads  # noqa: E402
from app.store.encoding import encode_counts  # noqa: E402
from app.store.record import ScrapeRecord  # noqa: E402
from app.store.repository import encode_floats  # noqa: E402

PAGE = ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom"
DAY = 86400.0
INTERVAL = 15.0


def template() -> Canonical:
    adapter = ADAPTERS["vllm"]
    return adapter.to_canonical(PageParser(keep=adapter.families.__contains__).parse(PAGE.read_bytes()))


@dataclass
class Engine:
    """One simulated engine: counters grow by rotating increment patterns; ``restart`` zeroes them."""

    base: Canonical
    rng: random.Random
    counts: list[list[float]] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    scalars: list[float] = field(default_factory=list)
    patterns: list[list[list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.restart()
        for h in self.base.histograms:
            pool = []
            for _ in range(8):
                per_bucket = [self.rng.randint(0, 3) for _ in h.bounds]
                cumulative, running = [], 0
                for v in per_bucket:
                    running += v
                    cumulative.append(running)
                pool.append(cumulative)
            self.patterns.append(pool)

    def restart(self) -> None:
        self.counts = [[0.0] * len(h.bounds) for h in self.base.histograms]
        self.sums = [0.0] * len(self.base.histograms)
        self.scalars = [0.0] * len(self.base.scalars)

    def scrape(self, i: int) -> Canonical:
        out = Canonical(engine="vllm")
        for k, h in enumerate(self.base.histograms):
            inc = self.patterns[k][i % 8]
            counts = self.counts[k] = [c + d for c, d in zip(self.counts[k], inc)]
            self.sums[k] += inc[-1] * 0.37
            out.histograms.append(CanonicalHistogram(h.signal, h.model, h.rank, h.bounds, tuple(counts),
                                                     self.sums[k], counts[-1]))
        for k, s in enumerate(self.base.scalars):
            if s.kind == "counter":
                self.scalars[k] += (i * 7 + k) % 50
                value = self.scalars[k]
            else:
                value = float((i * 13 + k) % 17) / (17.0 if s.signal == "kv_usage" else 1.0)
            out.scalars.append(CanonicalScalar(s.signal, s.kind, s.model, s.rank, value))
        return out


def om_lines(name: str, c: Canonical, ts: float) -> list[str]:
    stamp = f"{ts:.3f}"
    inst = f'instance="{name}"'
    out = []
    for h in c.histograms:
        for b, v in zip(h.bounds, h.counts):
            le = "+Inf" if math.isinf(b) else repr(b)
            out.append(f'{h.signal}_bucket{{le="{le}",{inst}}} {v!r} {stamp}\n')
        out.append(f"{h.signal}_sum{{{inst}}} {h.sum!r} {stamp}\n")
        out.append(f"{h.signal}_count{{{inst}}} {h.count!r} {stamp}\n")
    for s in c.scalars:
        out.append(f"{s.signal}{{{inst}}} {s.value!r} {stamp}\n")
    return out


BLOCK = 7200.0  # promtool's backfill block length (tsdb.DefaultBlockDuration)


class Backfill:
    """The same samples for Prometheus, as promtool backfills them, one 2-hour block at a time.

    promtool 2.42 re-reads its whole input once for every 2-hour block it creates (and has no
    ``--max-block-duration``), so one OpenMetrics file of 7 days would be parsed 84 times, and
    holding the lines in memory to sort them by series does not fit either. Samples arrive
    in time order (promtool accepts families interleaved in time order), go to the file of
    their block, and each finished file is handed to promtool and deleted."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.data = workdir / "prom" / "prometheus-data"
        self.data.mkdir(parents=True)
        self.block: int | None = None
        self.file = None
        self.seconds = 0.0

    def add(self, lines: list[str], ts: float) -> None:
        block = int(ts // BLOCK)
        if block != self.block:
            self.flush()
            self.block = block
            self.file = (self.workdir / "block.om").open("w")
        self.file.writelines(lines)  # type: ignore[union-attr]

    def flush(self) -> None:
        if self.file is None:
            return
        self.file.write("# EOF\n")
        self.file.close()
        self.file = None
        source = self.workdir / "block.om"
        began = time.time()
        done = subprocess.run(["/usr/bin/promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                               str(source), str(self.data)], capture_output=True, text=True, timeout=3600)
        self.seconds += time.time() - began
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        source.unlink()

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.data.rglob("*") if p.is_file())


def build(url: str, targets: int, days: float, end: float, raw_hours: float,
          backfill: Backfill | None) -> tuple[object, object, list[int], dict[str, float]]:
    """The history as a live service makes it: scrapes written in time order, and once per
    simulated hour the downsample round and once per simulated day retention, so raw samples
    never pile up beyond the raw period (7 days of raw samples for 20 targets would be tens
    of GB). Write CPU counts ``SampleWriter.write`` only; the simulation and the
    OpenMetrics lines for Prometheus are not counted."""
    from app.store import db, retention
    from app.store.writer import SampleWriter
    from app.targets import repository as target_repository

    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    base = template()
    ids = []
    with sessions.begin() as session:
        for t in range(targets):
            ids.append(target_repository.create_target(session, name=f"t{t}", url=f"http://127.0.0.1:1/{t}",
                       engine="vllm",
                                                labels={}, scrape_interval=INTERVAL, scrape_timeout=5.0).id)
    writer = SampleWriter(engine)
    start = end - days * DAY
    if engine.dialect.name == "postgresql":  # the days of the history get their partitions, as a live service's do
        from app.store import partitions

        with engine.begin() as conn:
            for table in partitions.PARTITIONED:
                partitions.ensure(conn, table, start, end)
    n = int(days * DAY / INTERVAL)
    engines = [Engine(base, random.Random(t)) for t in range(targets)]
    write_cpu = downsample_cpu = prune_cpu = 0.0
    batch: list[ScrapeRecord] = []

    def flush() -> None:
        nonlocal write_cpu, batch
        began = time.process_time()
        writer.write(batch)
        write_cpu += time.process_time() - began
        batch = []

    per_hour = int(3600 / INTERVAL)
    for i in range(n):
        for t, eng in enumerate(engines):
            if i and i % 5760 == 1000 + 37 * t:
                eng.restart()
            ts = start + i * INTERVAL + (t * 0.137) % 1
            canonical = eng.scrape(i)
            batch.append(ScrapeRecord(ids[t], ts, True, 0.01, 50_000, 500, 250, 0, "vllm", None, None, canonical))
            if backfill is not None:
                backfill.add(om_lines(f"t{t}", canonical, ts), ts)
        if len(batch) >= 400:
            flush()
        if i % per_hour == per_hour - 1:
            flush()
            now = start + (i + 1) * INTERVAL
            began = time.process_time()
            retention.downsample(sessions, now=now)
            downsample_cpu += time.process_time() - began
            if i % 5760 == 5759:
                began = time.process_time()
                retention.prune(sessions, 7 * DAY, now=now, raw_retention=raw_hours * 3600)
                prune_cpu += time.process_time() - began
    flush()
    if backfill is not None:
        backfill.flush()
    began = time.process_time()
    retention.downsample(sessions, now=end + 600)
    downsample_cpu += time.process_time() - began
    retention.prune(sessions, 7 * DAY, now=end, raw_retention=raw_hours * 3600)
    raw = table_bytes(engine, ("scrape_samples",))
    levels = table_bytes(engine, ("sample_levels",))
    raw_days = min(days, raw_hours / 24)
    sizes = {
        "raw_per_target_day": raw / (targets * raw_days),
        "levels_per_target_day": levels / (targets * days),
        "steady_per_target_day": (raw + levels) / (targets * days),
        "write_cpu_per_scrape_us": write_cpu / (n * targets) * 1e6,
        "downsample_cpu_per_scrape_us": downsample_cpu / (n * targets) * 1e6,
        "prune_cpu_per_scrape_us": prune_cpu / (n * targets) * 1e6,
    }
    return engine, sessions, ids, sizes


def table_bytes(engine, tables: tuple[str, ...]) -> float:
    from sqlalchemy import text

    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return float(sum(conn.scalar(text(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t"),
                {"t": t}) for t in tables))
        total = 0
        for t in tables:
            total += conn.exec_driver_sql("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ? OR name IN "
                                          "(SELECT name FROM sqlite_master WHERE tbl_name = ? AND type = 'index')",
                                          (t, t)).scalar() or 0
        return float(total)


@contextmanager
def service_collector() -> Iterator[None]:
    """The cyclic garbage collector as ``llm-latency serve`` runs it (``tune_collector``, and
    what exists before the questions frozen out of its scans, as the service freezes its
    long-lived state after the first write): with CPython's defaults a collection landing
    in a 7-day ``latency`` call slows it by up to 2.5x, so the p99 would measure a collector
    setting the service does not use."""
    from app.scrape.scheduler import tune_collector

    thresholds = gc.get_threshold()
    tune_collector()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    times.sort()
    return statistics.median(times) * 1000, times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)] * 1000


WINDOWS = {"5m": 300.0, "1h": 3600.0, "24h": DAY, "7d": 7 * DAY}


def our_questions(sessions, ids: list[int], end: float, days: float) -> dict[str, Callable[[], object]]:

    out: dict[str, Callable[[], object]] = {}
    for label, w in WINDOWS.items():
        if w <= days * DAY:
            out[f"latency {label}"] = lambda w=w: _with(sessions, lambda s: reads.latency_report(s, ids[:1], w, end))
    for span_label, span in (("24h", DAY), ("7d", 7 * DAY)):
        for step_label, step in (("5m", 300.0), ("1h", 3600.0)):
            if span <= days * DAY:
                out[f"series {span_label} step {step_label}"] = lambda span=span, step=step: _with(
                    sessions, lambda s: reads.quantile_series(s, ids[:1], "ttft", 0.99, span, step, 300.0, end))
    for label in ("1h", "24h"):
        w = WINDOWS[label]
        if w <= days * DAY:
            out[f"fleet {label}"] = lambda w=w: _with(sessions, lambda s: reads.latency_report(s, ids, w, end, False))
    return out


def _with(sessions, fn):
    with sessions() as session:
        return fn(session)


def prometheus_questions(client, base: Canonical, end: float, days: float) -> dict[str, Callable[[], object]]:
    def latency_queries(w: str, match: str) -> list[str]:
        qs = [f"sum by (le) (increase({h.signal}_bucket{match}[{w}]))" for h in base.histograms]
        qs += [f"sum by (le) (increase({h.signal}_sum{match}[{w}]))" for h in base.histograms[:1]]
        qs += [f"sum(rate({s.signal}{match}[{w}]))" for s in base.scalars if s.kind == "counter"]
        qs += [f"sum(avg_over_time({s.signal}{match}[{w}]))" for s in base.scalars if s.kind == "gauge"]
        return qs

    def run(queries: list[str]) -> None:
        for q in queries:
            client.query(q, end)

    out: dict[str, Callable[[], object]] = {}
    for label, w in WINDOWS.items():
        if w <= days * DAY:
            out[f"latency {label}"] = lambda label=label: run(latency_queries(label, '{instance="t0"}'))
    for span_label, span in (("24h", DAY), ("7d", 7 * DAY)):
        for step_label, step in (("5m", 300.0), ("1h", 3600.0)):
            if span <= days * DAY:
                first = math.ceil((end - span) / step) * step
                expr = 'histogram_quantile(0.99, sum by (le) (increase(ttft_bucket{instance="t0"}[5m])))'
                out[f"series {span_label} step {step_label}"] = (
                    lambda first=first, step=step, expr=expr: client.query_range(expr, first, end, step))
    for label in ("1h", "24h"):
        if WINDOWS[label] <= days * DAY:
            out[f"fleet {label}"] = lambda label=label: run(latency_queries(label, ""))
    return out


def encoding_sizes(base: Canonical) -> dict[str, float]:
    """Bytes per stored bucket count: comma-joined repr text vs the binary encoding, for the
    counts of a day-old loaded engine (values in the millions)."""
    rng = random.Random(3)
    text_bytes = blob_bytes = n = 0
    for h in base.histograms:
        running = 0.0
        counts = []
        for _ in h.bounds:
            running += rng.randint(0, 400_000)
            counts.append(running)
        text_bytes += len(encode_floats(counts))
        blob_bytes += len(encode_counts(counts))
        n += len(counts)
    return {"text": text_bytes / n, "binary": blob_bytes / n}


def encoding_tables(url: str, rows: int = 20_000) -> dict[str, float]:
    """Bytes per bucket count of the same histogram rows stored as comma-joined text, as the
    binary blob and (PostgreSQL) as a ``float8[]`` array: table + index bytes / counts."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    rng = random.Random(5)
    nb = 23  # the TTFT histogram of the vLLM page
    data = []
    for i in range(rows):
        running, counts = 0.0, []
        for _ in range(nb):
            running += rng.randint(0, 400_000)
            counts.append(running)
        data.append((i % 200, 1.7e9 + i * 15.0, counts))
    pg = engine.dialect.name == "postgresql"
    kinds = {"text": "TEXT", "binary": "BYTEA" if pg else "BLOB"}
    if pg:
        kinds["float8[]"] = "FLOAT8[]"
    out = {}
    with engine.begin() as conn:
        for kind, column in kinds.items():
            table = "enc_" + kind.replace("[]", "_array")
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(text(f"CREATE TABLE {table} (series_id INTEGER, ts FLOAT, counts {column}, sum FLOAT, "
                              "count FLOAT, PRIMARY KEY (series_id, ts))"))
            values = [{"s": s, "t": t, "c": encode_floats(c) if kind == "text" else encode_counts(c)
                       if kind == "binary" else c, "x": 1.0, "n": c[-1]} for s, t, c in data]
            conn.execute(text(f"INSERT INTO {table} VALUES (:s, :t, :c, :x, :n)"), values)
    with engine.begin() as conn:
        for kind in kinds:
            table = "enc_" + kind.replace("[]", "_array")
            if pg:
                size = conn.scalar(text(f"SELECT pg_total_relation_size('{table}')"))
            else:
                size = conn.exec_driver_sql("SELECT sum(pgsize) FROM dbstat WHERE name = ? OR name LIKE ?",
                                            (table, f"sqlite_autoindex_{table}%")).scalar()
            out[kind] = size / (rows * nb)
            conn.execute(text(f"DROP TABLE {table}"))
    engine.dispose()
    return out


def run_prometheus(workdir: Path):
    from tests.support.prometheus import running_prometheus

    return running_prometheus(workdir / "prom", "scrape_configs: []",
                              extra_args=["--storage.tsdb.retention.time=30d"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 targets x 2 days")
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--raw-hours", type=float, default=24.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--skip-prometheus", action="store_true")
    parser.add_argument("--encoding", action="store_true", help="only: bytes per bucket count stored as text, "
                        "binary and float8[] (PostgreSQL), on both databases")
    args = parser.parse_args()
    if args.encoding:
        from tests.conftest import scratch_postgres_database

        with tempfile.TemporaryDirectory(prefix="bench-encoding-") as tmp:
            print("sqlite, bytes per count (table + primary key):", encoding_tables(f"sqlite:///{tmp}/e.db"))
        if not args.skip_postgres:
            with scratch_postgres_database("bench_encoding") as database:
                print("postgresql, bytes per count (table + primary key):", encoding_tables(database.url))
        return
    if args.quick:
        args.targets, args.days, args.repeats = 3, 2.0, 10
    end = math.floor(time.time() / 3600) * 3600 - 1800.0 + 0.25
    base = template()
    print(f"# {args.targets} targets x {args.days:g} days of 15 s scrapes, raw kept {args.raw_hours:g} h; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared machine)")
    enc = encoding_sizes(base)
    print(f"# bucket count encoding: text {enc['text']:.1f} bytes/count, binary {enc['binary']:.1f} bytes/count")
    results: dict[str, dict[str, tuple[float, float]]] = {}
    sizes: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-query-") as tmp:
        backfill = None if args.skip_prometheus else Backfill(Path(tmp))
        backends = [("sqlite", f"sqlite:///{tmp}/bench.db")]
        pg = None
        if not args.skip_postgres:
            from tests.conftest import scratch_postgres_database

            pg = scratch_postgres_database("bench_query")
            backends.append(("postgresql", pg.__enter__().url))
        try:
            for name, url in backends:
                began = time.time()
                engine, sessions, ids, sizes[name] = build(url, args.targets, args.days, end, args.raw_hours,
                                                           backfill if name == "sqlite" else None)
                print(f"# {name}: history built in {time.time() - began:.0f} s", file=sys.stderr)
                with service_collector():
                    results[name] = {q: timed(fn, args.repeats) for q, fn in
                                     our_questions(sessions, ids, end, args.days).items()}
                engine.dispose()
        finally:
            if pg is not None:
                pg.__exit__(None, None, None)
        if backfill is not None:
            print(f"# promtool backfill: {backfill.seconds:.0f} s", file=sys.stderr)
            target_days = args.targets * args.days
            sizes["prometheus"] = {"steady_per_target_day": backfill.size() / target_days}
            from app.promql.client import PrometheusClient

            with run_prometheus(Path(tmp)) as prom:
                client = PrometheusClient(prom.url, timeout=120)
                try:
                    results["prometheus"] = {q: timed(fn, args.repeats) for q, fn in
                                             prometheus_questions(client, base, end, args.days).items()}
                finally:
                    client.close()
                # Prometheus compacts the backfilled 2-hour blocks into longer ones while it runs
                sizes["prometheus (compacted)"] = {"steady_per_target_day": backfill.size() / target_days}
    report(results, sizes)


def report(results: dict[str, dict[str, tuple[float, float]]], sizes: dict[str, dict[str, float]]) -> None:
    prom = results.get("prometheus", {})
    print("\n| question | backend | p50 ms | p99 ms | Prometheus p99 ms | ratio | target |")
    print("|---|---|---:|---:|---:|---:|---|")
    for backend in ("sqlite", "postgresql"):
        for q, (p50, p99) in results.get(backend, {}).items():
            base = prom.get(q)
            ratio = f"{p99 / base[1]:.1f}x" if base else "-"
            if q.startswith("latency"):
                ok = p99 <= 100 and (base is None or p99 <= 20 * base[1])
                target = ("PASS" if ok else "MISS") + " (<=100 ms, <=20x)"
            elif q.startswith("series 7d"):
                target = ("PASS" if p99 <= 250 else "MISS") + " (<=250 ms)"
            else:
                target = ""
            print(f"| {q} | {backend} | {p50:.1f} | {p99:.1f} | {base[1]:.1f} | {ratio} | {target} |" if base else
                  f"| {q} | {backend} | {p50:.1f} | {p99:.1f} | - | - | {target} |")
    print("\n| storage | raw MB/target-day | levels MB/target-day | steady state MB/target-day | write CPU us/scrape "
          "| downsample CPU us/scrape | prune CPU us/scrape |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for backend, s in sizes.items():
        cells = [f"{s[k] / 1e6:.2f}" if k in s else "-"
                 for k in ("raw_per_target_day", "levels_per_target_day", "steady_per_target_day")]
        cells += [f"{s[k]:.0f}" if k in s else "-" for k in ("write_cpu_per_scrape_us", "downsample_cpu_per_scrape_us",
                                                                 "prune_cpu_per_scrape_us")]
        print(f"| {backend} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
