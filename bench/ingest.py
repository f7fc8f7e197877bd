"""Ingest benchmark: our scrape path against baselines measured in the same run.

Not a test. Prints a Markdown table of absolute numbers, the baseline, the ratio and
PASS/MISS against the ingest targets:

(a) parse only, per page, ``PageParser(keep=ADAPTERS["vllm"].families.__contains__)``
    reused across calls (warm line cache; cold = a fresh parser per call) vs
    ``prometheus_client.parser.text_string_to_metric_families`` on the same page.
    Target: ours <= 1/20 of prometheus_client (warm).
(b) the whole path with the real components -- ``PageFetcher`` (aiohttp, 64
    concurrent) -> ``TargetScraper`` (parse + adapter) -> ``SampleWriter.write`` --
    for N targets served over loopback by a separate process (``bench/page_server.py``),
    on SQLite (temp file) and PostgreSQL (scratch database). CPU per scrape is
    ``time.process_time()`` of this process over the measured rounds (after two warm-up
    rounds), split into fetch+parse+normalize (the event loop) and store (the writer
    thread). Each round's batch is written in a worker thread (``asyncio.to_thread``,
    as ``ScrapeService.flush`` does) after the round's scrapes finished, so the split
    is exact. PostgreSQL's server-side CPU (our backends' utime+stime from /proc) is
    added to ours (Prometheus' figure includes its storage) and shown beside it. The
    5-minute level is built by the writer (the downsample round's check that remains is
    not in this path; bench/query.py measures it); the level row a series gets once per
    interval (once in 300 scrapes here) is written outside the measured rounds: they start
    in the interval the last unmeasured round opened and wait for a boundary they might
    reach (else 5 rounds would carry a whole interval's rows, 60 times their share). Time inside the cyclic GC is
    reported too (``gc.callbacks``). Targets are created with ``engine="vllm"``, which is
    what an ``auto`` target becomes after its first page (same parser and adapter).
    Not included: APScheduler's per-job overhead and the telemetry callback (``on_result``).
    Target: CPU per scrape <= half of Prometheus' CPU per scrape of the same page.
(c) Debian's Prometheus 2.42 scraping the same pages from the same server: CPU per
    scrape = delta of its ``process_cpu_seconds_total`` / delta of
    ``sum(prometheus_target_interval_length_seconds_count)`` (one per scrape) over a
    measured window after warm-up (cross-checked with the page server's request count).
    8-model page: 100 targets by default (``--prom-targets-8``); 500 at 1 s would need
    ~2 cores and ~1.5 M series.
(d) CPU per 50 kB fetch: one shared ``httpx.AsyncClient`` vs ``aiohttp`` (our
    ``PageFetcher``) at 1 and at 50 concurrent connections against the same server.

Pages: the real vLLM 0.32 page (``tests/fixtures/exposition/vllm-0.32-cpu-real.prom``,
1 model) and an 8-model page built here (every ``vllm:`` family's samples repeated with
8 ``model_name`` values). The server rotates through page variants per target (counters,
histogram sums/counts and upper buckets grow, gauges move), so consecutive scrapes of a
target differ like a loaded engine's pages do.

Run from the repository root::

    python -m bench.ingest                       # full run (~5 min on 2 cores)
    python -m bench.ingest --quick               # ~1 min smoke run
    python -m bench.ingest --skip-prometheus --skip-postgres
    python -m bench.ingest --profile [8-model]   # + cProfile of the SQLite path (1-model page by default)

Most of a full run's wall time is the unmeasured first write of the 8-model targets:
``SampleWriter`` creates the new series of each target's first page (80,000 series for 500
targets; one SELECT of the target's series and one INSERT each). For a sampling profile
without cProfile's distortion, attach py-spy (``pip install py-spy``) to the bench process:
``py-spy record -p PID --threads --format raw -o out.txt -d 20`` while table (b) is being measured.

Run it on a quiet machine: CPU times are per process, but two busy cores shared with
other work still inflate them (the header prints the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import math
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python bench/ingest.py`
    sys.path.insert(0, str(ROOT))

FIXTURE = ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom"
SERVER = Path(__file__).resolve().with_name("page_server.py")
DEFAULT_PG_ADMIN = os.environ.get("LLM_LATENCY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
VARIANTS = 32  # page versions per target, served in turn
PROMETHEUS_REFERENCE_US = 1000.0  # "≥ ~1,000 scrapes/s per core" when Prometheus is not run


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# =========================================================================== pages

_MODEL_RE = re.compile(r'model_name="([^"]*)"')
_LE_RE = re.compile(r'le="([^"]*)"')


def _blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """Split an exposition into (family name, lines) blocks, a block starting at ``# HELP``."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        if line.startswith("# HELP "):
            blocks.append((line.split(" ", 3)[2], [line]))
        else:
            blocks[-1][1].append(line)
    return blocks


def multi_model_page(text: str, n_models: int) -> str:
    """The page with every ``vllm:`` family's samples repeated for ``n_models`` model names."""
    found = _MODEL_RE.search(text)
    assert found, "page has no model_name label"
    original = f'model_name="{found.group(1)}"'
    models = [f'model_name="org{k}/llama-3.1-8b-instruct-v{k}"' for k in range(n_models)]
    out: list[str] = []
    for name, lines in _blocks(text):
        if name is None or not name.startswith("vllm:"):
            out.extend(lines)
            continue
        header = [ln for ln in lines if ln.startswith("#") or not ln.strip()]
        samples = [ln for ln in lines if ln and not ln.startswith("#")]
        out.extend(header)
        for model in models:
            out.extend(ln.replace(original, model) for ln in samples)
    return "\n".join(out) + "\n"


def page_variants(text: str, k: int) -> tuple[list[bytes], float]:
    """``k`` versions of the page as a loaded engine would show them on successive scrapes.

    Variant v adds v observations to every ``vllm:`` histogram (``_count``, ``_sum`` and the
    cumulative buckets with ``le >= 1``, so +Inf == _count stays true), v*3 to counters, and
    moves the queue/KV gauges. Returns the variants and the fraction of sample lines that
    differ between consecutive variants.
    """
    lines = text.splitlines()
    variants = [text.encode()]
    changed = total = 0
    for v in range(1, k):
        out = []
        for line in lines:
            if not line.startswith("vllm:"):
                out.append(line)
                continue
            head, _, value = line.rpartition(" ")
            name = head.split("{", 1)[0]
            x = float(value)
            if name.endswith("_bucket"):
                le = _LE_RE.search(head)
                bound = float(le.group(1).replace("+Inf", "inf")) if le else 0.0
                if bound >= 1.0:
                    x += v
            elif name.endswith("_count"):
                x += v
            elif name.endswith("_sum"):
                x += v * 0.37
            elif name.endswith("_created"):
                pass
            elif name.endswith("_total"):
                x += v * 3
            elif name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                x = float(v % 7)
            elif name == "vllm:kv_cache_usage_perc":
                x = (v % 10) / 10
            new = f"{head} {x!r}"
            out.append(new)
        variants.append(("\n".join(out) + "\n").encode())
    a = variants[1].decode().splitlines() if k > 2 else lines
    b = variants[2].decode().splitlines() if k > 2 else lines
    for x, y in zip(a, b):
        if x and not x.startswith("#"):
            total += 1
            changed += x != y
    return variants, (changed / total if total else 0.0)


@dataclass
class PageKind:
    key: str               # "1-model" / "8-model"
    variants: list[bytes]
    changed_fraction: float
    server: PageServer | None = None

    @property
    def body(self) -> bytes:
        return self.variants[0]


class PageServer:
    """``bench/page_server.py`` in its own process; stopped by PID."""

    def __init__(self, files: list[Path], use_gzip: bool) -> None:
        args = [sys.executable, str(SERVER), *map(str, files)] + (["--gzip"] if use_gzip else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"page server did not start (got {line!r})")
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"

    def url(self, i: int) -> str:
        return f"{self.base_url}/t/{i}/metrics"

    def requests(self) -> int:
        import urllib.request

        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=5) as r:
            return int(json.load(r)["requests"])

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class OtherProcesses:
    """CPU used by every process on the machine except the ones being measured.

    The machine has 2 cores and may be shared: a busy neighbour inflates our CPU times
    (shared caches, SMT siblings), so every measured window reports how much CPU the
    rest of the machine used, and by whom.
    """

    def __init__(self) -> None:
        self._start = self._snapshot()
        self._t = time.perf_counter()

    @staticmethod
    def _snapshot() -> dict[int, tuple[str, float]]:
        out = {}
        tick = os.sysconf("SC_CLK_TCK")
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    data = f.read()
                fields = data.rsplit(")", 1)[1].split()
                out[int(name)] = (data[data.index("(") + 1:data.rindex(")")],
                                  (int(fields[11]) + int(fields[12])) / tick)
            except (OSError, ValueError, IndexError):
                continue
        return out

    def stop(self, exclude: set[int]) -> tuple[float, str]:
        """(cores used by the others, "comm pid: cores" of the top two)."""
        end = self._snapshot()
        wall = time.perf_counter() - self._t
        used = []
        for pid, (comm, cpu) in end.items():
            if pid in exclude:
                continue
            delta = cpu - self._start.get(pid, (comm, 0.0))[1]
            if delta > 0:
                used.append((delta, comm, pid))
        used.sort(reverse=True)
        top = ", ".join(f"{comm} ({pid}) {d / wall:.2f}" for d, comm, pid in used[:2] if d / wall >= 0.05)
        return sum(d for d, _, _ in used) / wall, top


def proc_cpu_seconds(pid: int) -> float:
    """utime+stime of a process from /proc (clock ticks), NaN if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MB from /proc, NaN if it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


# =========================================================================== (a) parse

def _per_call(fn: Callable[[int], Any], budget: float, repeats: int) -> float:
    """Median seconds per call of ``fn(i)`` over ``repeats`` batches of ~``budget`` s each."""
    t = time.perf_counter()
    fn(0)
    first = time.perf_counter() - t
    n = max(1, int(budget / max(first, 1e-7)))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times)


@dataclass
class ParseResult:
    page: str
    size: int
    samples: int
    kept: int
    ours_warm: float
    ours_warm_varying: float
    ours_cold: float
    adapter: float
    prometheus_client: float
    cross_check: dict | None = None  # bench/parse_bench.py's bench_parse (GC off, best of 3), same keep


def bench_parse_page(kind: PageKind, budget: float, repeats: int) -> ParseResult:
    from prometheus_client.parser import text_string_to_metric_families

    from app.exposition.parser import PageParser
    from app.sources import ADAPTERS

    adapter = ADAPTERS["vllm"]
    keep = adapter.families.__contains__
    body = kind.body
    text = body.decode()
    variants = kind.variants

    warm = PageParser(keep=keep)
    page = warm.parse(body)
    canonical = adapter.to_canonical(page)
    assert canonical.histograms and not canonical.problems, canonical.problems[:3]
    ours_warm = _per_call(lambda i: warm.parse(body), budget, repeats)

    varying = PageParser(keep=keep)
    for v in variants:
        varying.parse(v)
    nv = len(variants)
    ours_varying = _per_call(lambda i: varying.parse(variants[i % nv]), budget, repeats)

    ours_cold = _per_call(lambda i: PageParser(keep=keep).parse(body), budget, repeats)
    adapter_time = _per_call(lambda i: adapter.to_canonical(page), budget, repeats)
    reference = _per_call(lambda i: list(text_string_to_metric_families(text)), budget, repeats)
    cross = None
    try:
        from bench.parse_bench import bench_parse
    except ImportError:
        pass
    else:
        repeat = max(10, int(budget * 0.8 / max(ours_warm, 1e-6)))
        cross = bench_parse(body, keep, repeat)
    return ParseResult(kind.key, len(body), page.samples_seen, page.samples_kept,
                       ours_warm, ours_varying, ours_cold, adapter_time, reference, cross)


# =========================================================================== (b) whole path

@dataclass
class PathResult:
    page: str
    db: str
    targets: int
    rounds: int
    scrapes: int = 0
    cpu_total: float = 0.0        # process CPU over the measured rounds
    cpu_scrape: float = 0.0       # event loop part: fetch + parse + normalize
    cpu_store: float = 0.0        # process CPU while the batch was written
    cpu_store_thread: float = 0.0  # thread_time of the writer thread
    wall_scrape: float = 0.0
    wall_total: float = 0.0
    series_per_scrape: float = 0.0
    pg_server_cpu: float | None = None
    setup_s: float = 0.0           # migrate + create targets (wall)
    warmup_scrape_s: float = 0.0   # first round: cold parsers, engine detection (wall)
    first_write_s: float = 0.0     # first batch: every series created (wall)
    gc_cpu: float = 0.0            # CPU inside the cyclic GC during the measured rounds
    gc_full: int = 0               # generation-2 collections during the measured rounds
    server_cpu: float = 0.0        # the page server's CPU during the measured rounds
    foreign_cores: float = float("nan")  # CPU of every other process on the machine, in cores
    foreign_top: str = ""
    failures: dict[str, int] = field(default_factory=dict)
    note: str = ""
    profile: str = ""

    def us(self, seconds: float) -> float:
        return seconds / self.scrapes * 1e6 if self.scrapes else float("nan")


class PostgresScratch:
    """A scratch database on the local server; dropped by :meth:`drop`."""

    def __init__(self, admin_url: str) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.name = f"llm_latency_bench_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        self.url = make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def backend_pids(self) -> list[int]:
        from sqlalchemy import text

        with self.admin.connect() as conn:
            return [int(r[0]) for r in conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = :n"), {"n": self.name})]

    def drop(self) -> None:
        from sqlalchemy import text

        try:
            with self.admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": self.name})
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        finally:
            self.admin.dispose()


class GcWatch:
    """Time spent inside the cyclic garbage collector (gc.callbacks; perf_counter, which is
    cheaper than process_time and equal to CPU here: a collection holds the GIL and the
    writer thread never runs during the scrape phase)."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.cpu = 0.0
        self.collections = [0, 0, 0]

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.cpu += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


gc_watch = GcWatch()


def result_rows(batch: list) -> float:
    """Series per scrape (histograms + scalars) of a batch."""
    rows = sum(len(r.canonical.histograms) + len(r.canonical.scalars) for r in batch if r.canonical is not None)
    return rows / max(1, len(batch))


async def _scrape_round(scrapers: list, pending: list) -> list:
    await asyncio.gather(*(s.run() for s in scrapers))
    batch = pending[:]
    pending.clear()
    return batch


async def whole_path(kind: PageKind, db_label: str, url: str, n_targets: int, rounds: int,
                     pg: PostgresScratch | None = None, profile: bool = False) -> PathResult:
    """Warm-up round + ``rounds`` measured rounds of every target scraped once and written."""
    from app.scrape.client import PageFetcher
    from app.scrape.jobs import ScrapeSpec, TargetScraper
    from app.scrape.scheduler import tune_collector
    from app.store import db
    from app.store.levels import LEVELS
    from app.store.writer import SampleWriter
    from app.targets.repository import create_target

    assert kind.server is not None
    result = PathResult(kind.key, db_label, n_targets, rounds)
    t_setup = time.perf_counter()
    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    specs = []
    with sessions.begin() as session:
        for i in range(n_targets):
            # engine "vllm": what an "auto" target becomes after its first page (same parser, same
            # adapter); saves the unmeasured warm-up round a second cold parse per target.
            target = create_target(session, name=f"t{i}", url=kind.server.url(i), engine="vllm", labels={},
                                   scrape_interval=1.0, scrape_timeout=10.0)
            specs.append(ScrapeSpec(target.id, target.name, target.url, "vllm", 1.0, 10.0))
    writer = SampleWriter(engine)
    pending: list = []
    last_ts: dict[int, float] = {}
    write_cpu: list[float] = []

    def timed_write(batch: list) -> int:
        t = time.thread_time()
        n = writer.write(batch)
        write_cpu.append(time.thread_time() - t)
        return n

    def check(batch: list) -> None:
        assert len(batch) == n_targets, (len(batch), n_targets)
        for r in batch:
            # (series, ts) is a primary key: a target's scrapes must never share a ts
            assert r.ts > last_ts.get(r.target_id, 0.0), "two rounds share a timestamp"
            last_ts[r.target_id] = r.ts
            if not r.up or r.error_class or r.canonical is None:
                key = r.error_class or "down"
                result.failures[key] = result.failures.get(key, 0) + 1

    profiler = cProfile.Profile() if profile else None
    async with PageFetcher(max_concurrency=64) as fetcher:
        scrapers = [TargetScraper(spec, fetcher, pending.append) for spec in specs]
        t_warm = time.perf_counter()
        batch = await _scrape_round(scrapers, pending)  # warm-up: connections, engine detection, series ids
        check(batch)
        t_first_write = time.perf_counter()
        await asyncio.to_thread(writer.write, batch)
        result.setup_s = t_warm - t_setup
        result.warmup_scrape_s = t_first_write - t_warm
        result.first_write_s = time.perf_counter() - t_first_write
        log(f"    setup {result.setup_s:.1f}s, warm-up round {result.warmup_scrape_s:.1f}s, first write "
            f"(creates {n_targets * result_rows(batch):.0f} series) {result.first_write_s:.1f}s")
        result.failures.clear()
        rows = sum(len(r.canonical.histograms) + len(r.canonical.scalars) + len(r.canonical.infos)
                   for r in batch if r.canonical is not None)
        result.series_per_scrape = rows / max(1, len(batch))
        # A series' 5-minute level row is written once per interval: at this 1 s interval
        # once in 300 scrapes. A boundary between the last unmeasured round and the end of
        # the measured ones would charge a whole interval's rows (one per series) to 5
        # scrapes per target, 60 times their share. So when the rounds might reach the next
        # boundary, wait for it; and when the intervals the last round opened have ended
        # (the first write can take a minute), one more round, unmeasured, writes their rows.
        async def unmeasured_round() -> list:
            batch = await _scrape_round(scrapers, pending)
            check(batch)
            await asyncio.to_thread(writer.write, batch)
            return batch

        level_s, unmeasured_rounds = LEVELS[0], 2
        t_round = time.perf_counter()
        batch = await unmeasured_round()  # a steady round: how long the measured ones take
        round_s = time.perf_counter() - t_round
        to_boundary = level_s - time.time() % level_s
        if to_boundary < rounds * round_s * 1.5 + 5:
            log(f"    waiting {to_boundary:.0f}s for the next {level_s // 60}-minute level boundary")
            await asyncio.sleep(to_boundary + 0.5)
        while time.time() // level_s != max(r.ts for r in batch) // level_s:
            batch = await unmeasured_round()
            unmeasured_rounds += 1
        opened = max(r.ts for r in batch) // level_s
        gc.collect()
        tune_collector()  # the collector settings ScrapeService uses, and its freeze after the first write
        gc.freeze()
        pg_pids = pg.backend_pids() if pg is not None else []
        pg_cpu0 = {pid: proc_cpu_seconds(pid) for pid in pg_pids}
        write_cpu.clear()
        gc_watch.reset()
        server0, others = kind.server.cpu_seconds(), OtherProcesses()
        c_start, w_start = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            if profiler:
                profiler.enable()
            batch = await _scrape_round(scrapers, pending)
            if profiler:
                profiler.disable()
            c1, w1 = time.process_time(), time.perf_counter()
            check(batch)
            if profiler:  # inline, so cProfile (main thread only) sees the writer too
                profiler.enable()
                t = time.thread_time()
                writer.write(batch)
                write_cpu.append(time.thread_time() - t)
                profiler.disable()
            else:
                await asyncio.to_thread(timed_write, batch)
            c2 = time.process_time()
            result.cpu_scrape += c1 - c0
            result.cpu_store += c2 - c1
            result.wall_scrape += w1 - w0
            result.scrapes += len(batch)
        result.cpu_total = time.process_time() - c_start
        result.wall_total = time.perf_counter() - w_start
        if time.time() // level_s != opened:
            result.note = f"a {level_s // 60}-minute level boundary fell inside the measured rounds"
        result.gc_cpu, result.gc_full = gc_watch.cpu, gc_watch.collections[2]
        server1 = kind.server.cpu_seconds()
        result.cpu_store_thread = sum(write_cpu)
        if pg is not None:
            pids_after = pg.backend_pids()
            total = 0.0
            for pid in set(pg_pids) | set(pids_after):
                now = proc_cpu_seconds(pid)
                total += now - pg_cpu0.get(pid, 0.0)
            result.pg_server_cpu = total if total == total else None  # NaN -> unreadable
        result.server_cpu = server1 - server0
        result.foreign_cores, result.foreign_top = others.stop({os.getpid(), kind.server.proc.pid, *pg_pids})
    # sanity: everything scraped was stored
    from sqlalchemy import func, select

    from app.store.models import Scrape

    with sessions() as session:
        stored = session.scalar(select(func.count()).select_from(Scrape))
    expected = n_targets * (rounds + unmeasured_rounds)
    if stored != expected:
        result.note = "; ".join(filter(None, [result.note, f"stored {stored} scrape rows, expected {expected}"]))
    engine.dispose()
    if profiler is not None:
        result.profile = profile_report(profiler, result)
    return result


#: the whole path's CPU per scrape (the database server's included) against Prometheus'
TARGET_INGEST_RATIO = 0.5

KEY_FUNCTIONS = (  # (file suffix, function name, what)
    ("app/scrape/jobs.py", "run", "TargetScraper.run (one scrape, event-loop part)"),
    ("app/scrape/client.py", "fetch", "  PageFetcher.fetch (aiohttp)"),
    ("app/exposition/parser.py", "parse", "  PageParser.parse"),
    ("app/sources/vllm.py", "to_canonical", "  VllmAdapter.to_canonical"),
    ("app/sources/base.py", "histogram_series", "    histogram_series"),
    ("app/sources/base.py", "scalar_series", "    scalar_series"),
    ("app/store/repository.py", "write", "SampleWriter.write (store)"),
    ("app/store/repository.py", "_upsert_info", "  _upsert_info (UPDATE [+INSERT] per info, per scrape)"),
    ("app/store/repository.py", "encode_floats", "  encode_floats"),
)


def profile_report(profiler: cProfile.Profile, result: PathResult, top: int = 25) -> str:
    """cProfile of the measured rounds (writes inline so the main-thread profiler sees them).

    cProfile's per-call overhead inflates functions that make many small calls, and the
    cyclic GC is invisible to it (its time lands in whichever function allocated), so
    read the shares as indicative; GC is reported separately in table (b).
    """
    stats = pstats.Stats(profiler)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in entries.values()) or 1e-9
    n = max(1, result.scrapes)
    out = [f"\n### Profile (cProfile): {result.page} page, {result.db}, {result.scrapes} scrapes, "
           f"{total / n * 1e6:,.0f} µs/scrape under the profiler\n",
           "| function (inclusive) | µs/scrape | % of profiled CPU |", "|---|---:|---:|"]
    for suffix, name, what in KEY_FUNCTIONS:
        cum = sum(v[3] for (f, _l, fn), v in entries.items() if fn == name and f.replace("\\", "/").endswith(suffix))
        out.append(f"| {what} | {cum / n * 1e6:,.0f} | {100 * cum / total:.1f}% |")
    out += ["", "| function (self time) | calls | self % | cumulative % |", "|---|---:|---:|---:|"]
    for (filename, line, name), v in sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]:
        short = filename.replace(str(ROOT) + "/", "")
        short = re.sub(r".*/site-packages/", "", short)
        short = re.sub(r".*/lib/python3\.\d+/", "", short)
        out.append(f"| `{short}:{line}({name})` | {v[1]} | {100 * v[2] / total:.1f}% | {100 * v[3] / total:.1f}% |")
    return "\n".join(out) + "\n"


# =========================================================================== (c) Prometheus

@dataclass
class PromResult:
    page: str
    targets: int
    seconds: float
    scrapes: int = 0
    cpu: float = 0.0
    server_requests: int = 0
    min_up: float = float("nan")
    samples_per_scrape: float = float("nan")
    foreign_cores: float = float("nan")  # CPU of all other processes, in cores
    foreign_top: str = ""
    error: str = ""

    @property
    def us_per_scrape(self) -> float:
        return self.cpu / self.scrapes * 1e6 if self.scrapes else float("nan")


def _prom_self_metrics(handle: Any) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = handle.client.get(f"{handle.url}/metrics").text
    cpu = scrapes = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "process_cpu_seconds_total":
                cpu = s.value
            elif s.name == "prometheus_target_interval_length_seconds_count":
                scrapes += s.value
    return cpu, scrapes


def prometheus_cost(kind: PageKind, n_targets: int, measure: float, workdir: Path) -> PromResult:
    from tests.support.prometheus import running_prometheus

    assert kind.server is not None
    res = PromResult(kind.key, n_targets, measure)
    host = f"127.0.0.1:{kind.server.port}"
    jobs = [{
        "job_name": "bench", "scrape_interval": "1s", "scrape_timeout": "1s",
        # one group per target: its own path, and a label so the 500 targets' series differ
        "static_configs": [{"targets": [host], "labels": {"__metrics_path__": f"/t/{i}/metrics", "target": f"t{i}"}}
                           for i in range(n_targets)],
    }]
    with running_prometheus(workdir, "scrape_configs: " + json.dumps(jobs), "1s",
                            ["--log.level=warn", "--storage.tsdb.retention.time=1h"]) as prom:
        prom.wait_for_samples("up", 4, timeout=90, poll=0.5)  # every target scraped >= 4 times
        time.sleep(2.0)
        cpu0, n0 = _prom_self_metrics(prom)
        r0, p0 = kind.server.requests(), proc_cpu_seconds(prom.pid)
        others = OtherProcesses()
        time.sleep(measure)
        cpu1, n1 = _prom_self_metrics(prom)
        r1, p1 = kind.server.requests(), proc_cpu_seconds(prom.pid)
        res.foreign_cores, res.foreign_top = others.stop({os.getpid(), prom.pid, kind.server.proc.pid})
        res.cpu, res.scrapes, res.server_requests = cpu1 - cpu0, int(n1 - n0), r1 - r0
        if abs((p1 - p0) - res.cpu) > 0.05 + 0.02 * res.cpu:
            res.error = f"/proc says {p1 - p0:.2f}s CPU, process_cpu_seconds_total {res.cpu:.2f}s"
        up = prom.query(f"min(min_over_time(up[{int(measure)}s]))")["result"]
        res.min_up = float(up[0]["value"][1]) if up else float("nan")
        samples = prom.query("avg(scrape_samples_scraped)")["result"]
        res.samples_per_scrape = float(samples[0]["value"][1]) if samples else float("nan")
    return res


# =========================================================================== (d) HTTP clients

async def fetch_cost(client_kind: str, server: PageServer, n_targets: int, concurrency: int, n: int) -> float:
    """CPU seconds per fetch of a page with ``concurrency`` requests in flight."""
    from app.scrape.client import ACCEPT, USER_AGENT, PageFetcher

    if client_kind == "aiohttp":
        fetcher = PageFetcher(max_concurrency=64)
        await fetcher.start()

        async def get(url: str) -> int:
            return len((await fetcher.fetch(url, 10.0)).body)

        async def close() -> None:
            await fetcher.close()
    else:
        import httpx

        client = httpx.AsyncClient(
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": USER_AGENT},
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64), timeout=10.0,
            follow_redirects=False)

        async def get(url: str) -> int:
            r = await client.get(url)
            assert r.status_code == 200
            return len(r.content)

        async def close() -> None:
            await client.aclose()

    async def run(count: int) -> None:
        it = iter(range(count))

        async def worker() -> None:
            for i in it:
                size = await get(server.url(i % n_targets))
                assert size > 1000

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    try:
        await run(concurrency * 3)  # open the connections
        c0 = time.process_time()
        await run(n)
        return (time.process_time() - c0) / n
    finally:
        await close()


# =========================================================================== report

@dataclass
class Row:
    ref: str
    what: str
    ours: str
    baseline: str
    ratio: str
    target: str
    result: str


def fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    if us != us:
        return "n/a"
    return f"{us:,.0f} µs" if us >= 100 else f"{us:.1f} µs"


def fmt_ratio(r: float) -> str:
    if r != r:
        return "n/a"
    return f"{r:.3f} (1/{1 / r:.0f})" if 0 < r < 1 else f"{r:.2f}"


def verdict(ok: bool | None) -> str:
    return "info" if ok is None else ("PASS" if ok else "**MISS**")


def print_table(rows: list[Row]) -> None:
    print("| # | measurement | ours | baseline | ours / baseline | target | result |")
    print("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r.ref} | {r.what} | {r.ours} | {r.baseline} | {r.ratio} | {r.target} | {r.result} |")


# =========================================================================== main

async def run_async_parts(args: argparse.Namespace, kinds: dict[str, PageKind], pg_admin: str | None,
                          tmp: Path) -> tuple[list[PathResult], dict[tuple[str, int], float], str, str]:
    fetch: dict[tuple[str, int], float] = {}
    pg_status = "skipped (--skip-postgres)" if args.skip_postgres else ""
    if not args.skip_http:
        for concurrency in (1, 50):
            for client_kind in ("aiohttp", "httpx"):
                n = args.fetches if client_kind == "aiohttp" or concurrency == 1 else max(100, args.fetches // 2)
                log(f"(d) {client_kind} fetch cost, {concurrency} concurrent, {n} fetches")
                fetch[(client_kind, concurrency)] = await fetch_cost(client_kind, kinds["1-model"].server,
                                                                     args.targets, concurrency, n)
    paths: list[PathResult] = []
    for key in ("1-model", "8-model"):
        kind = kinds[key]
        sqlite_dir = Path(tempfile.mkdtemp(prefix="ingest-sqlite-", dir=tmp))
        log(f"(b) whole path, {key} page, SQLite, {args.targets} targets x {args.rounds} rounds")
        paths.append(await whole_path(kind, "SQLite", f"sqlite:///{sqlite_dir / 'bench.db'}", args.targets,
                                      args.rounds))
        shutil.rmtree(sqlite_dir, ignore_errors=True)
        if args.skip_postgres or pg_status.startswith("unreachable"):
            continue
        try:
            pg = PostgresScratch(pg_admin or DEFAULT_PG_ADMIN)
        except Exception as exc:
            pg_status = f"unreachable at {pg_admin}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            print(f"\n!!! PostgreSQL {pg_status} -- continuing with SQLite only\n", flush=True)
            continue
        try:
            log(f"(b) whole path, {key} page, PostgreSQL ({pg.name}), {args.targets} targets x {args.rounds} rounds")
            paths.append(await whole_path(kind, "PostgreSQL", pg.url, args.targets, args.rounds, pg))
            pg_status = "ok"
        finally:
            pg.drop()
    if args.profile:
        sqlite_dir = Path(tempfile.mkdtemp(prefix="ingest-profile-", dir=tmp))
        log(f"profiling the {args.profile} SQLite path (cProfile)")
        profiled = await whole_path(kinds[args.profile], "SQLite", f"sqlite:///{sqlite_dir / 'bench.db'}",
                                    args.targets, args.rounds, profile=True)
        shutil.rmtree(sqlite_dir, ignore_errors=True)
        profile_text = profiled.profile
    else:
        profile_text = ""
    return paths, fetch, pg_status, profile_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Ingest benchmark (parse, whole scrape path, Prometheus, HTTP clients).")
    ap.add_argument("--targets", type=int, default=500, help="targets for the whole path (default 500)")
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds after two warm-up rounds (default 20)")
    ap.add_argument("--skip-prometheus", action="store_true", help="no Prometheus baseline (uses 1,000 µs/scrape)")
    ap.add_argument("--skip-postgres", action="store_true")
    ap.add_argument("--skip-http", action="store_true", help="skip the httpx vs aiohttp comparison")
    ap.add_argument("--quick", action="store_true", help="100 targets, 3 rounds, short timings (~1 min)")
    ap.add_argument("--postgres-url", default=DEFAULT_PG_ADMIN, help="admin URL; a scratch database is made")
    ap.add_argument("--prom-seconds", type=float, default=20.0, help="Prometheus measurement window")
    ap.add_argument("--prom-targets-8", type=int, default=100,
                    help="Prometheus targets for the 8-model page (1 s interval; 500 would need ~4 cores)")
    ap.add_argument("--fetches", type=int, default=600, help="fetches per HTTP client measurement")
    ap.add_argument("--gzip", action="store_true", help="serve gzip to clients that ask (vLLM does not)")
    ap.add_argument("--profile", nargs="?", const="1-model", choices=("1-model", "8-model"),
                    help="also cProfile the SQLite whole path of this page (default 1-model)")
    args = ap.parse_args(argv)
    budget, repeats = 0.25, 5
    if args.quick:
        args.targets = min(args.targets, 100)
        args.rounds = min(args.rounds, 3)
        args.prom_seconds = min(args.prom_seconds, 8.0)
        args.prom_targets_8 = min(args.prom_targets_8, 50)
        args.fetches = min(args.fetches, 200)
        budget, repeats = 0.05, 3

    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="llm-ingest-bench-"))
    servers: list[PageServer] = []
    try:
        text = FIXTURE.read_text()
        kinds: dict[str, PageKind] = {}
        for key, page_text in (("1-model", text), ("8-model", multi_model_page(text, 8))):
            # more variants than a target's scrapes in (b), so no measured scrape sees its
            # counters fall back (an engine restart, which a real page shows rarely)
            variants, frac = page_variants(page_text, VARIANTS)
            kind = kinds[key] = PageKind(key, variants, frac)
            files = []
            for i, v in enumerate(variants):
                path = tmp / f"{key}-{i:02d}.prom"
                path.write_bytes(v)
                files.append(path)
            kind.server = PageServer(files, args.gzip)
            servers.append(kind.server)
            log(f"{key} page: {len(kind.body):,} bytes, {frac:.0%} of sample lines change between scrapes, "
                f"served by PID {kind.server.proc.pid} on {kind.server.base_url}")

        parse: dict[str, ParseResult] = {}
        for key in ("1-model", "8-model"):
            log(f"(a) parse, {key} page")
            parse[key] = bench_parse_page(kinds[key], budget, repeats)

        paths, fetch, pg_status, profile_text = asyncio.run(run_async_parts(args, kinds, args.postgres_url, tmp))

        prom: dict[str, PromResult] = {}
        if not args.skip_prometheus:
            for key, n in (("1-model", args.targets), ("8-model", args.prom_targets_8)):
                log(f"(c) Prometheus 2.42 scraping the {key} page, {n} targets @1s, {args.prom_seconds:g}s measured")
                try:
                    prom[key] = prometheus_cost(kinds[key], n, args.prom_seconds, tmp / f"prometheus-{key}")
                except Exception as exc:
                    prom[key] = PromResult(key, n, args.prom_seconds, error=f"{type(exc).__name__}: {exc}"[:300])
                    log(f"Prometheus run failed: {prom[key].error}")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------ details
    print("\n## Ingest benchmark\n")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; pages: `{FIXTURE.relative_to(ROOT)}` "
          f"({len(kinds['1-model'].body):,} B) and the 8-model page built from it "
          f"({len(kinds['8-model'].body):,} B); served {'gzip' if args.gzip else 'uncompressed'} "
          f"by `bench/page_server.py` (separate process), {VARIANTS} variants rotating per target "
          f"({kinds['1-model'].changed_fraction:.0%} of sample lines change from one scrape to the next). "
          f"Load average (1 min) before the run: {load_start:.2f}.\n")
    foreign = [(r.foreign_cores, r.foreign_top) for r in paths] + [(p.foreign_cores, p.foreign_top)
                                                                   for p in prom.values()]
    worst = max(foreign, key=lambda f: f[0] if f[0] == f[0] else 0.0, default=(0.0, ""))
    if worst[0] > 0.25:
        print(f"**Warning:** unrelated processes used up to {worst[0]:.2f} of the {os.cpu_count()} cores while we "
              f"measured (top: {worst[1] or '?'}; column 'other processes'); CPU times are inflated by that "
              "contention (shared caches, SMT) and wall rates are unreliable. Re-run on a quiet machine for "
              "reference numbers.\n")

    print("### (a) parse only, per page (median of batches)\n")
    print("| page | samples seen/kept | ours warm | ours warm, page varies | ours cold | adapter (normalize) "
          "| prometheus_client |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in parse.values():
        print(f"| {p.page} ({p.size:,} B) | {p.samples}/{p.kept} | {fmt_us(p.ours_warm)} | "
              f"{fmt_us(p.ours_warm_varying)} | {fmt_us(p.ours_cold)} | {fmt_us(p.adapter)} | "
              f"{fmt_us(p.prometheus_client)} |")
    crosses = [p for p in parse.values() if p.cross_check]
    if crosses:
        print("\nCross-check with `bench/parse_bench.py`'s `bench_parse` (same page and keep; GC off, best of 3): "
              + "; ".join(f"{p.page}: warm {fmt_us(p.cross_check['warm_s'])}, cold {fmt_us(p.cross_check['cold_s'])}, "
                          f"prometheus_client {fmt_us(p.cross_check['prometheus_client_s'])} "
                          f"(warm 1/{p.cross_check['warm_speedup']:.0f})" for p in crosses) + ".")

    print("\n### (b) whole path: fetch (aiohttp, 64 concurrent) + parse + normalize + store, CPU of this process\n")
    print("Each round scrapes every target once (`asyncio.gather` of `TargetScraper.run`, sink = list), then "
          "writes the round's batch with `SampleWriter.write` in a worker thread (`asyncio.to_thread`, as "
          "`ScrapeService.flush` does). Two warm-up rounds (and one more after a 5-minute level boundary) "
          "are not measured. No APScheduler and no telemetry "
          "callbacks (`on_result`) in the loop.\n")
    print("| page | DB | scrapes | series/scrape | CPU µs/scrape | fetch+parse+normalize | store (writer thread) "
          "| of which cyclic GC (full GCs) | scrapes/s per core | wall scrapes/s | PostgreSQL server CPU µs/scrape "
          "| page server CPU µs/scrape | other processes (cores) | failures |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in paths:
        pgcpu = "—" if r.pg_server_cpu is None else f"{r.us(r.pg_server_cpu):,.0f}"
        fails = ", ".join(f"{k}: {v}" for k, v in r.failures.items()) or "none"
        if r.note:
            fails += f"; {r.note}"
        print(f"| {r.page} | {r.db} | {r.targets}×{r.rounds} | {r.series_per_scrape:.0f} | {r.us(r.cpu_total):,.0f} | "
              f"{r.us(r.cpu_scrape):,.0f} | {r.us(r.cpu_store_thread):,.0f} (process {r.us(r.cpu_store):,.0f}) | "
              f"{r.us(r.gc_cpu):,.0f} ({r.gc_full}) | {1e6 / r.us(r.cpu_total):,.0f} | "
              f"{r.scrapes / r.wall_total:,.0f} | {pgcpu} | {r.us(r.server_cpu):,.0f} | {r.foreign_cores:.2f} | "
              f"{fails} |")
    print("\nNot measured (one-off per target, wall time): " + "; ".join(
        f"{r.page}/{r.db}: first round {r.warmup_scrape_s:.1f} s, first write (creates every series, "
        f"one SELECT + INSERT each) {r.first_write_s:.1f} s" for r in paths) + ".")
    if pg_status != "ok":
        print(f"\nPostgreSQL: {pg_status}.")

    if prom:
        print("\n### (c) Prometheus 2.42 scraping the same pages (its own CPU, from process_cpu_seconds_total)\n")
        print("| page | targets @1s | window | scrapes counted | page-server requests | CPU s | CPU µs/scrape "
              "| min(up) | samples/scrape | other processes (cores) | note |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for p in prom.values():
            print(f"| {p.page} | {p.targets} | {p.seconds:g} s | {p.scrapes:,} | {p.server_requests:,} | {p.cpu:.2f} | "
                  f"{p.us_per_scrape:,.0f} | {p.min_up:g} | {p.samples_per_scrape:,.0f} | {p.foreign_cores:.2f} | "
                  f"{p.error or ''} |")

    if fetch:
        print("\n### (d) CPU per page fetch (50 kB page), shared client, this process\n")
        print("| concurrent | aiohttp (PageFetcher) | httpx.AsyncClient |")
        print("|---:|---:|---:|")
        for c in (1, 50):
            print(f"| {c} | {fmt_us(fetch[('aiohttp', c)])} | {fmt_us(fetch[('httpx', c)])} |")

    # ------------------------------------------------------------------ summary
    rows: list[Row] = []
    for i, key in enumerate(("1-model", "8-model")):
        p = parse[key]
        base = f"prometheus_client {fmt_us(p.prometheus_client)}"
        r = p.ours_warm / p.prometheus_client
        rows.append(Row(f"a{3 * i + 1}", f"parse, {key} page, warm parser", fmt_us(p.ours_warm), base,
                        fmt_ratio(r), "≤ 1/20", verdict(r <= 0.05)))
        r = p.ours_warm_varying / p.prometheus_client
        rows.append(Row(f"a{3 * i + 2}", f"parse, {key} page, warm parser, page changes each call",
                        fmt_us(p.ours_warm_varying), base, fmt_ratio(r), "—", verdict(None)))
        r = p.ours_cold / p.prometheus_client
        rows.append(Row(f"a{3 * i + 3}", f"parse, {key} page, cold (new parser)", fmt_us(p.ours_cold), base,
                        fmt_ratio(r), "—", verdict(None)))
    for i, r in enumerate(paths, 1):
        pr = prom.get(r.page)
        # Prometheus' CPU includes its storage: the PostgreSQL server's CPU is counted in ours
        ours = r.us(r.cpu_total + (r.pg_server_cpu or 0.0)) / 1e6
        if pr is not None and pr.scrapes:
            base_s, base = pr.us_per_scrape / 1e6, f"Prometheus {fmt_us(pr.us_per_scrape / 1e6)}"
        elif r.page == "1-model":
            base_s, base = PROMETHEUS_REFERENCE_US / 1e6, "1,000 µs (reference: 1,000 scrapes/s/core)"
        else:
            base_s, base = float("nan"), "Prometheus not run"
        ratio = ours / base_s
        extra = "" if r.pg_server_cpu is None else f"; of it {r.us(r.pg_server_cpu):,.0f} µs in the PostgreSQL server"
        rows.append(Row(f"b{i}", f"whole path CPU/scrape, {r.page}, {r.db} "
                                 f"({1e6 / r.us(r.cpu_total):,.0f} scrapes/s/core in our process{extra})",
                        fmt_us(ours), base, fmt_ratio(ratio), f"≤ {TARGET_INGEST_RATIO:g} of Prometheus",
                        verdict(None if ratio != ratio else ratio <= TARGET_INGEST_RATIO)))
    for i, p in enumerate(prom.values(), 1):
        rows.append(Row(f"c{i}", f"Prometheus 2.42 CPU/scrape, {p.page}, {p.targets} targets "
                                 f"({1e6 / p.us_per_scrape if p.scrapes else float('nan'):,.0f} scrapes/s/core)",
                        fmt_us(p.us_per_scrape / 1e6), "—", "—", "baseline", verdict(None) if p.scrapes else "error"))
    for i, c in enumerate((1, 50), 1):
        if ("aiohttp", c) in fetch:
            a, h = fetch[("aiohttp", c)], fetch[("httpx", c)]
            rows.append(Row(f"d{i}", f"CPU per 50 kB fetch, {c} concurrent: aiohttp vs httpx", fmt_us(a),
                            f"httpx {fmt_us(h)}", fmt_ratio(a / h), "aiohttp ≤ httpx", verdict(a <= h)))
    print(f"\n### Summary (total runtime {time.perf_counter() - started:.0f} s)\n")
    print_table(rows)
    if profile_text:
        print(profile_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
