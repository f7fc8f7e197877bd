"""Windows' facts built by hand for the attribution's unit tests: every number chosen, none read."""

from __future__ import annotations

from app.attribution.measures import Facts
from app.latency import WindowSummary
from app.window import ItlInterval


def summary(mean: float | None, count: float = 600.0, p99: float | None = None,
            p99_bucket: tuple[float, float] | None = None) -> WindowSummary:
    intervals = {"p99": p99_bucket} if p99_bucket is not None else {}
    return WindowSummary(None, None, None, p99, mean, count, intervals)


def facts(start: float = 0.0, end: float = 600.0, *, ttft: float | None = 0.07, queue: float | None = 0.01,
          prefill: float | None = 0.05, itl: float | None = 0.0126, e2e: float | None = 2.4,
          decode: float | None = 2.3, rate: float | None = 3.0, prompt: float | None = 300.0,
          output: float | None = 180.0, hit: float | None = 0.3, running: float | None = 7.0,
          running_max: float | None = 14.0, waiting: float | None = 0.0, intervals: tuple[ItlInterval, ...] = (),
          scrapes: int = 120, replicas: tuple[str, ...] = (), restarts: int | None = 0,
          running_last: float | None = None, waiting_last: float | None = None,
          p99: dict[str, float] | None = None, **more: float) -> Facts:
    means = {"ttft": ttft, "queue_time": queue, "prefill_time": prefill, "itl": itl, "e2e": e2e,
             "decode_time": decode, **more}
    p99 = p99 or {}
    summaries = {name: summary(mean, p99=p99.get(name)) for name, mean in means.items() if mean is not None}
    return Facts(start, end, summaries, rate, prompt, output, hit, running, running_max, waiting,
                 running if running_last is None else running_last, waiting if waiting_last is None else waiting_last,
                 intervals, restarts, replicas, scrapes)


def steady_parts(start: float = 0.0, end: float = 600.0, n: int = 6, spread: float = 0.02, **kw) -> list[Facts]:
    """``n`` sub-windows of a baseline whose numbers wobble by +-``spread`` around ``facts(**kw)``'s."""
    out = []
    width = (end - start) / n
    base = facts(**kw)
    for i in range(n):
        wobble = 1.0 + spread * (1 if i % 2 else -1) * (1 + i % 3) / 3
        scaled = {name: base.mean(name) * wobble for name in ("ttft", "queue_time", "prefill_time", "itl", "e2e",
                                                               "decode_time") if base.mean(name) is not None}
        out.append(facts(start + i * width, start + (i + 1) * width, ttft=scaled.get("ttft"),
                         queue=scaled.get("queue_time"), prefill=scaled.get("prefill_time"), itl=scaled.get("itl"),
                         e2e=scaled.get("e2e"), decode=scaled.get("decode_time"),
                         rate=None if base.request_rate is None else base.request_rate * wobble,
                         prompt=None if base.prompt_mean is None else base.prompt_mean * wobble,
                         output=None if base.output_mean is None else base.output_mean * wobble,
                         hit=None if base.hit_rate is None else base.hit_rate * wobble,
                         running=None if base.running_mean is None else base.running_mean * wobble,
                         scrapes=20, **{k: v for k, v in kw.items() if k in ("running_max", "waiting", "replicas")}))
    return out
