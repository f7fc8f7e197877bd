"""The numbers the regime rules look at, computed per target and model over a window.

Everything comes from stored snapshots through the same Prometheus-identical math as
the latency API (:mod:`app.latency`). Means are ``increase(_sum)/increase(_count)``,
which stay exact even where vLLM's buckets are coarse (request-phase histograms have
no bucket below 300 ms), so shares of TTFT are computed from means, not quantiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app import latency
from app.core import human, quantiles
from app.core.quantiles import LatencySummary, WindowHistogram
from app.diagnosis.findings import field_names, plain_json
from app.diagnosis.profile import PREFILL_MFU, HardwareProfile
from app.diagnosis.step_budget import StepBudget
from app.diagnosis.step_budget import infer as infer_step_budget
from app.probe.canary import ProbeBaseline
from app.probe.consistency import ConsistencyResult
from app.sources.base import CanonicalInfo
from app.store.models import Target
from app.window import ItlInterval, ModelWindow, TargetWindow
from app.windows import default_windows

DIAGNOSIS_HISTOGRAMS = ("ttft", "itl", "tpot", "queue_time", "prefill_time", "decode_time", "e2e", "prompt_tokens",
                        "generation_tokens", "iteration_tokens", "kv_transfer_time", "kv_wait_time", "prealloc_time",
                        "kv_alloc_time", "render_time")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica of a service over the window, for the comparison between replicas."""

    target: str
    running_mean: float
    waiting_mean: float
    requests_per_second: float | None
    ttft_mean: float | None
    queue_mean: float | None

    @property
    def load(self) -> float:
        """Requests in the replica: running + waiting."""
        return self.running_mean + self.waiting_mean


@dataclass(slots=True)
class Signals:
    target: str
    model: str
    engine: str
    window_start: float
    window_end: float
    scrapes: int = 0
    ttft: LatencySummary | None = None
    ttft_derived: bool = False
    itl: LatencySummary | None = None
    tpot: LatencySummary | None = None        # per-request time per output token (trtllm-serve's only decode time)
    queue_time: LatencySummary | None = None
    prefill_time: LatencySummary | None = None
    e2e: LatencySummary | None = None
    prompt_tokens: LatencySummary | None = None
    generation_tokens: LatencySummary | None = None
    queue_share: float | None = None          # mean queue / mean TTFT, bounded to [0, 1] (see share_notes)
    queue_mean_estimated: float | None = None  # no queue histogram: mean waiting / first tokens per second
    queue_mean_from_ttft: float | None = None  # no queue histogram: mean TTFT - expected prefill (prefill_expected)
    prefill_expected: float | None = None     # the engine's prefill histogram mean, else the hardware profile's
    queue_estimates_ratio: float | None = None  # the larger of the two queue estimates over the smaller
    prefill_share: float | None = None        # mean prefill / mean TTFT, bounded to [0, 1]
    share_notes: dict[str, str] = field(default_factory=dict)  # share -> why its raw ratio was bounded
    prompt_mean_counters: float | None = None  # increase(prompt_tokens_total) / finished requests
    output_mean_counters: float | None = None  # increase(generation_tokens_total) / finished requests
    finished_per_second: float | None = None  # finished requests: requests_total, else the e2e histogram's count
    first_tokens_per_second: float | None = None  # the TTFT histogram's count over the window
    #: every number derived from others (not read from one histogram or gauge) -> its inputs, in words
    derived: dict[str, str] = field(default_factory=dict)
    itl_ratio_bounds: tuple[float, float] | None = None  # p99/p50 from the edges of their buckets
    prefill_per_request: float | None = None  # seconds of prefill a request waits for its first token
    ttft_per_1k_prompt_tokens: float | None = None
    itl_ratio: float | None = None            # p99 / p50
    decode_stall_share: float | None = None   # share of decode time spent stalled (see _stall_share)
    itl_low_batch: float | None = None        # mean ITL over scrape intervals with a small running batch
    itl_low_batch_running: float | None = None
    itl_by_batch: list[dict] = field(default_factory=list)
    max_step_tokens: float | None = None      # upper bound of the largest iteration_tokens bucket used
    large_step_fraction: float | None = None  # engine steps above 512 tokens
    step_budget: StepBudget | None = None     # chunked prefill and the per-step token budget, inferred
    running_mean: float | None = None
    running_max: float | None = None
    running_last: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    waiting_last: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    prealloc_queue_mean: float | None = None  # P/D decode worker: requests waiting for KV memory (SGLang)
    transfer_queue_mean: float | None = None  # ... requests whose KV is on its way
    kv_alloc_mean: float | None = None        # ... mean wait for KV memory per request (SGLang kv_transfer_alloc_ms)
    preemptions_per_second: float | None = None
    prefix_cache_hit_rate: float | None = None
    requests_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    config: dict[str, str] = field(default_factory=dict)
    hardware: str | None = None
    gpu: str | None = None                    # the hardware profile's GPU preset (remedies that fit it)
    weight_dtype: str | None = None           # the hardware profile's weight dtype
    decode_floor_seconds: float | None = None
    itl_over_floor: float | None = None       # small-batch ITL (or mean ITL) / floor
    replicas: list[ReplicaLoad] = field(default_factory=list)  # a service's replicas, busiest first
    # P/D disaggregation: KV-cache transfers between prefill and decode workers
    pd_role: str | None = None                # "prefill" | "decode" | "both" (latency.pd_role)
    pd_role_source: str | None = None         # what said so: engine configuration, target label or metrics
    kv_transfer: LatencySummary | None = None  # this worker's transfer-time histogram
    kv_transfer_mean: float | None = None     # the transfer term: this worker's histogram or pd_split's
    kv_transfer_source: str | None = None     # what kv_transfer_mean was read from
    kv_transfer_share: float | None = None    # kv_transfer_mean / mean TTFT (bounded to 1)
    kv_wait_bound: float | None = None        # no transfer term, only the decode worker's KV wait: an upper bound
    pd_split: dict = field(default_factory=dict)  # a decode worker's TTFT terms (latency.pd_terms)
    pd_prefill_targets: list[str] = field(default_factory=list)  # its paired prefill worker(s)
    kv_transfers_per_second: float | None = None
    kv_transfer_failures_per_second: float | None = None
    kv_transfer_failure_share: float | None = None  # failed / (failed + completed) transfers
    # speculative decoding
    spec_drafts: float | None = None          # verification steps with a draft in the window
    spec_accept_rate: float | None = None     # accepted / proposed draft tokens
    spec_accept_length: float | None = None   # tokens per verification step: 1 + accepted / drafts
    spec_draft_length: float | None = None    # proposed draft tokens per draft (num_speculative_tokens)
    # front end: chat template, tokenization, multimodal preprocessing
    render: LatencySummary | None = None
    render_share: float | None = None         # mean render / mean TTFT (bounded to 1)
    # data-parallel ranks of this engine (more than one), busiest first
    ranks: list[ReplicaLoad] = field(default_factory=list)
    rank_kv_usage: dict[str, float] = field(default_factory=dict)  # rank -> mean KV usage
    dp_token_imbalance_ratio: float | None = None  # the engine's own (SGLang DP attention), mean over the window
    # LoRA adapter slots (vLLM lora_requests_info), over the window's scrapes
    lora_slots: float | None = None            # max_lora, the largest seen
    lora_demand_mean: float | None = None      # adapters with requests in flight (running or waiting)
    lora_demand_max: float | None = None
    lora_slot_wait_share: float | None = None  # share of scrapes with more adapters in demand than slots
    # the scheduler's own time (SGLang 0.5.20+), shares of its loop's wall time over the window
    scheduler_cpu_share: float | None = None   # CPU-seconds of the scheduler process per second of its loop
    scheduler_busy_share: float | None = None  # share of the loop with runnable or queued work
    gpu_idle_share: float | None = None        # share of that busy time without a forward pass on the GPU
    probe_baseline: ProbeBaseline | None = None  # latest client-side single-request probe (canary), if any
    probe_consistency: ConsistencyResult | None = None  # client vs. engine TTFT over recent probe runs

    @property
    def window_seconds(self) -> float:
        return self.window_end - self.window_start

    @property
    def prompt_mean(self) -> float | None:
        """Mean prompt length from the most exact source the page has: the prompt-length
        histogram's ``_sum/_count``, else the token counter over the finished requests (:func:`_token_means`)."""
        if self.prompt_tokens is not None and self.prompt_tokens.mean is not None:
            return self.prompt_tokens.mean
        return self.prompt_mean_counters

    @property
    def prompt_mean_source(self) -> str | None:
        if self.prompt_tokens is not None and self.prompt_tokens.mean is not None:
            return "prompt-length histogram (_sum / _count)"
        if self.prompt_mean_counters is not None:
            return self.derived.get("prompt_mean_counters", "the prompt-token counter over the finished requests")
        return None

    @property
    def output_mean(self) -> float | None:
        """Mean output length: the output-length histogram's ``_sum/_count``, else the generated-token
        counter over the finished requests (:func:`_token_means`)."""
        if self.generation_tokens is not None and self.generation_tokens.mean is not None:
            return self.generation_tokens.mean
        return self.output_mean_counters

    @property
    def output_mean_source(self) -> str | None:
        if self.generation_tokens is not None and self.generation_tokens.mean is not None:
            return "output-length histogram (_sum / _count)"
        return self.derived.get("output_mean_counters")

    @property
    def decode_mean(self) -> tuple[float | None, str]:
        """The decode time per token the page gives, and its name: the per-step ITL (at a small batch
        when known, see :attr:`itl_typical`), else the per-request TPOT (trtllm-serve has no ITL)."""
        if self.itl is not None and self.itl.mean is not None:
            return self.itl_typical, self.itl_typical_name
        if self.tpot is not None and self.tpot.mean is not None:
            return self.tpot.mean, "TPOT mean (per request; no per-step ITL)"
        return None, "ITL"

    @property
    def itl_typical(self) -> float | None:
        """A typical decode step, exactly: the mean ITL over small-batch scrape intervals when
        there are enough of them, else the window's mean ITL (``_sum/_count``). Not the p50:
        vLLM's ITL buckets are coarse (25-50 ms), and a p50 interpolated to 37.5 ms inside one
        can sit on the other side of a threshold from the exact 28 ms mean."""
        if self.itl_low_batch is not None:
            return self.itl_low_batch
        return self.itl.mean if self.itl is not None else None

    @property
    def itl_typical_name(self) -> str:
        return "ITL at small batch (mean)" if self.itl_low_batch is not None else "ITL mean"

    def to_dict(self) -> dict:
        """The JSON form (stored with each diagnosis): an infinite bucket edge (+Inf) becomes null."""
        values = {name: getattr(self, name) for name in field_names(type(self))}
        return {k: plain_json(v) for k, v in values.items() if v not in (None, [], {})}


def _mean(h: LatencySummary | None) -> float | None:
    return None if h is None else h.mean


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _bounded_share(s: Signals, name: str, part: float | None, whole: float | None) -> float | None:
    """``part / whole`` of two means, bounded to [0, 1].

    The two means come from different request sets: vLLM observes a request's queue time
    when it is scheduled and its TTFT when its first token leaves, so in a window a request
    can count in one histogram and not yet (or no longer) in the other, and mean queue can
    exceed mean TTFT ("101 % of TTFT"). A share above 1 (or below 0) cannot be true of any one
    request; it is bounded, and the raw ratio is kept in ``share_notes`` with the reason.
    """
    raw = _ratio(part, whole)
    if raw is None or 0.0 <= raw <= 1.0:
        return raw
    bounded = min(1.0, max(0.0, raw))
    s.share_notes[name] = (f"raw ratio {raw:.3f} bounded to {bounded:.0%}: the two means are over different "
                           "requests of the window (a request is counted in one histogram when it is scheduled, "
                           "in the other when its first token leaves)")
    return bounded


def _token_means(s: Signals, m: ModelWindow) -> None:
    """The first-token rate (the TTFT histogram's count over the window), and the mean prompt and
    output length from the token counters over the finished requests.

    A length histogram's ``_sum/_count`` is exact for the requests it counted; an engine without
    one (SGLang 0.4, trtllm-serve) still counts prompt and generated tokens, and
    ``increase(tokens_total) / increase(finished requests)`` (= the ratio of their rates over the
    same window) is the same mean over finished requests: exact where the engine counts a
    request's tokens when it finishes (SGLang, with its e2e histogram and request counter), the
    steady-traffic mean where it counts them as they are processed (vLLM). Finished requests are
    the engine's request counter (``requests_total``: vLLM/trtllm ``request_success_total``, SGLang
    ``num_requests_total``, TGI ``tgi_request_success``), else the count of its e2e histogram
    (SGLang 0.4 has no request counter). Never a quantile: a mean is what the rules compare.
    """
    seconds = s.window_seconds
    if s.ttft is not None and s.ttft.count and seconds > 0:
        s.first_tokens_per_second = s.ttft.count / seconds
        s.derived["first_tokens_per_second"] = ("increase(queue_time _count) / window (TTFT derived)" if s.ttft_derived
                                                else "increase(ttft _count) / window")
    finished, source = m.rates.get("requests_total"), "increase(requests_total)"
    if not finished and s.e2e is not None and s.e2e.count and seconds > 0:
        finished, source = s.e2e.count / seconds, "increase(e2e _count) (the engine has no request counter)"
    if not finished:
        return
    s.finished_per_second = finished
    s.derived["finished_per_second"] = f"{source} / window"
    for counter, name in (("prompt_tokens_total", "prompt_mean_counters"),
                          ("generation_tokens_total", "output_mean_counters")):
        tokens = m.rates.get(counter)
        if tokens is not None:
            setattr(s, name, tokens / finished)
            s.derived[name] = f"increase({counter}) / {source} over the window"


def _ratio_bounds(num: LatencySummary | None, num_key: str, den: LatencySummary | None,
                  den_key: str) -> tuple[float, float] | None:
    """The range of ``num[num_key] / den[den_key]`` over every position inside their buckets."""
    if num is None or den is None:
        return None
    a, b = num.interval(num_key), den.interval(den_key)
    if a is None or b is None:
        return None
    low = a[0] / b[1] if b[1] > 0 else 0.0
    high = a[1] / b[0] if b[0] > 0 else math.inf
    return (max(low, 0.0), high)


def _largest_used_bucket(h: WindowHistogram | None) -> tuple[float | None, float | None]:
    """(upper bound of the highest bucket with observations, fraction of steps > 512 tokens)."""
    if h is None or h.count <= 0:
        return None, None
    largest = None
    previous = 0.0
    above_512 = None
    for bound, cumulative in zip(h.bounds, h.increases):
        if cumulative - previous > 1e-9:
            largest = bound
        if bound == 512.0:
            above_512 = 1.0 - cumulative / h.count if h.count else None
        previous = max(previous, cumulative)
    if largest == math.inf:
        largest = h.bounds[-2] if len(h.bounds) > 1 else None
    return largest, above_512


STALL_SECONDS = 0.2  # a gap this long between two tokens is a visible stutter


def _stall_share(engine: str, itl: WindowHistogram | None, prefill: WindowHistogram | None) -> float | None:
    """Share of the time decoding requests spent waiting in stalls.

    vLLM/SGLang record a stalled step in the ITL histogram itself: the share is the
    time in ITL buckets at or above ``STALL_SECONDS`` (bucket midpoints; the lower bound
    for +Inf) over all ITL time. TGI pauses the decode batch for every prefill batch and
    times the two separately, so there it is prefill batch time over prefill + decode
    batch time (meaningful only while something is decoding).
    """
    if itl is None or itl.count <= 0 or not itl.sum or math.isnan(itl.sum):
        return None
    if engine == "tgi":
        if prefill is None or math.isnan(prefill.sum):
            return None
        return prefill.sum / (prefill.sum + itl.sum)
    if itl.means_only:
        return None  # read means first: no buckets to find the stalls in
    stalled = 0.0
    previous_bound, previous_count = 0.0, 0.0
    for bound, cumulative in zip(itl.bounds, itl.increases):
        in_bucket = max(0.0, cumulative - previous_count)
        if previous_bound >= STALL_SECONDS and in_bucket > 0:
            stalled += in_bucket * (previous_bound if bound == math.inf else (previous_bound + bound) / 2)
        previous_bound, previous_count = bound, max(previous_count, cumulative)
    return min(1.0, stalled / itl.sum)


def compute(session: Session, target_id: int, target: str, engine: str, start: float, end: float,
            hardware: HardwareProfile | None = None) -> list[Signals]:
    """Signals for every model the target served in the window, from the built-in store."""
    window = default_windows().window(session, session.get_one(Target, target_id), start, end, DIAGNOSIS_HISTOGRAMS,
                                      diagnosis=True)
    return from_window(window, target, engine, hardware)


def from_window(window: TargetWindow, target: str, engine: str,
                hardware: HardwareProfile | None = None,
                prefill: tuple[list[str], TargetWindow] | None = None) -> list[Signals]:
    """Signals for every model of a :class:`TargetWindow`, whichever source filled it. ``prefill``:
    the prefill side paired with a P/D decode worker (its names and window, all models summed)."""
    start, end = window.start, window.end
    out = []
    for model, m in window.models.items():
        s = Signals(target, model, engine, start, end, scrapes=window.scrapes)
        merged = {sig: m.histograms.get(sig) for sig in DIAGNOSIS_HISTOGRAMS}
        found = {sig: quantiles.summarize(m.histograms[sig]) for sig in DIAGNOSIS_HISTOGRAMS
                 if sig in m.histograms}  # absent: None below
        s.ttft, s.itl, s.tpot = found.get("ttft"), found.get("itl"), found.get("tpot")
        s.queue_time, s.prefill_time = found.get("queue_time"), found.get("prefill_time")
        s.e2e, s.prompt_tokens = found.get("e2e"), found.get("prompt_tokens")
        s.generation_tokens = found.get("generation_tokens")
        queue_mean, prefill_mean = _mean(s.queue_time), _mean(s.prefill_time)
        if s.ttft is None and s.queue_time is not None and s.prefill_time is not None \
                and queue_mean is not None and prefill_mean is not None:
            # TGI: TTFT ≈ queue + prefill. Its prefill histogram is per prefill *batch*
            # (a chunk of a long prompt is one batch), so the prefill a request sees is
            # the total prefill batch time per admitted request, not the batch mean.
            s.ttft_derived = True
            if s.queue_time.count:
                prefill_mean = prefill_mean * s.prefill_time.count / s.queue_time.count
            s.ttft = LatencySummary(None, None, None, None, queue_mean + prefill_mean, s.queue_time.count)
        ttft_mean = _mean(s.ttft)
        s.queue_share = _bounded_share(s, "queue_share", queue_mean, ttft_mean)
        if prefill_mean is not None:
            s.prefill_share = _bounded_share(s, "prefill_share", prefill_mean, ttft_mean)
        s.prefill_per_request = prefill_mean
        if s.itl is not None and s.itl.p50:
            s.itl_ratio = _ratio(s.itl.p99, s.itl.p50)
            s.itl_ratio_bounds = _ratio_bounds(s.itl, "p99", s.itl, "p50")
        s.decode_stall_share = _stall_share(engine, merged["itl"], merged["prefill_time"])
        s.max_step_tokens, s.large_step_fraction = _largest_used_bucket(merged["iteration_tokens"])
        _gauges_and_rates(s, m)
        _token_means(s, m)
        if ttft_mean is not None and s.prompt_mean:
            s.ttft_per_1k_prompt_tokens = ttft_mean / (s.prompt_mean / 1000.0)
        if s.queue_time is None:
            _queue_estimates(s, hardware)
        s.step_budget = infer_step_budget(merged["iteration_tokens"], merged["prompt_tokens"], merged["itl"],
                                          merged["prefill_time"], s.running_mean, s.preemptions_per_second)
        _itl_by_batch(s, m.itl_intervals)
        s.replicas = _replicas(window, model)
        s.config = _config(window.infos, model)
        s.kv_transfer, s.render = found.get("kv_transfer_time"), found.get("render_time")
        s.kv_alloc_mean = _mean(found.get("kv_alloc_time"))
        _disaggregation(s, m, window.infos, window.seconds, prefill)
        _speculation(s, m, window.seconds)
        s.render_share = _share(_mean(s.render), ttft_mean)
        _ranks(s, m)
        _scheduler_time(s, m)
        if hardware is not None:
            s.hardware = hardware.describe()
            s.gpu, s.weight_dtype = hardware.gpu, hardware.weight_dtype
            s.decode_floor_seconds = hardware.decode_floor_seconds
            s.itl_over_floor = _ratio(s.itl_typical, s.decode_floor_seconds)
        out.append(s)
    return out


def _queue_estimates(s: Signals, hardware: HardwareProfile | None) -> None:
    """Two estimates of the mean queue time, for pages without a queue-time histogram (SGLang
    0.4.0-0.4.3), each with its inputs in ``derived``:

    * Little's law: requests waiting on average / requests leaving the queue per second (the
      first-token rate: those that got their first token in the window). Exact for a steady queue.
    * TTFT minus the expected prefill: the engine's own prefill histogram mean where it has one,
      else the hardware profile's compute time for the mean prompt
      (:meth:`HardwareProfile.prefill_seconds`). An upper bound: TTFT also holds the steps a
      prefill shares with other requests.

    ``queue_estimates_ratio`` is the larger over the smaller; the queueing rule reads both.
    """
    if s.first_tokens_per_second and s.waiting_mean is not None:
        s.queue_mean_estimated = s.waiting_mean / s.first_tokens_per_second
        s.derived["queue_mean_estimated"] = ("Little's law: mean of the waiting gauge / first tokens per second "
                                             "(increase(ttft _count) / window)")
    if s.prefill_time is not None and s.prefill_time.mean is not None:
        s.prefill_expected = s.prefill_per_request
        s.derived["prefill_expected"] = "the engine's prefill-time histogram (_sum / _count)"
    elif hardware is not None and s.prompt_mean:
        s.prefill_expected = hardware.prefill_seconds(s.prompt_mean)
        s.derived["prefill_expected"] = (f"2 x parameters x mean prompt length ({human.number(s.prompt_mean)} tokens, "
                                         f"{s.prompt_mean_source}) / FLOP/s at {PREFILL_MFU:.0%} of peak "
                                         f"({hardware.describe()})")
    ttft_mean = _mean(s.ttft)
    if s.prefill_expected is not None and ttft_mean is not None:
        s.queue_mean_from_ttft = max(0.0, ttft_mean - s.prefill_expected)
        s.derived["queue_mean_from_ttft"] = "TTFT mean (_sum / _count) - expected prefill (prefill_expected)"
    low, high = sorted((s.queue_mean_estimated or 0.0, s.queue_mean_from_ttft or 0.0))
    if s.queue_mean_estimated is not None and s.queue_mean_from_ttft is not None:
        s.queue_estimates_ratio = high / low if low > 0 else math.inf if high > 0 else 1.0
        s.derived["queue_estimates_ratio"] = "the larger of queue_mean_estimated and queue_mean_from_ttft / the smaller"


def _replicas(window: TargetWindow, model: str) -> list[ReplicaLoad]:
    """Each replica's load for this model (a service's window only), busiest first."""
    out = []
    for name, replica in sorted(window.replicas.items()):
        m = replica.models.get(model)
        if m is None or "running" not in m.gauges:
            continue
        waiting = m.gauges.get("waiting")
        ttft, queue = m.histograms.get("ttft"), m.histograms.get("queue_time")
        out.append(ReplicaLoad(name, m.gauges["running"].mean, waiting.mean if waiting else 0.0,
                               m.rates.get("requests_total"), quantiles.summarize(ttft).mean if ttft else None,
                               quantiles.summarize(queue).mean if queue else None))
    return sorted(out, key=lambda r: -r.load)


def _share(part: float | None, whole: float | None) -> float | None:
    """``part / whole`` bounded to 1: a part measured over another request set (transfers,
    renders) can exceed the TTFT mean of the requests that finished their prefill."""
    ratio = _ratio(part, whole)
    return None if ratio is None else min(1.0, ratio)


def _disaggregation(s: Signals, m: ModelWindow, infos: list[CanonicalInfo], seconds: float,
                    prefill: tuple[list[str], TargetWindow] | None) -> None:
    """The worker's P/D role, transfers and their failures; for a decode worker (or one paired with
    a prefill side) its TTFT terms (:func:`app.latency.pd_terms`, the latency API's split) and the
    transfer term among them. A decode worker whose only transfer number is its own wait for the KV
    (SGLang unpaired: the wait holds the prefill side's queue and prefill too) has that wait as an
    upper bound (``kv_wait_bound``), not as the transfer."""
    role = latency.pd_role(infos, {*m.histograms, *m.rates}, s.engine, s.model)  # the API's role too
    s.pd_role, s.pd_role_source = (role.role, role.source) if role is not None else (None, None)
    s.kv_transfer_mean = _mean(s.kv_transfer)
    s.kv_transfer_source = "this worker's transfer-time histogram" if s.kv_transfer_mean is not None else None
    if s.pd_role == "decode" or prefill is not None:
        side = latency.model_report(prefill[1].overall, prefill[1].seconds) if prefill is not None else None
        s.pd_split = latency.pd_terms(latency.model_report(m, seconds), side)
        s.pd_prefill_targets = list(prefill[0]) if prefill is not None else []
        s.kv_transfer_mean, s.kv_transfer_source = s.pd_split["kv_transfer"], s.pd_split["sources"]["kv_transfer"]
        if s.kv_transfer_mean is None:
            s.kv_wait_bound = s.pd_split["kv_wait"]
    completed = m.rates.get("kv_transfers_total")
    arrived = s.kv_transfer if s.kv_transfer is not None else quantiles.summarize(m.histograms["kv_wait_time"]) \
        if m.histograms.get("kv_wait_time") is not None else None  # SGLang's decode worker: each KV that arrived
    if completed is None and arrived is not None and seconds > 0:
        completed = arrived.count / seconds
    failed = m.rates.get("kv_transfer_failures_total")
    s.kv_transfers_per_second, s.kv_transfer_failures_per_second = completed, failed
    if failed is not None and (failed + (completed or 0.0)) > 0:
        s.kv_transfer_failure_share = failed / (failed + (completed or 0.0))
    s.kv_transfer_share = _share(s.kv_transfer_mean, _mean(s.ttft))


def _speculation(s: Signals, m: ModelWindow, seconds: float) -> None:
    """Acceptance from the counters when the engine has them (vLLM: exact over the window),
    else the engine's own gauges (SGLang), averaged over the window."""
    drafts, proposed = m.rates.get("spec_drafts_total"), m.rates.get("spec_draft_tokens_total")
    accepted = m.rates.get("spec_accepted_tokens_total")
    if drafts is not None:
        s.spec_drafts = drafts * seconds
    if proposed and accepted is not None:
        s.spec_accept_rate = accepted / proposed
    elif "spec_accept_rate" in m.gauges:
        s.spec_accept_rate = m.gauges["spec_accept_rate"].mean
    if drafts and accepted is not None:
        s.spec_accept_length = 1.0 + accepted / drafts
        s.spec_draft_length = (proposed or 0.0) / drafts or None
    elif "spec_accept_length" in m.gauges:
        s.spec_accept_length = m.gauges["spec_accept_length"].mean


def _ranks(s: Signals, m: ModelWindow) -> None:
    """Each data-parallel rank's load (running + waiting, means over the window) and mean queue
    time (its queue-time histogram's ``_sum / _count``, where the engine labels it per rank),
    busiest first."""
    loads = [ReplicaLoad(rank, g.get("running", 0.0), g.get("waiting", 0.0), None, None, g.get("queue_time"))
             for rank, g in m.ranks.items() if "running" in g]
    s.ranks = sorted(loads, key=lambda r: -r.load) if len(loads) > 1 else []
    s.rank_kv_usage = {rank: g["kv_usage"] for rank, g in m.ranks.items() if "kv_usage" in g}
    ratio = m.gauges.get("dp_token_imbalance_ratio")
    s.dp_token_imbalance_ratio = ratio.mean if ratio else None


def _scheduler_time(s: Signals, m: ModelWindow) -> None:
    """Where the scheduler's loop spent the window (SGLang 0.5.20+). Ratios of rates summed over the
    same ranks, so they hold for any number of them: CPU per loop second; the busy share (the loop's
    time minus its idle time); the GPU's idle share of that busy time (without its forward-pass
    time, exported only with SGLang's device timer, it is unknown)."""
    loop = m.rates.get("scheduler_loop_seconds_total")
    if not loop or loop <= 0:
        return
    cpu, idle = m.rates.get("scheduler_cpu_seconds_total"), m.rates.get("scheduler_idle_seconds_total")
    gpu = m.rates.get("gpu_busy_seconds_total")
    if cpu is not None:
        s.scheduler_cpu_share = cpu / loop
    busy = loop - min(idle or 0.0, loop)
    if idle is not None:
        s.scheduler_busy_share = busy / loop
    if gpu is not None and busy > 0:
        s.gpu_idle_share = max(0.0, 1.0 - gpu / busy)


def _gauges_and_rates(s: Signals, m: ModelWindow) -> None:
    def gauge(signal: str) -> tuple[float | None, float | None, float | None]:
        g = m.gauges.get(signal)
        return (None, None, None) if g is None else (g.mean, g.max, g.last)
    s.running_mean, s.running_max, s.running_last = gauge("running")
    s.waiting_mean, s.waiting_max, s.waiting_last = gauge("waiting")
    s.kv_usage_mean, s.kv_usage_max, _ = gauge("kv_usage")
    s.prealloc_queue_mean, s.transfer_queue_mean = gauge("prealloc_queue")[0], gauge("transfer_queue")[0]
    s.lora_slots = gauge("lora_max_adapters")[1]
    s.lora_demand_mean, s.lora_demand_max, _ = gauge("lora_adapters_in_demand")
    s.lora_slot_wait_share = gauge("lora_slot_wait")[0]
    s.preemptions_per_second = m.rates.get("preemptions_total")
    s.requests_per_second = m.rates.get("requests_total")
    s.generation_tokens_per_second = m.rates.get("generation_tokens_total")
    queries, hits = m.rates.get("prefix_cache_queries_total"), m.rates.get("prefix_cache_hits_total")
    if queries:
        s.prefix_cache_hit_rate = (hits or 0.0) / queries


def _itl_by_batch(s: Signals, intervals: list[ItlInterval], small: float = 2.0) -> None:
    """ITL per scrape interval next to the running batch size in that interval.

    This is the "single request vs. under load" split from server metrics: intervals in
    which at most ``small`` requests were running show what decode costs with
    (almost) no batching, which is what the bandwidth floor predicts.
    """
    groups = {"1-2": [0.0, 0.0, 0.0, 0], "3-8": [0.0, 0.0, 0.0, 0], "9-32": [0.0, 0.0, 0.0, 0],
              "33+": [0.0, 0.0, 0.0, 0]}
    for interval in intervals:
        batch = interval.running
        key = "1-2" if batch <= small else "3-8" if batch <= 8 else "9-32" if batch <= 32 else "33+"
        g = groups[key]
        g[0] += interval.itl_sum
        g[1] += interval.itl_count
        g[2] += batch
        g[3] += 1
    for key, (total, count, batch_total, n) in groups.items():
        if count > 0:
            s.itl_by_batch.append({"running": key, "itl_mean": total / count, "steps": count,
                                   "intervals": n, "running_mean": batch_total / n})
    low = groups["1-2"]
    if low[1] >= 20:
        s.itl_low_batch = low[0] / low[1]
        s.itl_low_batch_running = low[2] / low[3]


def _config(infos: list[CanonicalInfo], model: str) -> dict[str, str]:
    config: dict[str, str] = {}
    for info in infos:
        if info.model not in (model, ""):
            continue
        if info.name == "cache_config":
            for key in ("enable_prefix_caching", "cpu_offload_gb", "block_size", "num_gpu_blocks", "cache_dtype",
                        "kv_offloading_size", "kv_role", "disaggregation_mode"):
                if key in info.labels:
                    config[key] = info.labels[key]
        elif info.name == "sleep_state":
            config["sleep_state"] = info.labels.get("sleep_state", "")
        for key in ("kv_role", "disaggregation_mode"):  # whichever info of an engine carries its P/D role
            if info.labels.get(key):
                config[key] = info.labels[key]
    return config
