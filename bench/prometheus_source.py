"""Prometheus-source scale benchmark: what the service's periodic work costs the source's
Prometheus and the service per diagnosis interval at N engines, one discovery + diagnosis round,
and the 7-day latency API, against a real Prometheus 2.42 measured in the same run.

    python3 bench/prometheus_source.py --sizes 100,1000,3000   # ~60 minutes on 2 cores (7 days of history)
    python3 bench/prometheus_source.py --quick                 # N = 10 only, ~5 minutes
    python3 bench/prometheus_source.py --healthy-share 0.9     # 90 % of the engines healthy

(About 2.5 minutes of either is writing the 7-day history and promtool turning it into
blocks; ``--history-days 0.5`` shortens that while working on the bench itself.)

What runs (all on 127.0.0.1, every process stopped by its PID at the end):

* **Engines.** One child process serves N emulated vLLM engines on one port, engine ``i`` on
  ``/engines/<i>/metrics``. N real-time simulations would not fit on two cores, so the pages
  are *replayed*: for each of the eight steady emulator scenarios (``app.emulator``), one
  :class:`~app.emulator.simulation.Simulation` is run offline for ``PERIOD`` = 8 x 15
  simulated seconds after a 60 s warm-up, recording a page every 15 s (pages ``p0 .. p8``).
  The n-th page of a replay is ``p[n % 8]`` with every counter and histogram sample raised by
  ``(n // 8) * (p8 - p0)``: counters never go down, each 15 s step adds exactly what the
  simulation added in that step, histograms stay consistent (every bucket grows by a real
  bucket increment), gauges repeat with a 2-minute period. Engine ``i`` replays scenario
  ``i % 8`` starting at step ``i // 8 % 8`` and advances one step per request, so every
  scrape Prometheus makes (every 15 s) is one simulated 15 s step - the same rates,
  percentiles and regimes a live engine in that scenario would show.
* **Prometheus.** Debian's ``/usr/bin/prometheus`` (2.42) on a free port, scraping every
  15 s through ``file_sd_configs`` (one target group per engine: ``__metrics_path__``,
  ``namespace``, ``pod``, ``service``). For each N the file grows to N engines; the round
  runs once Prometheus holds >= 75 s of scrapes of every engine (the diagnosis window is the
  service default, 60 s).
* **History.** Before Prometheus starts, 7 days of 15 s scrapes of engine 0 (the same replay,
  steps ``0 .. 40319``; live scraping continues at step 40320 so its counters go on) are
  written as OpenMetrics and turned into TSDB blocks by ``promtool tsdb
  create-blocks-from openmetrics --max-block-duration=24h`` (24 h blocks: larger than
  Prometheus' own compaction ranges at the default 15 d retention, so it does not start
  compacting them during the measurement).
* **The monitor.** The real service (``app.main.create_app``) on a temp SQLite database with
  a targets YAML holding one ``sources:`` entry (``target_labels: [namespace, pod]``,
  ``service_labels: [namespace, service]``), driven through ``TestClient``; background jobs
  that would also run during the round (summaries, alerts, diagnosis) get a one-hour
  interval. The round is ``monitor.evaluate_diagnoses(now)`` - discovery, target rows,
  every window, diagnosis and persistence - run twice per N: the first round inserts the
  newly discovered targets, the second is a steady round.
* **Per diagnosis interval.** Then, per N, Prometheus' process CPU (``/proc/<pid>/stat``) over
  a quiet period of ``--intervals`` x 30 s with the service idle (its ingest: the baseline),
  then the same length with the service's periodic work at its default cadence, driven here
  so that each 30 s interval holds exactly one diagnosis round, two summary rounds, two
  alert rounds (the default SLOs) and one change events round: Prometheus' CPU minus its
  ingest CPU over as long, this process' CPU (the service), the wall of each diagnosis round,
  the queries and answer bytes (decompressed) of the source's client, and VmRSS; then a
  least-squares fit ``a x N^b`` per column and its projection to N = 10,000, printed as a
  projection. Then the same intervals again with the sources' raw samples dropped - every
  window queried, the design before them (``measure_queried``) - and the ratios of the two: a
  baseline measured in the same run; and once more with the means series kept alone, the TTFT
  and ITL buckets queried where needed (``hold_buckets: []``, ``measure_means_only``).
* **The floor of a read-once design.** What Prometheus spends to read, once, every series the
  means-first round reads (an instant snapshot of all of them; or one evaluation of a per-pod
  ``rate[1m]`` recording rule per name), and every pod's bucket series of the histograms whose
  tails the diagnosis judges or shows (read once; or their p99 per pod computed by Prometheus):
  no design that reads each of those series once per interval can cost Prometheus less.
* **The wire format of a refresh.** The raw samples' three reads (means, TTFT and ITL buckets,
  30 s) as the service sends them (the JSON API, gzip) and through Prometheus' remote read
  (protobuf, snappy: the samples, or the raw XOR chunks that hold them): Prometheus' CPU and
  the bytes on the wire of each.

Measured per round: wall time, CPU time of this process (``time.process_time``: the round's
threads included; Prometheus and the page server are other processes), HTTP API calls
(``queries_last_round`` of ``GET /api/v1/sources``), VmRSS of this process after the round,
targets discovered. Baseline, measured right after each round: **Prometheus alone** - the
round's exact queries (recorded from the client) sent again by a bare ``httpx`` client at the
same concurrency (8), bodies read but not decoded.

The 7-day latency API: ``GET /api/v1/targets/<engine 0>/latency?window=7d`` through
``TestClient`` (median of 3) vs Prometheus answering ``histogram_quantile(0.99, sum by (le)
(increase(vllm:time_to_first_token_seconds_bucket{pod="engine-0"}[7d])))`` (median of 3), and
vs the endpoint's own queries replayed bare.

Targets at N = 1,000 per diagnosis interval (issue 41): Prometheus' extra CPU <= 1 s, the
service's <= 1.5 s, wall per round <= 5 s, answer bytes <= 10 MB; 7-day latency <= 1 s.
Exits 1 when one is missed (the last line says ``MISS``). Run it on a quiet machine: on two
shared cores, Prometheus' ingestion of 1,000 engines competes with the round for CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import math
import multiprocessing as mp
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python bench/prometheus_source.py`
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from app.promsource.mirror import means_names  # noqa: E402
from bench.ingest import rss_mb  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
SCRAPE_INTERVAL = 15.0
STEPS = 8  # pages per replay period (2 minutes of simulated time)
WARMUP = 60.0
SCENARIOS = ["healthy", "queueing", "prefill_compute", "kv_cache_pressure", "healthy_bursty",
             "prefill_interference", "bandwidth_bound", "weights_offloaded"]
SOURCE = "bench"
NAMESPACE = "llm"
REPLICAS_PER_SERVICE = 10
WINDOW_FILL = 75.0  # seconds of scrapes every engine has before a round (window 60 s)
CONCURRENCY = 8  # the source's max_concurrency (the config default)
TARGET_ROUND_WALL, TARGET_QUERIES, TARGET_LATENCY_7D = 5.0, 40, 1.0
DIAGNOSIS_INTERVAL, SUMMARY_INTERVAL = 30.0, 15.0  # the service's defaults (alerts: every 15 s too)
CHANGES_INTERVAL = 30.0  # the change events round's default
# Issue 41, per diagnosis interval at N = 1,000: Prometheus' extra CPU, the service's CPU, answer bytes
TARGET_PROM_CPU, TARGET_SERVICE_CPU, TARGET_BYTES = 1.0, 1.5, 10e6
PROJECT_TO = 10_000

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$")


# ---------------------------------------------------------------------------------- replayed pages
@dataclass
class Replay:
    """One scenario's recorded pages: ``render(n)`` is the n-th 15 s page (see the module doc)."""

    chunks: list[str]  # static text before each sample value (HELP/TYPE lines, the sample's name)
    values: list[list[float]]  # per recorded page p0..p8, one value per sample
    cumulative: list[bool]  # counter or histogram sample (grows per period) vs gauge (replayed)
    tail: str

    @classmethod
    def record(cls, scenario: str, seed: int) -> Replay:
        from app.emulator.simulation import Simulation

        sim = Simulation(scenario, seed=seed)
        sim.run_for(WARMUP)
        pages = []
        for _ in range(STEPS + 1):
            sim.run_for(SCRAPE_INTERVAL)
            pages.append(sim.render_metrics().decode())
        return cls.from_pages(pages)

    @classmethod
    def from_pages(cls, pages: list[str]) -> Replay:
        types: dict[str, str] = {}
        keys: list[str] | None = None
        values: list[list[float]] = []
        chunks: list[str] = []
        text: list[str] = []
        for page in pages:
            page_keys, page_values = [], []
            for line in page.splitlines():
                if line.startswith("#"):
                    parts = line.split(" ", 3)
                    if keys is None:
                        text.append(line + "\n")
                        if parts[1] == "TYPE":
                            types[parts[2]] = parts[3]
                    continue
                m = _SAMPLE.match(line)
                if m is None:
                    raise ValueError(f"unexpected exposition line: {line[:80]!r}")
                series = line[:m.start(3)].rstrip()
                page_keys.append(series)
                page_values.append(float(m[3]))
                if keys is None:
                    chunks.append("".join(text) + series)
                    text = []
            if keys is None:
                keys = page_keys
            elif page_keys != keys:
                raise ValueError("the recorded pages do not have the same series in the same order")
            values.append(page_values)
        assert keys is not None

        def is_cumulative(series: str) -> bool:
            name = _SAMPLE.match(series + " 0")[1]  # type: ignore[index]
            for suffix in ("", "_total", "_bucket", "_sum", "_count"):
                if name.endswith(suffix) and types.get(name[:len(name) - len(suffix)] if suffix else name) in (
                        "counter", "histogram"):
                    return True
            return False

        return cls(chunks, values, [is_cumulative(k) for k in keys], "".join(text))

    def sample_values(self, n: int) -> list[float]:
        j, cycle = n % STEPS, n // STEPS
        first, last, page = self.values[0], self.values[STEPS], self.values[j]
        return [v + cycle * (last[i] - first[i]) if self.cumulative[i] else v for i, v in enumerate(page)]

    def render(self, n: int) -> bytes:
        return ("".join(f"{c} {v!r}\n" for c, v in zip(self.chunks, self.sample_values(n), strict=True))
                + self.tail).encode()

    def series(self) -> list[str]:
        """The sample names with labels (``name{...}``), without HELP/TYPE text."""
        return [c.rsplit("\n", 1)[-1] for c in self.chunks]


def record_replays() -> list[Replay]:
    return [Replay.record(s, seed=i + 1) for i, s in enumerate(SCENARIOS)]


def history_steps(days: float) -> int:
    return int(days * 86400 / SCRAPE_INTERVAL)  # 40,320 scrapes for 7 days


def scenario_of(i: int, healthy_share: float) -> int:
    """Engine ``i``'s scenario (index into SCENARIOS): ``i % 8`` (each scenario alike, two of eight
    healthy), or with ``healthy_share`` that share of the engines healthy and the rest cycling
    through the seven others (a fleet where most replicas need no distribution read)."""
    if not healthy_share:
        return i % len(SCENARIOS)
    block = round(1 / (1 - healthy_share)) if healthy_share < 1 else 0
    if not block or i % block:
        return 0
    return 1 + (i // block) % (len(SCENARIOS) - 1)


def start_step(i: int, history_steps: int) -> int:
    """Engine 0 continues its backfilled history; the others start at staggered steps."""
    return history_steps if i == 0 else (i // len(SCENARIOS)) % STEPS


class EnginePages:
    """``/engines/<i>/metrics``: engine i's next replayed page (``bench/page_server.py``'s
    protocol calls :meth:`respond`)."""

    def __init__(self, replays: list[Replay], history_steps: int, healthy_share: float = 0.0) -> None:
        self.replays = replays
        self.healthy_share = healthy_share
        self.history_steps = history_steps
        self.steps: dict[int, int] = {}
        self.cache: dict[tuple[int, int], bytes] = {}
        self.requests = 0

    def respond(self, path: bytes, wants_gzip: bool) -> bytes:
        m = re.fullmatch(rb"/engines/(\d+)/metrics", path)
        if m is None:
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot found\n"
        i = int(m[1])
        n = self.steps.get(i, start_step(i, self.history_steps))
        self.steps[i] = n + 1
        self.requests += 1
        key = (scenario_of(i, self.healthy_share), n)
        body = self.cache.get(key)
        if body is None:
            if len(self.cache) > 256:
                self.cache.clear()
            body = self.cache[key] = self.replays[key[0]].render(n)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)


def serve_engines(conn: Any, replays: list[Replay], history_steps: int,
                  healthy_share: float = 0.0) -> None:  # child process
    from bench.page_server import Http

    pages = EnginePages(replays, history_steps, healthy_share)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Http(pages), "127.0.0.1", 0, backlog=1024)  # type: ignore[arg-type]
        conn.send(server.sockets[0].getsockname()[1])
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(main())


# ---------------------------------------------------------------------------------- Prometheus
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def names_read() -> set[str]:
    """Every metric name the source's queries select (histogram series, gauges, counters, infos)."""
    from app.promsource.queries import HISTOGRAM_FAMILIES, INFO_FAMILIES

    buckets = {f"{f.name}_bucket" for fs in HISTOGRAM_FAMILIES.values() for f in fs}
    return set(means_names()) | buckets | {metric for _, metric in INFO_FAMILIES}


def write_history(replay: Replay, labels: dict[str, str], end: float, path: Path, steps: int) -> int:
    """7 days of engine 0's scrapes ending before ``end``, as OpenMetrics grouped by series
    (each series' samples in time order, as promtool wants); returns the sample count.

    Only the series some source query selects go into the history (256 of the page's 389):
    the others (``_created``, FLOPs estimates, ...) are never read, and writing them would
    add a minute of promtool time to every run without changing any query's work."""
    read = names_read()
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    stamps = [f"{end - (steps - k) * SCRAPE_INTERVAL:.3f}" for k in range(steps)]
    series = replay.series()
    first, last = replay.values[0], replay.values[STEPS]
    count = 0
    with path.open("w") as out:
        out.write("".join(f"up{{{extra}}} 1 {t}\n" for t in stamps))
        for s, name in enumerate(series):
            if re.split(r"[{ ]", name, maxsplit=1)[0] not in read:
                continue
            count += steps
            head = f"{name[:-1]},{extra}}}" if name.endswith("}") else f"{name}{{{extra}}}"
            per_step = [replay.values[j][s] for j in range(STEPS)]
            if replay.cumulative[s]:
                delta = last[s] - first[s]
                out.write("".join(f"{head} {per_step[k % STEPS] + (k // STEPS) * delta!r} {stamps[k]}\n"
                                  for k in range(steps)))
            else:
                out.write("".join(f"{head} {per_step[k % STEPS]!r} {stamps[k]}\n" for k in range(steps)))
        out.write("# EOF\n")
    return count + steps


class Prometheus:
    """Debian's Prometheus on a free loopback port, stopped by PID."""

    def __init__(self, workdir: Path, sd_file: Path) -> None:
        self.config = workdir / "prometheus.yml"
        self.data = workdir / "prometheus-data"
        self.log = workdir / "prometheus.log"
        job = {"job_name": "engines", "scrape_interval": f"{SCRAPE_INTERVAL:g}s",
               "scrape_timeout": "10s", "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "5s"}]}
        self.config.write_text(f"global: {{scrape_interval: {SCRAPE_INTERVAL:g}s, evaluation_interval: 1m}}\n"
                               f"scrape_configs: {json.dumps([job])}\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after 120 s: {self.log_tail()}")

    def cpu(self) -> float:
        """CPU seconds (user + system) the Prometheus process has used so far, from /proc."""
        return process_cpu(self.process.pid if self.process else 0)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        body = httpx.post(f"{self.url}/api/v1/query", data=params, timeout=60).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body.get('error')}")
        return body["data"]["result"]

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its threads included) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_sd(path: Path, port: int, n: int) -> None:
    groups = [{"targets": [f"127.0.0.1:{port}"],
               "labels": {"__metrics_path__": f"/engines/{i}/metrics", "namespace": NAMESPACE, "pod": f"engine-{i}",
                          "service": f"svc-{i // REPLICAS_PER_SERVICE}"}} for i in range(n)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- measuring
class Recorder:
    """Records every query the source's client sends (method, arguments, seconds), so the
    same queries can be replayed against Prometheus alone."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[tuple[str, tuple, float]] = []
        for method in ("query", "query_range", "query_samples"):
            setattr(client, method, self._wrap(method, getattr(client, method)))

    def _wrap(self, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.calls.append((method, args, time.perf_counter() - t0))
        return timed

    def take(self) -> list[tuple[str, tuple, float]]:
        calls, self.calls = self.calls, []
        return calls


def _form(method: str, args: tuple) -> tuple[str, dict[str, str]]:
    if method == "query_range":
        promql, start, end, step = args
        return "query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return "query", {"query": args[0], "time": f"{args[1]:.3f}"}


def replay_bare(url: str, calls: list[tuple[str, tuple, float]]) -> float:
    """Wall seconds for Prometheus to answer ``calls`` sent by a bare client, 8 at a time."""
    requests = [_form(m, a) for m, a, _ in calls]
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
        def send(req: tuple[str, dict[str, str]]) -> int:
            r = client.post(f"{url}/api/v1/{req[0]}", data=req[1])
            if r.status_code != 200:
                raise RuntimeError(f"replayed query failed: HTTP {r.status_code}")
            return len(r.content)

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(send, requests[:CONCURRENCY]))  # warm connections
            t0 = time.perf_counter()
            list(pool.map(send, requests))
            return time.perf_counter() - t0


def serial_costs(url: str, calls: list[tuple[str, tuple, float]]) -> list[tuple[float, int, str]]:
    """Each query of ``calls`` sent alone, one after the other: (seconds, response bytes,
    the query's start), slowest first - where Prometheus' share of a round goes."""
    out = []
    with httpx.Client(timeout=120) as client:
        for method, args, _ in calls:
            endpoint, data = _form(method, args)
            t0 = time.perf_counter()
            r = client.post(f"{url}/api/v1/{endpoint}", data=data)
            out.append((time.perf_counter() - t0, len(r.content), " ".join(data["query"].split())[:90]))
    return sorted(out, reverse=True)


@dataclass
class RoundRow:
    n: int
    kind: str
    discovered: int
    queries: int
    wall: float
    cpu: float
    rss: float
    bare: float
    verdicts: Counter
    costs: list[tuple[float, int, str]]


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def wait_until(what: str, ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1.0)


def backfill(replay: Replay, labels: dict[str, str], end: float, workdir: Path, data: Path,
             steps: int) -> tuple[int, float]:
    """Engine 0's 7-day history into ``data`` (TSDB blocks); (samples, seconds taken)."""
    t0 = time.monotonic()
    source = workdir / "history.om"
    samples = write_history(replay, labels, end, source, steps)
    data.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=18h",
                           str(source), str(data)], capture_output=True, text=True, timeout=1800)
    source.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"promtool failed ({done.returncode}): {done.stderr[-2000:]}")
    return samples, time.monotonic() - t0


def config_yaml(url: str) -> str:
    return f"""targets: []
diagnosis: {{interval: 1h}}
sources:
  - name: {SOURCE}
    url: {url}
    selector: '{{namespace="{NAMESPACE}"}}'
    target_labels: [namespace, pod]
    service_labels: [namespace, service]
    query_timeout: 60s
    max_concurrency: {CONCURRENCY}
"""


def measure_round(client: Any, monitor: Any, recorder: Recorder, prom_url: str, n: int, kind: str,
                  now: float | None = None) -> RoundRow:
    recorder.take()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    results = monitor.evaluate_diagnoses(now=time.time() if now is None else now)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rss = rss_mb()
    calls = recorder.take()
    (status,) = client.get("/api/v1/sources").json()
    if status["state"] != "ok":
        raise RuntimeError(f"the source failed: {status['last_error']}")
    bare = replay_bare(prom_url, calls)
    costs = serial_costs(prom_url, calls)
    verdicts = Counter(d.verdict for d, _ in results)
    return RoundRow(n, kind, status["targets"], status["queries_last_round"], wall, cpu, rss, bare, verdicts, costs)


@dataclass
class IntervalRow:
    """What the service's periodic work costs per diagnosis interval at N engines: every job a
    service with default settings runs against its source in one interval (one diagnosis round,
    two summary rounds, two alert rounds, one change events round), against Prometheus' own
    ingest over a quiet interval."""

    n: int
    intervals: int
    ingest_cpu: float  # Prometheus CPU per interval with the service idle (scraping only)
    prom_cpu: float  # Prometheus CPU per interval while the service runs, minus ingest_cpu
    service_cpu: float  # this process' CPU per interval (the service's threads)
    round_walls: list[float]  # wall of each diagnosis round
    queries: float  # per interval
    bytes_read: float  # per interval (decompressed answers)
    wire_bytes: float  # per interval, as sent (gzip)
    rss: float  # MB, at the end
    overran: float  # seconds the work ran past its intervals (0 when it fits)
    by_job: dict[str, tuple[float, ...]]  # job -> (queries, bytes, Prometheus extra CPU, service CPU) per interval
    calls: dict[str, list[tuple[str, tuple, float]]]  # job -> the queries it sent in the first interval


def measure_intervals(monitor: Any, recorder: Recorder, prom: Prometheus, n: int, intervals: int,
                      profile: cProfile.Profile | None = None) -> IntervalRow:
    """``intervals`` diagnosis intervals of the service's periodic work at the default cadence
    (diagnosis every DIAGNOSIS_INTERVAL, summaries and alerts every SUMMARY_INTERVAL, change
    events every CHANGES_INTERVAL), driven here in the scheduler's order so that each interval
    holds exactly those rounds, after one summary and alert round; Prometheus' process CPU over
    them minus its ingest CPU over an equally long quiet period just before.
    ``profile``: the jobs run under it (their CPU then includes the profiler's)."""
    span = intervals * DIAGNOSIS_INTERVAL
    source_client = recorder.client
    # a service that has been running: its first summary and alert rounds (which create every
    # gauge and alert row) are not a periodic cost
    monitor.refresh_summaries()
    monitor.evaluate_alerts()
    c0, q0 = prom.cpu(), time.monotonic()
    time.sleep(span)
    ingest_rate = (prom.cpu() - c0) / (time.monotonic() - q0)
    walls: list[float] = []
    queries0, bytes0, wire0 = source_client.queries, source_client.bytes_read, source_client.wire_bytes
    cpu0, prom0, t0 = time.process_time(), prom.cpu(), time.monotonic()
    ticks = int(DIAGNOSIS_INTERVAL / SUMMARY_INTERVAL)
    jobs = ("diagnosis", "summaries", "alerts", "changes")
    by_job: dict[str, list[float]] = {name: [0.0, 0.0, 0.0, 0.0] for name in jobs}
    calls: dict[str, list[tuple[str, tuple, float]]] = {name: [] for name in by_job}

    def job(name: str, fn: Callable[[], Any]) -> None:
        q, b, c = source_client.queries, source_client.bytes_read, prom.cpu()
        t, own = time.monotonic(), time.process_time()
        recorder.take()
        if profile is not None:
            profile.runcall(fn)
        else:
            fn()
        if time.monotonic() - t0 < DIAGNOSIS_INTERVAL:
            calls[name] += recorder.take()
        by_job[name][0] += source_client.queries - q
        by_job[name][1] += source_client.bytes_read - b
        by_job[name][2] += prom.cpu() - c - ingest_rate * (time.monotonic() - t)
        by_job[name][3] += time.process_time() - own

    for tick in range(intervals * ticks):
        time.sleep(max(0.0, t0 + tick * SUMMARY_INTERVAL - time.monotonic()))
        if tick % ticks == 0:
            w0 = time.perf_counter()
            job("diagnosis", monitor.evaluate_diagnoses)
            walls.append(time.perf_counter() - w0)
        job("summaries", monitor.refresh_summaries)
        job("alerts", monitor.evaluate_alerts)
        if tick % int(CHANGES_INTERVAL / SUMMARY_INTERVAL) == 1:  # out of step with the diagnosis, as scheduled
            job("changes", monitor.detect_changes)
    elapsed = time.monotonic() - t0
    time.sleep(max(0.0, t0 + span - time.monotonic()))  # the last interval runs to its end
    elapsed = max(elapsed, span)
    prom_cpu = prom.cpu() - prom0 - ingest_rate * (time.monotonic() - t0)
    return IntervalRow(n, intervals, ingest_rate * DIAGNOSIS_INTERVAL, prom_cpu / intervals,
                       (time.process_time() - cpu0) / intervals, walls,
                       (source_client.queries - queries0) / intervals, (source_client.bytes_read - bytes0) / intervals,
                       (source_client.wire_bytes - wire0) / intervals,
                       rss_mb(), elapsed - span, {k: tuple(x / intervals for x in v) for k, v in by_job.items()},
                       calls)


def measure_swapped(monitor: Any, recorder: Recorder, prom: Prometheus, n: int, intervals: int, what: str,
                    mirror_of: Callable[[Any], Any]) -> IntervalRow:
    """:func:`measure_intervals` with each source's raw samples replaced by ``mirror_of(reader)``
    (None: none, every window queried), after one diagnosis round that makes their first read;
    the service's own kept again after."""
    readers = [source.reader for source in monitor.sources.sources.values()]
    mirrors = [reader.mirror for reader in readers]
    for reader in readers:
        reader.mirror = mirror_of(reader)
    try:
        monitor.evaluate_diagnoses(now=time.time())
        recorder.take()
        row = measure_intervals(monitor, recorder, prom, n, intervals)
        recorder.take()
    finally:
        for reader, mirror in zip(readers, mirrors, strict=True):
            reader.mirror = mirror
    print(f"# N={n} {what}, per interval: Prometheus +{row.prom_cpu:.2f} s CPU, service {row.service_cpu:.2f} s CPU, "
          f"{row.queries:.0f} queries, {row.bytes_read / 1e6:.1f} MB", file=sys.stderr)
    return row


def measure_queried(monitor: Any, recorder: Recorder, prom: Prometheus, n: int, intervals: int) -> IntervalRow:
    """The intervals with every window queried: the design before the raw samples were kept."""
    return measure_swapped(monitor, recorder, prom, n, intervals, "queried", lambda reader: None)


def measure_means_only(monitor: Any, recorder: Recorder, prom: Prometheus, n: int, intervals: int) -> IntervalRow:
    """The intervals with the means series' raw samples kept alone (``hold_buckets: []``)."""
    from app.promsource.mirror import SampleMirror

    return measure_swapped(monitor, recorder, prom, n, intervals, "means kept alone", lambda reader: SampleMirror(
        reader.client, reader.matchers, reader.target_labels, reader.mirror.lag, buckets=()))


@dataclass
class FloorRow:
    """What reading each series the means-first round needs costs Prometheus, once: the least
    any read-once design pays per interval (instant snapshots read each series once; recording
    rules evaluate each series once per evaluation)."""

    n: int
    series: int  # the series read (histograms' _sum/_count, gauges, counters of the engines)
    snapshot_cpu: float  # Prometheus CPU of one instant read of all of them
    snapshot_bytes: int  # its answer, decoded
    rules_cpu: float  # Prometheus CPU of one evaluation of per-pod rate[1m] rules over all of them
    bucket_series: int  # the bucket series of the histograms the tail rules and evidence read
    bucket_cpu: float  # Prometheus CPU of one instant read of those, every pod
    bucket_bytes: int
    quantile_cpu: float  # Prometheus CPU of their p99 per pod over 1m (histogram_quantile on the server)
    quantile_bytes: int


def measure_floor(prom: Prometheus, n: int, ingest_rate: float, repeats: int = 5) -> FloorRow:
    """Prometheus' CPU for reading every means-first series once (an instant vector, grouped by
    pod, model and name as the service would keep it), and for evaluating one per-pod ``rate[1m]``
    rule per name once - each repeated ``repeats`` times, minus ingest over as long."""
    from app.diagnosis.tails import TAIL_SIGNALS
    from app.promsource.queries import HISTOGRAM_FAMILIES

    names = [name for name in means_names() if prom.query(f'count({name}{{job="engines"}})')]
    by = "namespace, pod, model_name"
    regex = "|".join(re.escape(name) for name in names)
    snapshot = f'sum by ({by}, __name__) ({{__name__=~"{regex}", job="engines"}})'
    series = int(prom.scalar(f'count({{__name__=~"{regex}", job="engines"}})'))

    def cost(queries: list[str]) -> tuple[float, int]:
        size = 0
        c0, t0 = prom.cpu(), time.monotonic()
        with httpx.Client(timeout=120) as client:
            for _ in range(repeats):
                for q in queries:
                    r = client.post(f"{prom.url}/api/v1/query", data={"query": q})
                    if r.status_code != 200:
                        raise RuntimeError(f"floor query failed: HTTP {r.status_code}: {r.text[:200]}")
                    size += len(r.content)
        return (prom.cpu() - c0 - ingest_rate * (time.monotonic() - t0)) / repeats, size // repeats

    snapshot_cpu, snapshot_bytes = cost([snapshot])
    rules_cpu, _ = cost([f'sum by ({by}) (rate({name}{{job="engines"}}[1m]))' for name in names])
    bucket_names = [f"{f.name}_bucket" for signal in sorted(TAIL_SIGNALS)
                    for f in HISTOGRAM_FAMILIES.get(signal, ()) if f.engine == "vllm"]
    buckets = "|".join(re.escape(name) for name in bucket_names)
    bucket_series = int(prom.scalar(f'count({{__name__=~"{buckets}", job="engines"}})'))
    bucket_cpu, bucket_bytes = cost([f'sum by ({by}, le, __name__) ({{__name__=~"{buckets}", job="engines"}})'])
    quantile_cpu, quantile_bytes = cost([
        f'histogram_quantile(0.99, sum by ({by}, le) (increase({name}{{job="engines"}}[1m])))'
        for name in bucket_names])
    return FloorRow(n, series, snapshot_cpu, snapshot_bytes, rules_cpu, bucket_series, bucket_cpu, bucket_bytes,
                    quantile_cpu, quantile_bytes)


@dataclass
class WireRow:
    """What one refresh of the raw samples costs Prometheus per wire format: the JSON API the
    service uses, and Prometheus' remote read (protobuf, snappy) as samples and as raw chunks."""

    n: int
    series: int  # the series of the refresh's three reads (means, TTFT buckets, ITL buckets)
    costs: dict[str, tuple[float, int]]  # format -> (Prometheus CPU, bytes received)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _snappy_literal(data: bytes) -> bytes:
    """``data`` as a snappy block of literals only (valid snappy, not compressed): what the
    remote-read endpoint requires of a request body, without a compression library."""
    out = bytearray(_varint(len(data)))  # the uncompressed length
    for i in range(0, len(data), 65536):
        chunk = data[i:i + 65536]
        out += bytes([61 << 2]) + (len(chunk) - 1).to_bytes(2, "little") + chunk
    return bytes(out)


def remote_read_body(selector_matchers: list[tuple[int, str, str]], start: float, end: float, chunks: bool) -> bytes:
    """A prompb.ReadRequest for one query (matchers: (type 0 EQ / 2 RE, name, value)), snappy-framed."""
    query = _field(1, int(start * 1000)) + _field(2, int(end * 1000)) + b"".join(
        _field(3, _field(1, kind) + _field(2, name.encode()) + _field(3, value.encode()))
        for kind, name, value in selector_matchers)
    return _snappy_literal(_field(1, query) + _field(2, 1 if chunks else 0))


def measure_wire(prom: Prometheus, n: int, ingest_rate: float, repeats: int = 5) -> WireRow:
    """Prometheus' CPU and the bytes received for one refresh's three reads of 30 s of raw samples
    (the service's selectors), per format, each repeated ``repeats`` times, minus ingest."""
    from app.promsource.mirror import SampleMirror, bucket_names

    groups = {"means": [*means_names(), "up"], "ttft": bucket_names("ttft"), "itl": bucket_names("itl")}
    selectors = SampleMirror(None, [("namespace", "=", NAMESPACE)], ["namespace", "pod"]).selectors
    regexes = {group: "|".join(names) for group, names in groups.items()}
    end = time.time()
    series = sum(int(prom.scalar(f'count({{__name__=~"{r}", namespace="{NAMESPACE}"}})')) for r in regexes.values())
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Read-Version": "0.1.0"}
    costs: dict[str, tuple[float, int]] = {}
    with httpx.Client(timeout=120) as client:
        def send(fmt: str) -> int:
            size = 0
            for group, selector in selectors.items():
                if fmt == "json":
                    form = {"query": f"{selector}[30s]", "time": f"{end:.3f}"}
                    r = client.post(f"{prom.url}/api/v1/query", data=form, headers={"Accept-Encoding": "gzip"})
                else:
                    body = remote_read_body([(2, "__name__", regexes[group or "means"]), (0, "namespace", NAMESPACE)],
                                            end - 30, end, chunks=fmt == "chunks")
                    r = client.post(f"{prom.url}/api/v1/read", content=body, headers=headers)
                size += r.num_bytes_downloaded  # on the wire (the JSON gzipped, the protobuf snappy)
                if r.status_code != 200:
                    raise RuntimeError(f"{fmt} read failed: HTTP {r.status_code}: {r.text[:200]}")
            return size

        for fmt in ("json", "samples", "chunks"):
            c0, t0, size = prom.cpu(), time.monotonic(), 0
            for _ in range(repeats):
                size = send(fmt)
            costs[fmt] = ((prom.cpu() - c0 - ingest_rate * (time.monotonic() - t0)) / repeats, size)
    return WireRow(n, series, costs)


@dataclass
class UnionRow:
    """Prometheus' CPU for one histogram query of the service (prefill time, every engine's family:
    18 branches) for a fifth of the pods and for all, its branches joined as a chain of ``or``
    (the baseline: the query before) and as the balanced tree the service sends."""

    n: int
    costs: dict[tuple[str, str], float]  # (pods, "chain" / "tree") -> Prometheus CPU per query


def measure_union(prom: Prometheus, n: int, ingest_rate: float) -> UnionRow:
    """Each form repeated for two scrape intervals (a scrape's ingest comes in bursts)."""
    from app.promql.text import union
    from app.promsource.queries import SourceQueries

    costs: dict[tuple[str, str], float] = {}
    with httpx.Client(timeout=120) as client:
        for share, pods in (("a fifth", [f"engine-{i}" for i in range(0, n, 5)]),
                            ("all", [f"engine-{i}" for i in range(n)])):
            parts = SourceQueries(("namespace", "pod"), (("namespace", "=", NAMESPACE), ("pod", "=~", "|".join(pods))),
                                  ).histogram_branches("prefill_time", 60.0)
            for form, query in (("chain", " or ".join(parts)), ("tree", union(parts))):
                repeats, c0, t0 = 0, prom.cpu(), time.monotonic()
                while repeats < 3 or time.monotonic() - t0 < 2 * SCRAPE_INTERVAL:
                    r = client.post(f"{prom.url}/api/v1/query", data={"query": query})
                    if r.status_code != 200:
                        raise RuntimeError(f"union query failed: HTTP {r.status_code}: {r.text[:200]}")
                    repeats += 1
                costs[(share, form)] = (prom.cpu() - c0 - ingest_rate * (time.monotonic() - t0)) / repeats
    return UnionRow(n, costs)


def fit_power(ns: list[int], values: list[float]) -> tuple[float, float] | None:
    """Least-squares fit of ``value = a * N^b`` on log-log axes: (a, b); None with fewer than two
    positive points."""
    points = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if v > 0]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return math.exp(my - b * mx), b


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def median_time(fn: Callable[[], Any], times: int = 3) -> tuple[float, float, Any]:
    """(first call's seconds, median of the next ``times`` calls, last result)."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(times):
        t0 = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - t0)
    return first, statistics.median(runs), result


def run(tmp: Path, port: int, sizes: list[int], replays: list[Replay], days: float, args_intervals: int,
        healthy_share: float = 0.0, profile_to: Path | None = None) -> int:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.promql.text import prom_duration
    from app.promsource.service import target_name
    from app.settings import Settings

    history_labels = {"job": "engines", "instance": f"127.0.0.1:{port}", "namespace": NAMESPACE,
                      "pod": "engine-0", "service": "svc-0"}
    history_end = time.time()
    steps = history_steps(days)
    samples, took = backfill(replays[0], history_labels, history_end, tmp, tmp / "prometheus-data", steps)
    print(f"# {days:g}-day history of engine-0: {samples:,} samples, promtool + writing {took:.0f} s", file=sys.stderr)

    sd = tmp / "engines.json"
    write_sd(sd, port, sizes[0])
    prom = Prometheus(tmp, sd)
    prom.start()
    rows: list[RoundRow] = []
    interval_rows: list[IntervalRow] = []
    queried_rows: list[IntervalRow] = []  # the same intervals with every window queried (no raw samples kept)
    means_rows: list[IntervalRow] = []  # the same intervals with the means series kept alone
    floors: list[FloorRow] = []
    wires: list[WireRow] = []
    unions: list[UnionRow] = []
    try:
        print(f"# Prometheus pid {prom.process.pid if prom.process else '?'} at {prom.url}", file=sys.stderr)
        (tmp / "targets.yaml").write_text(config_yaml(prom.url))
        settings = Settings(data_dir=tmp, config_file=tmp / "targets.yaml", default_scrape_interval=3600,
                            summary_interval=3600, alert_interval=3600)
        app = create_app(settings)
        with TestClient(app) as client:
            monitor = app.state.monitor
            recorder = Recorder(monitor.sources.sources[SOURCE].client)
            for n in sizes:
                write_sd(sd, port, n)

                def scraped(n: int = n) -> bool:
                    return prom.scalar('count(up{job="engines"} == 1)') >= n

                wait_until(f"Prometheus scraping {n} engines", scraped, 120)
                ready_at = time.time() + WINDOW_FILL
                print(f"# N={n}: all engines scraped; waiting {WINDOW_FILL:g} s for a full window", file=sys.stderr)
                time.sleep(max(0.0, ready_at - time.time()))
                for kind in ("discovery", "steady"):
                    row = measure_round(client, monitor, recorder, prom.url, n, kind)
                    rows.append(row)
                    print(f"# N={n} {kind}: {row.wall:.2f} s wall, {row.cpu:.2f} s CPU, {row.queries} queries, "
                          f"{row.discovered} targets, verdicts {dict(row.verdicts)}", file=sys.stderr)
                    time.sleep(2.0)
                recorder.take()
                profile = cProfile.Profile() if profile_to is not None and n == max(sizes) else None
                irow = measure_intervals(monitor, recorder, prom, n, args_intervals, profile)
                if profile is not None and profile_to is not None:
                    profile.dump_stats(profile_to)
                recorder.take()
                floors.append(measure_floor(prom, n, irow.ingest_cpu / DIAGNOSIS_INTERVAL))
                wires.append(measure_wire(prom, n, irow.ingest_cpu / DIAGNOSIS_INTERVAL))
                unions.append(measure_union(prom, n, irow.ingest_cpu / DIAGNOSIS_INTERVAL))
                if n == max(sizes):
                    job_costs = {job: serial_costs(prom.url, calls) for job, calls in irow.calls.items()}
                interval_rows.append(irow)
                queried_rows.append(measure_queried(monitor, recorder, prom, n, args_intervals))
                means_rows.append(measure_means_only(monitor, recorder, prom, n, args_intervals))
                monitor.evaluate_diagnoses(now=time.time())  # the default mirror again, refreshed after the gap
                print(f"# N={n} per interval: Prometheus +{irow.prom_cpu:.2f} s CPU (ingest {irow.ingest_cpu:.2f} s), "
                      f"service {irow.service_cpu:.2f} s CPU, rounds {[round(w, 2) for w in irow.round_walls]} s, "
                      f"{irow.queries:.0f} queries, {irow.bytes_read / 1e6:.1f} MB; by job (queries, bytes) "
                      f"{irow.by_job}",
                      file=sys.stderr)

            name = target_name(SOURCE, (NAMESPACE, "engine-0"))
            span = prom_duration(days * 86400)
            end = time.time()
            recorder.take()
            api_first, body = timed(lambda: client.get(
                f"/api/v1/targets/{name}/latency", params={"window": span, "end": end}))
            api_calls = recorder.take()  # the first call's (its repeats are answered from the memo)
            api_queries = len(api_calls)
            _, api_median, _ = median_time(lambda: client.get(
                f"/api/v1/targets/{name}/latency", params={"window": span, "end": end}))
            if body.status_code != 200:
                raise RuntimeError(f"latency API answered {body.status_code}: {body.text[:300]}")
            report = body.json()
            promql = ('histogram_quantile(0.99, sum by (le) (increase('
                      f'vllm:time_to_first_token_seconds_bucket{{namespace="{NAMESPACE}",pod="engine-0"}}[{span}])))')
            prom_first, prom_median, answer = median_time(lambda: prom.query(promql, end))
            bare = replay_bare(prom.url, api_calls)
            prom_rss = rss_mb(prom.process.pid if prom.process else 0)
            series = httpx.get(f"{prom.url}/api/v1/status/tsdb", timeout=30).json()["data"]["headStats"]["numSeries"]
    finally:
        prom.stop()

    p99_api, p99_prom = report["ttft"]["p99"], float(answer[0]["value"][1])
    print(f"\n## What the service costs per {DIAGNOSIS_INTERVAL:g} s diagnosis interval (default settings: one "
          f"diagnosis round, {DIAGNOSIS_INTERVAL / SUMMARY_INTERVAL:g} summary and alert rounds, "
          f"{DIAGNOSIS_INTERVAL / CHANGES_INTERVAL:g} change events round; Prometheus 2.42, "
          f"15 s scrapes; engines healthy: {f'{healthy_share:.0%}' if healthy_share else '2 of 8 scenarios'}; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end)\n")
    print("| N engines | Prometheus ingest CPU (quiet) | Prometheus extra CPU | extra / ingest | service CPU "
          "| wall per diagnosis round | queries | bytes read (decoded) | on the wire (gzip) | service RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in interval_rows:
        print(f"| {r.n:,} | {r.ingest_cpu:.2f} s | {r.prom_cpu:.2f} s | {r.prom_cpu / r.ingest_cpu:.2f}x | "
              f"{r.service_cpu:.2f} s | {statistics.median(r.round_walls):.2f} s | {r.queries:.0f} | "
              f"{r.bytes_read / 1e6:.2f} MB | {r.wire_bytes / 1e6:.2f} MB | {r.rss:,.0f} MB |")
    print("\nBaseline of the same run: the same intervals right after, with every window queried "
          "(no raw samples kept: the design before them), and the ratios kept / queried:\n")
    print("| N engines | queried: Prometheus extra CPU | service CPU | wall per round | queries | bytes read | "
          "kept / queried: Prometheus | service | bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, q in zip(interval_rows, queried_rows, strict=True):
        print(f"| {r.n:,} | {q.prom_cpu:.2f} s | {q.service_cpu:.2f} s | {statistics.median(q.round_walls):.2f} s | "
              f"{q.queries:.0f} | {q.bytes_read / 1e6:.2f} MB | {r.prom_cpu / q.prom_cpu:.2f} | "
              f"{r.service_cpu / q.service_cpu:.2f} | {r.bytes_read / q.bytes_read:.2f} |")
    print("\nThe same intervals with the means series' raw samples kept alone, the TTFT and ITL buckets queried "
          "where needed (`hold_buckets: []`), and the ratios default / that:\n")
    print("| N engines | means alone: Prometheus extra CPU | service CPU | wall per round | queries | bytes read | "
          "default / means alone: Prometheus | service | bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, h in zip(interval_rows, means_rows, strict=True):
        print(f"| {r.n:,} | {h.prom_cpu:.2f} s | {h.service_cpu:.2f} s | {statistics.median(h.round_walls):.2f} s | "
              f"{h.queries:.0f} | {h.bytes_read / 1e6:.2f} MB | {r.prom_cpu / h.prom_cpu:.2f} | "
              f"{r.service_cpu / h.service_cpu:.2f} | {r.bytes_read / h.bytes_read:.2f} |")
    print("\nThe floor of any read-once design - every series the means-first round reads, read by Prometheus "
          "once (no buckets): an instant snapshot of all of them, or one evaluation of a per-pod rate[1m] recording "
          "rule per metric name; and the bucket series of the histograms whose tails the diagnosis judges or shows "
          "(ITL, TTFT, prefill, prompt, ...), every pod's, read once - or their p99 per pod over 1m computed by "
          "Prometheus (histogram_quantile):\n")
    print("| N engines | means series | snapshot: Prometheus CPU | snapshot: bytes decoded | rules: Prometheus CPU "
          "| bucket series | buckets once: Prometheus CPU | buckets once: bytes decoded | p99 on the server: "
          "Prometheus CPU | p99 on the server: bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in floors:
        print(f"| {f.n:,} | {f.series:,} | {f.snapshot_cpu:.2f} s | {f.snapshot_bytes / 1e6:.2f} MB | "
              f"{f.rules_cpu:.2f} s | {f.bucket_series:,} | {f.bucket_cpu:.2f} s | {f.bucket_bytes / 1e6:.2f} MB | "
              f"{f.quantile_cpu:.2f} s | {f.quantile_bytes / 1e6:.2f} MB |")
    print("\nOne refresh of the raw samples (30 s of the means series, TTFT and ITL buckets: the three reads) "
          "per wire format - the JSON API's range selector (what the service sends), and Prometheus' remote read "
          "(protobuf, snappy) as samples or as raw XOR chunks (whole chunks, decoded by the client):\n")
    print("| N engines | series | JSON: Prometheus CPU | JSON: bytes (gzip) | remote read samples: Prometheus CPU "
          "| samples: bytes | remote read chunks: Prometheus CPU | chunks: bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wr in wires:
        cells = [f"{wr.costs[fmt][0]:.2f} s | {wr.costs[fmt][1] / 1e6:.2f} MB" for fmt in ("json", "samples", "chunks")]
        print(f"| {wr.n:,} | {wr.series:,} | " + " | ".join(cells) + " |")
    print("\nOne histogram query of the service (prefill time, every engine's family: 18 branches), its branches "
          "joined as a chain of `or` (**baseline**: the query before) and as the balanced tree sent now - "
          "Prometheus' CPU per query:\n")
    print("| N engines | pods asked | chain | tree | tree / chain |")
    print("|---:|---|---:|---:|---:|")
    for u in unions:
        for share in ("a fifth", "all"):
            chain, tree = u.costs[(share, "chain")], u.costs[(share, "tree")]
            print(f"| {u.n:,} | {share} | {chain * 1000:.0f} ms | {tree * 1000:.0f} ms | "
                  f"{tree / chain if chain > 0 else math.nan:.2f} |")
    print("\nPer job and interval (queries, bytes decoded, Prometheus extra CPU, service CPU): " + "; ".join(
        f"N={r.n:,}: " + ", ".join(f"{name} {q:.0f} / {b / 1e6:.1f} MB / {c:.2f} s / {own:.2f} s"
                                   for name, (q, b, c, own) in r.by_job.items()) for r in interval_rows))
    ns = [r.n for r in interval_rows]
    print(f"\nGrowth with N (least-squares fit of a * N^b over N = {', '.join(f'{n:,}' for n in ns)}) and a "
          f"**projection** to N = {PROJECT_TO:,} (extrapolated, not measured):\n")
    for what, values, unit in (("Prometheus extra CPU per interval", [r.prom_cpu for r in interval_rows], "s"),
                               ("service CPU per interval", [r.service_cpu for r in interval_rows], "s"),
                               ("wall per diagnosis round", [statistics.median(r.round_walls) for r in interval_rows],
                                "s"),
                               ("bytes read per interval", [r.bytes_read / 1e6 for r in interval_rows], "MB"),
                               ("bytes on the wire per interval", [r.wire_bytes / 1e6 for r in interval_rows], "MB")):
        fit = fit_power(ns, values)
        if fit is not None:
            print(f"- {what}: ~ N^{fit[1]:.2f}; projected {fit[0] * PROJECT_TO ** fit[1]:,.2f} {unit} at "
                  f"N = {PROJECT_TO:,}")
    print("\n## One discovery + diagnosis round per N, driven alone\n")
    print("| N engines | round | targets discovered | queries | wall | CPU (monitor) | monitor RSS "
          "| Prometheus alone (same queries) | wall / Prometheus alone |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.n:,} | {r.kind} | {r.discovered:,} | {r.queries} | {fmt_s(r.wall)} | {fmt_s(r.cpu)} | "
              f"{r.rss:,.0f} MB | {fmt_s(r.bare)} | {r.wall / r.bare:.1f}x |")
    last = next(r for r in reversed(rows) if r.kind == "steady")
    print(f"\nThe N={last.n:,} {last.kind} round's queries sent one at a time: {fmt_s(sum(c[0] for c in last.costs))} "
          "in all; the slowest:\n")
    print("| seconds | response bytes | query |")
    print("|---:|---:|---|")
    for seconds, size, head in last.costs[:8]:
        print(f"| {seconds:.3f} | {size:,} | `{head}` |")
    print(f"\nThe N={max(sizes):,} interval's queries per job, sent one at a time (the slowest four of each):\n")
    print("| job | seconds | response bytes | query |")
    print("|---|---:|---:|---|")
    for job, costs in job_costs.items():
        for seconds, size, head in costs[:4]:
            print(f"| {job} | {seconds:.3f} | {size:,} | `{head}` |")
    print(f"\nPrometheus at the end: {series:,.0f} head series, {prom_rss:,.0f} MB RSS. Verdicts at the "
          f"largest N: {dict(rows[-1].verdicts)}")
    print(f"\n## Latency API, {days:g}-day window (engine-0: {days:g} days of 15 s history + live)\n")
    print("| measurement | first call | median of 3 | baseline: Prometheus' histogram_quantile (first / median) "
          "| ratio (median) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| GET /api/v1/targets/{name}/latency?window={span} ({api_queries} queries) | {fmt_s(api_first)} | "
          f"{fmt_s(api_median)} | {fmt_s(prom_first)} / {fmt_s(prom_median)} | {api_median / prom_median:.1f}x |")
    print(f"| the endpoint's {api_queries} queries replayed bare (8 at a time) | - | {fmt_s(bare)} | "
          f"{fmt_s(prom_first)} / {fmt_s(prom_median)} | {bare / prom_median:.1f}x |")
    print(f"\nttft p99 over {days:g} days: API {p99_api!r}, Prometheus {p99_prom!r} "
          f"(count {report['ttft']['count']:,.0f} requests)")

    largest = [r for r in rows if r.n == max(sizes)]
    checks = [(f"N={max(sizes):,} targets discovered == N", all(r.discovered == max(sizes) for r in largest)),
              (f"{days:g}-day latency API <= {TARGET_LATENCY_7D:g} s (median)", api_median <= TARGET_LATENCY_7D),
              (f"{days:g}-day ttft p99 equals Prometheus' (1e-9)", math.isclose(p99_api, p99_prom, rel_tol=1e-9))]
    at_1000 = next((r for r in interval_rows if r.n == 1000), None)
    if at_1000 is not None:
        checks += [(f"N=1,000 Prometheus extra CPU per interval <= {TARGET_PROM_CPU:g} s",
                    at_1000.prom_cpu <= TARGET_PROM_CPU),
                   (f"N=1,000 service CPU per interval <= {TARGET_SERVICE_CPU:g} s",
                    at_1000.service_cpu <= TARGET_SERVICE_CPU),
                   (f"N=1,000 wall per diagnosis round <= {TARGET_ROUND_WALL:g} s (median)",
                    statistics.median(at_1000.round_walls) <= TARGET_ROUND_WALL),
                   (f"N=1,000 bytes read per interval <= {TARGET_BYTES / 1e6:g} MB",
                    at_1000.bytes_read <= TARGET_BYTES)]
    print("\n## Targets\n")
    for what, ok in checks:
        print(f"- {what}: {'PASS' if ok else 'MISS'}")
    all_ok = all(ok for _, ok in checks)
    print(f"\nOverall: {'PASS' if all_ok else 'MISS'}")
    return 0 if all_ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000", help="numbers of engines, ascending")
    parser.add_argument("--quick", action="store_true", help="N = 10 only")
    parser.add_argument("--healthy-share", type=float, default=0.0,
                        help="share of healthy engines (default: the eight scenarios alike, 2 of 8 healthy)")
    parser.add_argument("--intervals", type=int, default=2,
                        help="diagnosis intervals measured per N (and as long a quiet period before)")
    parser.add_argument("--history-days", type=float, default=7.0,
                        help="days of engine-0 history and the latency API's window (7 in the table)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile of the largest N's measured intervals to this file "
                             "(the service's CPU column then includes the profiler's)")
    args = parser.parse_args()
    sizes = [10] if args.quick else sorted(int(s) for s in args.sizes.split(","))
    for binary in (PROMETHEUS, PROMTOOL):
        if not os.access(binary, os.X_OK):
            print(f"{binary} is missing (Debian package prometheus)", file=sys.stderr)
            return 2
    print(f"# machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    replays = record_replays()  # recorded once: engine 0's live pages continue its history exactly
    engines = ctx.Process(target=serve_engines, args=(child, replays, history_steps(args.history_days),
                                                      args.healthy_share),
                          daemon=True)
    engines.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-promsource-") as tmp_name:
            tmp = Path(tmp_name)
            port = parent.recv()
            print(f"# {len(SCENARIOS)} scenario replays served by pid {engines.pid} on port {port}", file=sys.stderr)
            return run(tmp, port, sizes, replays, args.history_days, args.intervals, args.healthy_share,
                       args.profile)
    finally:
        engines.terminate()
        engines.join(30)


if __name__ == "__main__":
    sys.exit(main())
