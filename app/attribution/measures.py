"""What the attribution reads of one window: the exact mean of every latency component and the
value of every driver (load, workload, batch, capacity, replicas), from a :class:`TargetWindow`.

Means are ``increase(_sum) / increase(_count)``, exact whatever the buckets; quantiles keep the
bucket that holds them (:func:`app.latency.summarize_histograms`). Nothing here compares two
windows: :mod:`app.attribution.algebra` and :mod:`app.attribution.drivers` do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app import latency
from app.latency import WindowSummary
from app.window import ItlInterval, ModelWindow, TargetWindow

#: The histograms an attribution reads: the latency signals, their components and the workload.
ATTRIBUTION_HISTOGRAMS = ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time",
                          "kv_transfer_time", "render_time", "prompt_tokens", "generation_tokens")
#: Waiting requests at which an engine is at its capacity: requests wait for a slot, so the running
#: batch is as large as the engine makes it (the queueing rule's ``queue_waiting``).
SATURATED_WAITING = 1.0


@dataclass(frozen=True, slots=True)
class Facts:
    """One window's numbers, for one model or all of them."""

    start: float
    end: float
    summaries: dict[str, WindowSummary] = field(default_factory=dict)
    request_rate: float | None = None      # requests finished per second
    prompt_mean: float | None = None       # tokens per request
    output_mean: float | None = None
    hit_rate: float | None = None          # prefix-cache hits / queries (tokens)
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    running_last: float | None = None      # at the window's last sample
    waiting_last: float | None = None
    intervals: tuple[ItlInterval, ...] = ()  # ITL between scrapes next to the running batch
    restarts: int | None = None            # counter resets in the window (None: not read)
    replicas: tuple[str, ...] = ()         # a service's replicas up in the window (scraped), busy or idle
    scrapes: int = 0
    decode_worker: bool = False            # a P/D decode worker: its queue is the decode side's

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def mean(self, signal: str) -> float | None:
        summary = self.summaries.get(signal)
        return None if summary is None else summary.mean

    @property
    def uncached_prompt(self) -> float | None:
        """Prompt tokens per request the engine computes: those the prefix cache did not hold."""
        if self.prompt_mean is None:
            return None
        return self.prompt_mean * (1.0 - (self.hit_rate or 0.0))

    @property
    def arrival_rate(self) -> float | None:
        """Requests arriving per second: those finished plus the growth of the requests in the engine
        (``2 x (last - mean) / window``, a linear ramp's; capacity.py's estimate). While requests
        queue, the finished ones are the engine's service rate, not the load."""
        if self.request_rate is None or self.running_last is None or self.running_mean is None \
                or self.seconds <= 0:
            return self.request_rate
        last = self.running_last + (self.waiting_last or 0.0)
        mean = self.running_mean + (self.waiting_mean or 0.0)
        return max(0.0, self.request_rate + 2.0 * (last - mean) / self.seconds)

    @property
    def saturated(self) -> bool:
        """Requests waited for a slot at the window's end: the batch was then as large as the engine
        makes it (its running requests there are its limit)."""
        return (self.waiting_last or 0.0) >= SATURATED_WAITING

    @property
    def service_time(self) -> float | None:
        """Mean time a request holds a slot: end-to-end less its queue wait."""
        e2e, queue = self.mean("e2e"), self.mean("queue_time")
        if e2e is None:
            return None
        return e2e - (queue or 0.0)


def _request_rate(m: ModelWindow, summaries: dict[str, WindowSummary], seconds: float) -> float | None:
    """Finished requests per second: the engine's request counter, else a histogram's count."""
    if m.rates.get("requests_total") is not None:
        return m.rates["requests_total"]
    for signal in ("e2e", "ttft"):
        summary = summaries.get(signal)
        if summary is not None and seconds > 0:
            return summary.count / seconds
    return None


def _token_mean(summaries: dict[str, WindowSummary], histogram: str, m: ModelWindow, counter: str,
                rate: float | None) -> float | None:
    """A length histogram's exact mean, else the token counter over the finished requests."""
    mean = summaries[histogram].mean if histogram in summaries else None
    if mean is not None:
        return mean
    tokens = m.rates.get(counter)
    return tokens / rate if tokens is not None and rate else None


def _up(replicas: dict[str, TargetWindow]) -> tuple[str, ...]:
    """A service's replicas scraped in at least half the scrapes its most-scraped replica had in
    the window: part of the service whether or not a request came (at low traffic a replica often
    serves none in a 30 s round, which is no change of the set); a replica whose pod went away
    has only the scrape at the window's start (range selectors include it) or none."""
    most = max((w.scrapes for w in replicas.values()), default=0)
    return tuple(sorted(name for name, w in replicas.items() if w.scrapes > 0 and 2 * w.scrapes >= most))


def facts_of(window: TargetWindow, model: str | None = None) -> Facts:
    """The facts of ``window``: all its models summed (``model`` None), or one model's."""
    m = window.overall if model is None else window.models.get(model, ModelWindow())
    summaries = latency.summarize_histograms(m.histograms)
    rate = _request_rate(m, summaries, window.seconds)
    queries, hits = m.rates.get("prefix_cache_queries_total"), m.rates.get("prefix_cache_hits_total")
    # an engine that counts cache queries and made none while it served requests hit nothing (vLLM
    # with prefix caching off keeps the counters and leaves them still)
    hit_rate = (hits or 0.0) / queries if queries else 0.0 if queries is not None and rate else None
    running, waiting = m.gauges.get("running"), m.gauges.get("waiting")
    intervals = tuple(m.itl_intervals) if model is not None else \
        tuple(i for one in window.models.values() for i in one.itl_intervals)
    present = {*m.histograms, *m.rates}
    role = latency.pd_role(window.infos, present, "", model)
    return Facts(
        window.start, window.end, summaries, rate,
        _token_mean(summaries, "prompt_tokens", m, "prompt_tokens_total", rate),
        _token_mean(summaries, "generation_tokens", m, "generation_tokens_total", rate),
        hit_rate, running.mean if running else None, running.max if running else None,
        waiting.mean if waiting else None, running.last if running else None, waiting.last if waiting else None,
        intervals, window.restarts,
        _up(window.replicas), window.scrapes,
        role is not None and role.role == "decode")
