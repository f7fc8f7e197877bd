"""The engines' default bucket layouts of the histograms an SLO can be written on.

An SLO's SLI is exact only when its threshold is a bucket bound (``le``) of the histogram:
``increase(bucket{le=threshold}) / increase(count)``. Anything else would be an
interpolation, and a guess must not page anyone. ``check-config``/``serve`` use these
layouts for targets whose engine is written in the file; the scraped histogram's own bounds
are checked again at run time (custom buckets, other versions), see :mod:`app.slo.status`.

Sources: vLLM ``vllm/v1/metrics/buckets.py`` (0.8 - 0.34; 0.33+ can override them with
``--custom-histogram-buckets``), SGLang 0.5.23's defaults (``--bucket-*`` overrides them), TGI's
``0.0001 x 1.5^k`` (k = 1..35) for every ``*_duration`` histogram.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0)
_VLLM_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
_SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
_SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               600.0, 1200.0, 1800.0, 2400.0)
_SGLANG_QUEUE = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0,
                 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)
_TGI_DURATION = tuple(0.0001 * 1.5 ** k for k in range(1, 36))

#: engine -> signal -> the default bounds (finite ``le`` values). A signal missing for an
#: engine has no histogram there (TGI exports no TTFT histogram; its TTFT is derived from
#: queue + prefill, which an exact SLI cannot use).
DEFAULT_BOUNDS: dict[str, dict[str, tuple[float, ...]]] = {
    "vllm": {"ttft": _VLLM_TTFT, "itl": _VLLM_ITL, "e2e": _VLLM_REQUEST, "queue_time": _VLLM_REQUEST},
    "sglang": {"ttft": _SGLANG_TTFT, "itl": _SGLANG_ITL, "e2e": _SGLANG_E2E, "queue_time": _SGLANG_QUEUE},
    "tgi": {"itl": _TGI_DURATION, "e2e": _TGI_DURATION, "queue_time": _TGI_DURATION},
}


def bound_index(bounds: Sequence[float], threshold: float) -> int | None:
    """The position of ``threshold`` among ``bounds`` (relative tolerance 1e-5: a bound copied
    from a page with six significant digits, e.g. TGI's ``2.52512``, still matches), or None."""
    for i, bound in enumerate(bounds):
        if math.isclose(bound, threshold, rel_tol=1e-5, abs_tol=1e-12):
            return i
    return None


def _fmt(seconds: float) -> str:
    return f"{seconds:.6g}s"


def not_a_bound(bounds: Sequence[float], threshold: float, what: str) -> str | None:
    """None when ``threshold`` is a bound; else the error with the two nearest bounds."""
    finite = sorted(b for b in bounds if math.isfinite(b))
    if bound_index(finite, threshold) is not None:
        return None
    if not finite:
        return f"threshold {_fmt(threshold)} cannot be checked: {what} has no finite buckets"
    pos = bisect.bisect_left(finite, threshold)
    # the bounds either side; at either end the two closest on the one side there is
    nearest = " and ".join(_fmt(b) for b in finite[max(0, min(pos - 1, len(finite) - 2)):][:2])
    return (f"threshold {_fmt(threshold)} is not a bucket bound of {what}; the nearest bounds are {nearest} "
            "(an SLI between bounds would be interpolated, a guess)")
