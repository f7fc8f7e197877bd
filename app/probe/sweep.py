"""Sweeps: change one factor at a time, hold the other two fixed (``shared/docs/domain.md`` §3).

* **Concurrency ladder** (1, 2, 4, ..., target) at a fixed prompt and output length: the
  ITL-vs-concurrency curve and how TTFT grows under load.
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from app.probe.runner import LevelPlan, LevelResult, ProbeResult, ProbeSpec, RequestResult, run_probe


def concurrency_ladder(target: int) -> list[int]:
    """1, 2, 4, ... below ``target``, then ``target`` itself."""
    if target < 1:
        raise ValueError(f"concurrency must be >= 1, got {target}")
    levels, c = [], 1
    while c < target:
        levels.append(c)
        c *= 2
    return [*levels, target]


def prompt_ladder(longest: int, shortest: int = 128) -> list[int]:
    """Doubling prompt lengths from ``shortest`` up to ``longest`` (included)."""
    if not 1 <= shortest <= longest:
        raise ValueError(f"need 1 <= shortest <= longest, got {shortest}, {longest}")
    levels, p = [], shortest
    while p < longest:
        levels.append(p)
        p *= 2
    return [*levels, longest]


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


@dataclass
class SweepResult:
    """A sweep: the probe run, the factor that moved and what it showed."""

    factor: str  # "concurrency" | "prompt_tokens"
    probe: ProbeResult
    fit: LinearFit | None  # TTFT vs prompt tokens (prompt sweeps)
    curve: list[dict]  # ITL vs concurrency (concurrency sweeps)

    @property
    def levels(self) -> list[LevelResult]:
        return self.probe.levels

    def table(self) -> list[dict]:
        return [level_row(lv) for lv in self.levels]

    def summary(self) -> dict:
        return {"factor": self.factor, "probe": self.probe.summary(),
                "ttft_vs_prompt": self.fit.to_dict() if self.fit else None, "itl_vs_concurrency": self.curve}

    def format(self) -> str:
        text = format_table(self.levels)
        if self.fit is not None:
            text += (f"\nTTFT vs prompt length: {self.fit.slope_per_1k * 1000:.1f} ms per 1k tokens "
                     f"+ {self.fit.intercept * 1000:.1f} ms (R² {self.fit.r2:.3f}, {self.fit.n} requests)")
        return text


async def sweep_concurrency(spec: ProbeSpec, levels: Sequence[int] | None = None, *,
                            requests_per_level: int | None = None,
                            on_request: Callable[[LevelPlan, RequestResult], None] | None = None,
                            seed: int | None = None) -> SweepResult:
    """Concurrency ladder (default ``concurrency_ladder(spec.concurrency)``) at the spec's
    prompt and output lengths; ``requests_per_level`` defaults to 2 x concurrency."""
    levels = list(levels or concurrency_ladder(spec.concurrency))
    plans = [LevelPlan(c, spec.prompt_tokens, spec.max_tokens,
                       requests_per_level or replace(spec, concurrency=c, requests=None).effective_requests)
             for c in levels]
    result = await run_probe(spec, plans, on_request=on_request, seed=seed)
    return SweepResult("concurrency", result, None, itl_curve([lv for lv in result.levels if lv.succeeded]))


async def sweep_prompt_length(spec: ProbeSpec, prompt_lengths: Sequence[int], *, requests_per_level: int = 2,
                              on_request: Callable[[LevelPlan, RequestResult], None] | None = None,
                              seed: int | None = None) -> SweepResult:
    """Prompt-length ladder at the spec's output length and concurrency; fits TTFT vs length."""
    plans = [LevelPlan(spec.concurrency, p, spec.max_tokens, requests_per_level) for p in prompt_lengths]
    result = await run_probe(spec, plans, on_request=on_request, seed=seed)
    return SweepResult("prompt_tokens", result, ttft_vs_prompt(result.levels), [])


# ---------------------------------------------------------------------------- single vs load

@dataclass(frozen=True)
class LoadComparison:
    """A single-request level against a loaded one (``domain.md`` §1: slow alone, or only under load?).

    Ratios are loaded / single of the p50 TTFT and the mean ITL. ``slow_alone`` lists what is
    already slow for one request (``ttft`` above ``slow_ttft``, ``itl`` above ``slow_itl``; with a
    known decode floor, a slow ITL within ``floor_factor`` of it is the hardware limit,
    ``bandwidth_bound``, and one far above it points at ``weights_offloaded``);
    ``slow_under_load`` what grows by more than the ratio thresholds. ``suggests`` maps them to
    the regimes they point at."""

    single_concurrency: int
    loaded_concurrency: int
    single_ttft_p50: float | None
    loaded_ttft_p50: float | None
    single_itl_mean: float | None
    loaded_itl_mean: float | None
    ttft_ratio: float | None
    itl_ratio: float | None
    itl_over_floor: float | None
    slow_alone: tuple[str, ...]
    slow_under_load: tuple[str, ...]
    suggests: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare_load(single: LevelResult, loaded: LevelResult, *, decode_floor: float | None = None,
                 slow_ttft: float = 1.0, slow_itl: float = 0.03, ttft_ratio: float = 5.0, itl_ratio: float = 1.5,
                 floor_factor: float = 1.5, time_scale: float = 1.0) -> LoadComparison:
    """``time_scale`` multiplies client seconds first (an emulated target's simulated clock)."""
    def scaled(v: float | None) -> float | None:
        return None if v is None else v * time_scale

    s_ttft, l_ttft = scaled(single.ttft.p50), scaled(loaded.ttft.p50)
    s_itl, l_itl = scaled(single.itl.mean), scaled(loaded.itl.mean)
    r_ttft, r_itl = _ratio(l_ttft, s_ttft), _ratio(l_itl, s_itl)
    over_floor = _ratio(s_itl, decode_floor)
    alone, load, suggests = [], [], []
    if s_ttft is not None and s_ttft >= slow_ttft:
        alone.append("ttft")
        suggests.append("prefill_compute")
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
                          over_floor, tuple(alone), tuple(load), tuple(suggests))


# ---------------------------------------------------------------------------- the table

def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if v < 10 else f"{v:.1f}s"


def level_row(lv: LevelResult) -> dict:
    return {"concurrency": lv.concurrency, "prompt_tokens": lv.plan.prompt_tokens, "max_tokens": lv.plan.max_tokens,
            "requests": lv.issued, "ok": lv.succeeded, "ttft_p50": lv.ttft.p50, "ttft_p90": lv.ttft.p90,
            "ttft_p99": lv.ttft.p99, "itl_p50": lv.itl.p50, "itl_p90": lv.itl.p90, "itl_p99": lv.itl.p99,
            "itl_mean": lv.itl.mean, "e2e_p50": lv.e2e.p50, "tokens_per_second": lv.output_tokens_per_s,
            "errors": dict(lv.errors)}


def format_table(levels: Sequence[LevelResult]) -> str:
    head = ("conc", "prompt", "output", "reqs", "ok", "ttft p50", "ttft p90", "ttft p99", "itl p50", "itl p90",
            "itl p99", "itl mean", "e2e p50", "tok/s", "errors")
    rows = [head]
    for lv in levels:
        tps = lv.output_tokens_per_s
        rows.append((str(lv.concurrency), str(lv.plan.prompt_tokens), str(lv.plan.max_tokens), str(lv.issued),
                     str(lv.succeeded), _ms(lv.ttft.p50), _ms(lv.ttft.p90), _ms(lv.ttft.p99), _ms(lv.itl.p50),
                     _ms(lv.itl.p90), _ms(lv.itl.p99), _ms(lv.itl.mean), _ms(lv.e2e.p50),
                     "-" if tps is None else f"{tps:.1f}",
                     ",".join(f"{k}={v}" for k, v in sorted(lv.errors.items())) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i < len(head) - 1 else c for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)
