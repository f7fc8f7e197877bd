"""Hugging Face TGI adapter (router metrics, v1.3+ through v3.3).

TGI differs from vLLM in ways the rest of the product must know about:

* No TTFT histogram. The official TGI dashboard (and the maintainers, TGI #2887)
  take TTFT ≈ queue time + prefill batch time; the latency service derives it at query
  time and marks it ``derived``: the mean as the sum of the two means (means add), each
  quantile as a bound (quantiles do not add; :func:`app.latency.derived_ttft`). The
  adapter stores the parts.
* ``tgi_batch_inference_duration{method="decode"}`` is the time of one decode step,
  observed once per batch step: every running request waits exactly that long for its
  next token, so it is the inter-token latency (weighted per step, not per request).
* ``prefill_time`` here is the prefill *batch* time, observed per prefill batch.
* No ``model_name`` label: the model is the empty string; no data-parallel rank.
* KV usage is derived: ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``.
* Counters have no ``_total`` suffix (Rust metrics exporter); the token counters are the
  ``_sum`` of the per-request length histograms.
"""

from __future__ import annotations

from app.exposition.parser import ParsedPage
from app.sources.base import (
    Canonical,
    CanonicalHistogram,
    CanonicalScalar,
    first_family,
    histogram_series,
    scalar_series,
)

NO_GROUP: tuple[str, ...] = ()
HISTOGRAMS: dict[str, tuple[str, dict[str, str] | None]] = {
    "queue_time": ("tgi_request_queue_duration", None),
    "prefill_time": ("tgi_batch_inference_duration", {"method": "prefill"}),
    "itl": ("tgi_batch_inference_duration", {"method": "decode"}),
    "e2e": ("tgi_request_duration", None),
    "inference_time": ("tgi_request_inference_duration", None),
    "tpot": ("tgi_request_mean_time_per_token_duration", None),
    "prompt_tokens": ("tgi_request_input_length", None),
    "generation_tokens": ("tgi_request_generated_tokens", None),
}
GAUGES = {"running": "tgi_batch_current_size", "waiting": "tgi_queue_size"}
KV_USED, KV_CAPACITY = "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens"
REQUESTS = ("tgi_request_success", "tgi_request_success_total")
TOKEN_COUNTERS = {"prompt_tokens_total": "tgi_request_input_length",
                  "generation_tokens_total": "tgi_request_generated_tokens"}

FAMILIES = frozenset({name for name, _ in HISTOGRAMS.values()} | set(GAUGES.values()) | {KV_USED, KV_CAPACITY}
                     | set(REQUESTS))
TTFT_DERIVATION = ("TTFT derived from queue_time and prefill_time (TGI exports no TTFT histogram): the mean is "
                   "mean queue + mean prefill (means add); quantiles are not added, each is given as a bound "
                   "max(q_queue(a), q_prefill(a)) <= q_ttft(a) <= q_queue((1+a)/2) + q_prefill((1+a)/2) on the "
                   "buckets' edges")


def _gauge(page: ParsedPage, name: str) -> float | None:
    family = page.families.get(name)
    if family is None:
        return None
    values = scalar_series(family, NO_GROUP)
    return values.get((), None)


class TgiAdapter:
    name = "tgi"
    family_prefixes = ("tgi_",)
    families = FAMILIES

    def detect(self, page: ParsedPage) -> bool:
        return any(name.startswith("tgi_") for name in page.families)

    def to_canonical(self, page: ParsedPage) -> Canonical:
        out = Canonical(engine=self.name, notes=[TTFT_DERIVATION])
        hist_cache: dict[str, dict] = {}
        for signal, (name, label_filter) in HISTOGRAMS.items():
            family = page.families.get(name)
            if family is None:
                continue
            series = histogram_series(family, NO_GROUP, out.problems, label_filter)
            hist_cache[name] = series
            for (bounds, counts, total, count) in series.values():
                out.histograms.append(CanonicalHistogram(signal, "", "0", bounds, counts, total, count))
        for signal, name in GAUGES.items():
            value = _gauge(page, name)
            if value is not None:
                out.scalars.append(CanonicalScalar(signal, "gauge", "", "0", value))
        used, capacity = _gauge(page, KV_USED), _gauge(page, KV_CAPACITY)
        if used is not None and capacity:
            out.scalars.append(CanonicalScalar("kv_usage", "gauge", "", "0", min(used / capacity, 1.0)))
        requests = first_family(page, REQUESTS)
        if requests is not None:
            for value in scalar_series(requests, NO_GROUP).values():
                out.scalars.append(CanonicalScalar("requests_total", "counter", "", "0", value))
        for signal, name in TOKEN_COUNTERS.items():
            for (_, _, total, _) in hist_cache.get(name, {}).values():
                out.scalars.append(CanonicalScalar(signal, "counter", "", "0", total))
        return out
