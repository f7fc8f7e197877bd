"""app.core.quantiles against the real thing: Debian's Prometheus 2.42 as the oracle.

A tiny page server plays two vLLM engines exposing ``vllm:time_to_first_token_seconds``
with vLLM's TTFT buckets (engine "1" with a slightly different layout, and only
appearing after a few scrapes); counts grow on every scrape and engine "0" restarts
(counters drop) in the middle. The page also carries static ``qcase`` series: edge
cases for ``histogram_quantile`` itself (non-monotonic counts, negative and zero
bounds, ``le="1"`` next to ``le="1.0"``, no +Inf bucket, NaN counts, ...).

Prometheus scrapes it every 500ms; after the last state the page goes empty so the
series get staleness markers and no sample is added while we query. Then we fetch
every raw sample WITH its timestamp through ``/api/v1/query`` (``x[1h]``), feed
those to app.core.quantiles, and compare with Prometheus' own answers for

* ``increase``/``rate`` of every bucket, ``_sum`` and ``_count`` series,
* ``histogram_quantile(q, sum by (le) (increase(x_bucket[w])))`` and per engine,

on a 100ms grid of evaluation times (window ends on, between and after samples,
starts on samples, windows spanning the restart, windows only partly covered by
data) for several window sizes, plus instant queries whose window start and end
fall exactly on sample timestamps (closed-window check). Relative error must be
<= 1e-9 (in practice the results are bit-identical).
"""

from __future__ import annotations

import math
import random
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.core.quantiles import (
    HistogramSnapshot,
    WindowHistogram,
    avg_of,
    avg_over_time,
    histogram_quantile,
    increase,
    merge,
    rate,
    select_range,
    sum_of,
    sum_over_time,
    to_millis,
    window_histogram,
)
from tests.support.pages import StaticPageServer
from tests.support.prometheus import PrometheusError, running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

METRIC = "vllm:time_to_first_token_seconds"
INF = math.inf
# vLLM's TTFT buckets (see tests/fixtures/exposition/vllm-0.32-cpu-real.prom)
VLLM_TTFT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, INF,
)  # fmt: skip
# A second engine with another layout: `sum by (le)` then unions the bounds and some
# buckets only get one engine's contribution -> histogram_quantile's monotonicity fix.
ENGINE1_BOUNDS = tuple(sorted(set(VLLM_TTFT_BOUNDS) - {0.75, 7.5} | {0.3, 1.5}))

SCRAPE_INTERVAL = "500ms"
N_STATES = 32  # scrapes with data; afterwards the page is empty (staleness markers)
RECORDINGS = 3  # attempts at recording every state (a scrape past its 500 ms timeout loses one)
RESET_AT = 17  # engine "0" restarts at this scrape
ENGINE1_FROM = 6  # engine "1" first appears at this scrape
WINDOWS_MS = (1000, 2500, 7000, 60000)
GRID_STEP_MS = 100
QS = (0.5, 0.9, 0.95, 0.99)
QCASE_QS = (-0.5, 0.0, 0.01, 0.25, 0.5, 0.500000000000025, 0.9, 0.95, 0.99, 1.0, 1.5, math.nan)
REL_TOL = 1e-9


def fmt_le(b: float) -> str:
    return "+Inf" if b == INF else repr(float(b))


def fmt_value(v: float) -> str:
    return "NaN" if math.isnan(v) else ("+Inf" if v == INF else "-Inf" if v == -INF else repr(float(v)))


@dataclass
class FakeEngine:
    """Cumulative TTFT histogram of one engine process."""

    name: str
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def restart(self) -> None:
        self.counts = [0] * len(self.bounds)
        self.total, self.n = 0.0, 0

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def exposition(self) -> str:
        lab = f'engine="{self.name}",model_name="tiny"'
        lines = [
            f'{METRIC}_bucket{{{lab},le="{fmt_le(b)}"}} {float(c)!r}' for b, c in zip(self.bounds, self.counts)
        ]
        lines.append(f"{METRIC}_sum{{{lab}}} {self.total!r}")
        lines.append(f"{METRIC}_count{{{lab}}} {float(self.n)!r}")
        return "\n".join(lines)


def make_qcases() -> dict[str, list[tuple[str, float]]]:
    """Static histogram_quantile edge cases: case name -> [(le label, count)]."""
    cases: dict[str, list[tuple[str, float]]] = {
        "plain": [("0.1", 10), ("0.5", 50), ("1", 80), ("+Inf", 100)],
        "non_monotonic": [("1", 5), ("2", 3), ("3", 8), ("+Inf", 6)],
        "inf_lower": [("1", 5), ("+Inf", 3)],
        "negative": [("-1", 4), ("0", 6), ("1", 10), ("+Inf", 10)],
        "all_negative": [("-3", 2), ("-2", 6), ("+Inf", 8)],
        "zero_bound": [("0", 3), ("1", 5), ("+Inf", 5)],
        "empty_lowest": [("0.1", 0), ("1", 5), ("+Inf", 5)],
        "coalesce": [("0.5", 2), ("1", 3), ("1.0", 2), ("+Inf", 10)],
        "no_inf": [("0.1", 1), ("0.5", 2), ("1", 3)],
        "only_inf": [("+Inf", 5)],
        "zero_obs": [("0.1", 0), ("1", 0), ("+Inf", 0)],
        "fractional": [("0.25", 0.3), ("0.5", 1.7), ("2.5", 2.2), ("+Inf", 2.2000000000000006)],
        "nan_count": [("0.1", 1), ("0.5", math.nan), ("1", 3), ("+Inf", 4)],
        "nan_first": [("0.1", math.nan), ("0.5", 2), ("+Inf", 4)],
        "nan_inf": [("0.1", 1), ("0.5", 2), ("+Inf", math.nan)],
        "neg_count": [("0.1", -2), ("0.5", 1), ("+Inf", 3)],
        # relative delta 1e-13 between le=1 and le=2: releases after 2.42 treat it as a
        # float error and flatten it (smallDeltaTolerance 1e-12); 2.42 interpolates
        "tiny_delta": [("1", 1e13), ("2", 1e13 + 1), ("+Inf", 2e13)],
    }
    rng = random.Random(4242)
    pool = [-5.0, -1.0, -0.25, 0.0, 0.001, 0.02, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 160.0, 2560.0]
    for i in range(60):
        bounds = sorted(rng.sample(pool, rng.randint(1, 8)))
        counts = sorted(rng.choice([0, 0, 1, 2, 5, 17, 100, 1234]) * rng.random() for _ in bounds)
        if rng.random() < 0.4:  # break monotonicity
            j = rng.randrange(len(counts))
            counts[j] = counts[j] * rng.random()
        rows = [(repr(b), float(c)) for b, c in zip(bounds, counts)]
        if rng.random() < 0.9:
            rows.append(("+Inf", float(max(counts, default=0)) + rng.choice([0, 0, 1, 3.5, -0.5])))
        cases[f"rand{i}"] = rows
    return cases


QCASES = make_qcases()


def qcase_exposition() -> str:
    lines = ["# TYPE qcase gauge"]
    for name, rows in QCASES.items():
        lines += [f'qcase{{case="{name}",le="{le}"}} {fmt_value(c)}' for le, c in rows]
    return "\n".join(lines)


class Scenario:
    """The page content per scrape: every call is the next scrape's state."""

    def __init__(self) -> None:
        self.rng = random.Random(20240607)
        self.engines = [FakeEngine("0", VLLM_TTFT_BOUNDS), FakeEngine("1", ENGINE1_BOUNDS)]
        self.k = 0
        self.qcases = qcase_exposition()

    def __call__(self) -> str:
        k, self.k = self.k, self.k + 1
        if k >= N_STATES:
            return ""  # target "disappears": Prometheus writes staleness markers, no new samples
        e0, e1 = self.engines
        if k == RESET_AT:
            e0.restart()
        for eng, active, load in ((e0, True, 5), (e1, k >= ENGINE1_FROM, 9)):
            if not active:
                continue
            for _ in range(self.rng.randint(0, load)):
                eng.observe(self.rng.lognormvariate(math.log(0.2), 1.3))
        parts = [f"# TYPE {METRIC} histogram", e0.exposition()]
        if k >= ENGINE1_FROM:
            parts.append(e1.exposition())
        parts.append(self.qcases)
        return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- collected data


@dataclass
class Collected:
    raw: dict[str, dict[tuple[str, float | None], list[tuple[float, float]]]]  # kind -> (engine, le) -> samples
    snapshots: dict[str, tuple[tuple[float, ...], list[HistogramSnapshot]]]  # engine -> (bounds, snaps)
    grid_ms: list[int]
    # (window_ms, expr-kind) -> label key -> {t_ms: value}
    ranged: dict[tuple[int, str], dict[tuple[Any, ...], dict[int, float]]]
    # (window_ms, T_ms) -> engine -> [(ts, value)] as returned for METRIC_count[w] at T
    edge_selections: dict[tuple[int, int], dict[str, list[tuple[float, float]]]]
    # (window_ms, T_ms, q) -> value of the merged quantile at instant T (None: no result)
    edge_quantiles: dict[tuple[int, int, float], float | None]
    # q -> case -> value
    qcase_answers: dict[float, dict[str, float]]
    prom_version: str


def _key(metric: dict[str, str], kind: str) -> tuple[Any, ...]:
    if kind == "bucket":
        return (metric["engine"], float(metric["le"]))
    if kind.startswith("qe"):
        return (metric["engine"],)
    if kind.startswith("qm") or kind.startswith("of"):
        return ()
    return (metric["engine"],)


def _matrix_to_series(result: list[dict[str, Any]]) -> dict[tuple[str, float | None], list[tuple[float, float]]]:
    out = {}
    for s in result:
        le = s["metric"].get("le")
        out[(s["metric"]["engine"], float(le) if le is not None else None)] = [
            (float(t), float(v)) for t, v in s["values"]
        ]
    return out


def _expressions(w: int) -> dict[str, str]:
    sel = f"[{w}ms]"
    exprs = {
        "bucket": f"increase({METRIC}_bucket{sel})",
        "count": f"increase({METRIC}_count{sel})",
        "sum": f"increase({METRIC}_sum{sel})",
        "rate": f"rate({METRIC}_count{sel})",
        "avg_over_time": f"avg_over_time({METRIC}_sum{sel})",
        "sum_over_time": f"sum_over_time({METRIC}_sum{sel})",
        "of_avg": f"avg(avg_over_time({METRIC}_sum{sel}))",
        "of_sum": f"sum(avg_over_time({METRIC}_sum{sel}))",
    }
    for q in QS:
        exprs[f"qm{q}"] = f"histogram_quantile({q}, sum by (le) (increase({METRIC}_bucket{sel})))"
        exprs[f"qe{q}"] = f"histogram_quantile({q}, sum by (engine, le) (increase({METRIC}_bucket{sel})))"
    return exprs


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Collected:
    tmp: Path = tmp_path_factory.mktemp("prom-oracle")
    for attempt in range(RECORDINGS):
        stack = ExitStack()
        scenario = Scenario()
        srv = stack.enter_context(StaticPageServer(scenario))
        prom = stack.enter_context(running_prometheus(tmp / f"attempt-{attempt}", [srv.url], SCRAPE_INTERVAL))
        try:
            prom.wait_for_samples(f'{METRIC}_count{{engine="0"}}', N_STATES, timeout=45)
            break
        except PrometheusError:  # a scrape that timed out on a loaded machine lost its state: record again
            stack.close()
            if attempt == RECORDINGS - 1:
                raise
    with stack:
        # wait until the empty page was scraped twice: staleness markers written, data final
        prom.wait_for_samples('up{job="target0"}', N_STATES + 2, timeout=10)
        version = prom.api("status/buildinfo")["version"]

        raw = {}
        for kind in ("bucket", "sum", "count"):
            res = prom.query(f"{METRIC}_{kind}[1h]")
            assert res["resultType"] == "matrix"
            raw[kind] = _matrix_to_series(res["result"])
        all_ts = sorted({to_millis(t) for series in raw["count"].values() for t, _ in series})
        first_ms, last_ms = all_ts[0], all_ts[-1]

        grid = list(range(first_ms - 700, last_ms + 5000, GRID_STEP_MS))
        ranged: dict[tuple[int, str], dict[tuple[Any, ...], dict[int, float]]] = {}
        for w in WINDOWS_MS:
            for kind, expr in _expressions(w).items():
                res = prom.query_range(expr, grid[0] / 1000, grid[-1] / 1000, GRID_STEP_MS / 1000)
                series: dict[tuple[Any, ...], dict[int, float]] = {}
                for s in res["result"]:
                    series[_key(s["metric"], kind)] = {to_millis(t): float(v) for t, v in s["values"]}
                ranged[(w, kind)] = series

        # instant queries with window edges exactly on sample timestamps
        edge_sel: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
        edge_q: dict[tuple[int, int, float], float | None] = {}
        picks = sorted({all_ts[i] for i in (1, 5, ENGINE1_FROM, RESET_AT - 1, RESET_AT, RESET_AT + 2, len(all_ts) - 1)})
        for w in WINDOWS_MS:
            for t0 in picks:
                for T in (t0, t0 + w):  # window end on a sample / window start on a sample
                    res = prom.query(f"{METRIC}_count[{w}ms]", time=T / 1000)
                    edge_sel[(w, T)] = {
                        s["metric"]["engine"]: [(float(t), float(v)) for t, v in s["values"]] for s in res["result"]
                    }
                    for q in QS:
                        r = prom.query(_expressions(w)[f"qm{q}"], time=T / 1000)["result"]
                        edge_q[(w, T, q)] = float(r[0]["value"][1]) if r else None

        # histogram_quantile edge cases, evaluated while the qcase series are fresh
        qans: dict[float, dict[str, float]] = {}
        for q in QCASE_QS:
            res = prom.query(f"histogram_quantile({'NaN' if math.isnan(q) else q}, qcase)", time=last_ms / 1000)
            qans[q] = {s["metric"]["case"]: float(s["value"][1]) for s in res["result"]}

    # snapshots per engine, from exactly the samples Prometheus returned
    snapshots = {}
    for engine, bounds in (("0", VLLM_TTFT_BOUNDS), ("1", ENGINE1_BOUNDS)):
        cols = [raw["bucket"][(engine, b)] for b in bounds]
        sums, counts = raw["sum"][(engine, None)], raw["count"][(engine, None)]
        ts = [t for t, _ in counts]
        for col in (*cols, sums):
            assert [t for t, _ in col] == ts, "all series of one scrape share the timestamp"
        snaps = [
            HistogramSnapshot(ts=ts[i], counts=tuple(c[i][1] for c in cols), sum=sums[i][1], count=counts[i][1])
            for i in range(len(ts))
        ]
        snapshots[engine] = (bounds, snaps)
    return Collected(raw, snapshots, grid, ranged, edge_sel, edge_q, qans, version)


# --------------------------------------------------------------------------- comparison helpers


class Comparator:
    def __init__(self) -> None:
        self.n = 0
        self.valued = 0  # comparisons where both sides had a number (not "no result")
        self.max_rel = 0.0
        self.mismatches: list[str] = []

    def check(self, what: str, ours: float | None, theirs: float | None) -> None:
        self.n += 1
        if ours is None or theirs is None:
            if ours is not theirs:
                self.mismatches.append(f"{what}: ours={ours} prometheus={theirs}")
            return
        self.valued += 1
        if (math.isnan(ours) and math.isnan(theirs)) or ours == theirs:
            return
        if not (math.isfinite(ours) and math.isfinite(theirs)):
            self.mismatches.append(f"{what}: ours={ours!r} prometheus={theirs!r}")
            return
        rel = abs(ours - theirs) / max(abs(ours), abs(theirs))
        self.max_rel = max(self.max_rel, rel)
        if rel > REL_TOL:
            self.mismatches.append(f"{what}: ours={ours!r} prometheus={theirs!r} rel={rel:.3g}")

    def assert_ok(self, label: str) -> None:
        print(f"\n{label}: {self.n} comparisons ({self.valued} with values), max relative error {self.max_rel:.3g}")
        assert not self.mismatches, f"{len(self.mismatches)} of {self.n} differ:\n" + "\n".join(self.mismatches[:30])


def our_windows(c: Collected, w: int, t_ms: int) -> dict[str, WindowHistogram | None]:
    return {
        engine: window_histogram(bounds, snaps, (t_ms - w) / 1000, t_ms / 1000)
        for engine, (bounds, snaps) in c.snapshots.items()
    }


# --------------------------------------------------------------------------- tests


def test_oracle_is_prometheus_2_42(collected: Collected) -> None:
    assert collected.prom_version.startswith("2.42."), collected.prom_version


def test_scenario_really_has_a_reset_and_a_late_series(collected: Collected) -> None:
    e0 = [v for _, v in collected.raw["count"][("0", None)]]
    assert len(e0) == N_STATES
    drops = [i for i in range(1, len(e0)) if e0[i] < e0[i - 1]]
    assert drops == [RESET_AT], "engine 0's counter reset is in Prometheus' data"
    assert len(collected.raw["count"][("1", None)]) == N_STATES - ENGINE1_FROM


def test_range_selector_window_is_closed_on_both_ends(collected: Collected) -> None:
    """x[w] at T returns the samples with T-w <= ts <= T (2.x): compare Prometheus'
    own selection with select_range at eval times whose edges are sample timestamps."""
    start_hits = end_hits = 0
    for (w, T), by_engine in collected.edge_selections.items():
        for engine, (_, snaps) in collected.snapshots.items():
            pts = [(s.ts, s.count) for s in snaps]
            ours = select_range(pts, (T - w) / 1000, T / 1000)
            assert [(to_millis(t), v) for t, v in ours] == [
                (to_millis(t), v) for t, v in by_engine.get(engine, [])
            ], (w, T, engine)
            start_hits += any(to_millis(t) == T - w for t, _ in ours)
            end_hits += any(to_millis(t) == T for t, _ in ours)
    assert start_hits > 0 and end_hits > 0, "edge cases were actually exercised"


def test_increase_and_rate_of_every_series_match(collected: Collected) -> None:
    cmp = Comparator()
    extrapolated = spanning_reset = 0
    reset_ms = to_millis(collected.snapshots["0"][1][RESET_AT].ts)
    for w in WINDOWS_MS:
        for t in collected.grid_ms:
            ours = our_windows(collected, w, t)
            for engine, (bounds, snaps) in collected.snapshots.items():
                h = ours[engine]
                for i, b in enumerate(bounds):
                    theirs = collected.ranged[(w, "bucket")].get((engine, b), {}).get(t)
                    cmp.check(f"increase bucket w={w} t={t} e={engine} le={b}", h.increases[i] if h else None, theirs)
                for kind, ours_v in (("count", h.count if h else None), ("sum", h.sum if h else None)):
                    cmp.check(f"increase {kind} w={w} t={t} e={engine}", ours_v,
                              collected.ranged[(w, kind)].get((engine,), {}).get(t))
                pts = [(s.ts, s.count) for s in snaps]
                r = rate(pts, (t - w) / 1000, t / 1000)
                cmp.check(f"rate count w={w} t={t} e={engine}", r,
                          collected.ranged[(w, "rate")].get((engine,), {}).get(t))
                if h is not None:
                    assert h.count >= 0 and all(x >= 0 for x in h.increases)
                    assert increase(pts, (t - w) / 1000, t / 1000) == h.count
                    extrapolated += h.count != round(h.count)
                    spanning_reset += engine == "0" and t - w < reset_ms <= t
    cmp.assert_ok("increase/rate vs Prometheus")
    assert cmp.valued > cmp.n // 2
    assert extrapolated > 50 and spanning_reset > 50  # the interesting cases were covered


def test_over_time_means_and_sums_and_their_aggregations_match_bit_for_bit(collected: Collected) -> None:
    """``avg_over_time`` and ``sum_over_time`` of each engine's ``_sum`` samples (non-integer
    values, compensated sums in Prometheus) and ``avg``/``sum`` over the two engines: the same
    floats as Prometheus' answers, not only within 1e-9 (a gauge's mean from raw samples kept by
    a source, app/promsource/mirror.py, is compared with the queried one exactly)."""
    compared = inexact = 0
    for w in WINDOWS_MS:
        for t in collected.grid_ms:
            means = []
            for engine in ("0", "1"):
                values = [v for _, v in select_range(collected.raw["sum"][(engine, None)], (t - w) / 1000, t / 1000)]
                for kind, fn in (("avg_over_time", avg_over_time), ("sum_over_time", sum_over_time)):
                    theirs = collected.ranged[(w, kind)].get((engine,), {}).get(t)
                    assert (theirs is None) == (not values), (kind, w, t, engine)
                    if values:
                        ours = fn(values)
                        assert ours == theirs, (kind, w, t, engine, ours, theirs)
                        compared += 1
                        inexact += kind == "avg_over_time" and ours != math.fsum(values) / len(values)
                if values:
                    means.append(avg_over_time(values))
            for kind, fn in (("of_avg", avg_of), ("of_sum", sum_of)):
                theirs = collected.ranged[(w, kind)].get((), {}).get(t)
                assert (theirs is None) == (not means), (kind, w, t)
                if means:
                    assert fn(means) == theirs, (kind, w, t, fn(means), theirs)
                    compared += 1
    assert compared > 1000 and inexact > 0, (compared, inexact)  # a plain mean differs somewhere


def test_histogram_quantile_of_sum_by_le_matches(collected: Collected) -> None:
    cmp = Comparator()
    for w in WINDOWS_MS:
        for t in collected.grid_ms:
            ours = our_windows(collected, w, t)
            merged = merge([ours["0"], ours["1"]])  # label-set order, like Prometheus
            for q in QS:
                mine = histogram_quantile(q, merged.bounds, merged.increases) if merged else None
                cmp.check(f"sum-by-le q={q} w={w} t={t}", mine, collected.ranged[(w, f"qm{q}")].get((), {}).get(t))
                for engine, h in ours.items():
                    mine_e = histogram_quantile(q, h.bounds, h.increases) if h else None
                    theirs = collected.ranged[(w, f"qe{q}")].get((engine,), {}).get(t)
                    cmp.check(f"per-engine q={q} w={w} t={t} e={engine}", mine_e, theirs)
    for (w, T, q), theirs in collected.edge_quantiles.items():
        ours = our_windows(collected, w, T)
        merged = merge([ours["0"], ours["1"]])
        cmp.check(f"instant edge q={q} w={w} T={T}",
                  histogram_quantile(q, merged.bounds, merged.increases) if merged else None, theirs)
    cmp.assert_ok("histogram_quantile(sum by (le) (increase)) vs Prometheus")
    assert cmp.valued > cmp.n // 2


def test_histogram_quantile_edge_cases_match(collected: Collected) -> None:
    cmp = Comparator()
    for q, answers in collected.qcase_answers.items():
        assert set(answers) == set(QCASES)
        for case, rows in QCASES.items():
            mine = histogram_quantile(q, [float(le) for le, _ in rows], [c for _, c in rows])
            cmp.check(f"qcase {case} q={q}", mine, answers[case])
    cmp.assert_ok("bucketQuantile edge cases vs Prometheus")
    assert cmp.valued == cmp.n
    # 2.42 has no small-delta tolerance: rank 1e13+0.5 interpolates inside le=2
    assert collected.qcase_answers[0.500000000000025]["tiny_delta"] == 1.5
