"""Run a real, throw-away Prometheus for end-to-end and oracle tests.

::

    with StaticPageServer(page) as srv, running_prometheus(tmp_path, [srv.url], "500ms") as prom:
        prom.wait_for_samples("my_metric_total", 5, timeout=20)
        data = prom.query("increase(my_metric_total[5s])", time=1700000000.5)

    # targets discovered from a file the test rewrites (Prometheus' file_sd_configs):
    sd = FileSD(tmp_path / "targets.json")
    sd.set({"a": fleet.urls["a"]}, namespace="llm")          # series get namespace="llm", pod="a"
    with running_prometheus(tmp_path, sd.scrape_configs()) as prom:
        sd.set({"a": fleet.urls["a"], "b": fleet.urls["b"]}, namespace="llm")  # b discovered
        prom.stop(); prom.start()                              # an outage: same port, same data

What it does:

* picks a free port on 127.0.0.1 (and retries with another one if Prometheus
  loses the race for it), writes a config into ``tmp_path``, starts the binary
  with ``--storage.tsdb.path`` inside ``tmp_path``;
* waits until ``/-/ready`` answers 200 (failing early, with the log, if the
  process dies);
* on exit stops exactly that process by PID: SIGTERM, then SIGKILL after a grace
  period. Never anything by name -- other Prometheus instances may be running.
* keeps Prometheus' log in ``tmp_path/prometheus.log``; errors raised by the
  handle, and exceptions leaving the ``with`` block, carry its tail.

A missing binary follows :func:`tests.support.components.require_binary`:
skip locally, fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time as _time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.promql.client import format_time  # one formatting of API times, shared with the client
from tests.support.components import require_binary

PROMETHEUS_BINARY = "/usr/bin/prometheus"

Targets = str | Sequence[str] | Mapping[str, str | Sequence[str]]


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered an API call with an error."""


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape_configs(targets: Targets, scrape_interval: str) -> str:
    """YAML text for ``scrape_configs:`` from a YAML string, URL list or job mapping.

    * ``str``: YAML, either a whole ``scrape_configs:`` section or a list of jobs
      (``- job_name: ...``); used verbatim.
    * sequence of URLs (``http://127.0.0.1:PORT/metrics``; a bare ``host:port``
      means ``http://host:port/metrics``): one job per URL named ``target0``,
      ``target1``, ...
    * mapping ``job_name -> URL or URLs``: one job per name (all URLs of a job
      must share scheme and path).
    """
    if isinstance(targets, str):
        text = targets.strip("\n")
        return text if text.lstrip().startswith("scrape_configs:") else "scrape_configs:\n" + text
    if isinstance(targets, Mapping):
        jobs = {name: [urls] if isinstance(urls, str) else list(urls) for name, urls in targets.items()}
    else:
        jobs = {f"target{i}": [url] for i, url in enumerate(targets)}
    configs = []
    for name, urls in jobs.items():
        parts = [urlsplit(u if "://" in u else f"http://{u}/metrics") for u in urls]
        schemes = {p.scheme for p in parts}
        paths = {p.path or "/metrics" for p in parts}
        if len(schemes) != 1 or len(paths) != 1:
            raise ValueError(f"job {name!r}: all targets must share scheme and path, got {urls}")
        configs.append(
            {
                "job_name": name,
                "scheme": schemes.pop(),
                "metrics_path": paths.pop(),
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [{"targets": [p.netloc for p in parts]}],
            }
        )
    # YAML is a superset of JSON: no YAML library needed to write the config.
    return "scrape_configs: " + json.dumps(configs, indent=2)


class FileSD:
    """A target-group file for ``file_sd_configs`` that a test rewrites to add or remove targets.

    ::

        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"], "b": fleet.urls["b"]}, namespace="llm")  # pod="a", pod="b"
        with running_prometheus(tmp_path, sd.scrape_configs()) as prom: ...
        sd.set({"a": fleet.urls["a"]}, namespace="llm")   # b removed: its series go stale

    Each target is its own group, so its labels (``namespace``, ``pod`` = its name, ...) are
    plain target-group labels: Prometheus and VictoriaMetrics attach them to every series
    scraped from it. Writes are atomic (temp file + rename): a server never reads half a file.
    """

    def __init__(self, path: Path, name_label: str = "pod") -> None:
        self.path = Path(path)
        self.name_label = name_label
        self.groups: list[dict[str, Any]] = []
        self.write([])

    def write(self, groups: list[dict[str, Any]]) -> None:
        """Replace the file with these target groups (``[{"targets": [...], "labels": {...}}]``)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, self.path)
        self.groups = groups

    def set(self, targets: Mapping[str, str], **labels: str) -> None:
        """One group per ``name -> URL`` (``http://host:port/metrics``; a bare base URL means
        ``/metrics``) labelled ``{name_label: name, **labels}``."""
        groups = []
        for name, url in targets.items():
            parts = urlsplit(url if "://" in url else f"http://{url}")
            group_labels = {**labels, self.name_label: name}
            if parts.path not in ("", "/", "/metrics"):
                group_labels["__metrics_path__"] = parts.path
            if parts.scheme != "http":
                group_labels["__scheme__"] = parts.scheme
            groups.append({"targets": [parts.netloc], "labels": group_labels})
        self.write(groups)

    def scrape_configs(self, job_name: str = "engines", scrape_interval: str = "1s",
                       refresh_interval: str | None = "1s") -> str:
        """``scrape_configs:`` YAML with one job reading this file. ``refresh_interval`` None
        leaves it out (VictoriaMetrics takes it from ``-promscrape.fileSDCheckInterval``)."""
        sd: dict[str, Any] = {"files": [str(self.path)]}
        if refresh_interval is not None:
            sd["refresh_interval"] = refresh_interval
        job = {"job_name": job_name, "scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
               "file_sd_configs": [sd]}
        return "scrape_configs: " + json.dumps([job], indent=2)


@dataclass
class PrometheusHandle:
    """A running Prometheus. ``url`` is its base URL (``http://127.0.0.1:PORT``)."""

    url: str
    pid: int
    log_path: Path
    config_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    client: httpx.Client = field(repr=False)
    #: the command line, so :meth:`start` runs the same server (port, data dir) again
    argv: list[str] = field(default_factory=list, repr=False)
    ready_path: str = "/-/ready"
    ready_timeout: float = 30.0

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:  # pragma: no cover - diagnostics only
            return f"<no log: {e}>"
        return "\n".join(text.splitlines()[-lines:])

    def _error(self, message: str) -> PrometheusError:
        return PrometheusError(f"{message}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raise PrometheusError otherwise."""
        try:
            r = self.client.get(f"{self.url}/api/v1/{path}", params=params)
        except httpx.HTTPError as e:
            raise self._error(f"GET /api/v1/{path} {params} failed: {e!r}") from e
        try:
            body = r.json()
        except ValueError:
            raise self._error(f"GET /api/v1/{path} {params}: HTTP {r.status_code}, not JSON: {r.text[:500]}") from None
        if body.get("status") != "success":
            raise self._error(f"GET /api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, time: float | None = None) -> dict[str, Any]:
        """Instant query; returns the API's ``data`` (``{"resultType": ..., "result": [...]}``).

        ``time`` is unix seconds (millisecond precision); None means "now" on the server.
        Values come back as strings formatted with Go's shortest round-trip format,
        so ``float(v)`` recovers the exact float64.
        """
        params: dict[str, Any] = {"query": expr}
        if time is not None:
            params["time"] = format_time(time)
        return self.api("query", **params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        return self.api(
            "query_range", query=expr, start=format_time(start), end=format_time(end), step=repr(float(step))
        )

    def wait_for_samples(
        self, expr: str, n: int, timeout: float = 30.0, *, lookback: str = "1h", poll: float = 0.1
    ) -> float:
        """Wait until every series matched by the selector ``expr`` has >= ``n`` samples
        within ``lookback`` (``min(count_over_time(expr[lookback])) >= n``); return that count.

        ``expr`` must be a series selector such as ``up`` or ``x_bucket{le="+Inf"}``.
        """
        deadline = _time.monotonic() + timeout
        promql = f"min(count_over_time({expr}[{lookback}]))"
        last: Any = None
        while True:
            if self.process.poll() is not None:
                raise self._error(f"prometheus exited with {self.process.returncode} while waiting for {expr}")
            res = self.query(promql)["result"]
            if res:
                last = float(res[0]["value"][1])
                if last >= n:
                    return last
            if _time.monotonic() > deadline:
                raise self._error(f"timed out after {timeout}s waiting for {n} samples of {expr} (have {last})")
            _time.sleep(poll)

    def stop(self, grace: float = 10.0) -> None:
        """Stop this process by PID: SIGTERM, then SIGKILL if it is still alive after ``grace``."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def start(self) -> None:
        """Start the same server again after :meth:`stop`: same port, config and data dir
        (an outage test stops it for a while, then expects its history back).

        Raises if it is still running or does not become ready (e.g. the port was taken
        while it was down).
        """
        if self.running:
            raise self._error(f"pid {self.pid} is still running")
        self.process = _spawn(self.argv, self.log_path)
        self.pid = self.process.pid
        try:
            ready = _wait_ready(self.process, self.url, self.client, self.ready_timeout, self.ready_path)
        except TimeoutError as e:
            self.stop()
            raise self._error(str(e)) from None
        if not ready:
            raise self._error(f"exited with {self.process.returncode} while restarting")

    def reload(self) -> None:
        """Re-read the config file now (SIGHUP to this PID)."""
        self.process.send_signal(signal.SIGHUP)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, client: httpx.Client, timeout: float,
                path: str = "/-/ready") -> bool:
    """True once ``path`` answers 200; False if the process died first; TimeoutError otherwise."""
    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{url}{path}").status_code == 200:
                return True
        _time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not ready after {timeout}s")


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the log's directory, appending its output to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=log_path.parent)


@contextlib.contextmanager
def serving(
    name: str,
    log_path: Path,
    config_path: Path,
    argv_for_port: Callable[[int], list[str]],
    *,
    ready_path: str,
    ready_timeout: float,
    handle_type: type[PrometheusHandle] | None = None,
) -> Iterator[PrometheusHandle]:
    """Start ``argv_for_port(port)`` on a free port (another port if it loses the race for
    it), wait for ``ready_path``, yield the handle, stop it by PID on exit."""
    client = httpx.Client(timeout=10.0)
    handle: PrometheusHandle | None = None
    try:
        for attempt in range(3):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = argv_for_port(port)
            proc = _spawn(argv, log_path)
            handle = (handle_type or PrometheusHandle)(url, proc.pid, log_path, config_path, proc, client, argv,
                                                       ready_path, ready_timeout)
            try:
                ready = _wait_ready(proc, url, client, ready_timeout, ready_path)
            except TimeoutError as e:
                raise handle._error(str(e)) from None
            if ready:
                break
            proc.wait()
            if "address already in use" in handle.log_tail(200) and attempt < 2:
                continue  # lost the race for the port; try another one
            raise handle._error(f"{name} exited with {proc.returncode} during startup")
        assert handle is not None
        try:
            yield handle
        except BaseException as e:
            e.add_note(f"--- {log_path} (tail) ---\n{handle.log_tail()}")
            raise
    finally:
        if handle is not None:
            handle.stop()
        client.close()


@contextlib.contextmanager
def running_prometheus(
    tmp_path: Path,
    scrape_configs_yaml_or_targets: Targets,
    scrape_interval: str = "1s",
    extra_args: Sequence[str] = (),
    *,
    binary: str = PROMETHEUS_BINARY,
    ready_timeout: float = 30.0,
    evaluation_interval: str | None = None,
) -> Iterator[PrometheusHandle]:
    """Start a real Prometheus scraping the given targets; yield a :class:`PrometheusHandle`.

    ``scrape_configs_yaml_or_targets``: see :func:`_scrape_configs` (YAML text, list
    of URLs, or ``{job: urls}``). ``scrape_interval`` is the global (and generated
    jobs') interval and timeout. ``extra_args`` are appended to the command line.
    Everything (config, TSDB, log) lives in ``tmp_path/prometheus*``.
    """
    exe = require_binary(binary, "a real Prometheus server (PromQL oracle / end-to-end scraping)")
    base = Path(tmp_path)
    base.mkdir(parents=True, exist_ok=True)
    config_path = base / "prometheus.yml"
    log_path = base / "prometheus.log"
    config_path.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        f"  evaluation_interval: {evaluation_interval or scrape_interval}\n"
        + _scrape_configs(scrape_configs_yaml_or_targets, scrape_interval)
        + "\n"
    )
    data_path = base / "prometheus-data"
    with serving(
        "prometheus", log_path, config_path,
        lambda port: [exe, f"--config.file={config_path}", f"--storage.tsdb.path={data_path}",
                      f"--web.listen-address=127.0.0.1:{port}", *extra_args],
        ready_path="/-/ready", ready_timeout=ready_timeout,
    ) as handle:
        yield handle
