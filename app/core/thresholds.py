"""Thresholds of the regime rules: documented data, with defaults, overridable in the
targets YAML under ``diagnosis:``.

Each default is chosen so that the emulator's ``healthy`` and ``healthy_bursty``
scenarios stay quiet with margin while each regime scenario clears its threshold with
margin (``bench/diagnosis_matrix.py`` shows both), and so that it reads as a sentence an
on-call engineer would agree with. Precision over recall: a wrong diagnosis sends
someone tuning the wrong knob.

A rule reads only these fields, never a number of its own: the ``*_critical_*`` fields
are where a finding's severity escalates to ``critical``, and ``llm-latency rules export``
writes the same numbers into the Prometheus rules.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # insufficient_data
    min_requests: float = Field(5, description="TTFT observations needed in the window.")
    min_decode_steps: float = Field(50, description="ITL observations needed in the window.")
    min_scrapes: int = Field(2, description="Scrapes needed in the window (a window needs two ends).")

    # queueing: time waiting for the scheduler dominates a noticeable TTFT
    queue_share: float = Field(0.5, description="Mean queue time / mean TTFT at or above this.")
    queue_seconds: float = Field(0.5, description="...and mean queue time at or above this (seconds).")
    queue_waiting: float = Field(1.0, description="...and mean waiting requests at or above this.")
    queue_critical_factor: float = Field(5.0, description="Critical when mean queue time is at or above this "
                                                          "multiple of queue_seconds.")

    # replica_imbalance: replicas of one service unevenly loaded (one queueing, another idle)
    imbalance_waiting: float = Field(1.0, description="Mean waiting requests on the busiest replica at or above "
                                                      "this ...")
    imbalance_idle_waiting: float = Field(0.1, description="... while the least busy replica has at most this "
                                                           "many waiting (it had room) ...")
    imbalance_load_ratio: float = Field(2.0, description="... and the busiest replica holds at least this many "
                                                         "times the requests (running + waiting) of the least busy.")
    imbalance_critical_factor: float = Field(2.5, description="Critical when the load ratio is at or above this "
                                                              "multiple of imbalance_load_ratio.")

    # prefill_compute: the prompt's own prefill dominates a slow TTFT, without queueing
    prefill_seconds: float = Field(0.5, description="Mean prefill time (TTFT minus queue) at or above this.")
    prefill_share: float = Field(0.6, description="Prefill share of TTFT at or above this.")
    long_prompt_tokens: float = Field(2000, description="Mean prompt length at or above this (tokens).")
    prefill_critical_factor: float = Field(4.0, description="Critical when mean prefill time is at or above this "
                                                            "multiple of prefill_seconds.")

    # prefill_interference: decodes stalled behind other requests' prefills
    stall_share: float = Field(0.2, description="Share of decode time spent in stalls (steps >= 0.2 s, or TGI "
                                                 "prefill pauses) at or above this ...")
    itl_ratio: float = Field(4.0, description="... or ITL p99/p50 at or above this ...")
    itl_p99_seconds: float = Field(0.1, description="... together with ITL p99 at or above this (seconds).")
    interference_prompt_tokens: float = Field(1000, description="And: mean prompt length at or above this.")
    # A mean hides a minority of long documents among many short chat prompts (10 % of
    # 6k-token prompts among 200-token ones average ~800), yet each of those prefills is
    # one long step. 2,000 tokens is about where a whole prefill becomes a visible stall:
    # 2 x 8e9 parameters x 2,000 tokens at ~60 % of an A100's 312 TFLOP/s is ~0.17 s, the
    # 0.2 s stall bound (larger models stall on fewer tokens, so this errs quiet for them).
    interference_long_prompt_tokens: float = Field(2000, description="... or: prompt-length p90 at or above this "
                                                                      "(one request in ten this long).")
    interference_running: float = Field(2.0, description="And: mean running requests at or above this "
                                                         "(decodes to interrupt).")
    interference_critical_stall_share: float = Field(0.4, description="Critical when the stalled share of decode "
                                                                      "time is at or above this ...")
    interference_critical_itl_p99_seconds: float = Field(0.5, description="... or ITL p99 at or above this "
                                                                          "(seconds).")

    # bandwidth_bound: decode slow even for small batches, near the HBM floor
    slow_itl_seconds: float = Field(0.035, description="ITL p50 at or above this counts as slow decode.")
    low_batch_running: float = Field(8.0, description="Mean running requests at or below this = small batch.")
    floor_ratio_max: float = Field(2.0, description="ITL/floor at or below this = at the hardware limit.")
    steady_itl_ratio: float = Field(2.5, description="ITL p99/p50 at or below this = steady decode (no stalls).")
    # "Steady" is a claim about the window's traffic. Three scrapes just after an engine start
    # hold a few decode steps of one or two requests: calm, and one burst later it stalls (a
    # false bandwidth_bound on a healthy engine). The default window (60 s) at the default
    # scrape interval (15 s) holds 4-5 scrapes once the engine has run a full window, and a
    # p99 means something (more than "the largest step") only from 100 observations.
    steady_min_scrapes: int = Field(4, ge=2, description="Scrapes in the window needed before decode is judged "
                                                         "steady; with fewer, bandwidth_bound is not judged.")
    steady_min_decode_steps: float = Field(100, description="ITL observations needed before decode is judged "
                                                            "steady (a p99 of fewer is the largest step).")

    # kv_cache_pressure: the KV cache is full and sequences are evicted
    kv_usage: float = Field(0.9, description="Max KV-cache usage at or above this.")
    preemptions_per_second: float = Field(0.01, description="Preemption rate above this (vLLM, SGLang).")
    kv_waiting: float = Field(1.0, description="Without a preemption metric (TGI): mean waiting requests at or "
                                               "above this instead.")
    kv_critical_preemptions_per_second: float = Field(1.0, description="Critical at a preemption rate at or above "
                                                                       "this.")
    # A P/D decode worker (SGLang) reserves a request's KV memory before the prefill worker may send it: with
    # memory to spare a request passes its prealloc queue in milliseconds (the gauge reads ~0); one waiting on
    # average means arrivals wait for running requests to finish, which is the cache being full, not the link.
    kv_prealloc_waiting: float = Field(1.0, description="On a P/D decode worker: mean requests waiting for KV "
                                                        "memory before their transfer (SGLang's prealloc queue) at "
                                                        "or above this ...")
    # With room a request's memory is reserved within a scheduler iteration (milliseconds; SGLang's
    # kv_transfer_alloc_ms buckets start at 1 ms): a tenth of a second per request is the cache full.
    kv_alloc_seconds: float = Field(0.1, description="... with a mean wait for that memory at or above this "
                                                     "(seconds, kv_transfer_alloc_ms; without it, max KV-cache "
                                                     "usage at or above kv_usage).")

    # weights_offloaded: decode far above the HBM floor
    offload_floor_ratio: float = Field(4.0, description="ITL at small batch / floor at or above this.")

    # outside_engine: clients wait much longer for the first token than the engine records
    # (client-side probes vs. the engine's TTFT histogram over the same periods). 0.25 s is
    # beyond what a healthy path adds: HTTP on a kept-alive connection and tokenizing a
    # 512-token prompt cost milliseconds, even a cross-region round trip is ~0.1-0.2 s; and a
    # lone request's own engine TTFT on a healthy busy engine varies by tens of milliseconds.
    # 30 % keeps a fixed overhead on a multi-second TTFT (where the engine is the place to look)
    # from firing.
    outside_gap_seconds: float = Field(0.25, description="Client mean TTFT minus the engine's, over the same "
                                                         "probe periods, at or above this (seconds) ...")
    outside_gap_share: float = Field(0.3, description="... and at or above this share of the client TTFT.")
    outside_min_requests: float = Field(3, description="Probe requests (preflight included) compared, at least: "
                                                       "one request on a busy engine is too noisy.")
    outside_lookback: float = Field(900.0, description="Probe runs that finished this long before the end of the "
                                                       "window count (seconds): longer than the canary interval "
                                                       "(default 5 m), so the finding holds between canaries.")

    # capacity signal (app/diagnosis/capacity.py): replicas needed for the load, not a regime rule
    capacity_kv_usage: float = Field(0.8, gt=0, le=1, description="Mean KV-cache usage per replica the capacity "
                                                                   "signal aims for: above it, a replica is short of "
                                                                   "KV blocks before it preempts (kv_usage, 0.9).")
    capacity_tolerance: float = Field(0.1, ge=0, lt=1, description="Utilization within this of 1 keeps the current "
                                                                   "replica count (the HPA's own default tolerance), "
                                                                   "so the signal does not flap around a boundary.")

    # kv_transfer: P/D disaggregation, the KV cache moving from the prefill to the decode worker
    # is a large part of TTFT, or fails. 0.1 s: a 2k-token prompt of an 8B model is ~260 MB of
    # KV, ~10 ms over a 200 Gb/s RDMA link; 100 ms means a TCP fallback, a congested or
    # cross-node path, or queued transfers.
    kv_transfer_share: float = Field(0.3, description="Mean KV transfer time / mean TTFT at or above this ...")
    kv_transfer_seconds: float = Field(0.1, description="... and mean KV transfer time at or above this (seconds) ...")
    kv_transfer_failure_share: float = Field(0.01, description="... or failed transfers / all transfers at or above "
                                                               "this.")
    kv_transfer_min_transfers: float = Field(10, description="Transfers (completed + failed) needed in the window.")
    kv_transfer_critical_failure_share: float = Field(0.1, description="Critical when the failed share of transfers "
                                                                       "is at or above this ...")
    kv_transfer_critical_share: float = Field(0.6, description="... or the transfer share of TTFT at or above this.")

    # speculation_ineffective: the draft tokens are mostly rejected, so each verification step
    # costs the draft and the wider verify but emits about one token, as without drafts
    spec_accept_rate: float = Field(0.3, description="Accepted / proposed draft tokens at or below this ...")
    spec_accept_length: float = Field(1.5, description="... or mean tokens per verification step (1 + accepted / "
                                                       "drafts) at or below this: the draft and verify cost of a "
                                                       "step (~30-50 % for a draft model) eats the gain.")
    spec_min_drafts: float = Field(100, description="Verification steps with a draft needed in the window.")
    spec_critical_accept_length: float = Field(1.1, description="Critical when mean tokens per verification step "
                                                                "is at or below this (drafts almost never accepted).")

    # dp_imbalance: the data-parallel ranks of one engine unevenly loaded; the replica_imbalance
    # thresholds (imbalance_*) apply rank by rank
    dp_token_imbalance_ratio: float = Field(2.0, description="Without per-rank gauges: the engine's own token "
                                                             "imbalance ratio between ranks (SGLang DP attention) "
                                                             "at or above this, with requests waiting "
                                                             "(imbalance_waiting).")

    # frontend_bound: chat template, tokenization and multimodal preprocessing before the
    # engine sees the request (vLLM 0.34 render time) dominate TTFT
    render_share: float = Field(0.3, description="Mean render time / mean TTFT at or above this ...")
    render_seconds: float = Field(0.1, description="... and mean render time at or above this (seconds).")
    render_critical_factor: float = Field(5.0, description="Critical when mean render time is at or above this "
                                                           "multiple of render_seconds.")

    # unexplained: latency out of its expected range while no rule explains it. The ranges are
    # wide on purpose: a rule that fires names the cause, this one only says "slow, and nothing
    # here says why", so it must stay quiet on anything a user would call normal. A lone
    # request's TTFT is its prefill: 2 x 8e9 parameters x 32k tokens at ~50 % of an A100's
    # 312 TFLOP/s is ~3.3 s, a 70B model's 32k-token prompt on 8 H100s ~1.1 s; past 10 s on
    # average requests wait for something (the queue, a transfer, the front end), and chat
    # users have left. Decode: the slowest deployment whose weights fit in GPU memory reads
    # them at ~50 ms per token (8B BF16 on an L4: 16 GB / 300 GB/s = 53 ms; 70B INT4 on an
    # L40S: 41 ms; 70B BF16 over 8 H100s: 5 ms); 250 ms per token (4 tokens/s) is ~5x that,
    # slower than people read. With a hardware profile the target's own decode floor gives a
    # tighter bound: 10x the floor leaves room for a full batch's KV reads (~4x the weights for
    # 256 sequences of 2k tokens on an 8B GQA model) and for the per-step overhead of small
    # models (~5x a 1B model's floor).
    expected_ttft_seconds: float = Field(10.0, gt=0, description="Mean TTFT above this is out of its expected range "
                                                                 "(seconds): prefill of a 32k-token prompt takes a "
                                                                 "few seconds, past 10 s requests wait for something.")
    expected_itl_seconds: float = Field(0.25, gt=0, description="Mean ITL (per-request TPOT where the engine has no "
                                                                "per-step ITL) above this is out of its expected "
                                                                "range (seconds): 4 tokens/s, slower than people "
                                                                "read, ~5x the decode floor of the slowest "
                                                                "deployment whose weights fit in GPU memory.")
    expected_itl_floor_factor: float = Field(10.0, gt=1, description="With a hardware profile: decode above this "
                                                                     "multiple of its floor (weight bytes / HBM "
                                                                     "bandwidth) is out of range too, when that is "
                                                                     "below expected_itl_seconds (room for a full "
                                                                     "batch's KV reads and a small model's per-step "
                                                                     "overhead).")
    expected_critical_factor: float = Field(5.0, gt=1, description="unexplained is critical when a latency is at "
                                                                    "or above this multiple of its expected range "
                                                                    "(TTFT 50 s, ITL 1.25 s by default).")
    # Two estimates of the mean queue time where the engine exports no queue-time histogram:
    # Little's law (waiting gauge / first-token rate) and TTFT minus the expected prefill. The
    # gauge is sampled a few times per window (4-5 scrapes a minute): the mean of a bursty
    # queue from 5 samples is off by up to ~2x, and TTFT minus the request's own prefill also
    # holds the steps it shares with other requests. Beyond 3x apart, one of them measures
    # something else (requests abandoned before their first token inflate Little's law; time
    # spent outside the queue inflates the other).
    queue_estimates_disagree: float = Field(3.0, gt=1, description="The two queue-time estimates (Little's law, "
                                                                   "TTFT minus the expected prefill) disagree when "
                                                                   "one is at least this multiple of the other and "
                                                                   "at least queue_seconds: the evidence says so. "
                                                                   "Whatever the ratio, queueing is not judged when "
                                                                   "they fall on both sides of its thresholds.")

    # lora_adapter_slots: requests wait for a LoRA adapter slot. vLLM runs at most max_lora adapters
    # at once, so while more adapters have requests in flight than that, the requests of at least one
    # wait however much KV room there is. Two of the five scrapes of the default window (60 s at a 15 s
    # interval): one scrape catching a new adapter while the slots turn over is what the slots are for.
    lora_slot_wait_share: float = Field(0.3, description="Share of the window's scrapes in which more LoRA adapters "
                                                          "had requests in flight than the engine has slots "
                                                          "(max_lora), at or above this, with requests waiting "
                                                          "(queue_waiting) while the KV cache has room (max usage "
                                                          "at most kv_usage).")
    lora_critical_slot_wait_share: float = Field(0.75, description="Critical when adapters are short of slots in "
                                                                   "at least this share of the scrapes: they take "
                                                                   "turns all the time.")

    # scheduler_cpu_bound: the GPU waits between steps for the scheduler's own CPU work (SGLang 0.5.20+
    # time accounting). With the overlap scheduler (SGLang's default) the CPU prepares step N+1 while
    # the GPU runs step N, and a GPU-bound engine's GPU is busy nearly all the time the scheduler has
    # work (the gaps left: a new batch's setup, a sampling sync, a few percent); even without overlap
    # the CPU part of an 8B model's 12-20 ms step is 2-4 ms, 10-20 %. 30 % is past both: tokens come
    # at least 1/(1 - 0.3) = 1.4 times slower than the GPU would make them.
    scheduler_gpu_idle_share: float = Field(0.3, description="Share of the scheduler's busy wall time (its loop's "
                                                              "wall time minus its idle time) in which the GPU ran no "
                                                              "forward pass, at or above this ...")
    scheduler_cpu_share: float = Field(0.8, description="... while the scheduler process used at least this many "
                                                         "CPU-seconds per second of its loop (its loop polls without "
                                                         "sleeping: well below 1, the process lacks a core or waits "
                                                         "on something else, not its own work) ...")
    scheduler_busy_share: float = Field(0.5, description="... and had runnable or queued work at least this share "
                                                          "of its loop's time (GPU gaps on a mostly idle engine lie "
                                                          "between requests, not between steps).")
    scheduler_critical_gpu_idle_share: float = Field(0.5, description="Critical when the GPU is idle at least this "
                                                                      "share of the busy time (tokens at least twice "
                                                                      "as slow as the GPU allows).")

    # lifecycle
    activate_after: int = Field(2, ge=1, description="Consecutive evaluations a finding must hold to become active.")
    resolve_after: int = Field(3, ge=1, description="Consecutive clear evaluations before an active finding resolves.")
