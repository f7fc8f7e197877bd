"""The prompt-length ladder the sweep tests run against the emulated healthy 8B/A100 engine,
and the TTFT-vs-prompt slope its physics implies.

The ladder spans 8k tokens, 0.78 s of prefill in simulated seconds, so wall-clock noise of a
loaded machine barely moves the fitted slope: with 2 requests per level, a 40 ms (simulated)
hiccup in one 8192-token request moves the least-squares slope by about 3 % (one point's
weight is ``(x - mean x) / Sxx``; a 256..2048 ladder would move 13 %). Idle, the measured
slope is within 1-2 % of the physics; a 10 % tolerance still fails a slope off by 2x.
"""

from __future__ import annotations

import statistics

from app.emulator.scenarios import get as get_scenario

LADDER = (256, 4096, 8192)
REQUESTS_PER_LEVEL = 2  # the sweep default


def prefill_slope_per_1k() -> float:
    """Seconds per 1k prompt tokens (simulated): the least-squares line through the emulator's
    prefill time of each request of the ladder (2048-token chunks), as the probe fits it."""
    deployment = get_scenario("healthy").deployment
    xs = [p for p in LADDER for _ in range(REQUESTS_PER_LEVEL)]
    return statistics.linear_regression(xs, [deployment.prefill_s(p, 2048) for p in xs]).slope * 1000.0
