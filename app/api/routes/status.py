"""The built-in status page: ``GET /`` (every target) and ``GET /targets/{name}`` (one target).

Server-rendered HTML (Jinja2, autoescape on, no JavaScript): someone trying the product
on a laptop without Grafana sees, first, which target needs attention. The index is one
compact fleet table, most severe first (down or a critical finding, then warning, info,
no verdict yet, healthy; by name within a level), coloured and worded by that level; the
evidence, remedies, runbook links and charts are one click away on the target's page.

One window per screen: by default the diagnosis window (``diagnosis.window`` of the
config file), so a row's TTFT/ITL p50/p99 describe the same span of traffic as its
verdict. The page states the window once; ``?window=`` changes the percentiles' window,
and a verdict judged over another window then says so.

Every number comes from the same functions as the JSON API
(:func:`app.store.reads.summarize_signals`, the math of :func:`app.store.reads.quantile_series`,
:func:`app.api.common.current_diagnoses`), so the page and ``/api/v1/targets/{name}/latency``
agree for the same window and ``end``. The index runs a fixed number of queries whatever
the number of targets (one session; all histogram snapshots of the window in one query), and
renders only the rows that changed since the last read (:data:`FLEET_ROW_HTML`).

Discovered targets (a Prometheus source, file/http discovery) name where they come from and
their labels. A Prometheus source's targets are never scraped by the service: their health is
the source's last round (:mod:`app.api.target_health`), and their pages speak of rounds and
queries. A Prometheus source that cannot be read gets a banner naming it and its error
(the classified text of :class:`app.windows.base.SourceStatus`, never the server's), and
each of its targets is unknown and stale and says its verdict is the last one, from when.
Gone targets (their series stopped) are not live: they are listed apart, collapsed. A
source's targets get their percentiles from the source (one set of queries per source for the
whole table), so they equal their ``/latency`` answer, and their charts from its server
(:meth:`app.windows.base.WindowReader.history`).

What a page computes for its request (a target's page always, the index for the targets the
last round's summaries do not answer) runs under the request budget of the JSON API
(:mod:`app.runtime.budget`): past ``api_request_budget`` a short 503 page names it, and a client that
went away stops the work (:mod:`app.api.errors`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from app import latency
from app.alerts.config import ALERT_RUNBOOKS
from app.api.common import (
    DiagnosisMade,
    current_diagnoses,
    diagnosis_out,
    diagnosis_sources,
    duration_param,
)
from app.api.deps import BudgetDep, MonitorDep, SessionDep
from app.api.disaggregation import add_disaggregation
from app.api.redaction import url_as_shown
from app.api.target_health import (
    Health,
    discovered_by,
    engine_origin,
    replica_counts,
    service_members,
    stale_source,
    target_health,
)
from app.api.window_notes import window_notes
from app.attribution import reads as change_reads
from app.attribution import repository as events_repository
from app.attribution.events import ChangeEvent
from app.attribution.explain import value_text
from app.core import human, quantiles
from app.core.durations import format_duration, format_utc
from app.core.limits import UnixTime
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.findings import CONFIDENCE_MEANING, Evidence
from app.diagnosis.profile import prefill_seconds_per_token
from app.diagnosis.rounds import RoundSummaries
from app.diagnosis.rules.base import margin
from app.probe import repository as probe_repository
from app.runtime.budget import bounded
from app.runtime.kept import KeptParts, RoundMemo
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS
from app.store import repository
from app.store.db import statement_budget
from app.store.models import DISCOVERED_BY_SOURCES, SERVICE_KIND, Target, TargetView
from app.summaries import answers
from app.targets import repository as target_repository
from app.window import TargetWindow
from app.windows import WindowError
from app.windows.base import TTFT_PARTS, HistogramHistory, SourceStatus

router = APIRouter(include_in_schema=False)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
CSS_PATH = WEB_DIR / "static" / "status.css"

CHART_SPAN = 3600.0     # the sparklines cover the last hour ...
CHART_MIN_SPAN = 60.0   # ... or, on a fresh install, the time since the first sample (at least 1 min)
CHART_STEPS = 30        # 31 points per line: 2 min apart over the hour
NICE_SPANS = (60, 120, 300, 600, 900, 1200, 1800, 2700, 3600)
REFRESH_SECONDS = 30
#: the fleet table's order, most severe first; ``not_judged``: nothing found, but not every regime
#: could be judged on the engine's metrics (never "ok")
LEVELS = ("critical", "warning", "info", "unknown", "not_judged", "healthy")
LEVEL_TEXT = {"critical": "critical", "warning": "warning", "info": "info", "unknown": "no verdict",
              "not_judged": "not judged", "healthy": "ok"}
TOKEN_SIGNALS = {"prompt_tokens", "generation_tokens", "iteration_tokens"}
SIGNAL_TITLES = {
    "ttft": "Time to first token", "itl": "Inter-token latency", "tpot": "Time per output token (per request)",
    "e2e": "End-to-end request latency", "queue_time": "Queue time", "prefill_time": "Prefill time",
    "decode_time": "Decode time", "inference_time": "Inference time", "prompt_tokens": "Prompt length",
    "generation_tokens": "Output length", "iteration_tokens": "Tokens per engine step",
}
SHORT_TITLES = {"ttft": "TTFT", "itl": "ITL", "queue_time": "Queue time", "prefill_time": "Prefill time"}
SECURITY_HEADERS = {
    # No script at all; styles only from this origin; nothing may frame the page.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


# --------------------------------------------------------------------------- formatting

fmt_seconds = human.seconds  # latency text, the same spelling as diagnosis evidence


def fmt_number(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if value != 0 and abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_percent(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value * 100:.1f} %"


def fmt_slo_percent(value: float | None) -> str:
    """An SLI or objective: enough digits to tell 99.9 % from 99.95 % (``99.42 %``)."""
    return "–" if value is None or not math.isfinite(value) else f"{value * 100:.2f} %"


def fmt_exhaustion(seconds: float | None) -> str:
    """When an SLO's budget runs out at the current burn: ``exhausted in 3.5 h``."""
    if seconds is None:
        return "not burning"
    if seconds <= 0:
        return "exhausted"
    if seconds < 5400:
        return f"exhausted in {seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"exhausted in {seconds / 3600:.1f} h"
    return f"exhausted in {seconds / 86400:.1f} d"


def fmt_value(value: float | None, signal: str) -> str:
    return fmt_number(value) if signal in TOKEN_SIGNALS else fmt_seconds(value)


def _unit(signal: str) -> str:
    return "" if signal in TOKEN_SIGNALS else "s"  # token counts are plain numbers in the tables


def fmt_quantile(summary: object, key: str, signal: str = "ttft") -> str:
    """A quantile cell: ``< 0.3 s`` in the lowest bucket, ``> 60 s`` in +Inf, a bound for a
    derived TTFT, else the value (:mod:`app.core.human`)."""
    return human.summary_quantile(summary, key, _unit(signal))


def fmt_bucket(summary: object, key: str, signal: str = "ttft") -> str:
    """The cell's tooltip: the bucket that holds the quantile."""
    return human.summary_bucket(summary, key, _unit(signal))


@dataclass(frozen=True)
class LatencyCell:
    """One percentile cell of the fleet table."""

    stat: str                # ``ttft-p50``
    value: str               # exact, for ``data-value``
    title: str               # the bucket that holds it
    text: str                # as shown
    derivation: str | None   # how a derived TTFT was made (``q+p``), else None


#: What ``q+p`` beside a TTFT cell means, said on the page itself
DERIVED_TTFT_NOTE = ("TTFT derived from queue and prefill, for an engine that exports no TTFT histogram (TGI). "
                     "Its mean is exact (mean queue + mean prefill); percentiles do not add, so each is shown as "
                     "the range the true one lies in.")
FLEET_CELLS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("itl", "p99"))


def latency_cells(summaries: Mapping[str, object]) -> tuple[LatencyCell, ...]:
    """The fleet table's TTFT/ITL p50/p99 cells of one row, formatted here rather than by a
    template macro per cell (four macro calls a row dominate a large fleet's rendering)."""
    cells = []
    for key, q in FLEET_CELLS:
        summary = summaries.get(key)
        value = human.field(summary, q)
        assert value is None or isinstance(value, (int, float))
        derived = key == "ttft" and bool(summary) and bool(human.field(summary, "derived"))
        cells.append(LatencyCell(f"{key}-{q}", data_value(value), fmt_bucket(summary, q, key),
                                 fmt_quantile(summary, q, key),
                                 str(human.field(summary, "derivation")) if derived else None))
    return tuple(cells)


def fmt_count(value: float | None, estimate: bool = True) -> str:
    """``≈136``: a count extrapolated like Prometheus' increase()."""
    return human.count(value, estimate)


def fmt_ts(ts: float | None) -> str:
    return "–" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def fmt_clock(ts: float | None) -> str:
    """The time of day of something that happens every few seconds (a source's round): ``12:00:05 UTC``."""
    return "–" if ts is None else time.strftime("%H:%M:%S UTC", time.gmtime(ts))


def iso_ts(ts: float | None) -> str:
    return "" if ts is None else format_utc(ts)


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def fmt_span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds < 7200 else f"{seconds / 3600:g} h"


def fmt_window(seconds: float) -> str:
    """The page's window in words, stated once per page: ``1 min``, ``90 s``, ``2 h``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def fmt_countdown(seconds: float) -> str:
    """How long until something scheduled happens: ``in ~25 s``, ``in ~4 min``, ``due now``."""
    if seconds < 1:
        return "due now"
    if seconds < 100:
        return f"in ~{math.ceil(seconds)} s"
    return f"in ~{round(seconds / 60)} min"


def confidence_title(finding: dict) -> str:
    """The confidence's tooltip: what it is, and which condition of this finding is the weakest."""
    conditions = [e for e in map(Evidence.from_dict, finding.get("evidence") or []) if e.op != "info" and e.met]
    margins = [(m, e) for e in conditions if (m := margin(e)) is not None]
    weakest = min(margins, key=lambda pair: pair[0])[1] if margins else None
    here = f" Weakest condition here: {replace(weakest, note='').text()}." if weakest is not None else ""
    return CONFIDENCE_MEANING + here


def evidence_text(item: dict) -> str:
    """``queue share of TTFT = 1.00 (>= 0.50)``, exactly as alerts and the CLI word it."""
    return Evidence.from_dict(item).text()


FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


def with_flags(text: str) -> Markup:
    """Escape ``text``, then set command-line flags (``--max-num-seqs``) in ``<code>`` so they never wrap."""
    return Markup(FLAG.sub(r'<code class="flag">\1</code>', str(escape(text))))


def data_value(value: float | None) -> str:
    """Exact machine-readable value for ``data-value`` attributes (repr round-trips)."""
    return "" if value is None else repr(float(value))


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(WEB_DIR / "templates"), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=fmt_seconds, number=fmt_number, percent=fmt_percent, ts=fmt_ts, iso=iso_ts,
                       age=fmt_age, evidence=evidence_text, flags=with_flags, duration=format_duration, dv=data_value,
                       value=fmt_value, span=fmt_span, slo_percent=fmt_slo_percent, exhaustion=fmt_exhaustion,
                       count=fmt_count, confidence_title=confidence_title, driver=value_text)
    env.filters.update(clock=fmt_clock)
    env.globals.update(quantile=fmt_quantile, bucket=fmt_bucket, estimate_note=human.ESTIMATE_NOTE,
                       derived_note=DERIVED_TTFT_NOTE)
    # every runbook the service serves: one per regime, per SLO signal, and target down
    env.globals.update(runbooks=sorted(set(ALERT_RUNBOOKS.values())), signal_titles=SIGNAL_TITLES)
    return env


templates = _environment()


# --------------------------------------------------------------------------- charts

@dataclass(slots=True)
class Line:
    label: str            # "p50"
    css: str              # class of the polyline
    values: list[float | None]
    segments: list[str] = field(default_factory=list)   # "x,y x,y ..." per run of defined points
    dots: list[tuple[float, float]] = field(default_factory=list)  # isolated points
    last: float | None = None
    low: float | None = None
    high: float | None = None


@dataclass(slots=True)
class Chart:
    """An inline-SVG sparkline; geometry is computed here, the template only draws it."""

    id: str
    signal: str
    title: str
    span: float
    lines: list[Line]
    width: int = 300      # viewBox units; the SVG stretches to its box (non-scaling strokes),
    height: int = 60      # axis labels are HTML next to it so their text never shrinks
    pad: int = 4
    y_min: float | None = None
    y_max: float | None = None
    derived: bool = False
    marks: list[tuple[float, str, str]] = field(default_factory=list)  # change events: (x, kind, summary)

    @property
    def empty(self) -> bool:
        return self.y_min is None

    @property
    def description(self) -> str:
        """The text alternative: every line's min, max and latest value."""
        what = f"{self.title} over the last {fmt_span(self.span)}"
        if self.empty:
            return f"{what}: no data yet."
        parts = [f"{ln.label} min {fmt_seconds(ln.low)}, max {fmt_seconds(ln.high)}, latest {fmt_seconds(ln.last)}"
                 for ln in self.lines if ln.low is not None]
        return f"{what}: " + "; ".join(parts) + "."


def chart_times(end: float, first_sample: float | None) -> tuple[float, list[float]]:
    """(span, point times): the last hour, or a shorter nice span on a fresh install."""
    span = CHART_SPAN
    if first_sample is not None and end - first_sample < CHART_SPAN:
        needed = max(CHART_MIN_SPAN, end - first_sample)
        span = float(next(s for s in NICE_SPANS if s >= needed))
    step = span / CHART_STEPS
    return span, [end - span + k * step for k in range(CHART_STEPS + 1)]


def quantile_points(loaded: HistogramHistory, signal: str, qs: tuple[float, ...], times: list[float],
                    lookback: float) -> dict[float, list[float | None]]:
    """``histogram_quantile(q, sum by (le) (increase(signal[lookback])))`` at each time,
    the math of :func:`app.store.reads.quantile_series`. TTFT without its own histogram (TGI)
    is queue + prefill per quantile, like ``latency_report``."""
    has = loaded.signals
    parts = (signal,) if signal in has or signal != "ttft" else TTFT_PARTS
    out: dict[float, list[float | None]] = {q: [] for q in qs}
    columns = [loaded.windows(part, times, lookback) for part in parts]  # one read per part
    for k in range(len(times)):
        merged = [column[k] for column in columns]
        for q in qs:
            total: float | None = 0.0
            for m in merged:
                value = math.nan if m is None else quantiles.histogram_quantile(q, m.bounds, m.increases)
                if not math.isfinite(value):
                    total = None
                    break
                total += value  # type: ignore[operator]
            out[q].append(total)
    return out


def build_chart(chart_id: str, signal: str, loaded: HistogramHistory, end: float, lookback: float,
                first_sample: float | None, width: int = 300, height: int = 60,
                events: Iterable[ChangeEvent] = ()) -> Chart:
    span, times = chart_times(end, first_sample)
    points = quantile_points(loaded, signal, (0.5, 0.99), times, lookback)
    lines = [Line("p50", "p50", points[0.5]), Line("p99", "p99", points[0.99])]
    has = loaded.signals
    chart = Chart(chart_id, signal, SHORT_TITLES.get(signal, SIGNAL_TITLES.get(signal, signal)), span, lines,
                  width=width, height=height,
                  derived=signal == "ttft" and "ttft" not in has and all(p in has for p in TTFT_PARTS))
    chart.marks = [(round((e.ts - (end - span)) / span * width, 1), e.kind, f"{fmt_ts(e.ts)}: {e.summary}")
                   for e in events if end - span <= e.ts <= end]
    defined = [v for ln in lines for v in ln.values if v is not None]
    if not defined:
        return chart
    lo, hi = min(defined), max(defined)
    chart.y_min, chart.y_max = lo, hi
    if hi - lo < 1e-12:  # a flat line sits in the middle
        lo, hi = lo - max(abs(lo) * 0.1, 1e-6), hi + max(abs(hi) * 0.1, 1e-6)
    x_scale = width / CHART_STEPS
    y_scale = (height - 2 * chart.pad) / (hi - lo)
    for ln in lines:
        vals = [v for v in ln.values if v is not None]
        if vals:
            ln.low, ln.high = min(vals), max(vals)
        ln.last = ln.values[-1]
        run: list[tuple[float, float]] = []
        for k, v in enumerate(ln.values + [None]):
            if v is not None:
                run.append((round(k * x_scale, 1), round(height - chart.pad - (v - lo) * y_scale, 1)))
                continue
            if len(run) == 1:
                ln.dots.append(run[0])
            elif run:
                ln.segments.append(" ".join(f"{x},{y}" for x, y in run))
            run = []
    return chart


# --------------------------------------------------------------------------- view models

def diagnosis_view(diagnosis: dict) -> dict:
    findings = diagnosis["findings"]
    primary = next((f for f in findings if f.get("primary")), findings[0] if findings else None)
    others = [f for f in findings if f is not primary]
    verdict = diagnosis["verdict"]
    kind = verdict if verdict in ("healthy", "not_judged") else "unknown" if verdict == "insufficient_data" else \
        (primary or {}).get("severity", "warning")
    # regimes the engine's metrics do not let be judged: shown next to the verdict; absent from
    # diagnoses saved by older versions
    not_judged = diagnosis.get("not_judged") or []
    return {**diagnosis, "primary": primary, "others": others, "kind": kind, "not_judged": not_judged}


def triage_level(health: Health, kinds: Iterable[str]) -> str:
    """The level a target is sorted and coloured by: a down target is critical whatever its
    last verdict said; otherwise its most severe diagnosis (one per model, ``kinds``),
    ``unknown`` while it has none."""
    if health.state == "down":
        return "critical"
    return min(set(kinds) or {"unknown"}, key=LEVELS.index)


@dataclass(frozen=True, slots=True)
class Badge:
    """What the health badge shows of a target's :class:`Health` (not its age; a source's target:
    the time of its source's last round)."""

    state: str
    label: str
    error_class: str | None
    error: str | None
    stale: bool
    round_at: float | None = None


@dataclass(frozen=True, slots=True)
class VerdictLine:
    """What the fleet table shows of one diagnosis (one per model)."""

    verdict: str
    kind: str
    pending: bool                               # its primary finding is still pending
    not_judged: tuple[tuple[str, str], ...]     # (regime, reason)
    model: str | None
    evaluated_at: float | None


@dataclass(frozen=True, slots=True)
class FleetRow:
    """Everything one row of the fleet table shows and nothing else, so that the row's HTML
    is a function of it (:data:`FLEET_ROW_HTML`)."""

    name: str
    origin: str | None
    labels: tuple[tuple[str, str], ...]         # sorted by key, case-insensitively
    discovered_by: str | None
    health: Badge
    level: str
    verdicts: tuple[VerdictLine, ...]
    stale_source: str | None                    # the failing source's name
    countdown: str | None                       # to the first evaluation, while it has no verdict
    cells: tuple[LatencyCell, ...]
    hashed: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hashed", hash((self.name, self.origin, self.labels, self.discovered_by, self.health,
                                                 self.level, self.verdicts, self.stale_source, self.countdown,
                                                 self.cells)))

    def __hash__(self) -> int:
        """Made once: a row is looked up three times per read in :data:`FLEET_ROW_HTML`."""
        return self.hashed


def verdict_line(made: DiagnosisMade) -> VerdictLine:
    d = diagnosis_view(diagnosis_out(*made))
    return VerdictLine(d["verdict"], d["kind"], bool(d["primary"]) and d["primary"].get("state") == "pending",
                       tuple((n["regime"], n["reason"]) for n in d["not_judged"]), d.get("model"),
                       d.get("evaluated_at"))


#: each diagnosis' line in the fleet table, by what the diagnosis is made of (as its JSON in
#: ``/api/v1/diagnoses``), so a read does not build every diagnosis' findings again
VERDICT_LINES = KeptParts[tuple, DiagnosisMade, VerdictLine](verdict_line)


def verdicts_by_target(session, monitor) -> dict[str, list[VerdictLine]]:
    """Each target's verdict lines, most severe first."""
    sources = diagnosis_sources(session, monitor)
    out: dict[str, list[VerdictLine]] = {}
    for (_, (row, _, _)), line in zip(sources, VERDICT_LINES.parts(sources), strict=True):
        out.setdefault(row.target, []).append(line)
    for lines in out.values():
        lines.sort(key=lambda line: LEVELS.index(line.kind))
    return out


#: each target's cells from the last round's summaries (up to 100,000 targets)
ROUND_CELLS = RoundMemo[int, tuple[LatencyCell, ...]](100_000)


def round_cells(kept: RoundSummaries, target_id: int) -> tuple[LatencyCell, ...]:
    """A target's cells from the round's summaries, formatted once per round (the same for
    every read until the next round: 4,000 cells per read at 1,000 targets)."""
    return ROUND_CELLS.get(kept, target_id, lambda: latency_cells(kept.by_target[target_id]))


def fleet_row(target: TargetView, health: Health, verdicts: list[VerdictLine], cells: tuple[LatencyCell, ...],
              stale: SourceStatus | None, countdown: str) -> FleetRow:
    discovered = discovered_by(target)
    labels = tuple(sorted((target.labels or {}).items(), key=lambda kv: kv[0].lower())) if discovered else ()
    return FleetRow(target.name, target.origin, labels, discovered,
                    Badge(health.state, health.label, health.error_class, health.error, health.stale, health.round_at),
                    triage_level(health, (v.kind for v in verdicts)), tuple(verdicts),
                    None if stale is None else stale.name, None if verdicts or stale is not None else countdown,
                    cells)


def render_fleet_row(row: FleetRow) -> Markup:
    macro = templates.get_template("_fleet_row.html").module.fleet_row  # type: ignore[attr-defined]
    return macro(row, LEVEL_TEXT)


#: the HTML of the rows the last fleet table showed, by row: a row that did not change since
#: is not rendered again (between two reads few rows change: a verdict, a failed scrape, a new
#: round's numbers).
FLEET_ROW_HTML = KeptParts[FleetRow, FleetRow, Markup](render_fleet_row)


def page_params(monitor, window: str | None, end: float | None) -> tuple[float, float, bool]:
    """(window seconds, end, live?) of a page request. The window defaults to the diagnosis
    window, so the percentiles on a page cover the same traffic as the verdicts beside them."""
    seconds = monitor.diagnosis_config.window if window is None else \
        duration_param(window, "window", maximum=86400)
    live = end is None
    return seconds, (time.time() if end is None else end), live


def latest_probe_levels(session) -> dict[int, dict]:
    """Per target, the newest client-side probe or canary result (one query for all targets)."""
    out: dict[int, dict] = {}
    for run in probe_repository.latest_runs(session):  # ordered by id: newer runs overwrite older
        levels = (run.summary or {}).get("levels", [])
        if levels:
            out[run.target_id] = {"kind": run.kind, "finished_at": run.finished_at, "run_id": run.id,
                                  "levels": levels}
    return out


def html(template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(templates.get_template(template).render(**context), status_code=status_code,
                        headers=SECURITY_HEADERS)


def common(request: Request, monitor, window: float, end: float, live: bool) -> dict:
    return {"request_path": request.url.path, "window_text": fmt_window(window), "window_seconds": window,
            "diagnosis_window": monitor.diagnosis_config.window, "end": end, "now": end,
            "refresh": REFRESH_SECONDS if live else None, "version": request.app.version,
            "countdown": fmt_countdown(monitor.next_diagnosis_at() - time.time()),
            "runbook_base": monitor.external_url}  # runbook links: absolute when the external URL is known


# --------------------------------------------------------------------------- error budgets

BUDGET_WARNING = 0.25  # a budget bar turns amber below this share left (red when spent or a page alert fires)


def budget_views(monitor) -> list[dict[str, Any]]:
    """One budget bar per SLO of the ``slos:`` section, as the latest alerting round computed
    it (the :class:`app.slo.status.SloStatus` that ``/metrics`` and the burn-rate alerts use;
    ``GET /api/v1/slos`` computes the same at request time). Level: ``critical`` when the
    budget is spent or a page alert's burn rates both exceed its factor, ``warning`` when a
    ticket alert's do or less than :data:`BUDGET_WARNING` is left, else ``healthy``;
    ``unknown`` before the first round or without requests."""
    statuses = {s.name: s for s in monitor.telemetry.slo.statuses}
    views = []
    for slo in monitor.slos:
        status = statuses.get(slo.name)
        budget = status.budget_remaining if status else None
        firing = sorted({(a.kind, a.long.label, a.short.label, a.factor) for part in (status.targets if status else ())
                         for a in part.alerts if a.firing}, key=lambda a: (a[0] != "page", -a[3]))
        kinds = {kind for kind, *_ in firing}
        if budget is None:
            level = "unknown"
        elif budget <= 0 or "page" in kinds:
            level = "critical"
        elif "ticket" in kinds or budget < BUDGET_WARNING:
            level = "warning"
        else:
            level = "healthy"
        views.append({
            "name": slo.name, "signal": slo.signal, "threshold": slo.threshold, "objective": slo.objective,
            "period": format_duration(slo.period), "status": status, "budget": budget, "level": level,
            "fill": 0.0 if budget is None else min(1.0, max(0.0, budget)) * 100.0,
            "burn": status.current_burn if status else None,
            "exhaustion": status.time_to_exhaustion if status else None,
            "firing": [f"{kind}: over {long} and {short} above {factor:g}x" for kind, long, short, factor in firing],
        })
    return views


#: the fleet table's health column, by (any target scraped, any read through a source)
HEALTH_HEADERS = {(True, False): "Scrape", (False, True): "Source round", (True, True): "Scrape or round",
                  (False, False): "Scrape"}


# --------------------------------------------------------------------------- a target's page

CHART_SIGNALS = ("ttft", "itl", "queue_time", "e2e")


def target_charts(session, monitor, target: Target, stale: SourceStatus | None, end: float, seconds: float,
                  events: Iterable[ChangeEvent] = ()) -> tuple[list[Chart], str | None]:
    """The target's charts, from whichever backend holds its samples (a source's Prometheus computes
    them: one query for what it exports, one per line), and a note when there are none: where to look."""
    where = f"the Prometheus of source {target.origin}" if target.source in DISCOVERED_BY_SOURCES else None
    if stale is not None:
        return [], f"No charts while source {stale.name} is failing: they come back when it answers."
    try:
        loaded = monitor.windows.history(session, target, (*CHART_SIGNALS, *TTFT_PARTS), end - CHART_SPAN - seconds,
                                         end)
        first = loaded.first_sample((*CHART_SIGNALS, *TTFT_PARTS))
        has = loaded.signals
        charts = [build_chart(f"d-{signal}", signal, loaded, end, seconds, first, width=400, height=100,
                              events=events)
                  for signal in CHART_SIGNALS if signal in has or (signal == "ttft" and set(TTFT_PARTS) <= has)]
    except WindowError as exc:
        return [], f"No charts: {exc.message}."
    if charts:
        return charts, None
    span = fmt_span(CHART_SPAN)
    return [], (f"No histogram series of this target in the last {span} on {where}." if where
                else "No histogram data yet.")


# --------------------------------------------------------------------------- routes

@router.get("/ui/status.css")
def stylesheet() -> Response:
    return Response(CSS_PATH.read_bytes(), media_type="text/css; charset=utf-8",
                    headers={"Cache-Control": "public, max-age=300", "X-Content-Type-Options": "nosniff"})


@router.get("/", response_class=HTMLResponse)
def index(request: Request, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
          window: Annotated[str | None, Query(description="percentile window; default the diagnosis window")] = None,
          end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None) -> HTMLResponse:
    """The fleet table: one row per target, most severe first, with its verdict and
    TTFT/ITL p50/p99 over one window; details on the target's own page. The numbers of the
    targets the last round's summaries do not answer are computed here, under the request
    budget (503 past ``api_request_budget``, like the JSON API)."""
    seconds, end, live = page_params(monitor, window, end)
    everything = target_repository.target_rows(session)
    targets = [t for t in everything if t.gone_at is None]
    gone = sorted((t for t in everything if t.gone_at is not None), key=lambda t: t.name)
    statuses = {s.name: s for s in monitor.windows.statuses()}
    failing = {name: s for name, s in statuses.items() if s.failing}
    latest = repository.latest_scrapes(session)
    replicas = replica_counts(targets, latest)
    kept = round_summaries(monitor, seconds, end) if live and window is None else None
    shown_end = end if kept is None else kept.end  # the numbers' window is the round's
    unread = [t for t in targets if kept is None or t.id not in kept.by_target]
    verdicts = verdicts_by_target(session, monitor)
    page = common(request, monitor, seconds, shown_end, live)
    countdown = page["countdown"]
    rows: list[FleetRow] = []
    # an index the round's summaries answer whole computes nothing: its statements are not bounded
    statements = statement_budget(session, budget) if unread else nullcontext()
    with bounded(budget), statements:
        # one set of reads per backend (none for a failing source: its banner says why its rows have none)
        summaries = monitor.windows.fleet_summaries(session, unread, shown_end - seconds, shown_end)
        for target in targets:
            if kept is not None and target.id in kept.by_target:
                cells = round_cells(kept, target.id)
            else:
                cells = latency_cells(summaries.get(target.id, {}))
            interval = target.scrape_interval or monitor.settings.default_scrape_interval
            health = target_health(target, latest.get(target.id), statuses, replicas, interval, end)
            stale = stale_source(target, failing)
            rows.append(fleet_row(target, health, verdicts.get(target.name, []), cells, stale, countdown))
    rows.sort(key=lambda r: (LEVELS.index(r.level), r.name))
    counts = {level: sum(r.level == level for r in rows) for level in LEVELS}
    down = sum(r.health.state == "down" for r in rows)
    row_html = FLEET_ROW_HTML.parts((row, row) for row in rows)
    read = {t.source in DISCOVERED_BY_SOURCES for t in targets}  # True: read through a source
    derived = any(c.derivation is not None for r in rows for c in r.cells)  # then the page says what q+p is
    return html("index.html", rows=rows, row_html=row_html, derived=derived, counts=counts, down=down, levels=LEVELS,
                level_text=LEVEL_TEXT, budgets=budget_views(monitor), window_notes=window_notes(monitor, targets),
                gone=[(t, discovered_by(t)) for t in gone], failing_sources=sorted(failing.values(),
                                                                                  key=lambda s: s.name),
                health_header=HEALTH_HEADERS[(False in read, True in read)],
                sources=sorted(statuses.values(), key=lambda s: s.name),
                base_url=str(request.base_url).rstrip("/"), **page)



def round_summaries(monitor, seconds: float, now: float) -> RoundSummaries | None:
    """The last diagnosis round's per-target summaries when they answer this page: same window
    length, and computed within the last two of its rounds (:func:`app.summaries.answers`;
    else the page reads samples itself)."""
    kept = getattr(monitor, "round_summaries", None)
    if kept is None or not answers(kept.start, kept.end, seconds, now, monitor.diagnosis_config.interval,
                                   kept.took):
        return None
    return kept


@router.get("/targets/{name}", response_class=HTMLResponse)
def target_page(name: str, request: Request, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
                window: Annotated[str | None, Query(description="percentile window; "
                                                                "default the diagnosis window")] = None,
                end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None) -> HTMLResponse:
    """One target in detail: all histogram signals, the TTFT split, gauges, rates, findings, scrapes.
    Its window and charts are computed for the request, under the request budget (503 past
    ``api_request_budget``, like ``/api/v1/targets/{name}/latency``)."""
    seconds, end, live = page_params(monitor, window, end)
    context = common(request, monitor, seconds, end, live)
    target: Target | None = target_repository.get_target(session, name)
    if target is None:
        return html("not_found.html", 404, name=name, targets=[t.name for t in target_repository.list_targets(session)],
                    **context)
    with bounded(budget), statement_budget(session, budget):  # every statement of the page
        statuses = {s.name: s for s in monitor.windows.statuses()}
        by_source = target.source in DISCOVERED_BY_SOURCES
        source = statuses.get(target.origin or "") if by_source else None
        stale = source if source is not None and source.failing else None
        report = latency.report_from_window(TargetWindow(end - seconds, end))  # no numbers until read
        if stale is None:
            try:  # the same numbers as its /latency answer
                read = monitor.windows.window(session, target, end - seconds, end, HISTOGRAM_SIGNALS)
                report = latency.report_from_window(read)
                add_disaggregation(session, monitor.windows, target, report, read.infos, end - seconds, end)
            except WindowError:
                pass  # no numbers; its source's status says why
        infos = repository.target_infos(session, target.id)
        events = events_repository.events(session, [target.id], since=end - change_reads.EVENT_LOOKBACK, until=end)
        charts, chart_note = target_charts(session, monitor, target, stale, end, seconds, events)
        changes = None
        if stale is None:
            try:  # the same answer as its /changes with the baseline the page chose
                found = change_reads.what_changed(  # the page's window when it asks one of 2m or more
                    monitor.windows, session, target, end, prefill_seconds_per_token(target.hardware),
                    window=seconds if window is not None and seconds >= 120 else change_reads.DEFAULT_WINDOW)
                changes = found.to_dict() if found is not None else None
            except WindowError:
                pass
        interval = target.scrape_interval or monitor.settings.default_scrape_interval
        latest = repository.scrape_log(session, target.id, 20)
        total, failed = repository.scrape_counts(session, target.id, end - seconds)
        models = report.get("models", {})
        ttft, queue, prefill = report.get("ttft"), report.get("queue_time"), report.get("prefill_time")
        split = None
        queue_mean, prefill_mean = (queue or {}).get("mean"), (prefill or {}).get("mean")
        if queue_mean is not None and prefill_mean is not None and queue_mean + prefill_mean > 0:
            whole = queue_mean + prefill_mean  # mean TTFT = mean queue + mean prefill (+ tokenization)
            split = {"queue": queue, "prefill": prefill, "ttft": ttft,
                     "queue_share": queue_mean / whole, "prefill_share": prefill_mean / whole}
        pd = report.get("disaggregation")  # the same split as its /latency answer
        history = [row for _, row in diagnosis_repository.finding_history(session, target.id, limit=50)]
        members = service_members(session, target) if target.source == SERVICE_KIND else []
        replicas = (sum(bool(m["up"]) for m in members), len(members))
        health = target_health(target, latest[0] if latest else None, statuses, {target.id: replicas}, interval,
                               end)
        diagnoses = [diagnosis_view(d) for d in current_diagnoses(session, monitor, target.id)]
        probe = latest_probe_levels(session).get(target.id)
    return html(
        "target.html", target=target, target_url=url_as_shown(target.url, token_holder=False),
        engine=target.detected_engine or target.engine, engine_origin=engine_origin(target),
        discovered_by=discovered_by(target), by_source=by_source, source=source, members=members,
        stale_source=stale, failing_sources=[stale] if stale is not None else [],
        health=health, interval=interval,
        scrapes=latest, scrape_total=total, scrape_failed=failed, report=report,
        signals=[s for s in HISTOGRAM_SIGNALS if s in report],
        model_tables=[(m, [s for s in HISTOGRAM_SIGNALS if s in body], body) for m, body in models.items()]
        if len(models) > 1 else [],
        gauges=[(g, report["gauges"][g]) for g in GAUGE_SIGNALS if g in report["gauges"]],
        rates=sorted(report["rates"].items()), charts=charts, chart_note=chart_note, split=split, pd=pd,
        pd_role=report.get("pd_role"), diagnoses=diagnoses, request_notes=latency.request_set_notes(report),
        changes=changes, events=list(reversed(events)),
        history=history, infos=infos,
        probe=probe,
        counter_signals=COUNTER_SIGNALS, **context)
