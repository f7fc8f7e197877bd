"""The status page's pure helpers: number spelling, escaping, chart spans and geometry."""

from __future__ import annotations

from dataclasses import replace

from markupsafe import Markup

from app.api.routes.status import (
    CHART_STEPS,
    FLEET_ROW_HTML,
    LEVELS,
    Badge,
    FleetRow,
    Health,
    LatencyCell,
    VerdictLine,
    build_chart,
    chart_times,
    confidence_title,
    evidence_text,
    fmt_age,
    fmt_countdown,
    fmt_number,
    fmt_seconds,
    fmt_window,
    round_cells,
    triage_level,
    with_flags,
)
from app.core.quantiles import HistogramSnapshot
from app.diagnosis.findings import CONFIDENCE_MEANING
from app.diagnosis.rounds import RoundSummaries
from app.latency import WindowSummary, request_set_notes
from app.store.reads import LoadedHistograms
from app.store.repository import SeriesRef


def test_number_spelling_matches_the_diagnosis_evidence() -> None:
    assert [fmt_seconds(v) for v in (None, 0.0123, 0.5, 1.0, 15.0, float("nan"))] == \
        ["–", "12.3 ms", "500.0 ms", "1.00 s", "15.00 s", "–"]
    assert [fmt_number(v) for v in (None, 4.606, 1656.25, 75008.9)] == ["–", "4.61", "1,656", "75,009"]
    assert [fmt_age(v) for v in (None, 3.2, 600, 7200)] == ["never", "3 s ago", "10 min ago", "2.0 h ago"]
    item = {"name": "queue share of TTFT", "value": 0.999, "op": ">=", "threshold": 0.5, "unit": "ratio",
            "met": True, "note": ""}
    assert evidence_text(item) == "queue share of TTFT = 1.00 (>= 0.50)"
    assert evidence_text({"name": "running requests (mean / max)", "value": "8.0 / 8", "op": "info",
                          "threshold": None, "unit": "", "met": True, "note": ""}) == \
        "running requests (mean / max) = 8.0 / 8"


def test_window_and_countdown_spelling() -> None:
    assert [fmt_window(v) for v in (60.0, 300.0, 90.0, 30.0, 7200.0, 5400.0)] == \
        ["1 min", "5 min", "90 s", "30 s", "2 h", "90 min"]
    assert [fmt_countdown(v) for v in (-3.0, 0.4, 1.0, 24.2, 99.5, 100.0, 599.0, 3600.0)] == \
        ["due now", "due now", "in ~1 s", "in ~25 s", "in ~100 s", "in ~2 min", "in ~10 min", "in ~60 min"]


def test_triage_level_is_down_first_then_the_worst_verdict() -> None:
    up, down, never = Health("up", "up"), Health("down", "down: connect"), Health("unknown", "no scrape yet")

    def views(*kinds: str) -> list[str]:
        return list(kinds)

    assert LEVELS == ("critical", "warning", "info", "unknown", "not_judged", "healthy")
    assert triage_level(up, views("healthy", "not_judged")) == "not_judged"  # never "ok" with a regime unjudged
    assert triage_level(down, views("healthy")) == "critical"  # a down target whatever its last verdict
    assert triage_level(up, views("critical")) == "critical"
    assert triage_level(up, views("healthy", "warning")) == "warning"  # the worst of its models
    assert triage_level(up, views("info", "healthy")) == "info"
    assert triage_level(up, views("healthy", "unknown")) == "unknown"
    assert triage_level(up, []) == "unknown" and triage_level(never, []) == "unknown"
    assert triage_level(up, views("healthy", "healthy")) == "healthy"


def test_flags_are_code_and_everything_else_is_escaped() -> None:
    assert str(with_flags("<b>raise</b> --max-num-seqs, not -x or a--b")) == \
        '&lt;b&gt;raise&lt;/b&gt; <code class="flag">--max-num-seqs</code>, not -x or a--b'


def test_chart_span_is_the_hour_or_a_nice_shorter_span_on_a_fresh_install() -> None:
    end = 10_000.0
    assert chart_times(end, None)[0] == 3600.0
    assert chart_times(end, end - 5000)[0] == 3600.0
    assert chart_times(end, end - 4)[0] == 60.0
    assert chart_times(end, end - 400)[0] == 600.0
    span, times = chart_times(end, end - 1790)
    assert span == 1800.0 and len(times) == CHART_STEPS + 1 and times[0] == end - 1800 and times[-1] == end


def _loaded(points: list[tuple[float, list[float]]]) -> LoadedHistograms:
    bounds = (0.1, 1.0, float("inf"))
    series = SeriesRef(1, 1, "ttft", "histogram", "m", "0", bounds)
    snaps = [HistogramSnapshot(ts, tuple(counts), 0.0, counts[-1]) for ts, counts in points]
    return LoadedHistograms([series], {1: snaps})


def test_chart_geometry_gaps_dots_and_text_alternative() -> None:
    end = 3600.0
    # steady traffic for the last 10 minutes: every observation in the (0.1, 1] bucket
    points = [(end - 600 + 30 * k, [0.0, 10.0 * k, 10.0 * k]) for k in range(21)]
    chart = build_chart("c", "ttft", _loaded(points), end, 300.0, points[0][0])
    assert chart.span == 600.0 and not chart.empty
    p50, p99 = chart.lines
    assert p50.last == 0.55 and p99.last == 0.991  # linear interpolation inside the (0.1, 1] bucket
    assert p50.values[0] is None and len(p50.segments) == 1 and p50.dots == []
    assert chart.y_min == 0.55 and chart.y_max == 0.991
    last_x, last_y = p99.segments[0].split()[-1].split(",")
    assert float(last_x) == chart.width and float(last_y) == chart.pad  # p99 is the top of the range
    assert chart.description == ("TTFT over the last 10 min: p50 min 550.0 ms, max 550.0 ms, latest 550.0 ms; "
                                 "p99 min 991.0 ms, max 991.0 ms, latest 991.0 ms.")
    empty = build_chart("e", "itl", _loaded(points), end, 300.0, None)
    assert empty.empty and empty.description == "ITL over the last 60 min: no data yet."


def fleet_row(name: str, **changes: object) -> FleetRow:
    cells = tuple(LatencyCell(f"ttft-{q}", "0.25", "(0.1, 0.5]", "250.0 ms", None) for q in ("p50", "p99"))
    healthy = VerdictLine("healthy", "healthy", False, (("kv_cache_pressure", "no KV gauge"),), "m", 1.5e9)
    row = FleetRow(name, None, (), None, Badge("up", "up", None, None, False), "healthy", (healthy,), None, None, cells)
    return replace(row, **changes)


def fleet_rows_html(rows: list[FleetRow]) -> list[Markup]:
    return FLEET_ROW_HTML.parts((row, row) for row in rows)


def test_a_fleet_row_is_rendered_again_only_when_what_it_shows_changed() -> None:
    a, b = fleet_row("a"), fleet_row("b")
    first = fleet_rows_html([a, b])
    assert 'data-target="a"' in first[0] and 'data-stat="ttft-p99" data-value="0.25"' in first[0]
    assert 'title="kv_cache_pressure: no KV gauge&#10;">1 not judged' in first[0]
    again = fleet_rows_html([fleet_row("a"), fleet_row("b")])  # equal rows, new objects
    assert again[0] is first[0] and again[1] is first[1]
    down = replace(b, health=Badge("down", "down: connect", "connect", "refused <x>", False), level="critical")
    third = fleet_rows_html([a, down])
    assert third[0] is first[0] and third[1] is not first[1]
    assert 'data-health="down"' in third[1] and 'title="refused &lt;x&gt;"' in third[1] \
        and 'data-severity="critical"' in third[1] and 'data-health="down"' not in first[1]
    # a target without a verdict shows the countdown; a new countdown is a new row
    fresh = fleet_rows_html([replace(a, verdicts=(), countdown="in ~12 s")])
    assert "first evaluation in ~12 s" in fresh[0] and fresh[0] is not first[0]
    # only the last page's rows are kept: one row now, and the first page's row renders anew
    assert len(FLEET_ROW_HTML) == 1
    assert fleet_rows_html([a])[0] == first[0] and fleet_rows_html([a])[0] is not first[0]
    # the row's hash is made once, from every field: a changed cell is a new row
    assert hash(fleet_row("a")) == hash(a) != hash(b)
    slower = replace(a, cells=(a.cells[0], replace(a.cells[1], value="0.5", text="500.0 ms")))
    assert hash(slower) != hash(a) and slower != a
    changed = fleet_rows_html([slower])
    assert 'data-stat="ttft-p99" data-value="0.5"' in changed[0] \
        and 'data-stat="ttft-p99" data-value="0.25"' not in changed[0]


def test_a_rounds_cells_are_formatted_once_per_round() -> None:
    def round_of(p99: float) -> RoundSummaries:
        ttft = WindowSummary(0.1, 0.2, 0.3, p99, 0.15, 40.0, {"p99": (0.25, 0.5)}, True)
        return RoundSummaries(0.0, 60.0, {1: {"ttft": ttft}, 2: {}})

    first = round_of(0.3)
    cells = round_cells(first, 1)
    assert [(c.stat, c.value, c.text) for c in cells[:2]] == [("ttft-p50", "0.1", "100.0 ms"),
                                                              ("ttft-p99", "0.3", "300.0 ms")]
    assert [c.text for c in round_cells(first, 2)] == ["–"] * 4  # no summary of a signal: a dash
    assert round_cells(first, 1) is cells  # the same round: formatted once
    later = round_cells(round_of(0.4), 1)  # a new round: formatted again from its summaries
    assert later is not cells and later[1].value == "0.4"


def test_the_confidence_tooltip_names_the_weakest_condition() -> None:
    finding = {"confidence": 0.5, "evidence": [
        {"name": "mean queue time", "value": 4.0, "op": ">=", "threshold": 0.5, "unit": "s", "met": True,
         "note": "from the histogram"},  # 8x past: margin 1
        {"name": "mean waiting requests", "value": 1.0, "op": ">=", "threshold": 1.0, "unit": "", "met": True,
         "note": ""},  # on its threshold: margin 0, the weakest
        {"name": "TTFT p99", "value": 19.9, "op": "info", "threshold": None, "unit": "s", "met": True, "note": "",
         "interval": [15.0, 20.0]}]}
    assert confidence_title(finding) == (CONFIDENCE_MEANING + " Weakest condition here: mean waiting requests = 1 "
                                         "(>= 1).")
    assert confidence_title({"evidence": []}) == CONFIDENCE_MEANING
    assert "0.5 to 0.99" in CONFIDENCE_MEANING and "Severity is separate" in CONFIDENCE_MEANING


def test_a_note_only_where_a_part_is_above_its_whole() -> None:
    """Queue p50 16.00 s above TTFT p50 14.69 s (the demo's queueing engine): one note naming both numbers and
    the request sets; prefill below TTFT and TTFT below end-to-end: nothing."""
    report = {"queue_time": {"p50": 16.0, "p90": 19.2, "p99": 19.92, "intervals": {"p99": [15.0, 20.0]}},
              "ttft": {"p50": 14.69, "p90": 18.94, "p99": 19.95},
              "prefill_time": {"p50": 0.15, "p99": 0.4}, "e2e": {"p50": 20.0, "p99": 30.0}}
    (note,) = request_set_notes(report)
    assert note.startswith("queue time p50 16.00 s > TTFT p50 14.69 s; queue time p90 19.20 s > TTFT p90 18.94 s: "
                           "a request's queue time is part of its TTFT, but these percentiles are over different "
                           "requests. Each histogram counts a request when that part ends: queue time the requests "
                           "that left the queue in the window, TTFT those that got their first token in it")
    assert "p99" not in note  # 19.92 < 19.95
    assert request_set_notes({**report, "queue_time": {"p50": 14.0, "p90": 18.0, "p99": 19.0}}) == []
    assert request_set_notes({"queue_time": {"p50": 2.0}, "ttft": {"p50": None, "derived": True}}) == []  # TGI
    (e2e,) = request_set_notes({"ttft": {"p50": 3.0}, "e2e": {"p50": 2.5}}, ("p50",))
    assert e2e.startswith("TTFT p50 3.00 s > end-to-end latency p50 2.50 s: ")
