"""outside_engine — clients wait for the first token much longer than the engine records.

Symptom: the TTFT a client-side probe (canary or ad hoc probe) measures is well above the
engine's own TTFT histogram over the same periods; the gap itself is the finding. The
engine's clock starts when the request reaches it; everything before that — network, TLS,
a gateway or load balancer, the API server's tokenization — is invisible to every other
rule. Why it matters: no engine flag fixes it; tuning the engine for a TTFT problem that
lives in the gateway changes nothing the user sees.

The numbers come from :func:`app.probe.consistency.period_consistency` (each probe run
against the engine over the scrapes that bracket it); the rule is quiet without probe
data, with too few probe requests, and when the comparison is unreliable (other traffic
on a queueing engine: one probe's queue wait varies more than the gap).
"""

from __future__ import annotations

from app.core.durations import format_utc
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import Rule, check, confidence, info, remedies
from app.diagnosis.signals import Signals


def _utc(ts: float | None) -> str:
    return "?" if ts is None else format_utc(ts)


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    c = s.probe_consistency
    if c is None or c.status == "unreliable" or c.gap_seconds is None or c.gap_share is None:
        return None
    conditions = [
        check("client TTFT - engine TTFT", c.gap_seconds, ">=", t.outside_gap_seconds, "s",
              "means over the same periods"),
        check("share of client TTFT outside the engine", c.gap_share, ">=", t.outside_gap_share, "%"),
        check("probe requests compared", c.client_requests, ">=", t.outside_min_requests, "",
              "preflight included"),
    ]
    if not all(e.met for e in conditions):
        return None
    runs = ", ".join(str(r) for r in c.runs)
    evidence = conditions + [
        info("client TTFT mean (probes)", c.client_mean, "s"),
        info("engine TTFT mean, same periods", c.server_mean, "s"),
        info("engine queue time mean, same periods", c.server_queue_mean, "s"),
        info("engine requests in those periods", c.server_requests, "",
             "other traffic mixed in" if c.other_traffic else "the probes' own"),
        info("compared period", f"{_utc(c.probe_start)} .. {_utc(c.probe_end)}", "",
             f"probe run(s) {runs}; engine snapshots {_utc(c.window_start)} .. {_utc(c.window_end)}"),
    ]
    common = [
        "Probe the engine's own port (llm-latency probe http://<engine-host>:<port>) and the public URL: "
        "the difference is the gateway/load balancer; check its buffering of streamed responses (nginx: "
        "proxy_buffering off), connection limits, auth or rate-limit plugins and TLS termination load.",
        "Check the network path between clients and the engine: round-trip time (cross-zone or cross-region "
        "hops), DNS, and TLS handshakes on new connections (clients should keep connections alive).",
    ]
    vllm = [
        "Check the CPU of vLLM's API server process: tokenization and detokenization run there, not on the GPU; "
        "a saturated core delays every first token (more CPU for the container, --api-server-count > 1).",
        *common,
    ]
    tgi = [
        "Check the CPU of TGI's router: it tokenizes and validates every request before the queue "
        "(raise --validation-workers, give the container more CPU).",
        *common,
    ]
    sglang = [
        "Check the CPU of SGLang's tokenizer manager (the HTTP server process): tokenization runs there, "
        "not on the GPU; give the container more CPU.",
        *common,
    ]
    trtllm = [
        "Check the CPU of trtllm-serve's OpenAI server process: tokenization and detokenization run there, not "
        "on the GPU; --num_postprocess_workers N moves response post-processing into worker processes, and the "
        "container needs the cores for them.",
        *common,
    ]
    return Finding(
        "outside_engine", "warning", confidence(conditions, c.client_requests, 4 * t.outside_min_requests),
        f"Clients wait {c.gap_seconds:.2f} s longer for the first token than the engine records "
        f"({c.gap_share:.0%} of their {c.client_mean:.2f} s TTFT, {c.client_requests} probe requests): "
        "the time is lost outside the engine.",
        evidence, remedies(s.engine, vllm, tgi, sglang, trtllm),
    )


RULE = Rule("outside_engine", evaluate, precedence=90, colour="dark-blue", from_probes=True, promql=None,
            no_promql="it compares client-side probe TTFT with the engine's; Prometheus sees only the engine's "
                      "metrics (the service's own alerts carry it)")
