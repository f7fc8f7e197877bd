"""The recording rules of one engine: quantiles, means, shares and gauges over a window,
each recorded once under ``llm_latency:<engine>_<what>:<aggregation>_<window>``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.diagnosis.rules.replica_imbalance import IDLE_FLOOR
from app.diagnosis.signals import STALL_SECONDS
from app.promql.text import (
    le_matcher,
    num,
    quantile_name,
)
from app.rules_export.engines import PREFIX, STANDARD_QUANTILES, TGI, EngineExposition

# ----------------------------------------------------------------------------- builder


@dataclass
class Group:
    engine: EngineExposition
    rules: list[dict[str, Any]] = field(default_factory=list)
    recorded: set[str] = field(default_factory=set)

    def record(self, name: str, expr: str) -> str:
        if name not in self.recorded:
            self.recorded.add(name)
            self.rules.append({"record": name, "expr": expr})
        return name

    # -- recorded signals ------------------------------------------------------------
    def rec(self, what: str, agg: str, w: str) -> str:
        return f"{PREFIX}:{self.engine.name}_{what}:{agg}_{w}"

    def sum_rate(self, metric: str, selector: str, w: str, fn: str = "rate") -> str:
        return f"sum by ({self.engine.labels}) ({fn}({self.engine.select(metric, selector)}[{w}]))"

    def quantile(self, signal: str, q: float, w: str) -> str:
        e = self.engine
        name = self.rec(e.stems[signal], quantile_name(q), w)
        if e.name == "tgi" and signal == "ttft":
            queue, prefill = self.quantile("queue_time", q, w), self.quantile("prefill_time", q, w)
            return self.record(name, f"{queue}\n+ {prefill}")
        metric, selector = e.histograms[signal]
        return self.record(name, f"histogram_quantile({num(q)}, sum by (le, {e.labels}) "
                                 f"(rate({e.select(metric + '_bucket', selector)}[{w}])))")

    def mean(self, signal: str, w: str) -> str:
        e = self.engine
        if e.name == "tgi" and signal == "ttft":
            return self.record(self.rec("ttft_seconds", "mean", w),
                               f"{self.mean('queue_time', w)}\n+ {self.prefill_per_request(w)}")
        metric, selector = e.histograms[signal]
        return self.record(self.rec(e.stems[signal], "mean", w),
                           f"{self.sum_rate(metric + '_sum', selector, w)}\n/\n"
                           f"{self.sum_rate(metric + '_count', selector, w)}")

    def prompt_mean_counters(self, w: str, histogram_mean: str | None) -> str:
        """The mean prompt length from the token and request counters (``rate(tokens) /
        rate(requests)``, the same mean over the window's finished requests); where the engine
        also has the histogram, its ``_sum/_count`` first, the counters only where it is absent."""
        e = self.engine
        assert e.prompt_counters is not None
        tokens, requests = e.prompt_counters
        finished = "\n    or\n    ".join(self.sum_rate(name, "", w) for name in requests)
        counted = self.record(self.rec("prompt_tokens" if histogram_mean is None else "prompt_tokens_counters",
                                       "mean", w),
                              f"{self.sum_rate(tokens, '', w)}\n/\n(\n  (\n    {finished}\n  ) > 0\n)")
        if histogram_mean is None:
            return counted
        return self.record(self.rec("prompt_tokens_best", "mean", w), f"{histogram_mean}\nor\n{counted}")

    def prefill_per_request(self, w: str) -> str:
        """Prefill time a request waits for its first token (TGI: batch time per admitted request)."""
        if self.engine.name != "tgi":
            return self.mean("prefill_time", w)
        prefill, selector = TGI.histograms["prefill_time"]
        queue, _ = TGI.histograms["queue_time"]
        return self.record(self.rec("prefill_seconds_per_request", "mean", w),
                           f"{self.sum_rate(prefill + '_sum', selector, w)}\n/\n"
                           f"{self.sum_rate(queue + '_count', '', w)}")

    def share(self, what: str, numerator: str, w: str) -> str:
        """A mean over mean TTFT, bounded to [0, 1] like the built-in share (the two means count
        different requests of the window, so the raw ratio can exceed 1)."""
        return self.record(self.rec(f"{what}_share", "ratio", w),
                           f"clamp(\n{numerator}\n/\n({self.mean('ttft', w)} > 0), 0, 1)")

    def itl_ratio(self, w: str) -> str:
        return self.record(self.rec("itl_p99_over_p50", "ratio", w),
                           f"{self.quantile('itl', 0.99, w)}\n/\n({self.quantile('itl', 0.5, w)} > 0)")

    def stall_share(self, w: str) -> str:
        e = self.engine
        name = self.rec("decode_stall_share", "ratio", w)
        if e.name == "tgi":
            prefill, p_sel = TGI.histograms["prefill_time"]
            decode, d_sel = TGI.histograms["itl"]
            p = self.sum_rate(prefill + "_sum", p_sel, w)
            return self.record(name, f"{p}\n/\n({p}\n + ({self.sum_rate(decode + '_sum', d_sel, w)} > 0))")
        metric, _ = e.histograms["itl"]
        terms = []
        bounds = (*e.itl_buckets, math.inf)
        for lower, upper in zip(bounds, bounds[1:]):
            if lower < STALL_SECONDS:
                continue
            weight = lower if math.isinf(upper) else (lower + upper) / 2
            hi = self.sum_rate(f"{metric}_bucket", "{" + le_matcher(upper) + "}", w)
            lo = self.sum_rate(f"{metric}_bucket", "{" + le_matcher(lower) + "}", w)
            terms.append(f"clamp_min({hi} - {lo}, 0) * {num(weight)}")
        total = self.sum_rate(f"{metric}_sum", "", w)
        body = "\n    + ".join(terms)
        return self.record(name, f"clamp_max(\n  (\n    {body}\n  )\n  /\n  ({total} > 0),\n  1\n)")

    def gauge_avg(self, what: str, metric: str, w: str) -> str:
        return self.record(self.rec(what, "avg", w), self.sum_rate(metric, "", w, "avg_over_time"))

    def kv_max(self, w: str) -> str:
        e = self.engine
        name = self.rec("kv_cache_usage", "max", w)
        if e.kv_usage is not None:
            return self.record(name, f"avg by ({e.labels}) "
                                     f"(max_over_time({e.select(e.kv_usage)}[{w}]))")
        usage = (f"clamp_max(\n    sum by ({e.labels}) ({e.select('tgi_batch_current_max_tokens')})\n    /\n"
                 f"    (sum by ({e.labels}) ({e.select('tgi_batch_max_total_tokens')}) > 0),\n    1\n  )")
        return self.record(name, f"max_over_time(\n  {usage}[{w}:]\n)")

    def preemption_rate(self, w: str) -> str | None:
        if self.engine.preemptions is None:
            return None
        return self.record(self.rec("preemptions", "rate", w), self.sum_rate(self.engine.preemptions, "", w))

    def requests(self, w: str) -> str:
        metric, selector = self.engine.histograms["queue_time" if self.engine.name == "tgi" else "ttft"]
        return self.record(self.rec("requests", "increase", w),
                           self.sum_rate(metric + "_count", selector, w, "increase"))

    def decode_steps(self, w: str) -> str:
        metric, selector = self.engine.histograms["itl"]
        return self.record(self.rec("decode_steps", "increase", w),
                           self.sum_rate(metric + "_count", selector, w, "increase"))

    def all_signals(self, w: str) -> dict[str, str | None]:
        """Every number a regime rule reads, recorded over ``w``. A number the engine does not
        export is absent (a twin reading it raises ``KeyError`` and exports no alert for the
        engine); ``preemptions`` is None where no preemption counter exists."""
        e = self.engine
        out: dict[str, str | None] = {}
        for signal in ("ttft", "itl"):
            if e.supports(signal):
                for q in STANDARD_QUANTILES:
                    out[f"{signal}_{quantile_name(q)}"] = self.quantile(signal, q, w)
                out[f"{signal}_mean"] = self.mean(signal, w)
        out["queue_mean"] = queue_mean = self.mean("queue_time", w)
        out["prefill_mean"] = prefill_mean = self.prefill_per_request(w)
        out["queue_share"] = self.share("queue", queue_mean, w)
        out["prefill_share"] = self.share("prefill", prefill_mean, w)
        if e.supports("prompt_tokens"):
            out["prompt_mean"] = self.mean("prompt_tokens", w)
            out["prompt_p90"] = self.quantile("prompt_tokens", 0.9, w)
        if e.prompt_counters is not None:
            out["prompt_mean"] = self.prompt_mean_counters(w, out.get("prompt_mean"))
        if e.supports("itl"):
            out["itl_ratio"] = self.itl_ratio(w)
            out["stall_share"] = self.stall_share(w)
        out["running"] = self.gauge_avg("num_requests_running", e.running, w)
        out["waiting"] = self.gauge_avg("num_requests_waiting", e.waiting, w)
        out["kv_max"] = self.kv_max(w)
        out["preemptions"] = self.preemption_rate(w)
        out["requests"] = self.requests(w)
        if e.supports("itl"):
            out["steps"] = self.decode_steps(w)
        out.update(self.transfer_and_speculation(w, out.get("steps")))
        if e.scheduler is not None:
            out.update(self.scheduler_time(w))
        if e.rank_label is not None:
            out.update(self.ranks(w))
        return out

    def ranks(self, w: str) -> dict[str, str | None]:
        """The data-parallel ranks of one engine compared as ``dp_imbalance`` compares them
        (:func:`app.diagnosis.rules.replica_imbalance.compare_loads`): each rank's load (mean
        running + mean waiting, a rank without a waiting gauge waits 0), the busiest and the least
        busy rank's mean waiting, the load ratio between them (the least busy counted as at least
        ``IDLE_FLOOR``), how many ranks report; and the engine's own token imbalance where it has one."""
        e = self.engine
        by, rank = e.labels, f"{e.labels}, {e.rank_label}"

        def per_rank(metric: str) -> str:
            return f"sum by ({rank}) (avg_over_time({e.select(metric)}[{w}]))"

        running = self.record(self.rec("rank_num_requests_running", "avg", w), per_rank(e.running))
        waiting = self.record(self.rec("rank_num_requests_waiting", "avg", w),
                              f"{per_rank(e.waiting)}\nor\n{running} * 0")
        load = self.record(self.rec("rank_load", "avg", w), f"{running}\n+ on({rank})\n{waiting}")
        out: dict[str, str | None] = {
            "rank_count": self.record(self.rec("ranks", "count", w), f"count by ({by}) ({load})"),
            "rank_busiest_waiting": self.record(
                self.rec("rank_busiest_waiting", "avg", w),
                f"max by ({by}) (\n  {waiting}\n  and on({rank})\n  topk by ({by}) (1, {load})\n)"),
            "rank_idlest_waiting": self.record(
                self.rec("rank_idlest_waiting", "avg", w),
                f"max by ({by}) (\n  {waiting}\n  and on({rank})\n  bottomk by ({by}) (1, {load})\n)"),
            "rank_load_ratio": self.record(
                self.rec("rank_load", "ratio", w),
                f"max by ({by}) ({load})\n/\nclamp_min(min by ({by}) ({load}), {num(IDLE_FLOOR)})"),
        }
        if e.token_imbalance is not None:
            out["dp_token_imbalance"] = self.record(
                self.rec("dp_token_imbalance", "avg", w),
                f"avg by ({by}) (avg_over_time({e.select(e.token_imbalance)}[{w}]))")
        return out

    def scheduler_time(self, w: str) -> dict[str, str | None]:
        """The shares of the scheduler loop's time ``scheduler_cpu_bound`` reads, as
        ``signals._scheduler_time`` computes them (every rate summed over the same ranks)."""
        assert self.engine.scheduler is not None
        loop, idle, cpu, gpu = (self.sum_rate(metric, "", w) for metric in self.engine.scheduler)
        return {
            "scheduler_cpu_share": self.record(self.rec("scheduler_cpu_share", "ratio", w),
                                               f"{cpu}\n/\n({loop} > 0)"),
            "scheduler_busy_share": self.record(self.rec("scheduler_busy_share", "ratio", w),
                                                f"1 - {idle}\n/\n({loop} > 0)"),
            "gpu_idle_share": self.record(self.rec("gpu_idle_share", "ratio", w),
                                          f"clamp_min(\n  1 - {gpu}\n  /\n  (({loop} - {idle}) > 0),\n  0\n)"),
        }

    def ratio_of_rates(self, what: str, numerator: str, denominator: str, w: str) -> str:
        return self.record(self.rec(what, "ratio", w), f"{self.sum_rate(numerator, '', w)}\n/\n"
                                                       f"({self.sum_rate(denominator, '', w)} > 0)")

    def transfer_histogram(self, part: str, w: str, fn: str = "rate") -> str:
        """``sum by (...) (fn(<transfer histogram>_<part>))``, the engine's first present transfer
        histogram (``or``); ``_sum`` divided to seconds where the family counts another unit."""
        terms = []
        for family, selector, divisor in self.engine.kv_transfer:
            term = self.sum_rate(f"{family}_{part}", selector, w, fn)
            terms.append(f"({term} / {num(divisor)})" if part == "sum" and divisor != 1.0 else term)
        return "\nor\n".join(terms)

    def spec_gauge(self, what: str, gauge: str, w: str) -> str:
        """An acceptance gauge's mean over the window, averaged over the ranks (``AVERAGED_GAUGES``);
        where a length of 0 means speculation is off, only series whose length stayed above 0."""
        e = self.engine
        mean = f"avg_over_time({e.select(gauge)}[{w}])"
        _, length = e.spec_gauges
        if e.spec_zero_is_off and length is not None:
            mean = f"{mean}\n  and\n  (min_over_time({e.select(length)}[{w}]) > 0)"
        return self.record(self.rec(what, "mean" if what == "spec_accept_length" else "ratio", w),
                           f"avg by ({e.labels}) (\n  {mean}\n)")

    def transfer_and_speculation(self, w: str, steps: str | None) -> dict[str, str | None]:
        """The KV-transfer (P/D), speculative-decoding and front-end numbers ``kv_transfer``,
        ``speculation_ineffective`` and ``frontend_bound`` read, from the families this engine
        exports them in, as ``signals._disaggregation`` / ``_speculation`` read them (each family
        exists only when the feature is on)."""
        e = self.engine
        out: dict[str, str | None] = {}
        if e.kv_transfer:
            out["kv_transfer_mean"] = mean = self.record(
                self.rec("kv_transfer_seconds_mean", "ratio", w),
                f"(\n{self.transfer_histogram('sum', w)}\n)\n/\n((\n{self.transfer_histogram('count', w)}\n) > 0)"
                if len(e.kv_transfer) > 1 or e.kv_transfer[0][2] != 1.0 else
                f"{self.transfer_histogram('sum', w)}\n/\n({self.transfer_histogram('count', w)} > 0)")
            out["kv_transfer_share"] = self.share("kv_transfer", mean, w)
            # completed transfers: the engine's counter where it has one, else the histogram's count, else (an
            # SGLang decode worker, whose page has no transfer time) the KV arrivals its wait histogram counts
            done = self.sum_rate(e.kv_transfers, "", w) if e.kv_transfers else self.transfer_histogram("count", w)
            done_increase = (self.sum_rate(e.kv_transfers, "", w, "increase") if e.kv_transfers
                             else self.transfer_histogram("count", w, "increase"))
            if e.kv_wait is not None:
                family, selector = e.kv_wait
                arrived = self.sum_rate(family + "_count", selector, w)
                arrived_increase = self.sum_rate(family + "_count", selector, w, "increase")
                done = f"(\n{done}\n)\nor\n{arrived}"
                done_increase = f"(\n{done_increase}\n)\nor\n{arrived_increase}"
            out["kv_transfers"] = done_count = self.record(self.rec("kv_transfers", "increase", w), done_increase)
            out["kv_transfer_attempts"] = done_count
            if e.kv_failed is not None:
                failed = self.sum_rate(e.kv_failed, "", w)
                out["kv_transfer_failure_share"] = self.record(
                    self.rec("kv_transfer_failure_share", "ratio", w),
                    f"{failed}\n/\n(({failed} + ({done})) > 0)")
                # the rule's gate counts completed and failed transfers (a counter may be absent: 0)
                out["kv_transfer_attempts"] = self.record(
                    self.rec("kv_transfer_attempts", "increase", w),
                    f"{done_count}\n+\n({self.sum_rate(e.kv_failed, '', w, 'increase')} or {done_count} * 0)")
        drafts, proposed, accepted = e.spec_counters or (None, None, None)
        rate_gauge, length_gauge = e.spec_gauges
        if proposed is not None and accepted is not None:
            out["spec_accept_rate"] = self.ratio_of_rates("spec_accept_rate", accepted, proposed, w)
        elif rate_gauge is not None:
            out["spec_accept_rate"] = self.spec_gauge("spec_accept_rate", rate_gauge, w)
        if drafts is not None and accepted is not None:
            out["spec_accept_length"] = length = self.record(
                self.rec("spec_accept_length", "mean", w),
                f"1 + {self.sum_rate(accepted, '', w)}\n/\n({self.sum_rate(drafts, '', w)} > 0)")
        elif length_gauge is not None:
            out["spec_accept_length"] = length = self.spec_gauge("spec_accept_length", length_gauge, w)
        if "spec_accept_rate" in out or "spec_accept_length" in out:
            # verification steps with a draft, as speculation_ineffective.verification_steps counts them
            if drafts is not None:
                out["spec_drafts"] = self.record(self.rec("spec_drafts", "increase", w),
                                                 self.sum_rate(drafts, "", w, "increase"))
            elif steps is not None:
                out["spec_drafts"] = steps  # SGLang: its ITL observations (at least one per step)
            elif e.generation_tokens is not None and "spec_accept_length" in out:
                out["spec_drafts"] = self.record(
                    self.rec("spec_drafts", "estimate", w),
                    f"{self.sum_rate(e.generation_tokens, '', w, 'increase')}\n/\n({length} > 0)")
        out.update(self.decode_side(w))
        if e.render is not None:
            out["render_mean"] = render_mean = self.ratio_of_rates("render_seconds_mean", e.render + "_sum",
                                                                   e.render + "_count", w)
            out["render_share"] = self.share("render", render_mean, w)
        return out

    def decode_side(self, w: str) -> dict[str, str | None]:
        """A P/D decode worker's own numbers (SGLang), as ``signals`` reads them: its mean wait for the KV
        (the stage histogram, else its transfer queue by Little's law over first tokens per second; an
        upper bound of the transfer, which no alert fires on alone), its prealloc queue and its mean wait
        for KV memory (``kv_cache_pressure``'s decode branch)."""
        e = self.engine
        out: dict[str, str | None] = {}
        if e.kv_wait is not None and e.transfer_queue is not None:
            family, selector = e.kv_wait
            ttft, _ = e.histograms["ttft"]
            stage = (f"{self.sum_rate(family + '_sum', selector, w)}\n/\n"
                     f"({self.sum_rate(family + '_count', selector, w)} > 0)")
            little = (f"{self.sum_rate(e.transfer_queue, '', w, 'avg_over_time')}\n/\n"
                      f"({self.sum_rate(ttft + '_count', '', w)} > 0)")
            out["kv_wait_mean"] = self.record(self.rec("kv_wait_seconds", "mean", w),
                                              f"(\n{stage}\n)\nor\n(\n{little}\n)")
        if e.prealloc_queue is not None and e.kv_alloc is not None:
            out["prealloc_queue"] = self.gauge_avg("decode_prealloc_queue_reqs", e.prealloc_queue, w)
            family, selector, divisor = e.kv_alloc
            out["kv_alloc_mean"] = self.record(
                self.rec("kv_alloc_seconds", "mean", w),
                f"({self.sum_rate(family + '_sum', selector, w)} / {num(divisor)})\n/\n"
                f"({self.sum_rate(family + '_count', selector, w)} > 0)")
        return out
