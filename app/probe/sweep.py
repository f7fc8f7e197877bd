"""Sweeps: change one factor at a time, hold the other two fixed.

:func:`sweep_plans` builds the levels; the CLI and the API run them with
:func:`~app.probe.runner.run_probe` and :func:`analyze` says what they show:

* **Concurrency ladder** (e.g. 1, 2, 4, ..., target) at a fixed prompt and output length:
  the ITL-vs-concurrency curve and how TTFT grows under load.
* **Prompt-length ladder** at a fixed output length and concurrency (normally 1): the
  least-squares TTFT-vs-prompt-length line. Its slope (seconds per 1k prompt tokens) is the
  prefill cost; a good fit (R² near 1) with a steep slope is the ``prefill_compute``
  signature, and the intercept is the fixed cost every request pays (network, API server,
  one engine step).

:func:`compare_load` turns a single-request level and a loaded level into the split the
diagnosis needs: slow even alone (``prefill_compute`` / ``bandwidth_bound``) or slow only
under load (``queueing`` / ``prefill_interference``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from app.core.thresholds import Thresholds
from app.probe.runner import LevelPlan, LevelResult, ProbeResult, RequestResult

ONE_FACTOR = ("only one factor may vary per sweep: give several prompt lengths or several concurrency "
              "levels, not both")


def sweep_plans(prompt_tokens: Sequence[int], concurrency: Sequence[int], max_tokens: int,
                requests: int | None = None) -> list[LevelPlan]:
    """The levels of a probe: one per prompt length (concurrency fixed) or one per concurrency
    (prompt length fixed), in the order given; output length always fixed. ``requests`` per
    level defaults to 2 x the level's concurrency. Raises ``ValueError(ONE_FACTOR)`` when both
    lists have more than one value."""
    if len(prompt_tokens) > 1 and len(concurrency) > 1:
        raise ValueError(ONE_FACTOR)
    return [LevelPlan(c, p, max_tokens, requests or 2 * c) for p in prompt_tokens for c in concurrency]


@dataclass(frozen=True)
class LinearFit:
    """``y = intercept + slope * x`` by least squares, with the coefficient of determination."""

    slope: float
    intercept: float
    r2: float
    n: int

    @property
    def slope_per_1k(self) -> float:
        """Seconds per 1000 units of x (prompt tokens)."""
        return self.slope * 1000.0

    def to_dict(self) -> dict:
        return {**asdict(self), "slope_seconds_per_1k_tokens": self.slope_per_1k}


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LinearFit | None:
    """Ordinary least squares; None with fewer than two distinct x values."""
    n = len(xs)
    if n != len(ys) or n < 2:
        return None
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = math.fsum((y - my) ** 2 for y in ys)
    ss_res = math.fsum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(slope, intercept, r2, n)


def _prompt_len(plan: LevelPlan, r: RequestResult) -> int:
    return r.prompt_tokens if r.prompt_tokens is not None else plan.prompt_tokens


def ttft_vs_prompt(levels: Sequence[LevelResult]) -> LinearFit | None:
    """Fit over every successful request (x = the prompt tokens the server counted)."""
    xs, ys = [], []
    for lv in levels:
        for r in lv.requests:
            if r.ok and r.ttft is not None:
                xs.append(float(_prompt_len(lv.plan, r)))
                ys.append(r.ttft)
    return fit_line(xs, ys)


def itl_curve(levels: Sequence[LevelResult]) -> list[dict]:
    """ITL (over all gaps) and TTFT per concurrency level, in ladder order."""
    return [{"concurrency": lv.concurrency, "itl_mean": lv.itl.mean, "itl_p50": lv.itl.p50, "itl_p90": lv.itl.p90,
             "itl_p99": lv.itl.p99, "ttft_p50": lv.ttft.p50, "output_tokens_per_second": lv.output_tokens_per_s}
            for lv in levels]


def analyze(result: ProbeResult) -> dict:
    """What a multi-level run shows: the TTFT-vs-prompt fit when prompt lengths vary, the
    ITL-vs-concurrency curve when concurrency varies."""
    out: dict = {}
    ok = [lv for lv in result.levels if lv.succeeded]
    if len({lv.plan.prompt_tokens for lv in ok}) > 1:
        fit = ttft_vs_prompt(ok)
        out["ttft_vs_prompt"] = fit.to_dict() if fit else None
    if len({lv.concurrency for lv in ok}) > 1:
        out["itl_vs_concurrency"] = itl_curve(ok)
    if ok and ok[0].concurrency == 1 and len(ok) > 1 and ok[-1].concurrency > 1:
        out["load_split"] = compare_load(ok[0], ok[-1]).to_dict()
    return out


# ---------------------------------------------------------------------------- single vs load

#: A lone request whose engine queue time is this share of its TTFT was not alone: the same
#: share the diagnosis's ``queueing`` rule uses (``Thresholds.queue_share``).
QUEUE_SHARE = Thresholds.model_fields["queue_share"].default


@dataclass(frozen=True)
class LoadComparison:
    """A single-request level against a loaded one (slow alone, or only under load?).

    Ratios are loaded / single of the p50 TTFT and the mean ITL. ``slow_alone`` lists what is
    already slow for one request (``ttft`` above ``slow_ttft`` once the engine's queue time is
    taken out, ``itl`` above ``slow_itl``; with a known decode floor, a slow ITL within
    ``floor_factor`` of it is the hardware limit, ``bandwidth_bound``, and one far above it
    points at ``weights_offloaded``); ``slow_under_load`` what grows by more than the ratio
    thresholds. ``suggests`` maps them to the regimes they point at.

    A lone request on a busy server waits in the queue behind everyone else's: with the
    engine's queue time over the single level (``LevelResult.server``, read from its
    ``/metrics``) a slow single request that spent ``queue_share`` of its TTFT queued marks the
    server ``busy`` and suggests ``queueing``, not ``prefill_compute`` (what is left after the
    queue is within the queue's own spread); a slow TTFT is judged without its queue time; and
    without the queue time, ``notes`` says the split cannot tell the two apart."""

    single_concurrency: int
    loaded_concurrency: int
    single_ttft_p50: float | None
    loaded_ttft_p50: float | None
    single_itl_mean: float | None
    loaded_itl_mean: float | None
    ttft_ratio: float | None
    itl_ratio: float | None
    itl_over_floor: float | None
    single_queue_time: float | None  # the engine's mean queue time while the single level ran
    single_ttft_without_queue: float | None
    busy: bool  # the single request's slow TTFT was mostly the engine's queue
    slow_alone: tuple[str, ...]
    slow_under_load: tuple[str, ...]
    suggests: tuple[str, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare_load(single: LevelResult, loaded: LevelResult, *, decode_floor: float | None = None,
                 slow_ttft: float = 1.0, slow_itl: float = 0.03, ttft_ratio: float = 5.0, itl_ratio: float = 1.5,
                 floor_factor: float = 1.5, queue_share: float = QUEUE_SHARE,
                 time_scale: float = 1.0) -> LoadComparison:
    """``time_scale`` multiplies client seconds first (an emulated target's simulated clock;
    the engine's queue time is already in its own seconds)."""
    def scaled(v: float | None) -> float | None:
        return None if v is None else v * time_scale

    s_ttft, l_ttft = scaled(single.ttft.p50), scaled(loaded.ttft.p50)
    s_itl, l_itl = scaled(single.itl.mean), scaled(loaded.itl.mean)
    r_ttft, r_itl = _ratio(l_ttft, s_ttft), _ratio(l_itl, s_itl)
    over_floor = _ratio(s_itl, decode_floor)
    server = single.server or {}
    queue = server.get("queue_time_mean")
    own_ttft = None if s_ttft is None or queue is None else max(0.0, s_ttft - queue)
    # a slow single-request TTFT that was mostly the engine's queue: the server was busy
    busy = own_ttft is not None and s_ttft >= slow_ttft and queue >= queue_share * s_ttft  # type: ignore[operator]
    alone, load, suggests, notes = [], [], [], []
    if busy:  # what is left after the queue is within the queue's own spread: no single-request baseline
        suggests.append("queueing")
        notes.append(f"the single request waited {queue:.2f} s of its {s_ttft:.2f} s TTFT in the engine's queue "
                     f"(mean over the level, {server['requests']:g} engine requests): the server was busy, so this "
                     "level is no single-request baseline; probe again when it is idle")
    else:
        judged = own_ttft if own_ttft is not None else s_ttft
        if judged is not None and judged >= slow_ttft:
            alone.append("ttft")
            suggests.append("prefill_compute")
            if queue is None:
                notes.append("the engine's queue time over the single level is unknown "
                             f"({server.get('error') or 'its /metrics was not read'}): on a busy server a lone "
                             "request waits in the queue too, so a slow single-request TTFT may be queueing, "
                             "not prefill")
    if s_itl is not None and s_itl >= slow_itl:
        alone.append("itl")
        suggests.append("bandwidth_bound" if over_floor is None or over_floor <= floor_factor
                        else "weights_offloaded")
    if r_ttft is not None and r_ttft >= ttft_ratio:
        load.append("ttft")
        suggests.append("queueing")
    if r_itl is not None and r_itl >= itl_ratio:
        load.append("itl")
        suggests.append("prefill_interference")
    return LoadComparison(single.concurrency, loaded.concurrency, s_ttft, l_ttft, s_itl, l_itl, r_ttft, r_itl,
                          over_floor, queue, own_ttft, busy, tuple(alone), tuple(load),
                          tuple(dict.fromkeys(suggests)), tuple(notes))


def format_analysis(analysis: dict) -> list[str]:
    """The lines under the table: the TTFT-vs-prompt fit and the single-vs-load split."""
    lines = []
    fit = analysis.get("ttft_vs_prompt")
    if fit:
        lines.append(f"TTFT vs prompt length: {fit['slope_seconds_per_1k_tokens'] * 1000:.1f} ms per 1k tokens "
                     f"+ {fit['intercept'] * 1000:.1f} ms (R² {fit['r2']:.3f}, {fit['n']} requests)")
    split = analysis.get("load_split")
    if split:
        lines.append(f"single -> {split['loaded_concurrency']}: TTFT x{_x(split['ttft_ratio'])}, "
                     f"ITL x{_x(split['itl_ratio'])}"
                     + (f"; points at {', '.join(split['suggests'])}" if split["suggests"] else ""))
        lines.extend(f"  note: {note}" for note in split["notes"])
    return lines


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ---------------------------------------------------------------------------- the table

def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if v < 10 else f"{v:.1f}s"


def format_table(levels: Sequence[LevelResult]) -> str:
    """One row per level; when the engine's page was read, its own view of the level too:
    ``engine queue`` and ``engine ttft``, the means of its queue-time and TTFT histograms over
    the level (a slow client TTFT with a long engine queue is queueing, not slow prefill)."""
    engine_view = any(lv.server is not None for lv in levels)
    head = ("conc", "prompt", "output", "reqs", "ok", "ttft p50", "ttft p90", "ttft p99", "itl p50", "itl p90",
            "itl p99", "itl mean", "e2e p50", "tok/s", *(("engine queue", "engine ttft") if engine_view else ()),
            "errors")
    rows = [head]
    for lv in levels:
        tps = lv.output_tokens_per_s
        server = lv.server or {}
        rows.append((str(lv.concurrency), str(lv.plan.prompt_tokens), str(lv.plan.max_tokens), str(lv.issued),
                     str(lv.succeeded), _ms(lv.ttft.p50), _ms(lv.ttft.p90), _ms(lv.ttft.p99), _ms(lv.itl.p50),
                     _ms(lv.itl.p90), _ms(lv.itl.p99), _ms(lv.itl.mean), _ms(lv.e2e.p50),
                     "-" if tps is None else f"{tps:.1f}",
                     *((_ms(server.get("queue_time_mean")), _ms(server.get("ttft_mean"))) if engine_view else ()),
                     ",".join(f"{k}={v}" for k, v in sorted(lv.errors.items())) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i < len(head) - 1 else c for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)
