"""prefill_interference — long prefills stall the decodes running next to them.

Symptom: ITL uneven under load — the p99/p50 ratio jumps — while long prompts arrive
(domain brief §2, §4). Without chunked prefill a new prompt's whole prefill runs as
one engine step and every in-flight decode waits for it, so the ITL tail is about
one long prefill long. vLLM does not export whether chunked prefill is on (and its
``iteration_tokens`` counts a prompt's full length in the step that finishes it, even
when chunked), so the rule looks at the effect: a heavy ITL tail with long prompts,
and compares the tail with the mean prefill time.
"""

from __future__ import annotations

from app.diagnosis.findings import Finding
from app.diagnosis.rules import Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals
from app.diagnosis.thresholds import Thresholds


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    prompt_mean = s.prompt_tokens.mean if s.prompt_tokens else None
    itl_p99 = s.itl.p99 if s.itl else None
    stall = check("stalled share of decode time", s.decode_stall_share, ">=", t.stall_share, "%",
                  "TGI: decode paused for prefill batches" if s.engine == "tgi" else "steps of 0.2 s or more")
    ratio = check("ITL p99/p50", s.itl_ratio, ">=", t.itl_ratio, "ratio")
    tail = check("ITL p99", itl_p99, ">=", t.itl_p99_seconds, "s")
    context = [
        check("mean prompt length", prompt_mean, ">=", t.interference_prompt_tokens, "tokens"),
        check("mean running requests", s.running_mean, ">=", t.interference_running),
    ]
    if not ((stall.met or (ratio.met and tail.met)) and all(c.met for c in context)):
        return None
    conditions = ([stall] if stall.met else [ratio, tail]) + context
    prefill_mean = s.prefill_time.mean if s.prefill_time else None
    alternatives = [info(e.name, e.value, e.unit, f"alternative condition {e.op} {e.threshold}, not needed")
                    for e in (stall, ratio, tail) if e not in conditions]
    evidence = conditions + alternatives + [
        info("ITL p50", s.itl.p50 if s.itl else None, "s"),
        info("mean prefill time", prefill_mean, "s", "an ITL spike of about this size = one whole prefill"),
        info("largest engine step", s.max_step_tokens, "tokens", "upper bucket bound of iteration_tokens"),
        info("running requests (mean)", s.running_mean),
    ]
    vllm = [
        "Enable chunked prefill (--enable-chunked-prefill; on by default in recent vLLM) so prefills are split "
        "into chunks that share steps with decodes.",
        "Lower the per-step token budget: --max-num-batched-tokens 512 is a common start for smooth ITL "
        "(raise it again if TTFT/throughput suffer).",
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
    severity = "critical" if (s.decode_stall_share or 0) >= 0.4 or (itl_p99 or 0) >= 0.5 else "warning"
    stalled = f"{s.decode_stall_share:.0%} of decode time is stalled" if s.decode_stall_share is not None \
        else f"ITL p99 is {s.itl_ratio:.1f}x p50"
    return Finding(
        "prefill_interference", severity,
        confidence(conditions, s.itl.count if s.itl else 0, 4 * t.min_decode_steps),
        f"{stalled} (ITL p99 {itl_p99 * 1000:.0f} ms) while {prompt_mean:.0f}-token prompts arrive among "
        f"{s.running_mean:.0f} running requests: decodes wait for prefills.",
        evidence, remedies(s.engine, vllm, tgi, sglang),
    )


RULE = Rule("prefill_interference", evaluate)
