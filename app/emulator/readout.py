"""Read a ``/metrics`` page back: parse it, difference two scrapes, take quantiles the way
Prometheus' ``histogram_quantile`` does, and summarise the regime signature.

Used by the emulator's tests and handy for benchmarks and the demo ("what does this
target look like right now"). It is deliberately independent of the monitor's own parser
(``app/scrape``): it uses ``prometheus_client``'s reference parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from app.core.quantiles import histogram_quantile


@dataclass
class Hist:
    buckets: list  # [(le, cumulative count)] sorted, +Inf last
    sum: float
    count: float

    def minus(self, other: Hist | None) -> Hist:
        if other is None:
            return self
        ob = dict(other.buckets)
        return Hist([(le, c - ob.get(le, 0.0)) for le, c in self.buckets], self.sum - other.sum,
                    self.count - other.count)

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile`` (the monitor's exact implementation)."""
        if self.count <= 0 or not self.buckets:
            return math.nan
        return histogram_quantile(q, [le for le, _ in self.buckets], [c for _, c in self.buckets])

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def fraction_above(self, bound: float) -> float:
        """Share of observations above the bucket bound ``bound`` (must be a bucket edge)."""
        if self.count <= 0:
            return math.nan
        below = dict(self.buckets).get(float(bound))
        return 1.0 - below / self.count if below is not None else math.nan


class Page:
    """A parsed exposition: families with types, samples, histograms by label set."""

    def __init__(self, text: str | bytes) -> None:
        if isinstance(text, bytes):
            text = text.decode()
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: dict[tuple, float] = {}
        self.labelnames: dict[str, set] = {}
        self.bucket_les: dict[str, set] = {}
        hist_parts: dict[tuple, dict] = {}
        for fam in text_string_to_metric_families(text):
            self.types[fam.name] = fam.type
            for s in fam.samples:
                labels = tuple(sorted(s.labels.items()))
                self.samples[(s.name, labels)] = s.value
                self.labelnames.setdefault(fam.name, set()).update(k for k in s.labels if k != "le")
                if fam.type == "histogram":
                    base = tuple((k, v) for k, v in labels if k != "le")
                    part = hist_parts.setdefault((fam.name, base), {"b": [], "sum": 0.0, "count": 0.0})
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        part["b"].append((le, s.value))
                        self.bucket_les.setdefault(fam.name, set()).add(s.labels["le"])
                    elif s.name.endswith("_sum"):
                        part["sum"] = s.value
                    elif s.name.endswith("_count"):
                        part["count"] = s.value
        self.hists = {k: Hist(sorted(v["b"]), v["sum"], v["count"]) for k, v in hist_parts.items()}

    def hist(self, family: str, **labels: str) -> Hist | None:
        """The histogram of ``family`` summed over label sets matching ``labels``."""
        found = [h for (name, lb), h in self.hists.items()
                 if name == family and all(dict(lb).get(k) == v for k, v in labels.items())]
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        acc: dict[float, float] = {}
        for h in found:
            for le, c in h.buckets:
                acc[le] = acc.get(le, 0.0) + c
        return Hist(sorted(acc.items()), sum(h.sum for h in found), sum(h.count for h in found))

    def value(self, sample: str, **labels: str) -> float:
        """Sum of samples named ``sample`` whose labels include ``labels`` (nan if none)."""
        vals = [v for (name, lb), v in self.samples.items()
                if name == sample and all(dict(lb).get(k) == v2 for k, v2 in labels.items())]
        return sum(vals) if vals else math.nan


def _delta(after: Page, before: Page | None, family: str, **labels: str) -> Hist | None:
    h = after.hist(family, **labels)
    if h is None:
        return None
    return h.minus(before.hist(family, **labels) if before else None)


def _counter_delta(after: Page, before: Page | None, sample: str, **labels: str) -> float:
    a = after.value(sample, **labels)
    b = before.value(sample, **labels) if before else 0.0
    return a - (0.0 if math.isnan(b) else b)


def signature(after: Page | str | bytes, before: Page | str | bytes | None = None, *, seconds: float | None = None,
              engine: str = "vllm") -> dict:
    """Regime evidence over the window between two scrapes of one target."""
    if not isinstance(after, Page):
        after = Page(after)
    if before is not None and not isinstance(before, Page):
        before = Page(before)
    out: dict = {}
    if engine == "tgi":
        q = _delta(after, before, "tgi_request_queue_duration")
        pre = _delta(after, before, "tgi_batch_inference_duration", method="prefill")
        dec = _delta(after, before, "tgi_batch_forward_duration", method="decode")
        tpt = _delta(after, before, "tgi_request_mean_time_per_token_duration")
        out.update(
            requests=_counter_delta(after, before, "tgi_request_success_total"),  # parser adds _total
            queue_mean=q.mean if q else math.nan,
            prefill_batch_mean=pre.mean if pre else math.nan,
            prefill_batch_p99=pre.quantile(0.99) if pre else math.nan,
            decode_forward_p50=dec.quantile(0.5) if dec else math.nan,
            decode_forward_p99=dec.quantile(0.99) if dec else math.nan,
            mean_time_per_token_p50=tpt.quantile(0.5) if tpt else math.nan,
            queue_size=after.value("tgi_queue_size"),
            batch_size=after.value("tgi_batch_current_size"),
            kv_usage=after.value("tgi_batch_current_max_tokens") / after.value("tgi_batch_max_total_tokens"),
        )
        if q and pre and q.count:
            out["queue_share"] = q.mean / (q.mean + pre.mean) if pre.count else math.nan
        return out
    legacy = "vllm:gpu_cache_usage_perc" in after.types
    itl_name = "vllm:time_per_output_token_seconds" if legacy else "vllm:inter_token_latency_seconds"
    ttft = _delta(after, before, "vllm:time_to_first_token_seconds")
    itl = _delta(after, before, itl_name)
    queue = _delta(after, before, "vllm:request_queue_time_seconds")
    prefill = _delta(after, before, "vllm:request_prefill_time_seconds")
    it = _delta(after, before, "vllm:iteration_tokens_total")
    prompt = _delta(after, before, "vllm:request_prompt_tokens")
    e2e = _delta(after, before, "vllm:e2e_request_latency_seconds")
    kv_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    pq = "vllm:gpu_prefix_cache_queries_total" if legacy else "vllm:prefix_cache_queries_total"
    ph = "vllm:gpu_prefix_cache_hits_total" if legacy else "vllm:prefix_cache_hits_total"
    preempt = _counter_delta(after, before, "vllm:num_preemptions_total")
    queries = _counter_delta(after, before, pq)
    itl_p50 = itl.quantile(0.5) if itl else math.nan
    itl_p99 = itl.quantile(0.99) if itl else math.nan
    out.update(
        requests=e2e.count if e2e else 0.0,
        ttft_p50=ttft.quantile(0.5) if ttft else math.nan,
        ttft_p99=ttft.quantile(0.99) if ttft else math.nan,
        ttft_mean=ttft.mean if ttft else math.nan,
        queue_mean=queue.mean if queue else math.nan,
        prefill_mean=prefill.mean if prefill else math.nan,
        queue_share=(queue.sum / ttft.sum) if (queue and ttft and ttft.sum > 0 and queue.count == ttft.count) else
        ((queue.mean / ttft.mean) if (queue and ttft and ttft.count and queue.count) else math.nan),
        itl_p50=itl_p50,
        itl_p99=itl_p99,
        itl_p99_p50=itl_p99 / itl_p50 if itl_p50 and itl_p50 > 0 else math.nan,
        itl_mean=itl.mean if itl else math.nan,
        iteration_tokens_over_2048=it.fraction_above(2048) if it else math.nan,
        prompt_mean=prompt.mean if prompt else math.nan,
        kv_usage=after.value(kv_name),
        running=after.value("vllm:num_requests_running"),
        waiting=after.value("vllm:num_requests_waiting"),
        preemptions=preempt,
        prefix_hit_rate=_counter_delta(after, before, ph) / queries if queries > 0 else math.nan,
    )
    xfer = _delta(after, before, "vllm:nixl_xfer_time_seconds")
    if xfer is not None:  # P/D decode worker
        failed = _counter_delta(after, before, "vllm:nixl_num_failed_transfers_total")
        out["kv_transfer_mean"] = xfer.mean
        out["kv_transfer_share"] = xfer.mean / ttft.mean if ttft and ttft.count else math.nan
        out["kv_transfer_failed_share"] = failed / (failed + xfer.count) if failed + xfer.count else math.nan
    drafts = _counter_delta(after, before, "vllm:spec_decode_num_drafts_total")
    if drafts > 0:  # speculative decoding
        accepted = _counter_delta(after, before, "vllm:spec_decode_num_accepted_tokens_total")
        out["spec_accept_rate"] = accepted / _counter_delta(after, before, "vllm:spec_decode_num_draft_tokens_total")
        out["spec_accept_length"] = 1 + accepted / drafts
    render = _delta(after, before, "vllm:request_render_duration_seconds")
    if render is not None and render.count:  # vLLM 0.34 front end
        out["render_mean"] = render.mean
        out["render_share"] = render.mean / ttft.mean if ttft and ttft.count else math.nan
    if seconds:
        out["preemptions_per_s"] = preempt / seconds
        out["requests_per_s"] = out["requests"] / seconds
    return out
