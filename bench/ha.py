"""The HA run: replicas of the service on one PostgreSQL database, killed with SIGKILL in turn.

    PYTHONPATH=. python bench/ha.py --database-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --replicas 3 --targets 300 --down 12 --interval 5

starts one page-server process (``bench/page_server.py``) serving every target's page
(``--targets`` up targets on the real vLLM page, ``--down`` targets answering 404, so each
fires a ``TargetDown`` alert), a webhook receiver, and ``--replicas`` service processes
(``llm-latency serve``) on loopback sharing the database. Once every down target's alert
fires and its notification is delivered, it kills each replica in turn (the leader first)
with SIGKILL, waits for the survivors to take over, and starts a replacement under a new
id. It prints:

* **scrape gaps**: per target, the longest time between two stored scrapes, in scrape
  intervals, over the quiet baseline before the first kill and over the kills (the bound
  is 2 intervals + ``replica_expiry``);
* **overlap**: scrapes per target per interval over the baseline (1.0 = each target
  scraped by exactly one replica; 2.0 = by two);
* **alert continuity**: firing alerts that were resolved, or re-fired with a new start,
  because of a failover (expected 0);
* **notifications**: rows written to the outbox, distinct Idempotency-Keys delivered, lost
  (a row never delivered), duplicated notifications (a second notification for an alert
  already notified: expected 0) and re-sent keys (a delivery in flight when its sender
  died, retried with the same key: allowed, at-least-once).

The receiver holds every request for ``--hold`` seconds, so a kill of the leader often
finds a delivery in flight. :class:`Cluster` is also what ``tests/test_replicas_processes.py``
drives.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import httpx
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom"


@dataclass
class Delivery:
    key: str
    status: str  # the payload's firing | resolved
    targets: tuple[str, ...]
    at: float


class Receiver:
    """A webhook receiver that records every request's Idempotency-Key; ``hold`` seconds of
    delay per request keep deliveries in flight (a killed sender leaves them unanswered)."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.received: list[Delivery] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                item = Delivery(self.headers.get("Idempotency-Key", ""), body.get("status", ""),
                                tuple(sorted(a["labels"].get("target", "") for a in body.get("alerts", []))),
                                time.time())
                with owner._lock:
                    owner.received.append(item)
                if owner.hold:
                    time.sleep(owner.hold)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:  # the sender is gone (killed)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def keys(self) -> Counter[str]:
        with self._lock:
            return Counter(d.key for d in self.received)

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self.received)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _read_line(stream: Any, want: Callable[[str], bool], timeout: float, what: str) -> tuple[str, threading.Thread]:
    """The first line of ``stream`` for which ``want`` is true, within ``timeout`` seconds, and
    the thread that keeps reading the stream (so the child never blocks on a full pipe)
    until it ends."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line == "":
            break
        seen.append(line)
        if want(line):
            return line, reader
    raise RuntimeError(f"{what} did not start within {timeout:g}s: {''.join(seen)[-2000:]}")


def _reap(proc: subprocess.Popen[str], reader: threading.Thread | None, *files: IO[str]) -> None:
    """After ``proc`` exited: let its stdout reader finish, close what was opened for it."""
    if reader is not None:
        reader.join(10)
    if proc.stdout is not None:
        proc.stdout.close()
    for f in files:
        f.close()


@dataclass
class Replica:
    id: str
    proc: subprocess.Popen[str]
    url: str
    log: Path
    reader: threading.Thread
    log_file: IO[str]

    def reap(self) -> None:
        _reap(self.proc, self.reader, self.log_file)

    def scrapes(self) -> dict[str, float]:
        """Scrape attempts per target this process made (its ``llm_latency_scrapes_total``)."""
        out: dict[str, float] = defaultdict(float)
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("llm_latency_scrapes_total{"):
                labels, value = line[len("llm_latency_scrapes_total{"):].rsplit("} ", 1)
                target = next(p.split("=", 1)[1].strip('"') for p in labels.split(",") if p.startswith("target="))
                out[target] += float(value)
        return dict(out)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    """Page server, receiver and replicas of the service sharing ``database_url``."""

    database_url: str
    workdir: Path
    up: int = 12
    down: int = 4
    interval: float = 2.0
    heartbeat: float = 0.5
    expiry: float = 3.0
    receiver_timeout: float = 5.0
    hold: float = 0.0
    replicas: dict[str, Replica] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.receiver = Receiver(self.hold)
        self._pages = subprocess.Popen([sys.executable, str(ROOT / "bench" / "page_server.py"), str(PAGE)],
                                       stdout=subprocess.PIPE, text=True)
        line, self._pages_reader = _read_line(self._pages.stdout, lambda s: s.startswith("PORT "), 30,
                                              "the page server")
        port = int(line.split()[1])
        base = f"http://127.0.0.1:{port}"
        self.targets = {f"up-{i:04d}": f"{base}/t/{i}/metrics" for i in range(self.up)}
        self.targets.update({f"down-{i:03d}": f"{base}/down/{i}/metrics" for i in range(self.down)})
        self.base = base
        config = {
            "targets": [{"name": name, "url": url} for name, url in self.targets.items()],
            "alerts": {"slos": [], "target_down_for": "0s", "group_interval": "1s", "repeat_interval": "24h",
                       "receivers": [{"name": "hook", "url": self.receiver.url,
                                      "timeout": f"{self.receiver_timeout:g}s"}]},
        }
        self.config = self.workdir / "targets.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.db = create_engine(self.database_url)
        self._run_cli("db", "upgrade")

    def env(self, replica_id: str) -> dict[str, str]:
        settings = {"DATABASE_URL": self.database_url, "DATA_DIR": str(self.workdir / replica_id),
                    "DEFAULT_SCRAPE_INTERVAL": f"{self.interval:g}s",
                    "DEFAULT_SCRAPE_TIMEOUT": f"{min(self.interval, 2.0):g}s",
                    "REPLICA_HEARTBEAT": f"{self.heartbeat:g}s", "REPLICA_EXPIRY": f"{self.expiry:g}s",
                    "REPLICA_ID": replica_id, "ALERT_INTERVAL": "1s", "DELIVERY_INTERVAL": "0.25s",
                    "WRITE_BATCH_INTERVAL": "0.25s", "SUMMARY_INTERVAL": "30s", "SCRAPE_JITTER": "0"}
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_LATENCY_")}
        env.update({f"LLM_LATENCY_{k}": v for k, v in settings.items()})
        env["PYTHONPATH"] = str(ROOT)
        return env

    def _run_cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "app.cli", *args], env=self.env("migrate"), check=True,
                       capture_output=True, text=True, timeout=120)

    def start(self, replica_id: str) -> Replica:
        log = self.workdir / f"{replica_id}.log"
        log_file = open(log, "w")  # the child's stderr
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(self.config),
                                 "--port", "0"], env=self.env(replica_id), stdout=subprocess.PIPE,
                                stderr=log_file, text=True)
        try:
            line, reader = _read_line(proc.stdout, lambda s: "LLM Latency Monitor on http://" in s, 90, replica_id)
        except RuntimeError as exc:
            proc.kill()
            proc.wait()
            _reap(proc, None, log_file)
            raise RuntimeError(f"{exc}\n{log.read_text()[-3000:]}") from None
        url = line.split(" on ", 1)[1].split()[0]
        replica = Replica(replica_id, proc, url, log, reader, log_file)
        self.replicas[replica_id] = replica
        self.started.append(replica_id)
        return replica

    def add_down_target(self, name: str) -> None:
        """A new target answering 404 (a new TargetDown alert), added through one replica's API."""
        url = f"{self.base}/down/{name}/metrics"
        via = next(iter(self.replicas.values()))
        httpx.post(via.url + "/api/v1/targets", json={"name": name, "url": url}, timeout=30).raise_for_status()
        self.targets[name] = url

    def told(self, target: str) -> bool:
        """Whether a notification about ``target`` reached the receiver (answered or still held)."""
        return any(target in d.targets for d in self.receiver.deliveries())

    def stop(self, replica_id: str) -> float:
        """SIGTERM (a rolling update's stop): the replica leaves cleanly; returns when it was sent."""
        replica = self.replicas.pop(replica_id)
        at = time.time()
        replica.proc.terminate()
        replica.proc.wait(60)
        replica.reap()
        return at

    def kill(self, replica_id: str) -> float:
        """SIGKILL by PID; returns when it was sent."""
        replica = self.replicas.pop(replica_id)
        at = time.time()
        os.kill(replica.proc.pid, signal.SIGKILL)
        replica.proc.wait(30)
        replica.reap()
        return at

    def close(self) -> None:
        for replica_id in list(self.replicas):
            replica = self.replicas.pop(replica_id)
            replica.proc.terminate()
            try:
                replica.proc.wait(20)
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                replica.proc.wait()
            replica.reap()
        self._pages.terminate()
        self._pages.wait(10)
        _reap(self._pages, self._pages_reader)
        self.receiver.close()
        self.db.dispose()

    # ------------------------------------------------------------------ what the database says
    def leader(self) -> str | None:
        with self.db.connect() as c:
            row = c.execute(text("SELECT holder, expires_at FROM leases WHERE name = 'leader'")).first()
        return row.holder if row is not None and row.expires_at > time.time() else None

    def live(self) -> list[str]:
        with self.db.connect() as c:
            return sorted(c.execute(text("SELECT id FROM replicas WHERE heartbeat_at > :t"),
                                    {"t": time.time() - self.expiry}).scalars())

    def scrape_times(self, since: float) -> dict[str, list[float]]:
        with self.db.connect() as c:
            rows = c.execute(text("SELECT t.name, s.ts FROM scrapes s JOIN targets t ON t.id = s.target_id "
                                  "WHERE s.ts >= :since ORDER BY t.name, s.ts"), {"since": since})
            out: dict[str, list[float]] = {name: [] for name in self.targets}
            for name, ts in rows:
                out.setdefault(name, []).append(ts)
        return out

    def alerts(self) -> dict[str, tuple[str, float | None, str]]:
        """fingerprint -> (state, starts_at, target) of every alert row."""
        with self.db.connect() as c:
            rows = c.execute(text("SELECT fingerprint, state, starts_at, labels FROM alerts"))
            return {fp: (state, starts, (labels if isinstance(labels, dict) else json.loads(labels)).get("target", ""))
                    for fp, state, starts, labels in rows}

    def notifications(self) -> dict[str, str]:
        """id (the Idempotency-Key) -> state of every outbox row."""
        with self.db.connect() as c:
            return dict(c.execute(text("SELECT id, state FROM notifications")).all())

    # ------------------------------------------------------------------ waiting
    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what}: not within {timeout:g}s")

    def all_firing_and_told(self) -> bool:
        alerts = self.alerts()
        firing = {t for state, _, t in alerts.values() if state == "firing"}
        told = {t for d in self.receiver.deliveries() for t in d.targets}
        states = self.notifications()
        down = {t for t in self.targets if t.startswith("down-")}
        # an up target whose scrape timed out on a loaded machine may fire too: not required here
        return (down <= firing and down <= told
                and bool(states) and all(s == "delivered" for s in states.values()))


def gaps(times: dict[str, list[float]], start: float, end: float) -> dict[str, float]:
    """Per target, the longest stretch of [start, end] without a scrape (seconds)."""
    out = {}
    for name, ts in times.items():
        points = [start, *(t for t in ts if start <= t <= end), end]
        out[name] = max(b - a for a, b in zip(points, points[1:], strict=False))
    return out


def notification_report(cluster: Cluster) -> dict[str, int]:
    """Outbox rows against what the receiver got. ``duplicated`` and ``resolved_sent`` count
    the down targets' alerts only (they fire once and never clear: one notification each);
    an up target's scrape that times out on a loaded machine may legitimately fire and
    resolve."""
    rows = cluster.notifications()
    deliveries = cluster.receiver.deliveries()
    keys = Counter(d.key for d in deliveries)
    per_alert: Counter[tuple[str, str]] = Counter()
    for key in keys:  # each distinct notification once
        d = next(x for x in deliveries if x.key == key)
        per_alert.update((t, d.status) for t in d.targets if t.startswith("down-"))
    return {
        "written": len(rows),
        "delivered": sum(1 for k in rows if k in keys),
        "lost": sum(1 for k in rows if k not in keys),
        "unknown_keys": sum(1 for k in keys if k not in rows),
        "duplicated": sum(n - 1 for n in per_alert.values() if n > 1),
        "resent_same_key": sum(n - 1 for n in keys.values()),
        "resolved_sent": sum(n for (_, status), n in per_alert.items() if status == "resolved"),
    }


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new database on the server of ``admin_url``, dropped afterwards."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"llm_latency_ha_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(args: argparse.Namespace) -> None:
    with scratch_database(args.database_url) as url:
        run_on(args, url)


def run_on(args: argparse.Namespace, database_url: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    cluster = Cluster(database_url, workdir, up=args.targets, down=args.down, interval=args.interval,
                      heartbeat=args.heartbeat, expiry=args.expiry, hold=args.hold)
    bound = 2 * args.interval + args.expiry
    try:
        t_start = time.time()
        for i in range(args.replicas):
            cluster.start(f"r{i}")
        n = len(cluster.targets)
        cluster.wait_for(lambda: len(cluster.live()) == args.replicas, 60, "replicas registered")
        cluster.wait_for(cluster.all_firing_and_told, 120, "every down target firing and notified")
        settle = time.time()
        counts_start = {r: rep.scrapes() for r, rep in cluster.replicas.items()}
        time.sleep(args.baseline)  # the quiet baseline: every replica up, nobody killed
        base_end = time.time()
        counts_end = {r: rep.scrapes() for r, rep in cluster.replicas.items()}
        firing_before = {fp: (starts, t) for fp, (state, starts, t) in cluster.alerts().items() if state == "firing"}
        kills = []
        for k in range(args.replicas):
            leader = cluster.leader()
            victim = leader if k == 0 and leader in cluster.replicas else sorted(cluster.replicas)[0]
            # a new alert just before the kill: its notification is in flight (held by the receiver)
            # when the leader is the victim
            cluster.add_down_target(f"down-late-{k}")
            cluster.wait_for(functools.partial(cluster.told, f"down-late-{k}"), 60, "the new alert's notification sent")
            at = cluster.kill(victim)
            kills.append((victim, at, victim == leader))
            time.sleep(bound + args.interval)  # the survivors take over
            cluster.start(f"r{args.replicas + k}")  # the replacement (a rolling restart after a crash)
            time.sleep(args.heartbeat * 3 + args.interval)
        cluster.wait_for(cluster.all_firing_and_told, 120, "outbox drained after the kills")
        end = time.time()
        times = {name: ts for name, ts in cluster.scrape_times(t_start).items() if "-late-" not in name}
        base_gaps = gaps(times, settle, base_end)
        kill_gaps = gaps(times, kills[0][1], end)
        per_interval = [len([t for t in ts if settle <= t <= base_end]) / ((base_end - settle) / args.interval)
                        for ts in times.values()]
        owners: dict[str, int] = defaultdict(int)
        for r, counts in counts_end.items():  # who scraped what during the baseline
            for target, value in counts.items():
                if value > counts_start[r].get(target, 0.0):
                    owners[target] += 1
        overlap_targets = sum(1 for v in owners.values() if v > 1)
        alerts_after = cluster.alerts()
        broken = sum(1 for fp, (starts, _) in firing_before.items()
                     if alerts_after.get(fp, ("gone", None, ""))[0] != "firing" or alerts_after[fp][1] != starts)
        report = notification_report(cluster)
        if os.environ.get("HA_BENCH_DEBUG"):
            for name, g in sorted(base_gaps.items(), key=lambda kv: -kv[1])[:3]:
                ts = [t - settle for t in times[name] if settle - args.interval <= t <= base_end]
                print("baseline", name, f"{g:.2f}", [f"{t:.1f}" for t in ts])
            for name, g in sorted(kill_gaps.items(), key=lambda kv: -kv[1])[:5]:
                ts = [t for t in times[name] if t >= kills[0][1] - args.interval]
                worst = max(zip(ts, ts[1:], strict=False), key=lambda p: p[1] - p[0], default=(0, 0))
                print(name, f"{g:.2f}", [f"{v}@{t - kills[0][1]:.2f}" for v, t, _ in kills],
                      f"gap {worst[0] - kills[0][1]:.2f}..{worst[1] - kills[0][1]:.2f}")
    finally:
        cluster.close()

    def in_intervals(values: list[float]) -> str:
        values = sorted(v / args.interval for v in values)
        return (f"p50 {statistics.median(values):.2f}  p99 {values[int(0.99 * (len(values) - 1))]:.2f}  "
                f"max {values[-1]:.2f}")

    print(f"HA run: {args.replicas} replicas, {n} targets ({args.down} down), scrape interval {args.interval:g}s, "
          f"heartbeat {args.heartbeat:g}s, expiry {args.expiry:g}s; bound 2 intervals + expiry = "
          f"{bound / args.interval:.2f} intervals")
    killed = ", ".join(v + (" (leader)" if lead else "") for v, _, lead in kills)
    print(f"kills (SIGKILL): {killed}")
    print()
    print("| measure | baseline (no kill) | across the kills |")
    print("|---|---|---|")
    print(f"| max scrape gap per target, intervals | {in_intervals(list(base_gaps.values()))} "
          f"| {in_intervals(list(kill_gaps.values()))} |")
    print(f"| ratio of worst gaps (kills / baseline) | 1.00 | "
          f"{max(kill_gaps.values()) / max(base_gaps.values()):.2f} |")
    print(f"| targets over the bound ({bound / args.interval:.2f} intervals) | "
          f"{sum(1 for g in base_gaps.values() if g > bound)} | {sum(1 for g in kill_gaps.values() if g > bound)} |")
    print(f"| scrapes per target per interval | {statistics.mean(per_interval):.2f} (max {max(per_interval):.2f}) "
          "| - |")
    print(f"| targets scraped by more than one replica (baseline) | {overlap_targets} | - |")
    print(f"| firing alerts resolved or re-fired by a failover | - | {broken} of {len(firing_before)} |")
    print(f"| notifications written / delivered / lost | - | {report['written']} / {report['delivered']} / "
          f"{report['lost']} |")
    print(f"| duplicated notifications (second one for an alert) | - | {report['duplicated']} |")
    print(f"| same key re-sent (in flight at a kill, at-least-once) | - | {report['resent_same_key']} |")
    print(f"| resolved notifications sent | - | {report['resolved_sent']} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default=os.environ.get("LLM_LATENCY_BENCH_DATABASE_URL",
                                                             "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
                    help="a server database; the run creates (and drops) its own database next to it")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--targets", type=int, default=300, help="up targets (one page-server process)")
    ap.add_argument("--down", type=int, default=12, help="targets answering 404 (each a TargetDown alert)")
    ap.add_argument("--interval", type=float, default=5.0, help="scrape interval (s)")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--expiry", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=1.0, help="receiver delay per request (s)")
    ap.add_argument("--baseline", type=float, default=30.0, help="quiet seconds before the first kill")
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
