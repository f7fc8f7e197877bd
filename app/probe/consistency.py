"""Client TTFT vs. the engine's TTFT histogram over the same period.

The engine's histogram starts its clock when the request reaches the engine; the client's
when it sends the request. The difference is time spent outside the engine: network, TLS,
a gateway or load balancer, the API server's tokenization and queueing in front of the
engine. When the probe is the only traffic, the histogram's increase over the probe period
holds exactly the probe's requests, so the means compare like with like.

The server side is :func:`app.latency.latency_report` over the smallest window of stored
snapshots that contains the probe period (the last scrape at or before its start to the
first at or after its end): no extrapolation, exact ``_sum``/``_count`` increases. A gap
above *both* thresholds (default 0.25 s and 20 %) is a finding: "time is lost outside the
engine".

Emulated targets record simulated seconds: pass their ``time_scale`` so client seconds are
converted before comparing (``client x time_scale``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sqlalchemy.orm import Session

from app import latency
from app.probe import repository as probe_repository
from app.probe.runner import LevelResult, ProbeResult

FINDING = "time is lost outside the engine (network, tokenization, API server)"


@dataclass(frozen=True)
class ConsistencyResult:
    """Client vs. server TTFT for one probe period (seconds; client already scaled)."""

    target_id: int
    probe_start: float
    probe_end: float
    window_start: float | None  # the stored snapshots compared (None: no scrape around the probe)
    window_end: float | None
    client_requests: int
    client_mean: float | None
    client_p50: float | None
    server_requests: float | None  # increase of the TTFT histogram's count over the window
    server_mean: float | None
    server_p50: float | None
    gap_seconds: float | None  # client mean - server mean
    gap_relative: float | None  # gap / server mean
    threshold_seconds: float
    threshold_relative: float
    finding: bool
    status: str  # ok | finding | insufficient_data
    message: str
    other_traffic: bool  # the server counted more requests than the probe sent

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Client:
    count: int
    total: float
    p50: float | None
    start: float
    end: float


def _client_side(probe: ProbeResult | LevelResult | list[LevelResult] | dict) -> _Client:
    """The probe's successful TTFTs and its period. A whole run (a ``ProbeResult`` or its stored
    ``summary``) includes its preflight requests: they reached the engine in the same period."""
    if isinstance(probe, dict):  # ProbeRunRow.summary
        count, total = 0, 0.0
        for level in probe.get("levels", []):
            ttft = level.get("ttft") or {}
            if ttft.get("count") and ttft.get("mean") is not None:
                count += ttft["count"]
                total += ttft["mean"] * ttft["count"]
        pre = [float(v) for v in probe.get("preflight_ttfts") or []]
        p50 = probe["levels"][0]["ttft"].get("p50") if len(probe.get("levels", [])) == 1 and not pre else None
        return _Client(count + len(pre), total + math.fsum(pre), p50, probe["started_at"], probe["finished_at"])
    if isinstance(probe, ProbeResult):
        levels, extra, start, end = probe.levels, probe.preflight_ttfts, probe.started_at, probe.finished_at
    else:
        levels = probe if isinstance(probe, list) else [probe]
        extra, start, end = [], min(lv.started_at for lv in levels), max(lv.finished_at for lv in levels)
    values = sorted([r.ttft for lv in levels for r in lv.requests if r.ok and r.ttft is not None] + extra)
    return _Client(len(values), math.fsum(values), _median(values), start, end)


def check_consistency(session: Session, target_id: int,
                      probe: ProbeResult | LevelResult | list[LevelResult] | dict, *,
                      time_scale: float = 1.0, min_gap_seconds: float = 0.25, min_gap_relative: float = 0.2,
                      start: float | None = None, end: float | None = None) -> ConsistencyResult:
    """Compare the probe's client TTFT with the stored server TTFT over the probe period.

    ``probe`` is a :class:`ProbeResult` (or the ``summary`` stored on its run row: preflight
    requests included, period = the whole run) or levels of one (period = those levels).
    ``start``/``end`` override the period. The target must have been scraped at or before
    the start and at or after the end."""
    client = _client_side(probe)
    start = client.start if start is None else start
    end = client.end if end is None else end
    n = client.count
    client_mean = client.total * time_scale / n if n else None
    client_p50 = client.p50 * time_scale if client.p50 is not None else None
    w_start, w_end = probe_repository.scrape_bracket(session, target_id, start, end)
    base = dict(target_id=target_id, probe_start=start, probe_end=end, window_start=w_start, window_end=w_end,
                client_requests=n, client_mean=client_mean, client_p50=client_p50,
                threshold_seconds=min_gap_seconds, threshold_relative=min_gap_relative)
    if w_start is None or w_end is None or w_end <= w_start:
        return ConsistencyResult(**base, server_requests=None, server_mean=None, server_p50=None, gap_seconds=None,
                                 gap_relative=None, finding=False, status="insufficient_data",
                                 message="no successful scrape before and after the probe period",
                                 other_traffic=False)
    report = latency.latency_report(session, [target_id], w_end - w_start, w_end, per_model=False)
    ttft = report.get("ttft") or {}
    server_mean, server_p50, count = ttft.get("mean"), ttft.get("p50"), ttft.get("count")
    if client_mean is None or server_mean is None:
        return ConsistencyResult(**base, server_requests=count, server_mean=server_mean, server_p50=server_p50,
                                 gap_seconds=None, gap_relative=None, finding=False, status="insufficient_data",
                                 message="no successful probe request" if client_mean is None
                                 else "the server recorded no TTFT observation in the probe period",
                                 other_traffic=False)
    gap = client_mean - server_mean
    relative = gap / server_mean if server_mean > 0 else None
    finding = gap > min_gap_seconds and (relative is None or relative > min_gap_relative)
    other = count is not None and count > n + 0.5
    if finding:
        message = (f"{FINDING}: clients wait {gap:.3f}s ({_pct(relative)}) longer for the first token than the "
                   f"engine records (client mean {client_mean:.3f}s, engine mean {server_mean:.3f}s)")
    else:
        message = (f"client and engine agree: client mean TTFT {client_mean:.3f}s, engine {server_mean:.3f}s "
                   f"(gap {gap:+.3f}s)")
    if other:
        message += f"; the engine served {count:g} requests in the window, the probe {n}: other " \
                   "traffic is mixed in"
    return ConsistencyResult(**base, server_requests=count, server_mean=server_mean, server_p50=server_p50,
                             gap_seconds=gap, gap_relative=relative, finding=finding,
                             status="finding" if finding else "ok", message=message, other_traffic=other)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _pct(relative: float | None) -> str:
    return "n/a" if relative is None else f"{relative:.0%}"
