"""Load benchmark: one service process scraping N targets at 15 s while 50 API clients read.

    python3 bench/load.py                  # N = 150, 500, 1,000; 10 minutes each (~50 min)
    python3 bench/load.py --quick          # N = 150 and 1,000, 1 minute warm-up, 2 measured (~8 min)
    python3 bench/load.py --sizes 1000 --minutes 5 --database postgresql+psycopg://postgres@127.0.0.1:5432/test

What runs (all on 127.0.0.1, every process stopped by its PID at the end):

* **Pages.** ``bench/page_server.py`` in one process serves the real vLLM page
  (``tests/fixtures/exposition/vllm-0.32-cpu-real.prom``) in 16 rotating variants
  (``bench.ingest.page_variants``: counters and histograms grow between scrapes) on
  ``/t/<i>/metrics`` for target ``i``.
* **The service.** ``llm-latency serve`` (real uvicorn) with a targets YAML of N static
  targets at 15 s, its SQLite database in a temp directory (``--database``: a PostgreSQL URL
  instead), ``LLM_LATENCY_SCRAPE_JITTER=0`` so a scrape's time is its schedule plus lateness.
  The periodic rounds run at their defaults (summaries and alerts every 15 s, diagnosis 30 s).
* **Clients.** From the first scrapes on, 50 concurrent clients (one ``aiohttp`` session
  each, gzip accepted) loop over the read endpoints a dashboard and an operator use:
  ``/api/v1/targets``, the status page ``/``, one target's ``/latency?window=5m``,
  ``/api/v1/diagnoses``, ``/metrics``, the fleet ``/api/v1/latency?window=5m``, each with a
  30 s client timeout. The clients share the service's cores, so they are kept cheap: aiohttp
  (``--client httpx`` for one ``httpx.AsyncClient`` each, which costs many times aiohttp's CPU
  per fetch, ``bench.ingest`` table (d)), reading each body as it was sent (gzip) without
  inflating it, so a request's time is the service's, until its last byte arrived.
  ``--client aiohttp-inflate`` inflates every answer (every ``/metrics`` is ~5 MB inflated at
  1,000 targets), which makes the clients' own event loop the limit. The clients' CPU is
  printed beside the service's.

Measured after a warm-up under the clients (``--warmup``, default 330 s: the rounds' longest
window, 5 minutes, fills, plus one round): **API** p50/p99 per endpoint and over all requests,
errors (non-2xx or timeout); **scrape lateness**: for every stored scrape of every target,
its time minus its schedule (the target's first scrape + k x 15 s; APScheduler's interval
trigger is fixed-rate, so a coalesced or late run shows as lateness), p50/p99/max; the share
of scheduled scrapes that happened; the service's **CPU** (utime+stime per second of run, of
its process) and **RSS** every 5 s: at the end of warm-up, the maximum, at the end; RSS growth
from the first to the last third of the measured run, and the mean of each measured minute.
Round self-metrics from ``/metrics``: diagnosis/alert/summary round overruns and skips.

Targets (issue 11): 1,000 targets with scrape lateness p99 <= 1 s and API p99 <= 500 ms; RSS
not growing after warm-up. Exits 1 when one is missed. Run on a quiet machine: on two shared
cores the clients, the page server and the service compete for the same CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python bench/load.py`
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import httpx  # noqa: E402

from bench.ingest import PageServer, page_variants, proc_cpu_seconds, rss_mb  # noqa: E402

PAGE = ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom"
INTERVAL = 15.0
CLIENTS = 50
TARGET_LATENESS_P99, TARGET_API_P99 = 1.0, 0.5
#: Seconds of warm-up, with the clients running, before anything is measured: the longest
#: window the rounds hold (the summaries' and /metrics' 5 minutes) fills, plus one round, so
#: what RSS does afterwards is the steady state and not the windows filling up.
WARMUP = 330.0
ENDPOINTS = ("targets", "status", "latency", "diagnoses", "metrics", "fleet")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)]


@dataclass
class Run:
    n: int
    minutes: float
    api: dict[str, list[float]] = field(default_factory=lambda: {e: [] for e in ENDPOINTS})
    errors: dict[str, int] = field(default_factory=dict)
    lateness: list[float] = field(default_factory=list)
    scrape_share: float = math.nan
    cpu: float = math.nan  # cores used by the service over the measured run
    client_cpu: float = math.nan  # cores used by the 50 clients (this process) over the measured run
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds since measuring, MB)
    rss_warm: float = math.nan
    rounds: dict[str, str] = field(default_factory=dict)
    startup: float = math.nan  # seconds from start to /healthz answering

    @property
    def all_api(self) -> list[float]:
        return [t for ts in self.api.values() for t in ts]

    @property
    def rss_growth(self) -> float:
        """MB from the first third's mean RSS to the last third's."""
        if len(self.rss) < 6:
            return math.nan
        third = len(self.rss) // 3
        return statistics.mean(m for _, m in self.rss[-third:]) - statistics.mean(m for _, m in self.rss[:third])


class Service:
    """``llm-latency serve`` in its own process; stopped by PID."""

    def __init__(self, workdir: Path, n: int, server: PageServer, database: str | None) -> None:
        self.port = free_port()
        config = workdir / "targets.yaml"
        lines = ["targets:"]
        for i in range(n):
            lines += [f"  - name: t{i:04d}", f"    url: {server.url(i)}", "    engine: vllm",
                      f"    scrape_interval: {INTERVAL:g}s"]
        config.write_text("\n".join(lines) + "\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LLM_LATENCY_DATA_DIR": str(workdir),
               "LLM_LATENCY_SCRAPE_JITTER": "0", "LLM_LATENCY_ALLOWED_TARGET_HOSTS": ""}
        self.log = (workdir / "service.log").open("wb")
        if database:  # PostgreSQL is migrated by an explicit step (replicas never race to migrate)
            env["LLM_LATENCY_DATABASE_URL"] = database
            subprocess.run([sys.executable, "-c", "from app.cli import main; main()", "db", "upgrade"],
                           cwd=str(workdir), env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                           stderr=subprocess.STDOUT, check=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from app.cli import main; main()", "serve", "--config", str(config),
             "--port", str(self.port)], cwd=str(workdir), env=env, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        started = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited ({self.proc.returncode}); see {workdir / 'service.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > started + 900:
                self.stop()
                raise RuntimeError("the service did not answer /healthz within 900 s")
            time.sleep(0.5)
        self.startup = time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


async def clients(url: str, run: Run, measured_from: float, until: float, kind_of_client: str = "aiohttp") -> None:
    """The 50 clients, from now to ``until``; requests that start before ``measured_from``
    (the warm-up) are made but not counted."""
    paths = {"targets": "/api/v1/targets", "status": "/", "latency": "/api/v1/targets/{t}/latency?window=5m",
             "diagnoses": "/api/v1/diagnoses", "metrics": "/metrics", "fleet": "/api/v1/latency?window=5m"}

    async def one(k: int) -> None:
        async with Getter(url, kind_of_client) as client:
            i = k
            while time.monotonic() < until:
                endpoint = ENDPOINTS[i % len(ENDPOINTS)]
                path = paths[endpoint].format(t=f"t{(i * 7919) % run.n:04d}")
                i += 1
                t0, t0_mono = time.perf_counter(), time.monotonic()
                try:
                    status = await client.get(path)
                    ok = 200 <= status < 300
                    kind = f"HTTP {status}"
                except (TimeoutError, httpx.HTTPError, aiohttp.ClientError) as exc:
                    ok, kind = False, type(exc).__name__
                if t0_mono < measured_from:
                    continue
                run.api[endpoint].append(time.perf_counter() - t0)
                if not ok:
                    key = f"{endpoint}: {kind}"
                    run.errors[key] = run.errors.get(key, 0) + 1

    await asyncio.gather(*(one(k) for k in range(CLIENTS)))


class Getter:
    """One client's connection: GET a path, read the whole body, return the status. The
    ``aiohttp`` clients read the gzip-encoded body as it came (what the service sent and when it
    finished sending it), ``aiohttp-inflate`` and ``httpx`` decode it too."""

    def __init__(self, base_url: str, kind: str) -> None:
        self.base_url, self.kind = base_url, kind

    async def __aenter__(self) -> Getter:
        if self.kind == "httpx":
            self.httpx = httpx.AsyncClient(base_url=self.base_url, timeout=30.0)
        else:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0),
                                                 connector=aiohttp.TCPConnector(limit=1),
                                                 auto_decompress=self.kind == "aiohttp-inflate")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await (self.httpx.aclose() if self.kind == "httpx" else self.session.close())

    async def get(self, path: str) -> int:
        if self.kind == "httpx":
            return (await self.httpx.get(path)).status_code
        async with self.session.get(self.base_url + path) as response:
            await response.read()
            return response.status


def lateness(workdir: Path, database: str | None, since: float, until: float) -> tuple[list[float], float]:
    """Every stored scrape's delay after its schedule, and the share of scheduled scrapes done."""
    from sqlalchemy import select

    from app.store import db
    from app.store.models import Scrape

    engine = db.make_engine(database or f"sqlite:///{workdir / 'llm-latency.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(Scrape.target_id, Scrape.ts).order_by(Scrape.target_id, Scrape.ts)).all()
    finally:
        engine.dispose()
    by_target: dict[int, list[float]] = {}
    for target_id, ts in rows:
        by_target.setdefault(target_id, []).append(ts)
    late, done, expected = [], 0, 0
    for times in by_target.values():
        first = times[0]
        measured = [t for t in times if since <= t <= until]
        for t in measured:
            k = round((t - first) / INTERVAL)
            late.append(max(0.0, t - (first + k * INTERVAL)))
        done += len(measured)
        # schedule points first + k x interval inside [since, until]
        expected += max(0, math.floor((until - first) / INTERVAL) - math.ceil((since - first) / INTERVAL) + 1)
    return late, (done / expected if expected else math.nan)


def database_file(workdir: Path) -> Path | None:
    found = sorted(workdir.glob("*.db"))
    return found[0] if found else None


def round_metrics(url: str) -> dict[str, str]:
    try:  # right after the clients stop, the service may still be working through their backlog
        text = httpx.get(f"{url}/metrics", timeout=300).text
    except httpx.HTTPError as exc:
        return {"/metrics": f"unanswered ({type(exc).__name__})"}
    out = {}
    for name in ("llm_latency_round_overruns_total", "llm_latency_round_skips_total",
                 "llm_latency_round_duration_seconds_count", "llm_latency_round_duration_seconds_sum"):
        for line in text.splitlines():
            match = re.match(rf"{name}\{{(.*)\}} (\S+)", line)
            if match:
                out[f"{name}{{{match[1]}}}"] = match[2]
    return out


def measure(n: int, minutes: float, server: PageServer, database: str | None, warmup: float,
            kind_of_client: str = "aiohttp") -> Run:
    run = Run(n, minutes)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        workdir = Path(tmp)
        service = Service(workdir, n, server, database)
        try:
            run.startup = service.startup
            print(f"# N={n}: service pid {service.proc.pid} on {service.url} (up after {service.startup:.0f} s); "
                  f"first scrapes, then {warmup:.0f} s of warm-up under the clients", file=sys.stderr)
            time.sleep(INTERVAL)
            t0 = time.monotonic()
            measured_from, until = t0 + warmup, t0 + warmup + minutes * 60
            since = time.time() + warmup
            cpu0 = own0 = math.nan

            async def sample_rss() -> None:
                nonlocal cpu0, own0
                while time.monotonic() < until:
                    now = time.monotonic()
                    if now >= measured_from:
                        if math.isnan(cpu0):
                            cpu0, run.rss_warm = proc_cpu_seconds(service.proc.pid), rss_mb(service.proc.pid)
                            own0 = time.process_time()
                        run.rss.append((now - measured_from, rss_mb(service.proc.pid)))
                    await asyncio.sleep(5.0)

            async def main() -> None:
                await asyncio.gather(clients(service.url, run, measured_from, until, kind_of_client), sample_rss())

            asyncio.run(main())
            run.cpu = (proc_cpu_seconds(service.proc.pid) - cpu0) / (time.monotonic() - measured_from)
            run.client_cpu = (time.process_time() - own0) / (time.monotonic() - measured_from)
            end = time.time()
            run.rounds = round_metrics(service.url)
        finally:
            service.stop()
        db_file = database_file(workdir)
        url = database or (f"sqlite:///{db_file}" if db_file else None)
        run.lateness, run.scrape_share = lateness(workdir, url, since, end - INTERVAL)
    return run


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.0f} ms"


def report(runs: list[Run], database: str) -> bool:
    print(f"\n## Load: one process, N targets at {INTERVAL:g} s, {CLIENTS} API clients ({database}; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end)\n")
    print("| N | start-up | minutes | scrapes done | lateness p50 / p99 / max | API requests | API p50 | API p99 "
          "| errors | CPU (cores) | clients' CPU | RSS warm / max / end | RSS growth (first → last third) |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in runs:
        api = r.all_api
        rss = [m for _, m in r.rss]
        print(f"| {r.n:,} | {r.startup:.0f} s | {r.minutes:g} | {r.scrape_share:.1%} | "
              f"{fmt_ms(pct(r.lateness, 0.5))} / "
              f"{fmt_ms(pct(r.lateness, 0.99))} / {fmt_ms(max(r.lateness, default=math.nan))} | {len(api):,} | "
              f"{fmt_ms(pct(api, 0.5))} | {fmt_ms(pct(api, 0.99))} | {sum(r.errors.values())} | {r.cpu:.2f} | "
              f"{r.client_cpu:.2f} | "
              f"{r.rss_warm:,.0f} / {max(rss, default=math.nan):,.0f} / {rss[-1] if rss else math.nan:,.0f} MB | "
              f"{r.rss_growth:+,.0f} MB |")
    print("\n| N | " + " | ".join(f"{e} p50 / p99" for e in ENDPOINTS) + " |")
    print("|---:|" + "---|" * len(ENDPOINTS))
    for r in runs:
        print(f"| {r.n:,} | " + " | ".join(f"{fmt_ms(pct(r.api[e], 0.5))} / {fmt_ms(pct(r.api[e], 0.99))}"
                                          for e in ENDPOINTS) + " |")
    for r in runs:
        by_minute: dict[int, list[float]] = {}
        for t, m in r.rss:
            by_minute.setdefault(int(t // 60), []).append(m)
        minutes_rss = [statistics.mean(values) for _, values in sorted(by_minute.items())]
        print(f"\nN={r.n:,} RSS by measured minute (MB): " + ", ".join(f"{m:,.0f}" for m in minutes_rss))
    for r in runs:
        if r.errors:
            print(f"\nN={r.n:,} errors: {r.errors}")
        print(f"\nN={r.n:,} rounds (self-metrics): " + ", ".join(f"{k} {v}" for k, v in sorted(r.rounds.items())))
    largest = max(runs, key=lambda r: r.n)
    checks = [(f"N={largest.n:,} scrape lateness p99 <= {TARGET_LATENESS_P99:g} s",
               pct(largest.lateness, 0.99) <= TARGET_LATENESS_P99),
              (f"N={largest.n:,} API p99 <= {TARGET_API_P99 * 1000:g} ms",
               pct(largest.all_api, 0.99) <= TARGET_API_P99),
              (f"N={largest.n:,} no API errors", not largest.errors),
              (f"N={largest.n:,} RSS growth after warm-up < 10 %", largest.rss_growth < 0.1 * largest.rss_warm)]
    print("\n## Targets\n")
    for what, ok in checks:
        print(f"- {what}: {'PASS' if ok else 'MISS'}")
    ok = all(ok for _, ok in checks)
    print(f"\nOverall: {'PASS' if ok else 'MISS'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="150,500,1000", help="numbers of targets")
    parser.add_argument("--minutes", type=float, default=10.0, help="measured minutes per size (after warm-up)")
    parser.add_argument("--quick", action="store_true", help="N = 150 and 1,000, 2 minutes each after 1 of warm-up")
    parser.add_argument("--warmup", type=float, default=None,
                        help=f"seconds of warm-up under the clients, not measured (default: {WARMUP:g}; --quick: 60)")
    parser.add_argument("--database", default=None, help="a PostgreSQL URL (default: SQLite in a temp directory)")
    parser.add_argument("--client", choices=("aiohttp", "aiohttp-inflate", "httpx"), default="aiohttp",
                        help="the API clients' HTTP library (default aiohttp: see the docstring)")
    args = parser.parse_args()
    sizes = [150, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    minutes = 2.0 if args.quick else args.minutes
    if args.warmup is None:
        args.warmup = 60.0 if args.quick else WARMUP
    print(f"# machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-load-pages-") as tmp:
        files = []
        variants, _ = page_variants(PAGE.read_text(), 16)
        for i, body in enumerate(variants):
            path = Path(tmp) / f"page-{i}.prom"
            path.write_bytes(body)
            files.append(path)
        server = PageServer(files, use_gzip=False)
        runs: list[Run] = []
        ok = False
        try:
            for n in sizes:  # the table so far after each size: a later size that fails loses nothing
                runs.append(measure(n, minutes, server, args.database, args.warmup, args.client))
                ok = report(runs, "PostgreSQL" if args.database else "SQLite")
        finally:
            server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
