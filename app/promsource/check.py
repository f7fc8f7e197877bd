"""What ``llm-latency check-config`` can only learn about a source by asking its server.

The YAML model (:mod:`app.promsource.config`) checks a source offline: URL scheme, label
names, selector syntax. When the server answers, two more things are checked: that the URL
is a Prometheus HTTP API at all (an HTML page, a 404 under a wrong path prefix, refused
credentials are errors), and that the server's own parser accepts the selector - it is
the authority (regular expressions are RE2, and Prometheus refuses a selector whose every
matcher matches the empty string). An unreachable server is a warning only: the file is
valid offline, and the check may run where the cluster's Prometheus is not reachable.

Every message names the field (``sources[0].selector: ...``) and is classified text from
:class:`app.promql.client.PromAPIError`, never what the server sent.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.promql.client import PromAPIError, PrometheusClient
from app.promsource import intervals
from app.promsource.config import PrometheusSourceConfig
from app.promsource.reader import SourceReader, SourceTargets

#: ``window_check(interval)``: a warning when the source's diagnosis window at that scrape
#: interval holds fewer scrapes than a rule needs (``app.diagnosis.sampling``), else None
WindowCheck = Callable[[float], "str | None"]

CHECK_TIMEOUT = 10.0  # seconds per request: check-config is interactive
_COLUMN = re.compile(r"column (\d+)")
_SERVER_TROUBLE = ("HTTP 500", "HTTP 502", "HTTP 503", "HTTP 504")  # passing trouble, not a wrong URL


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """One finding about a source: ``loc`` is its field path, ``error`` False for a warning."""

    loc: tuple[str | int, ...]
    message: str
    error: bool

    @property
    def field(self) -> str:
        out = ""
        for part in self.loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out


def check_selector_text(selector: str) -> tuple[str, int]:
    """The series selector sent to the server's parser - the user's matchers, verbatim, on
    ``up``, as every query of the source puts them on a metric name (a bare ``{pod=~".*"}``
    would be refused where the source's real queries are not) - and how many characters
    were put before the user's text."""
    body = selector.strip()
    if not body:
        return "up", 0
    prefix = "up" if body.startswith("{") else "up{"
    return f"{prefix}{body}" if body.startswith("{") else f"{prefix}{body}}}", len(prefix) + len(selector) - len(
        selector.lstrip())


def missing_credentials(config: PrometheusSourceConfig, index: int) -> list[SourceProblem]:
    """Environment variables the source reads credentials from that are not set here."""
    loc: tuple[str | int, ...] = ("sources", index)
    problems = []
    if config.bearer_token_env and not os.environ.get(config.bearer_token_env):
        problems.append(SourceProblem((*loc, "bearer_token_env"), f"environment variable "
                                      f"{config.bearer_token_env} is not set: no token would be sent", False))
    if config.basic_auth and not os.environ.get(config.basic_auth.password_env):
        problems.append(SourceProblem((*loc, "basic_auth", "password_env"), f"environment variable "
                                      f"{config.basic_auth.password_env} is not set: the password would be empty",
                                      False))
    return problems


def window_problems(config: PrometheusSourceConfig, index: int, interval: intervals.ScrapeInterval,
                    window_check: WindowCheck | None) -> list[SourceProblem]:
    """A warning when the source's diagnosis window at its scrape interval leaves a rule unjudged."""
    if interval.seconds is None or window_check is None:
        return []
    warning = window_check(interval.seconds)
    where = ("sources", index, "scrape_interval") if interval.origin == "config" else ("sources", index)
    return [] if warning is None else [SourceProblem(where, f"its targets are {warning} (scrape interval: "
                                                            f"{interval.note})", False)]


def check_source(config: PrometheusSourceConfig, index: int, timeout: float = CHECK_TIMEOUT,
                 window_check: WindowCheck | None = None) -> list[SourceProblem]:
    """Every problem of one source found by asking its server (plus unset credential variables).
    When the server answers, its engines are discovered: how many lack a service label, and
    their scrape interval (the source's, or the server's ``/api/v1/targets``) for ``window_check``."""
    loc: tuple[str | int, ...] = ("sources", index)
    problems = missing_credentials(config, index)
    try:
        client = PrometheusClient(config.url, headers=dict(config.headers), bearer_token=config.bearer_token(),
                                  basic_auth=config.basic_credentials(), ca_file=config.tls.ca_file,
                                  insecure_skip_verify=config.tls.insecure_skip_verify,
                                  timeout=min(timeout, config.query_timeout), max_concurrency=1)
    except ValueError as exc:  # e.g. ca_file: cannot be read as PEM certificates
        field, _, reason = str(exc).partition(": ")
        where = (*loc, "tls", "ca_file") if field == "ca_file" else (*loc, "url")
        return [*problems, SourceProblem(where, reason or str(exc), True)]
    found, interval = SourceTargets(), None
    with client:
        try:
            text, shift = check_selector_text(config.selector)
            rejected = client.check_selector(text)
            if rejected is None:
                found = SourceReader(client, config.target_labels, config.selector,
                                     config.service_labels).discover(time.time())
                interval = intervals.configured(config.scrape_interval) if config.scrape_interval is not None \
                    else intervals.learn(client, config.target_labels, found.engines.keys()) if found.engines \
                    else None
        except PromAPIError as exc:
            return [*problems, _server_problem(exc, loc, credentials_unset=bool(problems))]
    if rejected is not None:  # the position in the user's text, not in ours
        rejected = _COLUMN.sub(lambda m: f"column {max(1, int(m[1]) - shift)}", rejected)
        problems.append(SourceProblem((*loc, "selector"), f"{rejected} by the server's parser", True))
        return problems
    problems += unlabelled_problems(config, index, found)
    if interval is not None and interval.seconds is None:
        problems.append(SourceProblem(loc, f"scrape interval unknown: {interval.note}; the diagnosis window stays "
                                           "diagnosis.window whatever the interval", False))
    elif interval is not None:
        problems += window_problems(config, index, interval, window_check)
    return problems


def unlabelled_problems(config: PrometheusSourceConfig, index: int, found: SourceTargets) -> list[SourceProblem]:
    """A warning naming how many discovered pods lack a value of one of ``service_labels`` (and
    which labels): they are in no service, diagnosed as replicas only."""
    if not config.service_labels:
        return []
    lacking: dict[str, int] = {}
    pods = 0
    for values in found.service.values():
        missing = [name for name in config.service_labels if not values.get(name)]
        pods += bool(missing)
        for name in missing:
            lacking[name] = lacking.get(name, 0) + 1
    if not pods:
        return []
    which = ", ".join(f"{name}: {count}" for name, count in lacking.items())
    return [SourceProblem(("sources", index, "service_labels"),
                          f"{pods} of {len(found.service)} discovered pod{'s' if len(found.service) != 1 else ''} "
                          f"lack a value of service_labels ({which}): they are diagnosed as replicas only, in no "
                          "service", False)]


def _server_problem(exc: PromAPIError, loc: tuple[str | int, ...], credentials_unset: bool) -> SourceProblem:
    url = (*loc, "url")
    if exc.kind in ("unreachable", "timeout"):
        return SourceProblem(url, f"not checked against the server ({exc.kind}: {exc.message}); "
                             "valid offline", False)
    if exc.kind == "not_prometheus":
        return SourceProblem(url, f"{exc.message}; give the base URL of a Prometheus HTTP API (it serves "
                             "/api/v1/query)", True)
    if exc.kind == "auth":  # expected where the credential variables are not set
        return SourceProblem(url, f"{exc.kind}: {exc.message}", not credentials_unset)
    if exc.kind == "http_error" and exc.message.startswith(_SERVER_TROUBLE):  # the server's, not the file's
        return SourceProblem(url, f"not checked against the server ({exc.kind}: {exc.message}); valid offline",
                             False)
    if exc.kind == "http_error":  # a 404 under a wrong path prefix, a 400 from something else
        return SourceProblem(url, f"the API request was refused ({exc.message}); give the base URL of a "
                             "Prometheus HTTP API", True)
    return SourceProblem(url, f"{exc.kind}: {exc.message}", True)
