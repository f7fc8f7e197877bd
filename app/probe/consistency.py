"""Client TTFT vs. the engine's TTFT histogram over the same period.

The engine's histogram starts its clock when the request reaches the engine; the client's
when it sends the request. The difference is time spent outside the engine: network, TLS,
a gateway or load balancer, the API server's tokenization and queueing in front of the
engine. When the probe is the only traffic, the histogram's increase over the probe period
holds exactly the probe's requests, so the means compare like with like; with other traffic
mixed in, the engine mean is what the other requests got in the same period, which a probe
request is a sample of.

The server side is the stored snapshots of the smallest window that contains the probe
period (the last scrape at or before its start to the first at or after its end): no
extrapolation, exact ``_sum``/``_count`` increases.

Two entry points:

* :func:`check_consistency` - one probe (a :class:`ProbeResult`, levels of one, or the
  summary stored on its run row);
* :func:`period_consistency` - the probe runs of a target that finished in a period (the
  newest :data:`MAX_RUNS`), combined (each run compared with the engine over its own period,
  weighted by its requests; the engine's request count taken once over the union of those
  periods): what the diagnosis's ``outside_engine`` rule reads and
  ``GET /api/v1/targets/{name}/consistency`` shows.

The judgement uses the diagnosis thresholds (:mod:`app.core.thresholds`,
``outside_*``): a gap of at least ``outside_gap_seconds`` that is at least
``outside_gap_share`` of the client's TTFT, over at least ``outside_min_requests`` probe
requests, is a finding ("time is lost outside the engine"). A comparison is *unreliable*
when other traffic is mixed in and the engine is queueing (queue time at least
``queue_share`` of its TTFT): one probe's own queue wait then varies by seconds around the
mean, far more than the gap to be measured.

Emulated targets record simulated seconds: pass their ``time_scale`` so client seconds are
converted before comparing (``client x time_scale``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from sqlalchemy.orm import Session

from app.core.thresholds import Thresholds
from app.probe import repository as probe_repository
from app.probe.runner import LevelResult, ProbeResult
from app.store import reads

FINDING = "time is lost outside the engine (network, tokenization, API server)"
#: Probe runs :func:`period_consistency` combines at most, the newest first: 15 minutes of
#: canaries every 5 minutes are 3 runs, so 20 leaves room for ad hoc probes and sweeps.
MAX_RUNS = 20
#: TGI has no TTFT histogram: its TTFT is derived from queue + prefill (app.latency).
SERVER_SIGNALS = ("ttft", "queue_time", "prefill_time")


@dataclass(frozen=True)
class ConsistencyResult:
    """Client vs. server TTFT over probe periods (seconds; client already scaled)."""

    target_id: int
    probe_start: float
    probe_end: float
    window_start: float | None  # the stored snapshots compared (None: no scrape around the probe)
    window_end: float | None
    client_requests: int
    client_mean: float | None
    server_requests: float | None  # increase of the TTFT histogram's count over the window(s)
    server_mean: float | None
    server_queue_mean: float | None  # the engine's mean queue time over the same window(s)
    gap_seconds: float | None  # client mean - server mean
    gap_share: float | None  # gap / client mean: the share of the user's wait spent outside the engine
    threshold_seconds: float
    threshold_share: float
    min_requests: float
    finding: bool
    status: str  # "ok", "finding", "insufficient_data" or "unreliable"
    message: str
    other_traffic: bool  # the server counted more requests than the probes sent
    runs: tuple[int, ...] = ()  # probe runs compared (period_consistency, or a stored run)
    models: tuple[str, ...] = ()  # the models the probes asked for

    def to_dict(self) -> dict:
        out = asdict(self)
        out["runs"], out["models"] = list(self.runs), list(self.models)
        return out


@dataclass(frozen=True)
class _Client:
    count: int
    total: float
    start: float
    end: float


@dataclass(frozen=True)
class _Server:
    window_start: float | None
    window_end: float | None
    requests: float | None
    mean: float | None
    queue_mean: float | None


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
        return _Client(count + len(pre), total + math.fsum(pre), probe["started_at"], probe["finished_at"])
    if isinstance(probe, ProbeResult):
        levels, extra, start, end = probe.levels, probe.preflight_ttfts, probe.started_at, probe.finished_at
    else:
        levels = probe if isinstance(probe, list) else [probe]
        extra, start, end = [], min(lv.started_at for lv in levels), max(lv.finished_at for lv in levels)
    values = [r.ttft for lv in levels for r in lv.requests if r.ok and r.ttft is not None] + list(extra)
    return _Client(len(values), math.fsum(values), start, end)


def _server_side(session: Session, target_id: int, start: float, end: float) -> _Server:
    w_start, w_end = probe_repository.scrape_bracket(session, target_id, start, end)
    if w_start is None or w_end is None or w_end <= w_start:
        return _Server(w_start, w_end, None, None, None)
    loaded = reads.load_histograms(session, [target_id], SERVER_SIGNALS, w_start, w_end)
    summaries = reads.summarize_signals(loaded, w_start, w_end)
    ttft, queue = summaries.get("ttft"), summaries.get("queue_time")
    return _Server(w_start, w_end, None if ttft is None else ttft.count, None if ttft is None else ttft.mean,
                   None if queue is None else queue.mean)


def _judge(t: Thresholds, target_id: int, start: float, end: float, n: int, client_mean: float | None,
           server: _Server, runs: Sequence[int] = (), models: Sequence[str] = ()) -> ConsistencyResult:
    result = functools.partial(
        ConsistencyResult, target_id=target_id, probe_start=start, probe_end=end,
        window_start=server.window_start, window_end=server.window_end, client_requests=n, client_mean=client_mean,
        server_requests=server.requests, server_mean=server.mean, server_queue_mean=server.queue_mean,
        threshold_seconds=t.outside_gap_seconds, threshold_share=t.outside_gap_share,
        min_requests=t.outside_min_requests, runs=tuple(runs), models=tuple(models))

    def unjudged(message: str, status: str = "insufficient_data", gap: float | None = None,
                 share: float | None = None, other: bool = False) -> ConsistencyResult:
        return result(gap_seconds=gap, gap_share=share, finding=False, status=status, message=message,
                      other_traffic=other)

    if client_mean is None:
        return unjudged("no successful probe request")
    if server.window_start is None or server.window_end is None or server.window_end <= server.window_start:
        return unjudged("no successful scrape before and after the probe period")
    if server.mean is None:
        return unjudged("the engine recorded no TTFT observation in the probe period")
    gap = client_mean - server.mean
    share = gap / client_mean if client_mean > 0 else None
    other = server.requests is not None and server.requests > n + 0.5
    numbers = (f"client mean TTFT {client_mean:.3f}s, engine {server.mean:.3f}s over the same period "
               f"(gap {gap:+.3f}s, {n} probe requests")
    numbers += f", {server.requests:g} engine requests: other traffic mixed in)" if other else ")"
    queue_share = server.queue_mean / server.mean if server.queue_mean is not None and server.mean > 0 else None
    if other and queue_share is not None and queue_share >= t.queue_share:
        return unjudged(f"cannot attribute the gap: the engine is queueing (queue {queue_share:.0%} of its TTFT) "
                        f"and serves other traffic, so one probe's queue wait varies more than the gap; {numbers}",
                        "unreliable", gap, share, other)
    large = gap >= t.outside_gap_seconds and share is not None and share >= t.outside_gap_share
    if large and n < t.outside_min_requests:
        return unjudged(f"a large gap over too few probe requests (need {t.outside_min_requests:g}); {numbers}",
                        gap=gap, share=share, other=other)
    if large:
        message = (f"{FINDING}: clients wait {gap:.3f}s ({share:.0%} of their TTFT) longer for the first token "
                   f"than the engine records; {numbers}")
    else:
        message = f"client and engine agree: {numbers}"
    return result(gap_seconds=gap, gap_share=share, finding=large, status="finding" if large else "ok",
                  message=message, other_traffic=other)


def check_consistency(session: Session, target_id: int,
                      probe: ProbeResult | LevelResult | list[LevelResult] | dict, *,
                      thresholds: Thresholds | None = None, time_scale: float = 1.0,
                      start: float | None = None, end: float | None = None) -> ConsistencyResult:
    """Compare the probe's client TTFT with the stored server TTFT over the probe period.

    ``probe`` is a :class:`ProbeResult` (or the ``summary`` stored on its run row: preflight
    requests included, period = the whole run) or levels of one (period = those levels).
    ``start``/``end`` override the period. The target must have been scraped at or before
    the start and at or after the end."""
    client = _client_side(probe)
    start = client.start if start is None else start
    end = client.end if end is None else end
    client_mean = client.total * time_scale / client.count if client.count else None
    model = probe.get("model") if isinstance(probe, dict) else probe.model if isinstance(probe, ProbeResult) else None
    return _judge(thresholds or Thresholds(), target_id, start, end, client.count, client_mean,
                  _server_side(session, target_id, start, end), models=(model,) if model else ())


def period_consistency(session: Session, target_id: int, since: float, until: float,
                       thresholds: Thresholds | None = None) -> ConsistencyResult | None:
    """The finished probe runs of the target with ``since <= finished_at <= until`` (the newest
    :data:`MAX_RUNS` of them), each compared with the engine over its own period, combined
    weighted by its probe requests (the client and the engine mean of the same periods). The
    engine's request count is taken over the union of the runs' snapshot windows: two runs
    between the same two scrapes see each other's requests, and adding their counts would
    report the probes' own requests as other traffic. None when no run finished in the period."""
    t = thresholds or Thresholds()
    runs = [run for run in probe_repository.finished_runs(session, target_id, since, until=until, limit=MAX_RUNS)
            if run.summary]
    if not runs:
        return None
    results = [check_consistency(session, target_id, run.summary, thresholds=t) for run in runs]  # newest first
    compared = [(run.id, r) for run, r in zip(runs, results) if r.client_mean is not None and r.server_mean is not None]
    models = tuple(sorted({run.summary["model"] for run in runs if run.summary.get("model")}))
    if not compared:  # say why with the newest run (e.g. the scrape after it has not happened yet)
        return replace(results[0], runs=tuple(sorted(run.id for run in runs)), models=models)
    ids, judged = tuple(sorted(i for i, _ in compared)), [r for _, r in compared]
    start, end = min(r.probe_start for r in judged), max(r.probe_end for r in judged)
    n = sum(r.client_requests for r in judged)

    def weighted(key: str) -> float | None:
        values = [(r.client_requests, getattr(r, key)) for r in judged]
        if any(v is None for _, v in values):
            return None
        return math.fsum(w * v for w, v in values) / n

    server = _Server(min(r.window_start for r in judged), max(r.window_end for r in judged),
                     _requests_once(session, target_id, judged), weighted("server_mean"),
                     weighted("server_queue_mean"))
    return _judge(t, target_id, start, end, n, weighted("client_mean"), server, ids, models)


def _requests_once(session: Session, target_id: int, judged: Sequence[ConsistencyResult]) -> float:
    """The engine's requests over the union of the runs' snapshot windows, each counted once.
    Windows that overlap (share more than an end scrape) are merged and counted over the merged
    window; a window of its own keeps the count already computed for its run."""
    windows: list[tuple[float, float, float | None]] = []  # (start, end, requests; None once merged)
    for r in sorted(judged, key=lambda r: (r.window_start, r.window_end)):
        if windows and r.window_start < windows[-1][1]:
            start, end, _ = windows[-1]
            windows[-1] = (start, max(end, r.window_end), None)
        else:
            windows.append((r.window_start, r.window_end, r.server_requests))
    return math.fsum((_server_side(session, target_id, start, end).requests if requests is None else requests) or 0.0
                     for start, end, requests in windows)
