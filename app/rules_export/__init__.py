"""``llm-latency rules export``: the built-in SLOs and regime rules as Prometheus rules.

Teams that already run Prometheus and Alertmanager can alert on the same conditions the
service diagnoses, computed by their own Prometheus from the engines' own metric names
(vLLM current names, TGI). One source of truth: every threshold is read from the config
objects (``diagnosis.thresholds``, ``diagnosis.window``/``interval``, ``alerts.slos``,
``alerts.target_down_for``), never written here; CI checks the committed file is fresh
(``--check``).

What each part mirrors
======================

Recording rules (``llm_latency:<engine>_<what>:<aggregation>_<window>``), per
``job, instance[, model_name]`` with data-parallel ranks (vLLM's ``engine`` label) summed
away, as :mod:`app.diagnosis.signals` does:

* quantiles: ``histogram_quantile(q, sum by (le, ...) (rate(x_bucket[w])))`` -- the
  service's quantile math is Prometheus' (``app/core/quantiles.py``), so these agree exactly;
* means ``rate(x_sum)/rate(x_count)``; queue and prefill *shares* are ratios of means;
* gauges: ``sum`` of per-rank ``avg_over_time`` (running, waiting), ``avg`` of per-rank
  ``max_over_time`` for KV usage (summing a usage fraction over ranks is wrong); for
  ``dp_imbalance`` the ranks are also kept apart (``<engine>_rank_load:avg``, the busiest and
  least busy rank's waiting, their load ratio, the rank count);
* the mean prompt length from ``rate(prompt tokens) / rate(finished requests)`` where the engine
  has no prompt-length histogram (trtllm-serve; SGLang where the histogram is absent);
* KV transfer (P/D) and speculative decoding per engine, as ``signals._disaggregation`` /
  ``_speculation`` read them: the transfer-time histogram's mean (SGLang's
  ``kv_transfer_latency_ms`` divided by 1000, as its adapter does; else its
  ``per_stage_req_latency_seconds{stage="prefill_transfer_kv_cache"}``), completed transfers
  from the engine's counter (TensorRT-LLM ``_success_total``) else the histogram's count, the
  failed share against completed + failed; acceptance from the draft/accepted token counters
  (vLLM, TensorRT-LLM) else the engine's gauges averaged over the window and the ranks (SGLang),
  tokens per verification step from vLLM's draft count else the gauge (SGLang, TensorRT-LLM), and
  the verification steps the rule needs from vLLM's draft count, SGLang's ITL observations or
  TensorRT-LLM's generated tokens / tokens per step. ``frontend_bound`` reads vLLM's render
  histogram, which no other engine exports;
* TGI has no TTFT histogram: TTFT quantile = queue quantile + prefill-batch quantile (what
  the latency API and TGI's own dashboard show), TTFT mean = mean queue time + prefill
  batch time per admitted request (``rate(prefill_sum)/rate(queue_count)``), ITL = decode
  batch duration, KV usage = ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``.

Alerting rules (names from :mod:`app.alerts.config`; labels ``severity``, ``engine`` and
``regime`` or ``slo``; annotations ``summary``, ``description`` with ``{{ $value }}`` and
the window, ``runbook_url``, and ``dashboard_url`` when configured):

* one per SLO and engine (``histogram_quantile > threshold`` for ``for``), limited to the
  SLO's ``targets`` by ``instance``; TGI has no decode-time histogram (skipped);
* one per regime and engine, written by the regime's own module (``RULE.promql`` in
  ``app/diagnosis/rules/<regime>.py``, with :class:`RegimeAlerts`), gated like
  ``engine.data_problems`` (``min_requests`` or ``min_decode_steps`` in the window), plus a
  ``critical`` twin where the built-in rule escalates severity (same alertname; the header
  suggests inhibit_rules);
* ``bandwidth_bound`` (warning) and ``weights_offloaded`` (critical) for every target
  with a ``hardware`` profile: its decode floor as a literal, matched on ``instance``
  (host:port of the target URL); for all other instances what the built-in rules say
  without a floor: ``bandwidth_bound`` at ``info``, and (vLLM) ``weights_offloaded``
  when the engine reports ``cpu_offload_gb > 0`` or the ``weights_offloaded`` sleep state;
* ``LLMLatencyTargetDown`` on ``up == 0`` for ``alerts.target_down_for`` (limited to the
  configured targets' instances when there are any).

For a Prometheus source (the config has ``sources:``; ``--source NAME`` when there are
several): the rules are for that source's Prometheus and see its replicas as the service
does. Every engine series carries the source's ``selector``; everything is grouped by its
``target_labels`` (plus ``model_name``) instead of ``job, instance``; alert texts, the
``dashboard_url`` variables and the suggested inhibit_rules name a target by those labels;
``LLMLatencyTargetDown`` is ``max by (<target labels>) (up{<selector>}) == 0`` (a pod whose
every scrape endpoint fails). Static targets of the file are not this Prometheus' series: their
hardware profiles and SLOs limited to them are left out (an SLO limited to discovered target
names is refused: narrow the selector instead).

Every alert links its runbook (``<external_url>/runbooks/<name>``, else
``docs/runbooks/<name>.md``; names from ``app.alerts.config.ALERT_RUNBOOKS``: the regime
for regime alerts, ``slo_<signal>`` for SLOs, ``target_down``).

Known differences from the built-in evaluation (the generated file's header points here):

* ``for:`` approximates the finding lifecycle: ``(activate_after - 1) x interval +
  alerts.diagnosis_for``; Prometheus evaluates every ``evaluation_interval``, not every
  ``diagnosis.interval``. Resolution is immediate (no ``resolve_after``).
* "ITL at small batch" (mean ITL over scrape intervals with <= 2 running requests) has
  no PromQL equivalent; the exported rules use the window's exact mean ITL (``_sum/_count``),
  which is what the built-in rules fall back to without enough small-batch intervals. Never an
  interpolated p50: inside a coarse bucket (25-50 ms) it can sit on the other side of
  ``slow_itl_seconds`` from the mean.
* Thresholds on quantiles (ITL p99/p50, ITL p99, prompt-length p90) compare the interpolated
  value; the built-in rules decide them on the bucket that holds the quantile and leave a
  regime "not judged" when the threshold lies inside it, or when "steady" rests on fewer than
  ``steady_min_scrapes`` scrapes. Prometheus has no bucket interval to compare.
* TGI KV usage max is a subquery over ``evaluation_interval`` steps, not over scrapes.
* ``dp_imbalance``: where two ranks tie for the busiest (or least busy) load, ``topk`` /
  ``bottomk`` may take the other rank's waiting count than the built-in rule's order does.
* Stall share (vLLM) weights each ITL bucket at or above the stall bound by its midpoint
  (the +Inf bucket by its lower bound), like ``signals._stall_share``; it needs the
  bucket layout as literals (:data:`VLLM_ITL_BUCKETS`), and negative per-bucket
  increases are clamped at 0 instead of the running-max repair.
* SGLang writes ``spec_accept_rate`` / ``spec_accept_length`` as 0 while speculation is off, and
  the built-in adapter drops each scrape whose length is 0; the exported gauges count a series only
  when its length stayed above 0 over the whole window (``min_over_time``), so a window that
  starts before the first speculative step stays quiet where the built-in rule averages the rest.
* ``kv_transfer``'s alert value is the mean transfer time, so a worker whose every transfer in
  the window failed (no transfer time recorded) raises no exported alert; the built-in rule
  still finds it from the failure counter.
* vLLM series use current names only (``inter_token_latency_seconds``,
  ``kv_cache_usage_perc``); 0.8-era names are not matched. SGLang series use 0.5 names
  (0.3's ``name=`` model label is not matched).
* The built-in ranking (a cause marks its symptoms ``caused_by``) has no rule-file
  equivalent; the suggested Alertmanager inhibit_rules approximate it.
* ``outside_engine`` (:data:`app.diagnosis.findings.PROBE_REGIMES`) compares client-side
  probe TTFT with the engine's; Prometheus sees only the engine's metrics, so it has no
  exported rule (the service's own alerts carry it as ``LLMLatencyOutsideEngine``).
* ``unexplained`` fires on the absence of every other regime's finding and lists the rules that
  could not judge; a rule file cannot see which twins were skipped for a missing series, so it
  has no exported rule (the service's own alerts carry it as ``LLMLatencyUnexplained``; latency
  above a bound alerts in Prometheus through the SLO rules). ``diagnosis.overrides`` (expected
  ranges per target) are read by ``unexplained`` alone, so they change no exported rule.
"""

from app.rules_export.alerting import inhibit_rules
from app.rules_export.engines import scope_of
from app.rules_export.export import build_rules, render_rules, rules

__all__ = ["build_rules", "inhibit_rules", "render_rules", "rules", "scope_of"]
