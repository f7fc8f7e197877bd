"""Prometheus' file and HTTP service discovery for the built-in scraper.

Pods come and go; a static target list pointed at a Service name scrapes whichever replica
the load balancer picks (see :mod:`app.scrape.load_balancing`). Discovery reads the same
target-group lists Prometheus reads::

    [{"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"pool": "a", "__metrics_path__": "/metrics"}}]

from ``file_sd_configs`` (JSON or YAML files, globs in the file name; re-read when a file's
mtime, size or the set of matching files changes, checked every ``refresh_interval``) and
``http_sd_configs`` (GET, 200 + ``application/json``, at most :data:`MAX_SD_BYTES`; a failed
refresh keeps the last good list, as Prometheus does).

Every discovered address becomes a row of ``targets`` with ``source`` ``file_sd``/``http_sd``
and ``origin`` naming the config (``file_sd_configs[0]``). A target that leaves its list
gets ``gone_at`` and is not scraped any more; its history stays, and it comes back (``gone_at``
cleared) when it reappears. Its name is derived from the address (``10.0.0.5-8000``), so the
same pod keeps its history when its labels or metrics path change.

A bad file or entry never stops the service: the entry is skipped and the problem is kept
in :attr:`DiscoveryService.status` (``GET /api/v1/discovery``) and logged, naming the file
(or config) and the entry (``groups[1].targets[0]``). Problems never quote what an HTTP SD
server sent: every API reader sees them.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol

import aiohttp
import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from sqlalchemy.orm import Session, sessionmaker

from app.core.durations import Seconds
from app.core.limits import (
    LABEL_NAME,
    MAX_INTERVAL_SECONDS,
    MAX_LABEL_VALUE_LENGTH,
    MAX_LABELS,
    MAX_LIST_LENGTH,
    MAX_URL_LENGTH,
    NAME_PATTERN,
    RESERVED_LABELS,
    Url,
)
from app.core.urls import check_url_in_file, validate_target_url
from app.scrape.client import USER_AGENT, http_status_message
from app.targets import repository as target_repository


class Discovery(Protocol):
    """The discovery sections of the targets file (``app.config.FileConfig``, which sits above
    the scrape layer and holds these configs)."""

    @property
    def file_sd_configs(self) -> Sequence[FileSDConfig]: ...

    @property
    def http_sd_configs(self) -> Sequence[HttpSDConfig]: ...

log = logging.getLogger(__name__)
SD_SOURCES = ("file_sd", "http_sd")  # Target.source of what this module discovers
#: An HTTP SD answer larger than this is refused (Prometheus' own file SD lists are a few kB
#: per hundred targets; the same bound as the targets YAML).
MAX_SD_BYTES = 1 << 20
HTTP_SD_TIMEOUT = 30.0  # or the refresh interval, when shorter
MAX_PROBLEMS = 100  # problems listed per refresh; the rest are counted
_NAME = re.compile(NAME_PATTERN)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_KEPT_META = ("__metrics_path__", "__scheme__")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Discovered:
    """One target of a target group: its scrape URL and its plain labels."""

    origin: str
    source: str
    address: str
    url: str
    labels: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class OriginStatus:
    """What one discovery config last did (``GET /api/v1/discovery``)."""

    origin: str
    kind: str
    where: list[str]  # the file patterns, or the URL
    refresh_interval: float
    last_refresh: float | None = None
    last_success: float | None = None
    targets: int = 0
    problems: list[str] = field(default_factory=list)  # this refresh's: bad files and entries
    error: str | None = None  # the refresh failed as a whole (HTTP SD): the last good list is kept

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "kind": self.kind, "where": self.where,
                "refresh_interval_seconds": self.refresh_interval, "last_refresh": self.last_refresh,
                "last_success": self.last_success, "targets": self.targets, "problems": self.problems,
                "error": self.error}


class SDError(Exception):
    """A whole refresh failed (HTTP SD unreachable, wrong status or type, not JSON)."""


# --------------------------------------------------------------------------- config

#: What Prometheus' file SD reads: JSON or YAML target-group files (it refuses other names too).
SD_FILE_SUFFIXES = (".json", ".yml", ".yaml")


class FileSDConfig(BaseModel):
    """Prometheus' ``file_sd_configs`` entry: target-group files (globs allowed in the file
    name), re-read when one of them changes; relative paths are relative to the targets YAML."""

    model_config = ConfigDict(extra="forbid")

    files: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_LENGTH)]] = Field(
        min_length=1, max_length=MAX_LIST_LENGTH)
    refresh_interval: Seconds = Field(60.0, gt=0, le=MAX_INTERVAL_SECONDS)

    @field_validator("files")
    @classmethod
    def _suffixes(cls, files: list[str]) -> list[str]:
        for index, pattern in enumerate(files):
            if not pattern.endswith(SD_FILE_SUFFIXES):
                raise ValueError(f"files[{index}]: must end in .json, .yml or .yaml (as Prometheus requires)")
            if any(c in part for part in Path(pattern).parent.parts for c in "*?["):
                raise ValueError(f"files[{index}]: a glob is allowed only in the file name, not in directories")
        return files


class HttpSDConfig(BaseModel):
    """Prometheus' ``http_sd_configs`` entry: a URL answering the target-group JSON list."""

    model_config = ConfigDict(extra="forbid")

    url: Url
    refresh_interval: Seconds = Field(60.0, gt=0, le=MAX_INTERVAL_SECONDS)

    @field_validator("url")
    @classmethod
    def _url_allowed(cls, url: str, info: ValidationInfo) -> str:
        return check_url_in_file(url, info)  # type: ignore[return-value]


# --------------------------------------------------------------------------- target groups

def parse_target_groups(data: object, origin: str, source: str, allowed_hosts: list[str]
                        ) -> tuple[list[Discovered], list[str]]:
    """Prometheus' target-group list -> targets, and one problem per bad group or entry
    (``groups[i]...: reason``). Bad entries are skipped, the rest used. Problems with an
    HTTP SD list never quote it (every API reader sees them): keys and hosts are named only
    in problems of files, which the operator wrote. Linear in the list and bounded: reading
    stops at :data:`MAX_LIST_LENGTH` targets, and past :data:`MAX_PROBLEMS` problems the rest
    are counted in one line."""
    quote = source == "file_sd"
    if not isinstance(data, list):
        return [], ["not a list of target groups"]
    out: list[Discovered] = []
    problems = _Problems()
    for g, group in enumerate(data):
        where = f"groups[{g}]"
        if not isinstance(group, dict):
            problems.append(f"{where}: not a mapping with 'targets' and 'labels'")
            continue
        unknown = set(group) - {"targets", "labels"}
        if unknown:
            keys = f" {', '.join(sorted(map(str, unknown)))[:200]}" if quote else ""
            problems.append(f"{where}: unknown key(s){keys}; a group has only 'targets' and 'labels'")
            continue
        addresses = group.get("targets") or []
        labels = group.get("labels") or {}
        if not isinstance(addresses, list):
            problems.append(f"{where}.targets: not a list")
            continue
        if not isinstance(labels, dict):
            problems.append(f"{where}.labels: not a mapping")
            continue
        plain, meta, problem = _group_labels(labels, quote)
        if problem:
            problems.append(f"{where}.labels{problem}")
            continue
        scheme = meta.get("__scheme__", "http")
        path = meta.get("__metrics_path__", "/metrics")
        if not path.startswith("/"):
            problems.append(f"{where}.labels.__metrics_path__: must start with '/'")
            continue
        for t, address in enumerate(addresses):
            if len(out) == MAX_LIST_LENGTH:
                problems.append(f"more than {MAX_LIST_LENGTH} targets; the rest are ignored")
                return out, problems.listed()
            at = f"{where}.targets[{t}]"
            if not isinstance(address, str) or not address or any(c in address for c in "/?#@ \t\n"):
                problems.append(f"{at}: not a host:port address")
                continue
            url = f"{scheme}://{address}{path}"
            if len(url) > MAX_URL_LENGTH:
                problems.append(f"{at}: URL longer than {MAX_URL_LENGTH} characters")
                continue
            try:
                validate_target_url(url, allowed_hosts)
            except ValueError as exc:
                problems.append(f"{at}: {exc}" if quote else f"{at}: refused by the URL policy (http(s) "
                                                              "with a valid port, LLM_LATENCY_ALLOWED_TARGET_HOSTS)")
                continue
            out.append(Discovered(origin, source, address, url, plain))
    return out, problems.listed()


class _Problems(list[str]):
    """The first :data:`MAX_PROBLEMS` problems of a list, and how many more there were."""

    more = 0

    def append(self, problem: str) -> None:
        if len(self) < MAX_PROBLEMS:
            super().append(problem)
        else:
            self.more += 1

    def listed(self) -> list[str]:
        return [*self, f"{self.more} more problems not listed"] if self.more else list(self)


def _group_labels(labels: dict[Any, Any], quote: bool
                  ) -> tuple[tuple[tuple[str, str], ...], dict[str, str], str | None]:
    """(plain labels, the kept ``__`` labels, problem suffix or None). ``__meta_*`` and other
    ``__`` labels are dropped, as Prometheus drops them after relabelling."""
    plain: dict[str, str] = {}
    meta: dict[str, str] = {}
    for index, (key, value) in enumerate(labels.items()):
        if not isinstance(key, str) or not isinstance(value, str):
            return (), {}, f": label #{index}: names and values must be strings"
        if key.startswith("__"):
            if key in _KEPT_META:
                meta[key] = value
            continue
        if not LABEL_NAME.match(key) or len(key) > 128:
            return (), {}, f": label #{index}: invalid label name"
        named = f".{key}" if quote or key in RESERVED_LABELS else f": label #{index}"
        if key in RESERVED_LABELS:
            return (), {}, f"{named}: label name is reserved"
        if len(value) > MAX_LABEL_VALUE_LENGTH:
            return (), {}, f"{named}: value longer than {MAX_LABEL_VALUE_LENGTH} characters"
        plain[key] = value
    if len(plain) > MAX_LABELS:
        return (), {}, f": more than {MAX_LABELS} labels"
    if meta.get("__scheme__", "http") not in ("http", "https"):
        return (), {}, ".__scheme__: must be http or https"
    return tuple(sorted(plain.items())), meta, None


# --------------------------------------------------------------------------- names

def base_name(address: str) -> str:
    """``10.0.0.5:8000`` -> ``10.0.0.5-8000``; ``[::1]:9`` -> ``1-9``: NAME_PATTERN-safe."""
    name = _UNSAFE.sub("-", address).strip("-._")[:63] or "target"
    return name if _NAME.match(name) else "t-" + name[:61]


def _identity_hash(item: Discovered) -> str:
    text = json.dumps([item.origin, item.url, item.labels])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def assign_names(items: Sequence[Discovered], taken: set[str]) -> dict[str, Discovered]:
    """A name per discovered target, deterministic: the address as a name; when several
    targets share it (same address under two metrics paths, two configs, or a config/API
    target already has it), the first in (origin, URL, labels) order keeps the plain name
    and the others get ``-<8 hex of origin, URL and labels>``."""
    groups: dict[str, list[Discovered]] = {}
    for item in items:
        groups.setdefault(base_name(item.address), []).append(item)
    names: dict[str, Discovered] = {}
    for base, group in sorted(groups.items()):
        unique = sorted(set(group), key=lambda i: (i.origin, i.url, i.labels))
        for index, item in enumerate(unique):
            name = base if index == 0 and base not in taken else f"{base[:54]}-{_identity_hash(item)}"
            names.setdefault(name, item)
    return names


def sync_discovered(session: Session, results: dict[str, list[Discovered] | None], now: float) -> bool:
    """Make the discovered rows match ``results`` (origin -> its targets, or None: keep that
    origin's rows as they are). Rows of an origin no longer configured are marked gone.
    Returns whether anything changed (the scheduler then reloads)."""
    rows = target_repository.list_targets(session)
    taken = {row.name for row in rows if row.source not in SD_SOURCES}
    frozen = {origin for origin, items in results.items() if items is None}
    wanted = assign_names([item for items in results.values() if items for item in items], taken)
    changed = False
    existing = {row.name: row for row in rows}
    for row in rows:
        if row.source not in SD_SOURCES or row.origin in frozen:
            continue
        item = wanted.get(row.name)
        if item is None:
            if row.gone_at is None:
                target_repository.update_target(session, row, gone_at=now)
                changed = True
            continue
        fields = {"url": item.url, "labels": dict(item.labels), "origin": item.origin, "source": item.source,
                  "gone_at": None}
        if any(getattr(row, key) != value for key, value in fields.items()):
            target_repository.update_target(session, row, **fields)
            changed = True
    for name, item in wanted.items():
        if name not in existing:
            target_repository.create_target(session, source=item.source, name=name, url=item.url,
                                     labels=dict(item.labels), origin=item.origin)
            changed = True
    return changed


# --------------------------------------------------------------------------- reading

def read_group_file(path: Path) -> object:
    """A target-group file's data; :class:`SDError` names what is wrong with it."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SD_BYTES + 1)
    except OSError as exc:
        raise SDError(f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_SD_BYTES:
        raise SDError(f"larger than {MAX_SD_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SDError("not UTF-8 text") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise SDError(f"not valid JSON (line {getattr(exc, 'lineno', '?')})") from None
    try:
        return yaml.load(text, Loader=_YAML_LOADER) or []
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        raise SDError(f"not valid YAML (line {line})") from None
    except (yaml.YAMLError, RecursionError):
        raise SDError("not valid YAML") from None


class FileSD:
    """One ``file_sd_configs`` entry: re-reads its files when their (path, mtime, size) change."""

    kind = "file_sd"

    def __init__(self, origin: str, config: FileSDConfig, base_dir: Path, allowed_hosts: list[str]) -> None:
        self.origin = origin
        self.config = config
        self.patterns = [str(base_dir / pattern) for pattern in config.files]
        self.allowed_hosts = allowed_hosts
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self._per_file: dict[str, list[Discovered]] = {}
        self._items: list[Discovered] = []
        self._problems: list[str] = []

    def files(self) -> list[Path]:
        found = {path for pattern in self.patterns for path in glob.glob(pattern)}
        return sorted(Path(path) for path in found if path.endswith((".json", ".yml", ".yaml")))

    async def refresh(self) -> tuple[list[Discovered], list[str]]:
        return await asyncio.to_thread(self.read)

    def read(self) -> tuple[list[Discovered], list[str]]:
        """Re-read when the set of files or one's mtime or size changed. A file that cannot be
        read or parsed keeps its last good targets (Prometheus does the same); a deleted file's
        targets leave."""
        stamps = []
        for path in self.files():
            try:
                stat = path.stat()
                stamps.append((str(path), stat.st_mtime_ns, stat.st_size))
            except OSError:
                stamps.append((str(path), 0, -1))
        if tuple(stamps) == self._seen:
            return self._items, self._problems
        per_file: dict[str, list[Discovered]] = {}
        problems: list[str] = []
        for path_text, _, _ in stamps:
            try:
                data = read_group_file(Path(path_text))
            except SDError as exc:
                kept = self._per_file.get(path_text)
                problems.append(f"{path_text}: {exc}" + ("; keeping its last good targets" if kept else ""))
                per_file[path_text] = kept or []
                continue
            found, bad = parse_target_groups(data, self.origin, self.kind, self.allowed_hosts)
            per_file[path_text] = found
            problems += [f"{path_text}: {problem}" for problem in bad]
        items = [item for found in per_file.values() for item in found]
        self._seen, self._per_file, self._items, self._problems = tuple(stamps), per_file, items, problems
        return items, problems


class HttpSD:
    """One ``http_sd_configs`` entry (Prometheus' HTTP SD rules)."""

    kind = "http_sd"

    def __init__(self, origin: str, config: HttpSDConfig, allowed_hosts: list[str]) -> None:
        self.origin = origin
        self.config = config
        self.allowed_hosts = allowed_hosts
        self.session: aiohttp.ClientSession | None = None

    async def refresh(self) -> tuple[list[Discovered], list[str]]:
        validate_target_url(self.config.url, self.allowed_hosts)
        if self.session is None:
            raise SDError("not started")
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT,
                   "X-Prometheus-Refresh-Interval-Seconds": f"{self.config.refresh_interval:g}"}
        timeout = min(HTTP_SD_TIMEOUT, self.config.refresh_interval)
        try:
            async with asyncio.timeout(timeout):
                async with self.session.get(self.config.url, headers=headers, allow_redirects=False) as response:
                    if response.status != 200:
                        raise SDError(http_status_message(response.status))
                    if response.content_type != "application/json":
                        raise SDError("the answer is not application/json")
                    body = bytearray()
                    async for chunk in response.content.iter_chunked(65536):
                        body += chunk
                        if len(body) > MAX_SD_BYTES:
                            raise SDError(f"the answer is larger than {MAX_SD_BYTES >> 20} MiB")
        except TimeoutError:
            raise SDError(f"no complete answer within {timeout:g}s") from None
        except aiohttp.ClientConnectorError:
            raise SDError("cannot connect") from None
        except aiohttp.ClientError as exc:
            raise SDError(f"HTTP error ({type(exc).__name__})") from None
        return await asyncio.to_thread(self._parse, bytes(body))  # off the event loop

    def _parse(self, body: bytes) -> tuple[list[Discovered], list[str]]:
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise SDError("the answer is not valid JSON") from None
        if not isinstance(data, list):
            raise SDError("the answer is not a list of target groups")
        return parse_target_groups(data, self.origin, self.kind, self.allowed_hosts)


def make_discoverers(config: Discovery, base_dir: Path, allowed_hosts: list[str]) -> list[FileSD | HttpSD]:
    """One discoverer per ``file_sd_configs``/``http_sd_configs`` entry, named by its position."""
    out: list[FileSD | HttpSD] = [FileSD(f"file_sd_configs[{i}]", c, base_dir, allowed_hosts)
                                  for i, c in enumerate(config.file_sd_configs)]
    out += [HttpSD(f"http_sd_configs[{i}]", c, allowed_hosts) for i, c in enumerate(config.http_sd_configs)]
    return out


# --------------------------------------------------------------------------- the service

class DiscoveryService:
    """Runs the discoverers (one scheduler job each, at its refresh interval), writes the
    targets table, and calls ``on_change`` (the scrape scheduler's reload) when it changed."""

    def __init__(self, sessions: sessionmaker[Session], allowed_hosts: list[str],
                 on_change: Callable[[], Awaitable[None]]) -> None:
        self.sessions = sessions
        self.allowed_hosts = allowed_hosts
        self.on_change = on_change
        self.discoverers: list[FileSD | HttpSD] = []
        self.status: dict[str, OriginStatus] = {}
        self._results: dict[str, list[Discovered] | None] = {}
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    def configure(self, config: Discovery, base_dir: Path) -> None:
        self.discoverers = make_discoverers(config, base_dir, self.allowed_hosts)
        self._results = {d.origin: None for d in self.discoverers}
        self.status = {d.origin: OriginStatus(d.origin, d.kind, d.patterns if isinstance(d, FileSD)
                                              else [d.config.url], d.config.refresh_interval)
                       for d in self.discoverers}

    async def start(self, scheduler: Any) -> None:
        """First refresh of every discoverer (so the first scrapes include them), then one
        scheduler job each. With no discovery configured, it only marks the rows of removed
        configs gone."""
        if any(isinstance(d, HttpSD) for d in self.discoverers):
            self._session = aiohttp.ClientSession()
        for discoverer in self.discoverers:
            if isinstance(discoverer, HttpSD):
                discoverer.session = self._session
        await asyncio.gather(*(self.refresh(d, apply=False) for d in self.discoverers))
        await self.apply()
        for discoverer in self.discoverers:
            scheduler.add_job(self.refresh, "interval", seconds=discoverer.config.refresh_interval,
                              args=(discoverer,), id=f"discovery:{discoverer.origin}", max_instances=1,
                              coalesce=True, replace_existing=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def refresh(self, discoverer: FileSD | HttpSD, apply: bool = True) -> None:
        status = self.status[discoverer.origin]
        now = time.time()
        status.last_refresh = now
        try:
            items, problems = await discoverer.refresh()
        except (SDError, ValueError) as exc:
            status.error = f"{discoverer.origin}: {exc}; keeping the last good list"
            log.warning("discovery %s", status.error)
        except Exception as exc:  # one discoverer's surprise must not stop the others
            log.exception("discovery %s failed", discoverer.origin)
            status.error = f"{discoverer.origin}: {type(exc).__name__}; the service log has the details"
        else:
            known = set(status.problems)
            for problem in problems:
                if problem not in known:
                    log.warning("discovery %s: %s", discoverer.origin, problem)
            status.error, status.problems = None, problems
            status.last_success, status.targets = now, len(items)
            self._results[discoverer.origin] = items
        if apply:
            await self.apply()

    async def apply(self) -> None:
        """Write the current lists to the targets table; reload the scrape jobs if it changed."""
        async with self._lock:
            results = dict(self._results)

            def write() -> bool:
                with self.sessions.begin() as session:
                    return sync_discovered(session, results, time.time())
            try:
                changed = await asyncio.to_thread(write)
            except Exception:  # the database is away: the next refresh writes the lists again
                log.exception("writing discovered targets failed")
                return
            if changed:
                await self.on_change()


def check_discovery(config: Discovery, base_dir: Path, allowed_hosts: list[str]
                    ) -> tuple[list[Discovered], list[str]]:
    """``check-config``: read every file SD file now; (targets found, problems). HTTP SD
    URLs are only validated (the config check does that), not fetched."""
    found: list[Discovered] = []
    problems: list[str] = []
    for discoverer in make_discoverers(config, base_dir, allowed_hosts):
        if isinstance(discoverer, FileSD):
            items, bad = discoverer.read()  # no matching file is no targets, as for Prometheus
            found += items
            problems += bad
    return found, problems
