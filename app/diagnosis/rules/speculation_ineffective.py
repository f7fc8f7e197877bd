"""speculation_ineffective — speculative decoding no longer pays: the draft tokens are mostly
rejected.

Symptom: each verification step runs the drafter (a draft model, EAGLE head, MTP or n-gram
lookup) and verifies ``k`` extra tokens, but only a few are accepted, so a step emits about
one token, as without drafts, and costs more: ITL is no better, often worse, than with
speculation off. Acceptance drops silently when the traffic mix changes (other languages,
code, tool calls, high temperature) or the target model was updated without its draft.
Why it matters: the fix is the drafter or ``k``, not capacity; and at high concurrency the
verify cost competes with batching.

Reads vLLM's ``vllm:spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens``
counters (acceptance rate = accepted / draft tokens, mean tokens per verification step
= 1 + accepted / drafts, exact over the window) or, where the engine computes them,
SGLang's ``spec_accept_rate`` / ``spec_accept_length`` gauges and TensorRT-LLM's draft/accepted
token counters with its ``spec_decode_acceptance_length`` gauge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals
from app.promql.text import human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    if s.spec_accept_rate is None and s.spec_accept_length is None:
        return None
    steps, source = verification_steps(s)
    enough = check("verification steps with a draft", steps, ">=", t.spec_min_drafts, "", source)
    rate = check("draft acceptance rate", s.spec_accept_rate, "<=", t.spec_accept_rate, "ratio",
                 "accepted / proposed draft tokens")
    length = check("mean tokens per verification step", s.spec_accept_length, "<=", t.spec_accept_length, "",
                   "1 + accepted / drafts")
    if not enough.met or not (rate.met or length.met):
        return None
    conditions = [enough] + [c for c in (rate, length) if c.met]
    evidence = conditions + [c for c in (rate, length) if not c.met and c.value is not None] + [
        info("draft tokens per step (num_speculative_tokens)", s.spec_draft_length),
        info("ITL mean", s.itl.mean if s.itl else None, "s", "per engine step: a step emits 1 + accepted tokens"),
        info("running requests (mean)", s.running_mean),
    ]
    k = f"{s.spec_draft_length:.0f}" if s.spec_draft_length else "k"
    busy = (s.running_mean or 0.0) >= 32
    vllm = [
        f"Propose fewer tokens: --speculative-config num_speculative_tokens below {k} (rejected positions cost "
        "verify compute for nothing).",
        "Use a better drafter: an EAGLE/EAGLE-3 head or MTP trained for this model, or a draft model tuned on this "
        "traffic; n-gram lookup only pays on repetitive (RAG, code-edit) prompts.",
        ("Turn speculation off at this concurrency: " if busy else "At high concurrency turn speculation off ")
        + "(the batch already uses the GPU; vLLM's disable_by_batch_size in --speculative-config).",
    ]
    sglang = [
        "Lower --speculative-num-draft-tokens / --speculative-num-steps.",
        "Use an EAGLE/EAGLE-3 draft trained for this model (--speculative-algorithm EAGLE3).",
        "Disable speculation at high batch sizes (it only pays when decode is memory-bound).",
    ]
    trtllm = [
        f"Propose fewer tokens: lower speculative_config.max_draft_len below {k} (--extra_llm_api_options YAML).",
        "Use a better drafter: speculative_config.decoding_type Eagle with an EAGLE-3 head trained for this model, "
        "or MTP where the model has MTP layers; NGram only pays on repetitive (RAG, code-edit) prompts.",
        ("Turn speculation off at this concurrency: " if busy else "At high concurrency turn speculation off ")
        + "(speculative_config.max_concurrency: no drafts above that batch size; PyTorch backend).",
    ]
    tgi = ["Lower or remove --speculate (Medusa / n-gram): accepted tokens are too few to pay for the verify."]
    critical = s.spec_accept_length is not None and s.spec_accept_length <= t.spec_critical_accept_length
    parts = []  # the conditions that fired, not every number the engine exports
    if rate.met:
        parts.append(f"only {s.spec_accept_rate:.0%} of draft tokens are accepted")
    if length.met:
        parts.append(f"a verification step emits {s.spec_accept_length:.2f} tokens on average")
    return Finding("speculation_ineffective", "critical" if critical else "warning",
                   confidence(conditions, steps, 4 * t.spec_min_drafts),
                   "Speculative decoding is not paying off: " + ", ".join(parts)
                   + "; the draft and verify cost of each step buys almost nothing.",
                   evidence, remedies(s.engine, vllm, tgi, sglang, trtllm))


def verification_steps(s: Signals) -> tuple[float, str]:
    """Verification steps with a draft in the window, and where the number comes from: the engine's
    draft count (vLLM), else its per-step ITL count (SGLang: one observation per emitted token, at
    least one per step), else the generated tokens over the mean tokens per step (trtllm-serve
    counts neither steps nor drafts; an estimate)."""
    if s.spec_drafts is not None:
        return s.spec_drafts, "counted by the engine"
    if s.itl:
        return s.itl.count, "ITL observations (the engine exports no draft count)"
    if s.generation_tokens_per_second and s.spec_accept_length:
        return (s.generation_tokens_per_second * s.window_seconds / s.spec_accept_length,
                "estimated: generated tokens / tokens per verification step (the engine counts no steps)")
    return 0.0, "the engine exports no draft count, no ITL and no generated tokens"


def promql(x: Twin) -> None:
    """Low acceptance from what the engine exports (vLLM and TensorRT-LLM counters, SGLang's and
    TensorRT-LLM's gauges), over at least ``spec_min_drafts`` verification steps counted as
    :func:`verification_steps` counts them (the recorded ``spec_drafts``)."""
    r, t, e = x.recorded, x.t, x.engine
    if r.get("spec_accept_length") is None:
        return
    # both branches carry the mean tokens per verification step, the alert's {{ $value }}; an engine
    # without a length has no step count to gate on either (verification_steps needs it), so no alert
    length, rate = r["spec_accept_length"], r.get("spec_accept_rate")
    low = f"{length} <= {num(t.spec_accept_length)}"
    if rate is not None:
        low = f"({low}) or ({length} and ({rate} <= {num(t.spec_accept_rate)}))"
    expr = x.and_(f"({low})", f"{r['spec_drafts']} >= {num(t.spec_min_drafts)}")
    x.add("warning", expr, f"Speculative decoding is ineffective on {e.title}",
          f"{e.who()}: a verification step emitted {{{{ $value | printf \"%.2f\" }}}} tokens on average over the last "
          f"{x.w} (at most {human.given(t.spec_accept_length)}, or at most {human_share(t.spec_accept_rate)} of draft "
          f"tokens accepted).")
    x.add("critical", x.and_(f"{length} <= {num(t.spec_critical_accept_length)}",
                             f"{r['spec_drafts']} >= {num(t.spec_min_drafts)}"),
          f"Speculative drafts are almost never accepted on {e.title}",
          f"{e.who()}: a verification step emitted {{{{ $value | printf \"%.2f\" }}}} tokens on average over the last "
          f"{x.w} (at most {human.given(t.spec_critical_accept_length)}).")


RULE = Rule("speculation_ineffective", evaluate, precedence=48, colour="light-blue", promql=promql,
            causes=("bandwidth_bound",))
