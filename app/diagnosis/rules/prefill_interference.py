"""prefill_interference — long prefills stall the decodes running next to them.

Symptom: ITL uneven under load — the p99/p50 ratio jumps — while long prompts arrive.
Without chunked prefill a new prompt's whole prefill runs as one engine step and every
in-flight decode waits for it, so the ITL tail is about one long prefill long. The rule
fires on that effect (a heavy ITL tail with long prompts). vLLM exports neither chunked
prefill nor the per-step token budget; the finding's evidence and first remedy come from
what the window implies about them
(:mod:`app.diagnosis.step_budget`): whole prompts in one step (turn chunking on),
chunks of a large budget (lower it), or chunks already near 512 tokens (the stalls have
another cause, so the budget is not the knob).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import (
    PROMPT_MEAN,
    Need,
    NotJudged,
    Rule,
    check,
    check_quantile,
    confidence,
    decided,
    info,
    quantile_info,
    remedies,
    undecided_reason,
)
from app.diagnosis.signals import STALL_SECONDS, Signals
from app.diagnosis.step_budget import StepBudget
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin

SMALL_BUDGET = 768  # an estimated budget up to 1.5 x 512 is "already small" (the estimate is +/-50 %)


def _budget_remedies(budget: StepBudget | None) -> list[str]:
    """vLLM's first remedies, from what the window says about the step budget."""
    lower = ("Lower the per-step token budget: --max-num-batched-tokens 512 is a common start for smooth ITL "
             "(raise it again if TTFT/throughput suffer).")
    enable = ("Enable chunked prefill (--enable-chunked-prefill; on by default in recent vLLM) so prefills are split "
              "into chunks that share steps with decodes.")
    if budget is None or budget.verdict == "unknown":
        return [enable, lower]
    if budget.verdict == "whole_prompts":
        return [f"Steps of ~{human.number(budget.step_tokens)} tokens: whole prompts run in one step, so chunked "
                "prefill appears off (or --max-num-batched-tokens is at least that). Enable it with a small budget: "
                "--enable-chunked-prefill --max-num-batched-tokens 512 (raise it again if TTFT/throughput suffer)."]
    if budget.budget_tokens > SMALL_BUDGET:
        return [f"Prefills are chunked at ~{human.number(budget.budget_tokens)} tokens per step: lower the budget with "
                "--max-num-batched-tokens 512 (raise it again if TTFT/throughput suffer)."]
    return [f"Prefills are already chunked at ~{human.number(budget.budget_tokens)} tokens per step, so the step "
            "budget is not what stalls the decodes here."]


def _all(*verdicts: bool | None) -> bool | None:
    """Three-valued "and": False if any is False, else None if any is undecided, else True."""
    if False in verdicts:
        return False
    return None if None in verdicts else True


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    prompt_mean = s.prompt_mean  # the histogram's _sum/_count, or the token and request counters
    itl_p99 = s.itl.p99 if s.itl else None
    stall = check("stalled share of decode time", s.decode_stall_share, ">=", t.stall_share, "%",
                  "TGI: decode paused for prefill batches" if s.engine == "tgi" else "steps of 0.2 s or more")
    # p99/p50, the p99 and the p90 prompt length are decided on their buckets, not on the values
    # interpolated inside them (None: the threshold lies inside a bucket)
    ratio = check("ITL p99/p50", s.itl_ratio, ">=", t.itl_ratio, "ratio")
    ratio_verdict = decided(*s.itl_ratio_bounds, ">=", t.itl_ratio) if s.itl_ratio_bounds else ratio.met
    ratio.met = bool(ratio_verdict)
    tail, tail_verdict = check_quantile("ITL p99", s.itl, "p99", ">=", t.itl_p99_seconds, "s")
    mean_long = check("mean prompt length", prompt_mean, ">=", t.interference_prompt_tokens, "tokens",
                      s.prompt_mean_source or "")
    p90_long, p90_verdict = check_quantile("prompt length p90", s.prompt_tokens, "p90", ">=",
                                           t.interference_long_prompt_tokens, "tokens",
                                           "one request in ten brings a prompt this long")
    long_prompts = mean_long if mean_long.met or not p90_long.met else p90_long
    running = check("mean running requests", s.running_mean, ">=", t.interference_running)
    context = [long_prompts, running]
    stalling = True if stall.met else _all(ratio_verdict, tail_verdict)
    prompts_long = True if mean_long.met else p90_verdict
    verdict = _all(stalling, prompts_long, running.met)
    if verdict is None:  # no condition fails, one cannot be decided: not judged rather than "no"
        reasons = [undecided_reason(e) for e, v in ((tail, tail_verdict), (p90_long, p90_verdict))
                   if v is None and e.interval]
        if ratio_verdict is None and s.itl_ratio_bounds is not None and not stall.met:
            low, high = s.itl_ratio_bounds
            reasons.append(f"ITL p99/p50 is between {low:.2f} and {high:.2f} over the buckets that hold them; "
                           f"the limit {human.given(t.itl_ratio)} is inside that range")
        raise NotJudged("; ".join(reasons) or "a threshold lies inside a bucket")
    if not verdict:
        return None
    conditions = ([stall] if stall.met else [ratio, tail]) + context
    prefill_mean = s.prefill_time.mean if s.prefill_time else None
    alternatives = [info(e.name, e.value, e.unit, f"alternative condition {e.op} {e.threshold}, not needed")
                    for e in (stall, ratio, tail, mean_long, p90_long) if e not in conditions]
    evidence = conditions + alternatives + [
        quantile_info("ITL p50", s.itl, "p50"),
        info("mean prefill time", prefill_mean, "s", "an ITL spike of about this size = one whole prefill"),
        info("largest engine step", s.max_step_tokens, "tokens", "upper bucket bound of iteration_tokens"),
        info("running requests (mean)", s.running_mean),
    ]
    budget = s.step_budget
    if budget is not None:
        evidence.append(info("engine step budget (inferred)", budget.describe(), note=(
            f"confidence {budget.confidence:.2f}: {budget.reasoning}" if budget.verdict != "unknown"
            else f"cannot tell: {budget.reasoning}")))
    vllm = _budget_remedies(budget) + [
        "Route very long prompts to a separate replica (or use prefill/decode disaggregation).",
    ]
    tgi = [
        "Lower --max-batch-prefill-tokens so each prefill chunk that pauses the decode batch is short.",
        "Raise --waiting-served-ratio / lower --max-waiting-tokens only with care: they decide how often "
        "prefills interrupt decoding.",
        "Route very long prompts to a separate replica.",
    ]
    sglang = [
        "Lower --chunked-prefill-size (e.g. 512-2048) so prefill chunks share steps with decodes.",
        "Enable mixed chunked prefill (--enable-mixed-chunk).",
    ]
    severity = ("critical" if (s.decode_stall_share or 0) >= t.interference_critical_stall_share
                or (itl_p99 or 0) >= t.interference_critical_itl_p99_seconds else "warning")
    # the headline names the conditions that fired: the stall share, or the ITL tail; the mean
    # prompt length, or the p90
    stalled = f"{s.decode_stall_share:.0%} of decode time is stalled" if stall.met \
        else f"ITL p99 is {s.itl_ratio:.1f}x p50"
    arriving = (f"{human.number(prompt_mean)}-token prompts" if long_prompts is mean_long
                else f"long prompts (p90 {human.quantile(p90_long.value, p90_long.interval, 'tokens')})")
    return Finding(
        "prefill_interference", severity,
        confidence(conditions, s.itl.count if s.itl else 0, 4 * t.min_decode_steps),
        f"{stalled} (ITL p99 {human.quantile(itl_p99, s.itl.interval('p99') if s.itl else None)}) while "
        f"{arriving} arrive among {s.running_mean:.0f} running requests: decodes wait for prefills.",
        evidence, remedies(s.engine, vllm, tgi, sglang),
    )


def promql(x: Twin) -> None:
    """(Stall share, or p99/p50 with a p99 floor) + long prompts + running decodes; critical
    at ``interference_critical_stall_share`` or ``interference_critical_itl_p99_seconds``."""
    r, t, e = x.recorded, x.t, x.engine
    stalled = (f"({r['stall_share']} >= {num(t.stall_share)})\n"
               f"or (({r['itl_ratio']} >= {num(t.itl_ratio)}) "
               f"and on({e.labels}) ({r['itl_p99']} >= {num(t.itl_p99_seconds)}))")
    long_prompts = (f"({r['prompt_mean']} >= {num(t.interference_prompt_tokens)})\n"
                    f"or ({r['prompt_p90']} >= {num(t.interference_long_prompt_tokens)})")
    conditions = [r["itl_p99"], stalled, long_prompts, f"{r['running']} >= {num(t.interference_running)}", x.gate]
    stall_what = "prefill batches pausing decodes" if e.name == "tgi" else f"steps >= {human_seconds(STALL_SECONDS)}"
    text = (f"{e.who()}: ITL p99 is {{{{ $value | humanizeDuration }}}} over the last {x.w}: at least "
            f"{human_share(t.stall_share)} of decode time stalled ({stall_what}), or ITL p99/p50 >= "
            f"{human.given(t.itl_ratio)} with p99 >= {human_seconds(t.itl_p99_seconds)}; prompts average at least "
            f"{human.given(t.interference_prompt_tokens)} tokens (or one in ten has at least "
            f"{human.given(t.interference_long_prompt_tokens)}) among at least "
            f"{human.given(t.interference_running)} running requests{{extra}}.")
    summary = f"Prefills stall running decodes on {e.title}"
    x.add("warning", x.and_(*conditions), summary, text.replace("{extra}", ""))
    escalated = (f"({r['stall_share']} >= {num(t.interference_critical_stall_share)})\n"
                 f"or ({r['itl_p99']} >= {num(t.interference_critical_itl_p99_seconds)})")
    x.add("critical", x.and_(*conditions, escalated), summary,
          text.replace("{extra}", f"; stall share >= {human_share(t.interference_critical_stall_share)} or "
                                  f"ITL p99 >= {human_seconds(t.interference_critical_itl_p99_seconds)}"))


RULE = Rule("prefill_interference", evaluate, precedence=30, colour="purple", promql=promql, needs=(
    Need("per-step ITL histogram", ("itl",),
         "a per-step inter-token latency histogram (vLLM inter_token_latency_seconds, SGLang "
         "inter_token_latency_seconds, TGI tgi_batch_inference_duration{method=\"decode\"}); trtllm-serve "
         "times decode per request only"), PROMPT_MEAN,
    Need("running-requests gauge", ("running_mean",),
         "the engine's running-requests gauge (vLLM num_requests_running, SGLang num_running_reqs, TGI "
         "tgi_batch_current_size)"),
))
