"""Build real-format engine /metrics pages for tests with prometheus_client itself.

vLLM exposes its metrics through prometheus_client, so a page generated here has the
same names, bucket rendering (``le="1.0"``), ``_created`` samples and ordering.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
VLLM_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)


class VllmPage:
    """A mutable vLLM engine state; ``render()`` returns the /metrics page bytes."""

    def __init__(self, model: str = "m", engines: Iterable[str] = ("0",)) -> None:
        self.model = model
        self.engines = tuple(engines)
        self.restart()

    def restart(self) -> None:
        """A fresh process: every counter and histogram starts again from zero."""
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", labels, buckets=VLLM_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", labels, buckets=VLLM_ITL_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "queue", labels, buckets=VLLM_REQUEST_BUCKETS,
                               registry=r)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "prefill", labels,
                                 buckets=VLLM_REQUEST_BUCKETS, registry=r)
        self.running = Gauge("vllm:num_requests_running", "running", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=r)
        self.generation = Counter("vllm:generation_tokens", "tokens", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", labels, registry=r)
        for engine in self.engines:
            for metric in (self.ttft, self.itl, self.queue, self.prefill, self.running, self.waiting, self.kv,
                           self.generation, self.preemptions):
                metric.labels(self.model, engine)

    def observe(self, ttft: Iterable[float] = (), itl: Iterable[float] = (), engine: str = "0") -> None:
        for value in ttft:
            self.ttft.labels(self.model, engine).observe(value)
            self.queue.labels(self.model, engine).observe(value / 2)
            self.prefill.labels(self.model, engine).observe(value / 2)
        for value in itl:
            self.itl.labels(self.model, engine).observe(value)
            self.generation.labels(self.model, engine).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
