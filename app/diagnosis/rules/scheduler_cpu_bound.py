"""scheduler_cpu_bound — the GPU waits between steps for the scheduler's own CPU work.

Symptom: the engine has work and its scheduler process is on its CPU, yet the GPU runs no forward
pass for a large share of that time: receiving and handling requests, building batches, grammar
masks, processing results and streaming output take longer than the GPU's step, so the scheduler
sets the pace. ITL and TTFT grow while the GPU idles. Typical: a small model on a fast GPU, many
short requests, structured outputs, the overlap scheduler turned off, a container short of CPU.
Why it matters: more or faster GPUs do not help; the fix is the scheduler's work per step and the
CPU it gets.

Read as shares of the scheduler loop's wall time over the window (ratios of rates, so any number of
ranks): busy = loop - idle, CPU per loop second, GPU idle = 1 - forward-pass time / busy time.
SGLang's loop polls without sleeping, so its CPU share is ~1 whenever it runs; a share well below
``scheduler_cpu_share`` means the process does not get its core or waits on something else, and the
rule stays quiet. The GPU's forward time is measured only with ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``:
without it, when the rest holds, the regime is not judged (never "healthy" by omission).
Checked: sglang 0.5.23 (wheel) sglang/srt/observability/metrics_collector.py and
managers/scheduler_components/metrics_reporter.py: ``sglang:scheduler_stage_seconds_total{category,
forward_overlap}``, ``sglang:scheduler_idle_seconds_total``, ``sglang:scheduler_process_cpu_seconds_total``,
``sglang:forward_execution_seconds_total{category}``, counters in seconds, labels model_name, engine_type,
tp_rank, pp_rank, moe_ep_rank[, dp_rank]; flags in sglang/srt/arg_groups/fields/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core import human
from app.core.thresholds import Thresholds
from app.diagnosis.findings import Finding
from app.diagnosis.rules.base import NotJudged, Rule, check, confidence, info, quantile_info
from app.diagnosis.signals import Signals
from app.promql.text import human_share, num

if TYPE_CHECKING:
    from app.diagnosis.rules.base import Twin

NO_GPU_TIME = ("the scheduler had work and used its CPU, but the page has no GPU forward time to tell a "
               "scheduler-paced engine from a GPU-bound one: start SGLang with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 "
               "(sglang:forward_execution_seconds_total)")


def evaluate(s: Signals, t: Thresholds) -> Finding | None:
    if s.scheduler_busy_share is None and s.scheduler_cpu_share is None:
        return None  # no scheduler time accounting on this page (SGLang before 0.5.20, other engines)
    conditions = [
        check("scheduler busy share", s.scheduler_busy_share, ">=", t.scheduler_busy_share, "ratio",
              "share of the scheduler loop's time with runnable or queued work"),
        check("scheduler CPU per loop second", s.scheduler_cpu_share, ">=", t.scheduler_cpu_share, "ratio",
              "CPU-seconds of the scheduler process per second of its loop"),
    ]
    if not all(c.met for c in conditions):
        return None
    if s.gpu_idle_share is None:
        raise NotJudged(NO_GPU_TIME)
    idle = check("GPU idle share of the busy time", s.gpu_idle_share, ">=", t.scheduler_gpu_idle_share, "ratio",
                 "1 - GPU forward-pass time / the scheduler's busy time")
    if not idle.met:
        return None
    conditions.insert(0, idle)
    evidence = conditions + [
        info("ITL mean", s.itl.mean if s.itl else None, "s"),
        quantile_info("TTFT p99", s.ttft, "p99"),
        info("running requests (mean)", s.running_mean),
        info("requests per second", s.requests_per_second),
        info("queue share of TTFT", s.queue_share, "ratio"),
    ]
    small_batch = (s.running_mean or 0.0) <= t.low_batch_running
    # Only SGLang exports the scheduler's time: the remedies are its flags (0.5.23 names).
    sglang = [
        "Keep the overlap scheduler on (no --disable-overlap-schedule): it builds the next batch on the CPU while "
        "the GPU runs the current one.",
        "Schedule less often: --num-continuous-decode-steps N (e.g. 4) runs N decode steps per scheduling round"
        + (" - with few requests running, the per-step cost is mostly fixed" if small_batch else "")
        + "; --scheduler-recv-interval N polls for new requests every N loop iterations.",
        "Stream in larger chunks: --stream-interval N (tokens per streamed chunk, default 1) cuts the output work "
        "of every step.",
        "Structured outputs: --grammar-backend xgrammar, the fastest of SGLang's grammar backends.",
        "Give the scheduler process a fast core of its own: a container CPU limit throttles its loop, and other busy "
        "processes on the host take its time; with data parallelism (--dp-size N) each rank has a scheduler of its "
        "own.",
    ]
    severity = "critical" if s.gpu_idle_share >= t.scheduler_critical_gpu_idle_share else "warning"
    return Finding(
        "scheduler_cpu_bound", severity, confidence(conditions, s.ttft.count if s.ttft else 0, 4 * t.min_requests),
        f"The GPU is idle {s.gpu_idle_share:.0%} of the time the scheduler has work, while the scheduler process "
        f"uses {s.scheduler_cpu_share:.2f} CPU-seconds per second: its own CPU work per step sets the pace.",
        evidence, sglang,
    )


def promql(x: Twin) -> None:
    """Warning at ``scheduler_gpu_idle_share``, critical at ``scheduler_critical_gpu_idle_share``."""
    r, t, e = x.recorded, x.t, x.engine

    def expr(idle: float) -> str:
        return x.and_(f"{r['gpu_idle_share']} >= {num(idle)}",
                      f"{r['scheduler_cpu_share']} >= {num(t.scheduler_cpu_share)}",
                      f"{r['scheduler_busy_share']} >= {num(t.scheduler_busy_share)}", x.gate)

    text = (f"{e.who()}: the GPU ran no forward pass for {{{{ $value | humanizePercentage }}}} of the time its "
            f"scheduler had work over the last {x.w} (at least {{min}}), while the scheduler process used at least "
            f"{human.given(t.scheduler_cpu_share)} CPU-seconds per second: the scheduler's CPU work sets the pace.")
    for severity, idle in (("warning", t.scheduler_gpu_idle_share), ("critical", t.scheduler_critical_gpu_idle_share)):
        x.add(severity, expr(idle), f"The scheduler's CPU work sets the pace on {e.title}",
              text.replace("{min}", human_share(idle)))


RULE = Rule("scheduler_cpu_bound", evaluate, precedence=15, colour="light-purple", promql=promql,
            causes=("queueing", "bandwidth_bound", "weights_offloaded"))
