"""frontend_bound — the API server's preprocessing (chat template, tokenization, multimodal
inputs) is a large part of TTFT.

Symptom: TTFT is high while the engine neither queues nor prefills for long: the time goes
before the engine sees the request, in the front end rendering it. vLLM 0.34 measures this
as ``vllm:request_render_duration_seconds``; TTFT starts at the same arrival, so the render
share of TTFT is what clients wait for the front end. Typical causes: one API-server process
(Python, one core) tokenizing long prompts or decoding images for many concurrent clients,
an expensive chat template, or a slow tokenizer (no fast tokenizer). Why it matters: more
GPUs do not help; the fix is front-end CPU and parallelism.

Read as means (``increase(_sum)/increase(_count)``), like the other shares of TTFT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals
from app.promql.text import human_seconds, human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    if s.render is None:
        return None
    conditions = [
        check("render share of TTFT", s.render_share, ">=", t.render_share, "ratio",
              "mean render time / mean TTFT"),
        check("mean render time", s.render.mean, ">=", t.render_seconds, "s"),
    ]
    if not all(c.met for c in conditions):
        return None
    evidence = conditions + [
        info("render p99", s.render.p99, "s"),
        info("TTFT mean", s.ttft.mean if s.ttft else None, "s"),
        info("queue share of TTFT", s.queue_share, "ratio"),
        info("prefill share of TTFT", s.prefill_share, "ratio"),
        info("mean prompt length", s.prompt_tokens.mean if s.prompt_tokens else None, "tokens"),
        info("requests per second", s.requests_per_second),
    ]
    vllm = [
        "Run more API-server processes: --api-server-count N (one Python process renders every request on one "
        "core).",
        "Make sure a fast (Rust) tokenizer is used (no --tokenizer-mode slow) and the chat template is simple; "
        "pre-tokenize and send token ids (prompt_token_ids) from the client for long prompts.",
        "Move multimodal preprocessing off the hot path: resize images on the client, raise "
        "--mm-processor-cache-gb, or run the encoder on its own instances (encoder disaggregation).",
    ]
    sglang = [
        "Raise --tokenizer-worker-num (tokenization in several processes).",
        "Pre-tokenize on the client (input_ids) and resize images before sending.",
    ]
    tgi = ["Raise --tokenizer-workers (or the router's validation workers) and pre-tokenize long prompts."]
    critical = s.render.mean is not None and s.render.mean >= t.render_critical_factor * t.render_seconds
    severity = "critical" if critical else "warning"
    return Finding("frontend_bound", severity, confidence(conditions, s.render.count, 4 * t.min_requests),
                   f"Requests spend {s.render.mean:.3f} s being rendered (chat template, tokenization, "
                   f"preprocessing) before the engine sees them, {s.render_share:.0%} of TTFT.",
                   evidence, remedies(s.engine, vllm, tgi, sglang))


def promql(x: Twin) -> None:
    r, t, e = x.recorded, x.t, x.engine
    if r.get("render_mean") is None:
        return

    def expr(min_render: float) -> str:
        return x.and_(f"{r['render_mean']} >= {num(min_render)}", f"{r['render_share']} >= {num(t.render_share)}",
                      x.gate)

    for severity, min_render in (("warning", t.render_seconds), ("critical", t.render_critical_factor
                                                                 * t.render_seconds)):
        x.add(severity, expr(min_render), f"The front end dominates TTFT on {e.title}",
              f"{e.who()}: rendering a request (chat template, tokenization, preprocessing) takes "
              f"{{{{ $value | humanizeDuration }}}} on average over the last {x.w} (at least "
              f"{human_seconds(min_render)}), at least {human_share(t.render_share)} of mean TTFT.")


RULE = Rule("frontend_bound", evaluate, precedence=47, colour="dark-yellow", promql=promql)
