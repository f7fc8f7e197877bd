"""Is prefill chunked, and how many tokens may one engine step hold? Inferred from a window.

vLLM exports neither ``enable_chunked_prefill`` nor ``max_num_batched_tokens`` (its only
config info metric, ``vllm:cache_config_info``, carries the cache config), and its
``vllm:iteration_tokens_total`` cannot tell them either. vLLM V1 observes that histogram
once per batch of engine outputs (``IterationStats`` in ``vllm/v1/metrics/stats.py``,
observed in ``loggers.py``) as ``num_prompt_tokens + num_generation_tokens``, where a
request adds its *whole* ``prompt_len`` (prefix-cache hits included) in the step that
produces its first token. A chunk that emits nothing adds nothing, so a 6,000-token
prompt shows up as one ~6,000-token step whether it ran whole or as twelve 512-token
chunks. The step counts say *which* steps finish long prompts, not how long those steps
were.

Time does: a decode running next to a long prefill waits one engine step for its next
token. Prefilled whole, that step is the prompt's entire prefill, so the decode gap (ITL)
is as long as the request's prefill time. Split into k chunks, the prefill takes k steps
and each gap is only 1/k of it. So, matching ranks across the window's histograms:

* ``iteration_tokens``: the share ``f`` of steps above ``T`` tokens are the steps that
  finish the prompts longer than ``T`` (``T`` = the largest of 8192/4096/2048/1024 with
  enough such steps);
* ``prompt_tokens``: the share ``g`` of requests above ``T``, and their typical length ``P``;
* ``inter_token_latency``: the gap at the same rank as those steps (the ``1 - f/2``
  quantile, median of 1 - f/4, 1 - f/2, 1 - 3f/4): the stall a long prompt causes;
* ``request_prefill_time``: the prefill time of the long prompts (quantiles at ``g``).

``ratio = stall / prefill``: about 1 means each long prompt ran in one step (chunked
prefill off, or a budget of at least the prompt); ``ratio <= 0.45`` means it was split
into about ``1/ratio`` chunks of ``ratio x P`` tokens, plus the decodes sharing the
step: the budget. Bucket edges limit the estimate to about +/-50 % for stalls from 50 ms
to 1 s, where vLLM's ITL buckets are 1.25-1.5x apart (its prefill buckets are 1.2-2x apart
below 60 s); its 2.5x buckets, 10-25 ms and 1-2.5 s, are coarser. That is enough to tell
512 from 2048 from "off".
A budget above about half the long prompts' length splits them in two at most and reads
as ``whole_prompts``: its lower bound (the step size) is then still true.

What it cannot see, and then says ``unknown`` with the reason: engines without a
per-step token histogram (TGI, SGLang); windows without prompts above 1024 tokens
(nothing to chunk, and any budget >= 1024 treats them alike); long prefills with no
decode beside them (nothing stalls, so nothing measures the step); prefills of the long
prompts under the prefill histogram's first bucket (0.3 s on vLLM); windows with
preemptions (a preempted request's prefill time includes its second wait). Prompt
lengths count prefix-cache hits, so long prompts with a cached prefix make the budget
estimate high by up to 1 / (1 - their hit share).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from app.core import human
from app.core.quantiles import WindowHistogram, histogram_quantile

LONG_PROMPT_THRESHOLDS = (8192, 4096, 2048, 1024)  # iteration_tokens bucket edges, largest first
MIN_LONG = 8              # long-prompt steps (and requests) needed in the window
CHUNKED_RATIO = 0.45      # stall / prefill at or below this: prompts were split into >= ~2 chunks
STANDS_OUT = 1.5          # a long-prompt stall must be this many times the median ITL to be measurable
RANKS = (0.25, 0.5, 0.75)  # positions inside the long-prompt group whose ratios are compared


@dataclass(slots=True)
class StepBudget:
    verdict: str  # "whole_prompts" | "chunked" | "unknown"
    confidence: float  # 0..1; 0 when unknown
    reasoning: str  # the argument, with its numbers
    budget_tokens: float | None = None  # chunked: estimated budget; whole_prompts: lower bound
    prompt_tokens: float | None = None  # typical length of the long prompts compared
    step_tokens: float | None = None    # what iteration_tokens counts for the steps finishing them
    threshold_tokens: float | None = None
    long_steps: float | None = None
    stall_seconds: float | None = None
    prefill_seconds: float | None = None
    ratio: float | None = None

    def describe(self) -> str:
        """Short form for evidence lines and summaries."""
        if self.verdict == "chunked":
            return f"chunked, ~{human.number(self.budget_tokens)} tokens per step"
        if self.verdict == "whole_prompts":
            return f"whole prompts of ~{human.number(self.prompt_tokens)} tokens in one step"
        return "unknown"


def share_above(h: WindowHistogram, x: float) -> float:
    """Share of a window's observations above ``x``, interpolating linearly inside the
    bucket as :func:`~app.core.quantiles.histogram_quantile` does (its inverse)."""
    total = h.increases[-1] if h.increases else 0.0
    if total <= 0:
        return 0.0
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(h.bounds, h.increases):
        if x <= bound:
            if bound != math.inf:
                below += (cumulative - below) * (x - lower) / (bound - lower)
            return max(0.0, 1.0 - below / total)
        lower, below = bound, cumulative
    return 0.0


def _quantile(h: WindowHistogram, q: float) -> float:
    return histogram_quantile(q, h.bounds, h.increases)


def _unknown(reason: str) -> StepBudget:
    return StepBudget("unknown", 0.0, reason)


def infer(iteration: WindowHistogram | None, prompts: WindowHistogram | None, itl: WindowHistogram | None,
          prefill: WindowHistogram | None, running_mean: float | None,
          preemptions_per_second: float | None) -> StepBudget:
    """Chunked prefill and the per-step token budget from one window (module docstring)."""
    if iteration is None or iteration.count <= 0:
        return _unknown("the engine exports no per-step token histogram (vllm:iteration_tokens_total)")
    if prompts is None or itl is None or prefill is None or prompts.count <= 0 or itl.count <= 0 \
            or prefill.count <= 0:
        return _unknown("prompt-length, ITL or prefill-time histograms are missing or empty in the window")
    for threshold in LONG_PROMPT_THRESHOLDS:
        f, g = share_above(iteration, threshold), share_above(prompts, threshold)
        if f * iteration.count >= MIN_LONG and g * prompts.count >= MIN_LONG:
            break
    else:
        return _unknown(f"fewer than {MIN_LONG} prompts above {LONG_PROMPT_THRESHOLDS[-1]} tokens in the window: "
                        "nothing long enough to be chunked")
    if preemptions_per_second:
        return _unknown("preemptions in the window: a preempted request's prefill time includes its second wait")
    decoders = max(0.0, (running_mean or 0.0) - 1.0)  # running requests besides the one prefilling
    if decoders < 1.0:
        return _unknown(f"{running_mean or 0:.1f} requests running on average: long prefills rarely had a decode "
                        "beside them, so no gap measures their steps")
    long_steps = f * iteration.count
    stalls = [_quantile(itl, 1.0 - k * f) for k in RANKS]
    prefills = [_quantile(prefill, 1.0 - k * g) for k in RANKS]
    stall, prefill_s = statistics.median(stalls), statistics.median(prefills)
    prompt = _quantile(prompts, 1.0 - g / 2)
    step = _quantile(iteration, 1.0 - f / 2)
    itl_p50 = _quantile(itl, 0.5)
    numbers = dict(prompt_tokens=prompt, step_tokens=step, threshold_tokens=float(threshold), long_steps=long_steps,
                   stall_seconds=stall, prefill_seconds=prefill_s)
    if min(prefills) <= prefill.bounds[0]:
        return StepBudget("unknown", 0.0, f"the prefill of {human.number(prompt)}-token prompts falls in the prefill "
                          f"histogram's first bucket (<= {human.bound(prefill.bounds[0])}): too coarse to compare",
                          **numbers)
    if stall <= 0 or stall < STANDS_OUT * itl_p50:
        return StepBudget("unknown", 0.0, f"decode gaps at the rank of the {human.number(prompt)}-token prompts' steps "
                          f"({stall * 1000:.0f} ms) do not stand out from the ITL median ({itl_p50 * 1000:.0f} ms): "
                          "prefill chunks too small to slow a step, or no decode ran beside them", **numbers)
    ratio = statistics.median(s / p for s, p in zip(stalls, prefills))
    margin = abs(math.log2(ratio / CHUNKED_RATIO))  # factors of two from the boundary
    confidence = round(min(0.95, 0.5 + 0.45 * min(1.0, margin)) * min(1.0, 0.5 + 0.5 * long_steps / 20), 3)
    shares = (f"{long_steps:.0f} steps finish prompts of > {threshold} tokens (iteration_tokens counts each as "
              f"~{human.number(step)} tokens, whole prompts, chunked or not); those ~{human.number(prompt)}-token "
              "prompts take "
              f"{prefill_s:.2f} s of prefill while decodes beside them wait {stall * 1000:.0f} ms per token")
    if ratio <= CHUNKED_RATIO:
        budget = ratio * prompt + decoders
        return StepBudget("chunked", confidence, f"{shares}: each prefill was split into ~{1 / ratio:.0f} steps of "
                          f"~{human.number(ratio * prompt)} prompt tokens (+{decoders:.0f} decodes): chunked prefill, "
                          f"--max-num-batched-tokens ~{budget:.0f} (+/-50 %, bucket resolution)",
                          budget_tokens=budget, ratio=ratio, **numbers)
    return StepBudget("whole_prompts", confidence, f"{shares}: each prompt ran in one step: chunked prefill is off, "
                      f"or --max-num-batched-tokens >= ~{step:.0f}", budget_tokens=step, ratio=ratio, **numbers)
