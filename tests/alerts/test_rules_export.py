"""`llm-latency rules export`: the exported Prometheus rules say what the built-in rules say.

Four kinds of evidence, cheapest first:

* the document itself: names, labels, runbooks, thresholds read from the config;
* ``promtool check rules`` on the committed file and on a custom config;
* ``promtool test rules`` on the hand-written unit tests in ``deploy/prometheus/tests/``
  (each alert fires on a breaching series and stays quiet on a healthy one);
* equivalence: emulated engines in every regime, scraped offline, diagnosed by the
  built-in pipeline (parse -> store -> signals -> rules) AND replayed into promtool with the
  exported rules: same numbers (to 9 significant digits), same alerts, same severities.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from app import rules_export
from app.alerts.config import TARGET_DOWN, SloConfig, regime_alertname, slo_alertname
from app.config import FileConfig, load_config
from app.core.quantiles import LatencySummary
from app.core.thresholds import Thresholds
from app.diagnosis.findings import PROBE_REGIMES, REGIMES
from app.diagnosis.rules import RULES, kv_cache_pressure, prefill_compute, prefill_interference, queueing
from app.diagnosis.signals import Signals
from app.promql.text import instance_of, num, prom_duration, quantile_name
from app.rules_export import build_rules, render_rules, rules
from app.rules_export.engines import VLLM_ITL_BUCKETS
from tests.support.components import require_binary

ROOT = Path(__file__).resolve().parents[2]
#: The regimes with a PromQL twin (the others say why not: ``Rule.no_promql``).
EXPORTED_REGIMES = {rule.regime for rule in RULES if rule.promql is not None}
DEPLOY = ROOT / "deploy" / "prometheus"
COMMITTED = DEPLOY / "llm-latency-rules.yaml"
UNIT_TESTS = DEPLOY / "tests"
HARDWARE_CONFIG = UNIT_TESTS / "hardware-targets.yaml"
HARDWARE_RULES = UNIT_TESTS / "hardware-rules.yaml"
SOURCES_CONFIG = UNIT_TESTS / "sources-targets.yaml"
SOURCES_RULES = UNIT_TESTS / "sources-rules.yaml"
SLO_BURN_CONFIG = UNIT_TESTS / "slo-burn-targets.yaml"
SLO_BURN_RULES = UNIT_TESTS / "slo-burn-rules.yaml"
PROMTOOL = "/usr/bin/promtool"

# The default severity escalations and the fixed comparison of kv_cache_pressure (Thresholds fields).
_DEFAULTS = Thresholds()
QUEUEING_CRITICAL_FACTOR = _DEFAULTS.queue_critical_factor
PREFILL_CRITICAL_FACTOR = _DEFAULTS.prefill_critical_factor
INTERFERENCE_CRITICAL_STALL = _DEFAULTS.interference_critical_stall_share
INTERFERENCE_CRITICAL_ITL_P99 = _DEFAULTS.interference_critical_itl_p99_seconds
KV_CRITICAL_PREEMPTIONS = _DEFAULTS.kv_critical_preemptions_per_second
KV_WAITING_WITHOUT_PREEMPTIONS = _DEFAULTS.kv_waiting


def promtool() -> str:
    return require_binary(PROMTOOL, "promtool: checking and unit-testing the exported Prometheus rules")


def alerts_of(document: dict) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def records_of(document: dict) -> dict[str, str]:
    return {rule["record"]: rule["expr"] for group in document["groups"] for rule in group["rules"] if "record" in rule}


# ----------------------------------------------------------------------------- the document


def test_default_export_has_the_recording_rules_named_in_the_brief() -> None:
    records = records_of(build_rules(FileConfig()))
    assert records["llm_latency:vllm_ttft_seconds:p99_5m"] == (
        "histogram_quantile(0.99, sum by (le, job, instance, model_name) "
        "(rate(vllm:time_to_first_token_seconds_bucket[5m])))")
    for engine in ("vllm", "tgi"):
        for window in ("1m", "5m"):  # diagnosis window and the dashboards' 5m
            for what in ("ttft_seconds:p50", "ttft_seconds:p90", "ttft_seconds:p99", "itl_seconds:p50",
                         "itl_seconds:p99", "queue_time_seconds:mean", "queue_share:ratio", "prefill_share:ratio",
                         "prompt_tokens:mean", "itl_p99_over_p50:ratio", "decode_stall_share:ratio",
                         "kv_cache_usage:max", "num_requests_waiting:avg", "num_requests_running:avg"):
                assert f"llm_latency:{engine}_{what}_{window}" in records
    assert "llm_latency:vllm_preemptions:rate_1m" in records and "llm_latency:tgi_preemptions:rate_1m" not in records
    # data-parallel ranks: usage is averaged, everything else summed
    assert records["llm_latency:vllm_kv_cache_usage:max_1m"].startswith("avg by (job, instance, model_name)")
    assert records["llm_latency:vllm_num_requests_running:avg_1m"].startswith("sum by (job, instance, model_name)")
    # TGI: no model_name, TTFT = queue + prefill batch, KV = current_max_tokens / max_total_tokens
    assert records["llm_latency:tgi_ttft_seconds:p99_5m"] == (
        "llm_latency:tgi_queue_time_seconds:p99_5m\n+ llm_latency:tgi_prefill_batch_seconds:p99_5m")
    assert 'tgi_batch_inference_duration_bucket{method="prefill"}[5m]' in records[
        "llm_latency:tgi_prefill_batch_seconds:p99_5m"]
    assert 'tgi_batch_inference_duration_bucket{method="decode"}[1m]' in records["llm_latency:tgi_itl_seconds:p50_1m"]
    assert "tgi_batch_current_max_tokens" in records["llm_latency:tgi_kv_cache_usage:max_1m"]
    assert all("model_name" not in expr for name, expr in records.items() if name.startswith("llm_latency:tgi_"))


def test_alerts_have_product_names_severity_runbooks_and_numbers() -> None:
    config = FileConfig.model_validate({"alerts": {"external_url": "https://llm.example.com/",
                                                   "dashboard_url": "https://grafana.example.com/d/x"}})
    alerts = alerts_of(build_rules(config))
    names = {a["alert"] for a in alerts}
    assert names == {slo_alertname("ttft"), slo_alertname("itl"), TARGET_DOWN,
                     *map(regime_alertname, EXPORTED_REGIMES)}
    assert {"LLMLatencyTTFTHigh", "LLMLatencyITLHigh", "LLMLatencyQueueing", "LLMLatencyKVCachePressure",
            "LLMLatencyTargetDown"} <= names
    for alert in alerts:
        labels, notes = alert["labels"], alert["annotations"]
        assert labels["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert set(notes) == {"summary", "description", "runbook_url", "dashboard_url"}
        assert notes["dashboard_url"] == "https://grafana.example.com/d/x?var-instance={{ $labels.instance }}"
        if "regime" in labels:
            assert alert["alert"] == regime_alertname(labels["regime"])
            assert notes["runbook_url"] == f"https://llm.example.com/runbooks/{labels['regime']}"
            assert (ROOT / "docs" / "runbooks" / f"{labels['regime']}.md").is_file()  # a runbook for every regime
            assert "{{ $value" in notes["description"] and "over the last 1m" in notes["description"]
            assert alert["for"] == "30s"  # (activate_after 2 - 1) x interval 30s + diagnosis_for 0
        elif "slo" in labels:
            assert notes["runbook_url"] == f"https://llm.example.com/runbooks/slo_{labels['slo'].split('_')[0]}"
            assert "over the last 5m is {{ $value | humanizeDuration }}" in notes["description"]
            assert alert["for"] == "2m"
        else:
            assert notes["runbook_url"] == "https://llm.example.com/runbooks/target_down"
    by_key = {(a["alert"], a["labels"].get("engine"), a["labels"]["severity"]): a for a in alerts}
    assert by_key[("LLMLatencyTTFTHigh", "vllm", "warning")]["expr"] == "llm_latency:vllm_ttft_seconds:p99_5m > 2"
    assert by_key[("LLMLatencyITLHigh", "tgi", "warning")]["expr"] == "llm_latency:tgi_itl_seconds:p99_5m > 0.15"
    assert by_key[("LLMLatencyTargetDown", None, "warning")]["expr"] == "up == 0"
    assert by_key[("LLMLatencyTargetDown", None, "warning")]["for"] == "1m"
    # critical twins exist exactly where the built-in rules escalate
    critical = {(a["alert"], a["labels"]["engine"]) for a in alerts
                if a["labels"]["severity"] == "critical" and "regime" in a["labels"]}
    assert critical == {("LLMLatencyQueueing", "vllm"), ("LLMLatencyQueueing", "tgi"),
                        ("LLMLatencyPrefillCompute", "vllm"), ("LLMLatencyPrefillCompute", "tgi"),
                        ("LLMLatencyPrefillInterference", "vllm"), ("LLMLatencyPrefillInterference", "tgi"),
                        ("LLMLatencyKVCachePressure", "vllm"), ("LLMLatencyWeightsOffloaded", "vllm"),
                        ("LLMLatencyQueueing", "sglang"), ("LLMLatencyPrefillCompute", "sglang"),
                        ("LLMLatencyPrefillInterference", "sglang"), ("LLMLatencyKVCachePressure", "sglang"),
                        # trtllm-serve has no per-step ITL: only what it can judge (the mean prompt length
                        # from its token and request counters)
                        ("LLMLatencyQueueing", "trtllm"), ("LLMLatencyPrefillCompute", "trtllm"),
                        # P/D transfer and speculative decoding on every engine that exports them;
                        # render time on vLLM only
                        ("LLMLatencyKVTransfer", "vllm"), ("LLMLatencySpeculationIneffective", "vllm"),
                        ("LLMLatencyKVTransfer", "sglang"), ("LLMLatencySpeculationIneffective", "sglang"),
                        ("LLMLatencyKVTransfer", "trtllm"), ("LLMLatencySpeculationIneffective", "trtllm"),
                        ("LLMLatencyFrontendBound", "vllm"),
                        # data-parallel ranks: vLLM's engine label, SGLang's dp_rank
                        ("LLMLatencyDpImbalance", "vllm"), ("LLMLatencyDpImbalance", "sglang"),
                        # only SGLang accounts its scheduler's time
                        ("LLMLatencySchedulerCpuBound", "sglang")}


def test_the_mean_prompt_length_comes_from_the_counters_where_the_engine_has_no_histogram() -> None:
    """As ``signals._prompt_mean``: the histogram's _sum/_count first, else rate(prompt tokens) /
    rate(finished requests); trtllm-serve has only the counters, so its prefill_compute alert reads them."""
    document = build_rules(FileConfig())
    records = records_of(document)
    assert records["llm_latency:trtllm_prompt_tokens:mean_1m"] == (
        "sum by (job, instance, model_name) (rate(trtllm_prompt_tokens_total[1m]))\n/\n(\n  (\n"
        "    sum by (job, instance, model_name) (rate(trtllm_request_success_total[1m]))\n  ) > 0\n)")
    assert records["llm_latency:sglang_prompt_tokens_best:mean_1m"] == (
        "llm_latency:sglang_prompt_tokens:mean_1m\nor\nllm_latency:sglang_prompt_tokens_counters:mean_1m")
    prefill = {a["labels"]["engine"]: a["expr"] for a in alerts_of(document)
               if a["alert"] == "LLMLatencyPrefillCompute" and a["labels"]["severity"] == "warning"}
    assert "llm_latency:trtllm_prompt_tokens:mean_1m >= 2000" in prefill["trtllm"]
    assert "llm_latency:sglang_prompt_tokens_best:mean_1m >= 2000" in prefill["sglang"]
    assert "llm_latency:vllm_prompt_tokens:mean_1m >= 2000" in prefill["vllm"]  # vLLM always has the histogram


def test_without_external_url_runbooks_are_repository_paths() -> None:
    alerts = alerts_of(build_rules(FileConfig()))
    queueing_alert = next(a for a in alerts if a["alert"] == "LLMLatencyQueueing")
    assert queueing_alert["annotations"]["runbook_url"] == "docs/runbooks/queueing.md"
    assert all("dashboard_url" not in a["annotations"] for a in alerts)  # none configured


#: Every threshold a regime rule reads, with a value no default uses.
CUSTOM_THRESHOLDS = {
    "min_requests": 7, "min_decode_steps": 77, "queue_share": 0.55, "queue_seconds": 0.75, "queue_waiting": 3,
    "prefill_seconds": 0.65, "prefill_share": 0.66, "long_prompt_tokens": 2222, "stall_share": 0.22,
    "itl_ratio": 4.4, "itl_p99_seconds": 0.111, "interference_prompt_tokens": 1111,
    "interference_long_prompt_tokens": 2444, "interference_running": 3,
    "slow_itl_seconds": 0.0333, "low_batch_running": 9, "floor_ratio_max": 2.2, "steady_itl_ratio": 2.7,
    "kv_usage": 0.88, "preemptions_per_second": 0.02, "offload_floor_ratio": 4.5,
    "kv_transfer_share": 0.33, "kv_transfer_seconds": 0.122, "kv_transfer_failure_share": 0.013,
    "kv_transfer_min_transfers": 12, "spec_accept_rate": 0.31, "spec_accept_length": 1.45, "spec_min_drafts": 111,
    "render_share": 0.34, "render_seconds": 0.133, "kv_transfer_critical_failure_share": 0.15,
    "spec_critical_accept_length": 1.12, "kv_transfer_critical_share": 0.62,
    "imbalance_waiting": 1.7, "imbalance_idle_waiting": 0.17, "imbalance_load_ratio": 2.3,
    "dp_token_imbalance_ratio": 2.9, "kv_prealloc_waiting": 1.3, "kv_alloc_seconds": 0.144,
    "scheduler_gpu_idle_share": 0.35, "scheduler_cpu_share": 0.85,
    "scheduler_busy_share": 0.45, "scheduler_critical_gpu_idle_share": 0.55,
}


def test_every_threshold_comes_from_the_config() -> None:
    config = FileConfig.model_validate({
        "targets": [{"name": "gpu", "url": "http://10.0.0.5:8000/metrics", "engine": "vllm",
                     "hardware": {"gpu": "A100-80G", "model": "llama-3.1-8b"}}],
        "diagnosis": {"window": "45s", "interval": "20s",
                      "thresholds": {**CUSTOM_THRESHOLDS, "activate_after": 3}},
        "alerts": {"diagnosis_for": "10s", "target_down_for": "3m",
                   "slos": [{"name": "ttft_p95", "signal": "ttft", "quantile": 0.95, "threshold": "1500ms",
                             "window": "10m", "for": "90s", "severity": "critical"}]},
    })
    alerts = alerts_of(build_rules(config))
    regime_exprs = "\n".join(a["expr"] for a in alerts if "regime" in a["labels"])
    for field, value in CUSTOM_THRESHOLDS.items():
        assert re.search(rf"[<>=] {re.escape(num(value))}\)*(\n|$| )", regime_exprs), field
    assert f">= {num(QUEUEING_CRITICAL_FACTOR * 0.75)}" in regime_exprs  # escalation scales with queue_seconds
    assert f">= {num(PREFILL_CRITICAL_FACTOR * 0.65)}" in regime_exprs
    floor = config.targets[0].hardware.decode_floor_seconds
    assert f"llm_latency:vllm_itl_seconds:mean_45s / {num(floor)} <= 2.2" in regime_exprs
    assert 'llm_latency:vllm_itl_seconds:mean_45s{instance="10.0.0.5:8000"} >= 0.0333' in regime_exprs
    assert "itl_seconds:p50" not in regime_exprs  # the exact mean, never the interpolated p50
    assert {a["for"] for a in alerts if "regime" in a["labels"]} == {"50s"}  # (3 - 1) x 20s + 10s
    slo = [a for a in alerts if "slo" in a["labels"]]
    assert [(a["expr"], a["for"], a["labels"]["severity"]) for a in slo] == [
        ("llm_latency:vllm_ttft_seconds:p95_10m > 1.5", "90s", "critical"),
        ("llm_latency:tgi_ttft_seconds:p95_10m > 1.5", "90s", "critical"),
        ("llm_latency:sglang_ttft_seconds:p95_10m > 1.5", "90s", "critical"),
        ("llm_latency:trtllm_ttft_seconds:p95_10m > 1.5", "90s", "critical")]
    down = next(a for a in alerts if a["alert"] == TARGET_DOWN)
    assert (down["expr"], down["for"]) == ('up{instance="10.0.0.5:8000"} == 0', "3m")
    # and nothing of the defaults survived (except where a rule's own fixed constant has the same value)
    fixed = {INTERFERENCE_CRITICAL_ITL_P99, INTERFERENCE_CRITICAL_STALL, KV_CRITICAL_PREEMPTIONS,
             KV_WAITING_WITHOUT_PREEMPTIONS, *CUSTOM_THRESHOLDS.values(), 2}  # 2: dp_imbalance needs two ranks
    for field, default in Thresholds().model_dump().items():
        if field in CUSTOM_THRESHOLDS and default not in fixed:
            assert not re.search(rf"[<>=] {re.escape(num(default))}\)*(\n|$| )", regime_exprs), field


def test_slo_targets_restrict_the_alert_to_those_instances_and_unknown_targets_are_refused() -> None:
    targets = [{"name": "a", "url": "http://a.example:8000/metrics"}, {"name": "b", "url": "https://b.example/metrics"}]
    slo = {"name": "e2e_p50", "signal": "e2e", "quantile": 0.5, "threshold": "30s", "targets": ["a", "b"]}
    alerts = alerts_of(build_rules(FileConfig.model_validate({"targets": targets, "alerts": {"slos": [slo]}})))
    assert [a["expr"] for a in alerts if "slo" in a["labels"]] == [
        'llm_latency:vllm_e2e_seconds:p50_5m{instance=~"a\\\\.example:8000|b\\\\.example|b\\\\.example:443"} > 30',
        'llm_latency:tgi_e2e_seconds:p50_5m{instance=~"a\\\\.example:8000|b\\\\.example|b\\\\.example:443"} > 30',
        'llm_latency:sglang_e2e_seconds:p50_5m{instance=~"a\\\\.example:8000|b\\\\.example|b\\\\.example:443"} > 30',
        'llm_latency:trtllm_e2e_seconds:p50_5m{instance=~"a\\\\.example:8000|b\\\\.example|b\\\\.example:443"} > 30']
    # TGI and SGLang have no decode-time histogram
    decode = {"name": "decode", "signal": "decode_time", "threshold": "1m"}
    alerts = alerts_of(build_rules(FileConfig.model_validate({"alerts": {"slos": [decode]}})))
    assert [a["labels"]["engine"] for a in alerts if "slo" in a["labels"]] == ["vllm", "trtllm"]
    with pytest.raises(ValueError, match=r"alerts.slos\[0\].targets: unknown target\(s\) 'nope'"):
        build_rules(FileConfig.model_validate({"alerts": {"slos": [{**slo, "targets": ["nope"]}]}}))


def test_formatting_helpers() -> None:
    assert [prom_duration(s) for s in (0, 1.5, 30, 60, 90, 300, 3600, 86400)] == [
        "0s", "1500ms", "30s", "1m", "90s", "5m", "1h", "1d"]
    assert [quantile_name(q) for q in (0.5, 0.9, 0.95, 0.99, 0.999)] == ["p50", "p90", "p95", "p99", "p99_9"]
    assert instance_of("http://10.0.0.5:8000/metrics") == "10.0.0.5:8000"
    assert instance_of("http://user:pw@h:9/metrics") == "h:9"
    assert instance_of("http://[::1]:8000/metrics") == "[::1]:8000"
    assert instance_of("https://vllm.internal/metrics") == "vllm.internal|vllm.internal:443"
    assert SloConfig(name="x", signal="itl", threshold=0.15).alertname == "LLMLatencyITLHigh"


def test_stall_share_bucket_literals_match_a_real_vllm_page() -> None:
    page = (ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom").read_text()
    les = re.findall(r'^vllm:inter_token_latency_seconds_bucket\{[^}]*le="([^"]+)"', page, re.M)
    assert tuple(float(le) for le in les if le != "+Inf") == VLLM_ITL_BUCKETS
    stall = records_of(build_rules(FileConfig()))["llm_latency:vllm_decode_stall_share:ratio_1m"]
    # buckets from 0.2 s up, weighted by midpoint (+Inf by its lower bound), as signals._stall_share
    weights = [float(w) for w in re.findall(r", 0\) \* ([0-9.]+)", stall)]
    assert weights == [0.25, 0.35, 0.45, 0.625, 0.875, 1.75, 3.75, 6.25, 8.75, 15, 30, 60, 80]
    assert 'le=~"1|1\\\\.0"' in stall and 'le="+Inf"' in stall  # both "1.0" (Prometheus 2) and "1" (3)


# ------------------------------------------------- severity escalations (Thresholds fields)


def _signals(engine: str = "vllm", **values: object) -> Signals:
    s = Signals("t", "m", engine, 0.0, 60.0, scrapes=5)
    s.ttft = LatencySummary(0.1, 0.2, 0.3, 0.4, 1.0, 100)
    s.itl = LatencySummary(0.02, 0.03, 0.04, 0.05, 0.025, 1000)
    s.queue_time = LatencySummary(None, None, None, None, values.pop("queue_mean", 0.01), 100)
    s.prefill_time = LatencySummary(None, None, None, None, 0.1, 100)
    s.prompt_tokens = LatencySummary(None, None, None, None, values.pop("prompt_mean", 500.0), 100)
    for key, value in values.items():
        setattr(s, key, value)
    return s


def test_escalation_constants_are_the_builtin_rules_own() -> None:
    """The built-in rules escalate exactly at the Thresholds fields the export writes."""
    t = Thresholds()
    below = 1 - 1e-9

    def severity(rule, s):
        finding = rule.evaluate(s, t)
        return finding.severity if finding else None

    q = QUEUEING_CRITICAL_FACTOR * t.queue_seconds
    assert severity(queueing, _signals(queue_mean=q, queue_share=0.9, waiting_mean=3.0)) == "critical"
    assert severity(queueing, _signals(queue_mean=q * below, queue_share=0.9, waiting_mean=3.0)) == "warning"
    p = PREFILL_CRITICAL_FACTOR * t.prefill_seconds
    common = dict(prefill_share=0.9, prompt_mean=5000.0)
    assert severity(prefill_compute, _signals(prefill_per_request=p, **common)) == "critical"
    assert severity(prefill_compute, _signals(prefill_per_request=p * below, **common)) == "warning"
    busy = dict(prompt_mean=3000.0, running_mean=10.0, itl_ratio=1.5)
    assert severity(prefill_interference,
                    _signals(decode_stall_share=INTERFERENCE_CRITICAL_STALL, **busy)) == "critical"
    assert severity(prefill_interference,
                    _signals(decode_stall_share=INTERFERENCE_CRITICAL_STALL * below, **busy)) == "warning"
    tail = _signals(decode_stall_share=0.0, **{**busy, "itl_ratio": 5.0})
    tail.itl = LatencySummary(0.1, 0.2, 0.3, INTERFERENCE_CRITICAL_ITL_P99, 0.12, 1000)
    assert severity(prefill_interference, tail) == "critical"
    tail.itl = LatencySummary(0.1, 0.2, 0.3, INTERFERENCE_CRITICAL_ITL_P99 * below, 0.12, 1000)
    assert severity(prefill_interference, tail) == "warning"
    full = dict(kv_usage_max=0.95, waiting_mean=2.0)
    assert severity(kv_cache_pressure, _signals(preemptions_per_second=KV_CRITICAL_PREEMPTIONS, **full)) == "critical"
    assert severity(kv_cache_pressure,
                    _signals(preemptions_per_second=KV_CRITICAL_PREEMPTIONS * below, **full)) == "warning"
    # no preemption counter (TGI): "requests waiting" is the fixed 1.0 of the rule, not queue_waiting
    assert severity(kv_cache_pressure, _signals("tgi", kv_usage_max=0.95,
                                                waiting_mean=KV_WAITING_WITHOUT_PREEMPTIONS)) == "warning"
    assert severity(kv_cache_pressure, _signals("tgi", kv_usage_max=0.95,
                                                waiting_mean=KV_WAITING_WITHOUT_PREEMPTIONS * below)) is None


# ----------------------------------------------------------------------------- Prometheus sources

SOURCE = {"name": "prod", "url": "http://prometheus-operated.monitoring.svc:9090", "selector": '{namespace="llm"}',
          "target_labels": ["namespace", "pod"]}


def _source_config(**extra: object) -> FileConfig:
    return FileConfig.model_validate({"sources": [SOURCE], **extra})


def test_a_source_config_groups_by_its_target_labels_and_reads_only_its_selector() -> None:
    document = build_rules(_source_config())
    records = records_of(document)
    assert records["llm_latency:vllm_ttft_seconds:p99_5m"] == (
        "histogram_quantile(0.99, sum by (le, namespace, pod, model_name) "
        '(rate(vllm:time_to_first_token_seconds_bucket{namespace="llm"}[5m])))')
    assert records["llm_latency:tgi_itl_seconds:p50_1m"] == (
        "histogram_quantile(0.5, sum by (le, namespace, pod) "
        '(rate(tgi_batch_inference_duration_bucket{method="decode",namespace="llm"}[1m])))')
    assert records["llm_latency:vllm_kv_cache_usage:max_1m"] == (
        'avg by (namespace, pod, model_name) (max_over_time(vllm:kv_cache_usage_perc{namespace="llm"}[1m]))')
    assert "instance" not in yaml.safe_dump(document) and "job" not in yaml.safe_dump(document)
    # every engine series the rules read carries the selector
    text = "\n".join(rule["expr"] for group in document["groups"] for rule in group["rules"])
    raw = re.findall(r"\b(?:vllm:|tgi_)[a-z_:]+(?:\{[^}]*\})?(?=\[|\)| )", text)
    assert len(raw) > 100 and [r for r in raw if 'namespace="llm"' not in r] == []
    down = next(a for a in alerts_of(document) if a["alert"] == TARGET_DOWN)
    assert down["expr"] == 'max by (namespace, pod) (up{namespace="llm"}) == 0'
    assert down["annotations"]["summary"] == "Prometheus cannot scrape {{ $labels.namespace }}/{{ $labels.pod }}"
    queueing_alert = next(a for a in alerts_of(document) if a["alert"] == "LLMLatencyQueueing")
    assert "and on(namespace, pod, model_name)" in queueing_alert["expr"]
    assert queueing_alert["annotations"]["description"].startswith(
        "vLLM {{ $labels.model_name }} on {{ $labels.namespace }}/{{ $labels.pod }}:")
    assert [r["equal"] for r in rules_export.inhibit_rules(rules_export.scope_of(_source_config()))][-1] == [
        "alertname", "namespace", "pod"]
    # same rules otherwise: every recorded name and alert of the default export, no more
    default = build_rules(FileConfig())
    assert set(records) == set(records_of(default))
    assert sorted((a["alert"], a["labels"]["severity"]) for a in alerts_of(document)) == sorted(
        (a["alert"], a["labels"]["severity"]) for a in alerts_of(default))


def test_a_source_without_selector_and_the_links_use_the_target_labels() -> None:
    config = FileConfig.model_validate({
        "sources": [{**SOURCE, "selector": "", "target_labels": ["cluster", "pod"]}],
        "alerts": {"dashboard_url": "https://grafana.example.com/d/x?orgId=1"}})
    document = build_rules(config)
    down = next(a for a in alerts_of(document) if a["alert"] == TARGET_DOWN)
    assert down["expr"] == "max by (cluster, pod) (up) == 0"
    assert down["annotations"]["dashboard_url"] == (
        "https://grafana.example.com/d/x?orgId=1&var-cluster={{ $labels.cluster }}&var-pod={{ $labels.pod }}")
    assert records_of(document)["llm_latency:vllm_num_requests_running:avg_1m"] == (
        "sum by (cluster, pod, model_name) (avg_over_time(vllm:num_requests_running[1m]))")


def test_static_targets_next_to_a_source_do_not_leak_into_its_rules() -> None:
    static = [{"name": "gpu", "url": "http://10.0.0.5:8000/metrics", "engine": "vllm",
               "hardware": {"gpu": "A100-80G", "model": "llama-3.1-8b"}}]
    slos = [{"name": "ttft_gpu", "signal": "ttft", "threshold": "1s", "targets": ["gpu"]},
            {"name": "itl_all", "signal": "itl", "threshold": "100ms"}]
    document = build_rules(_source_config(targets=static, alerts={"slos": slos}))
    alerts = alerts_of(document)
    # the SLO of the static target is not this Prometheus' business; the fleet-wide one is
    assert [(a["alert"], a["expr"]) for a in alerts if "slo" in a["labels"]] == [
        ("LLMLatencyITLHigh", "llm_latency:vllm_itl_seconds:p99_5m > 0.1"),
        ("LLMLatencyITLHigh", "llm_latency:tgi_itl_seconds:p99_5m > 0.1"),
        ("LLMLatencyITLHigh", "llm_latency:sglang_itl_seconds:p99_5m > 0.1")]
    # no decode floor of the static target's instance, no instance selector
    assert not [a for a in alerts if "target" in a["labels"]]
    assert "10.0.0.5" not in yaml.safe_dump(document)
    discovered = [{"name": "ttft_pod", "signal": "ttft", "threshold": "1s", "targets": ["prod.llm.vllm-0"]}]
    with pytest.raises(ValueError, match=r"alerts.slos\[0\].targets: rules for source 'prod' group by its "
                                         r"target_labels and cannot be limited to named targets \('prod.llm.vllm-0'\)"):
        build_rules(_source_config(alerts={"slos": discovered}))


def test_source_choice_with_several_sources(tmp_path: Path) -> None:
    second = {**SOURCE, "name": "edge", "url": "http://vm.edge:8428", "selector": "",
              "target_labels": ["cluster", "pod"]}
    config_file = tmp_path / "targets.yaml"
    config_file.write_text(yaml.safe_dump({"sources": [SOURCE, second]}))
    runner = CliRunner()
    refused = runner.invoke(rules, ["export", "--config", str(config_file)])
    assert refused.exit_code == 1
    assert "the config has 2 sources ('prod', 'edge'): the rules are evaluated by one Prometheus, choose its " \
           "source with --source NAME" in refused.stderr
    edge = runner.invoke(rules, ["export", "--config", str(config_file), "--source", "edge"])
    assert edge.exit_code == 0 and "max by (cluster, pod) (up) == 0" in edge.stdout
    assert "# For the Prometheus of source 'edge': every engine series," in edge.stdout
    unknown = runner.invoke(rules, ["export", "--config", str(config_file), "--source", "nope"])
    assert unknown.exit_code == 1 and "--source 'nope': no such source in the config (its sources are 'prod', " \
                                      "'edge')" in unknown.stderr
    none = runner.invoke(rules, ["export", "--source", "prod"])
    assert none.exit_code == 1 and "--source 'prod': no such source in the config (it has no sources)" in none.stderr
    out = tmp_path / "rules.yaml"
    assert runner.invoke(rules, ["export", "--config", str(config_file), "--source", "prod", "--out",
                                 str(out)]).exit_code == 0
    assert out.read_text() == render_rules(load_config(config_file), "prod")
    out.write_text(out.read_text().replace('namespace="llm"', 'namespace="x"', 1))
    stale = runner.invoke(rules, ["export", "--config", str(config_file), "--source", "prod", "--out", str(out),
                                  "--check"])
    assert stale.exit_code == 1
    assert f"--config {config_file} --source prod --out {out}`" in stale.stderr


# ----------------------------------------------------------------------------- freshness / CLI


def test_committed_rule_files_are_fresh() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == render_rules(FileConfig()), (
        "regenerate: llm-latency rules export --out deploy/prometheus/llm-latency-rules.yaml")
    assert HARDWARE_RULES.read_text(encoding="utf-8") == render_rules(load_config(HARDWARE_CONFIG)), (
        "regenerate: llm-latency rules export --config deploy/prometheus/tests/hardware-targets.yaml "
        "--out deploy/prometheus/tests/hardware-rules.yaml")
    assert SOURCES_RULES.read_text(encoding="utf-8") == render_rules(load_config(SOURCES_CONFIG)), (
        "regenerate: llm-latency rules export --config deploy/prometheus/tests/sources-targets.yaml "
        "--out deploy/prometheus/tests/sources-rules.yaml")
    assert SLO_BURN_RULES.read_text(encoding="utf-8") == render_rules(load_config(SLO_BURN_CONFIG)), (
        "regenerate: llm-latency rules export --config deploy/prometheus/tests/slo-burn-targets.yaml "
        "--out deploy/prometheus/tests/slo-burn-rules.yaml")
    text = COMMITTED.read_text(encoding="utf-8")
    assert text.startswith("# GENERATED by `llm-latency rules export`")
    assert "DO NOT EDIT BY HAND" in text.splitlines()[0]
    assert yaml.safe_load(text) == build_rules(FileConfig())


def test_check_exits_0_on_the_committed_file_and_1_with_a_message_on_a_modified_copy(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(rules, ["export", "--out", str(COMMITTED), "--check"])
    assert (ok.exit_code, ok.stdout) == (0, f"{COMMITTED}: up to date\n")
    stale = tmp_path / "rules.yaml"
    stale.write_text(COMMITTED.read_text().replace("llm_latency:vllm_queue_time_seconds:mean_1m >= 0.5",
                                                   "llm_latency:vllm_queue_time_seconds:mean_1m >= 0.7", 1))
    result = runner.invoke(rules, ["export", "--out", str(stale), "--check"])
    assert result.exit_code == 1
    assert f"{stale} is stale: regenerate it with `llm-latency rules export --out {stale}`" in result.stderr
    assert re.search(r"^-\s+llm_latency:vllm_queue_time_seconds:mean_1m >= 0.7$", result.stderr, re.M)
    assert re.search(r"^\+\s+llm_latency:vllm_queue_time_seconds:mean_1m >= 0.5$", result.stderr, re.M)
    assert stale.read_text() != COMMITTED.read_text()  # --check never writes
    missing = runner.invoke(rules, ["export", "--out", str(tmp_path / "absent.yaml"), "--check"])
    assert missing.exit_code == 1 and "cannot read" in missing.stderr
    assert runner.invoke(rules, ["export", "--check"]).exit_code == 2  # --check needs --out


def test_export_writes_stdout_or_file_and_reports_bad_configs(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(rules, ["export"])
    assert out.exit_code == 0 and out.stdout == render_rules(FileConfig())
    written = tmp_path / "deploy" / "rules.yaml"
    result = runner.invoke(rules, ["export", "--config", str(HARDWARE_CONFIG), "--out", str(written)])
    assert result.exit_code == 0 and written.read_text() == HARDWARE_RULES.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("diagnosis: {thresholds: {queue_share: lots}}\n")
    failed = runner.invoke(rules, ["export", "--config", str(bad)])
    assert failed.exit_code == 1 and "diagnosis.thresholds.queue_share" in failed.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("alerts: {slos: [{name: x, signal: ttft, threshold: 1s, targets: [ghost]}]}\n")
    failed = runner.invoke(rules, ["export", "--config", str(unknown)])
    assert failed.exit_code == 1 and "unknown target(s) 'ghost'" in failed.stderr


# ----------------------------------------------------------------------------- promtool


@pytest.mark.prometheus
def test_promtool_check_rules_accepts_the_default_and_a_custom_export(tmp_path: Path) -> None:
    exe = promtool()
    custom = FileConfig.model_validate({
        "targets": [{"name": "gpu", "url": "http://gpu:8000/metrics", "hardware": {"gpu": "H100-SXM",
                                                                                   "model": "llama-3.1-70b"}},
                    {"name": "edge", "url": "https://edge.example/metrics", "engine": "tgi",
                     "hardware": {"hbm_bandwidth": 3e11, "params": 8e9, "weight_dtype": "int4"}}],
        "diagnosis": {"window": "2m", "interval": "1m"},
        "alerts": {"external_url": "https://llm.example.com", "slos": [
            {"name": "tpot_p90", "signal": "tpot", "quantile": 0.9, "threshold": "80ms"},
            {"name": "queue_p999", "signal": "queue_time", "quantile": 0.999, "threshold": "10s", "window": "15m",
             "targets": ["gpu"]},
            {"name": "prefill_p50", "signal": "prefill_time", "quantile": 0.5, "threshold": "1s", "for": "0s"}]},
    })
    custom_file = tmp_path / "custom-rules.yaml"
    custom_file.write_text(render_rules(custom))
    expected = {COMMITTED: build_rules(FileConfig()), HARDWARE_RULES: build_rules(load_config(HARDWARE_CONFIG)),
                SOURCES_RULES: build_rules(load_config(SOURCES_CONFIG)), custom_file: build_rules(custom)}
    for path, document in expected.items():
        result = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        count = sum(len(group["rules"]) for group in document["groups"])
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"SUCCESS: {count} rules found" in result.stdout, result.stdout
    assert "llm_latency:vllm_queue_time_seconds:p99_9_15m" in records_of(expected[custom_file])


UNIT_TEST_FILES = sorted(UNIT_TESTS.glob("*.test.yaml"))


def test_unit_tests_cover_every_alert_firing() -> None:
    """Each alert has a promtool case where it fires (and, in the same case, quiet instances)."""
    fired: set[str] = set()
    for path in UNIT_TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                fired |= {alert["exp_labels"]["alertname"] for alert in check["exp_alerts"]}
    assert fired == {"LLMLatencyTTFTHigh", "LLMLatencyITLHigh", "LLMLatencyQueueing", "LLMLatencyKVCachePressure",
                     "LLMLatencyPrefillInterference", "LLMLatencyPrefillCompute", "LLMLatencyTargetDown",
                     "LLMLatencyBandwidthBound", "LLMLatencyWeightsOffloaded", "LLMLatencyKVTransfer",
                     "LLMLatencySpeculationIneffective", "LLMLatencyFrontendBound",
                     "LLMLatencyDpImbalance", "LLMLatencySchedulerCpuBound", "LLMLatencySLOBurnRate"}
    sources = yaml.safe_load((UNIT_TESTS / "sources.test.yaml").read_text())
    assert yaml.safe_load((UNIT_TESTS / "sources.test.yaml").read_text())["rule_files"] == ["sources-rules.yaml"]
    in_sources = {alert["exp_labels"]["alertname"]: alert["exp_labels"] for case in sources["tests"]
                  for check in case["alert_rule_test"] for alert in check["exp_alerts"]}
    assert {name: (labels["namespace"], labels["pod"]) for name, labels in in_sources.items()} == {
        "LLMLatencyTargetDown": ("llm", "vllm-0"), "LLMLatencyQueueing": ("llm", "vllm-0")}


@pytest.mark.prometheus
@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=[p.name for p in UNIT_TEST_FILES])
def test_promtool_unit_tests_pass(path: Path) -> None:
    exe = promtool()
    result = subprocess.run([exe, "test", "rules", path.name], cwd=path.parent, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].strip() == "SUCCESS"


# ----------------------------------------------------------------------------- equivalence

#: scenario, engine, hardware profile? -- one emulated target per row, all in one promtool run
EQUIVALENCE_CASES = [
    ("healthy", "vllm", False), ("queueing", "vllm", False), ("prefill_compute", "vllm", False),
    ("prefill_interference", "vllm", False), ("kv_cache_pressure", "vllm", False), ("bandwidth_bound", "vllm", True),
    ("weights_offloaded", "vllm", True), ("healthy_bursty", "tgi", False), ("queueing", "tgi", False),
    ("prefill_compute", "tgi", False), ("prefill_interference", "tgi", False), ("kv_cache_pressure", "tgi", False),
    ("bandwidth_bound", "tgi", False), ("weights_offloaded", "tgi", True), ("kv_transfer", "vllm", False),
    ("speculation_ineffective", "vllm", False), ("frontend_bound", "vllm", False), ("dp_imbalance", "vllm", False),
    # SGLang writes its acceptance gauges as 0 without speculation: the healthy pages must stay quiet
    ("healthy", "sglang", False), ("kv_transfer", "sglang", False), ("speculation_ineffective", "sglang", False),
    ("healthy", "trtllm", False), ("kv_transfer", "trtllm", False), ("speculation_ineffective", "trtllm", False),
    ("scheduler_cpu_bound", "sglang", False),
]
STEP = 5  # simulated seconds between scrapes (= promtool's interval)

#: built-in signal -> exported recording rule (vLLM name; the case's engine swapped in)
SIGNAL_RECORDS = {
    "queue_share": "queue_share:ratio", "prefill_share": "prefill_share:ratio", "itl_ratio": "itl_p99_over_p50:ratio",
    "decode_stall_share": "decode_stall_share:ratio", "running_mean": "num_requests_running:avg",
    "waiting_mean": "num_requests_waiting:avg", "kv_usage_max": "kv_cache_usage:max",
    "preemptions_per_second": "preemptions:rate", "ttft.mean": "ttft_seconds:mean", "itl.p50": "itl_seconds:p50",
    "itl.p99": "itl_seconds:p99", "prompt_tokens.mean": "prompt_tokens:mean", "prompt_tokens.p90": "prompt_tokens:p90",
    "queue_time.mean": "queue_time_seconds:mean", "kv_transfer_share": "kv_transfer_share:ratio",
    "kv_transfer_failure_share": "kv_transfer_failure_share:ratio",
    "kv_transfer.mean": "kv_transfer_seconds_mean:ratio", "spec_accept_rate": "spec_accept_rate:ratio",
    "spec_accept_length": "spec_accept_length:mean", "gpu_idle_share": "gpu_idle_share:ratio",
    "scheduler_cpu_share": "scheduler_cpu_share:ratio", "scheduler_busy_share": "scheduler_busy_share:ratio",
}


def _series(pages: list[str], wanted: set[str], instance: str) -> dict[str, list[str]]:
    """The raw samples Prometheus would ingest from these pages (one page per STEP), for
    the metric names the rules read."""
    out: dict[str, list[str]] = {}
    for index, page in enumerate(pages):
        for line in page.splitlines():
            if not line or line.startswith("#"):
                continue
            ident, _, value = line.rpartition(" ")
            if ident.split("{", 1)[0] not in wanted:
                continue
            extra = f'job="llm",instance="{instance}"'
            ident = f"{ident[:-1]},{extra}}}" if ident.endswith("}") else f"{ident}{{{extra}}}"
            out.setdefault(ident, ["_"] * len(pages))[index] = value
    return out


def _rounded(value: float) -> tuple[str, float]:
    """(PromQL scaling, expected) comparing to 9 significant digits, as PromQL's round() does."""
    if value == 0:
        return "", 0.0
    k = 8 - math.floor(math.log10(abs(value)))
    return f" * 1e{k}", float(math.floor(value * 10.0**k + 0.5))


def _expected_alerts(findings) -> list[tuple[str, str]]:
    out = []
    twins = {"queueing", "prefill_compute", "prefill_interference", "kv_cache_pressure", "kv_transfer",
             "speculation_ineffective", "frontend_bound", "dp_imbalance", "scheduler_cpu_bound"}
    for f in findings:
        name = regime_alertname(f.regime)
        out.append((name, f.severity))
        if f.severity == "critical" and f.regime in twins:
            out.append((name, "warning"))
    return sorted(out)


@pytest.mark.prometheus
def test_exported_rules_agree_with_the_builtin_diagnosis_on_emulated_engines(tmp_path: Path) -> None:
    from tests.diagnosis.harness import OfflineTarget, profile_of

    exe = promtool()
    window = 60.0
    wanted = set(re.findall(r"\b(?:vllm:|tgi_|sglang:|trtllm_)[a-z_:]+", render_rules(FileConfig())))
    targets, series, expr_tests, eval_time = [], {}, [], None
    summary = []
    for index, (scenario, engine, profiled) in enumerate(EQUIVALENCE_CASES):
        instance = f"{scenario.replace('_', '-')}-{engine}:{8000 + index}"
        hardware = profile_of(scenario) if profiled else None
        target = OfflineTarget(tmp_path, scenario, engine=engine, seed=1, hardware=hardware, name=f"t{index}")
        pages: list[str] = []
        render = target.sim.render_metrics

        def capture(render=render, pages=pages) -> str:
            page = render()
            pages.append(page if isinstance(page, str) else page.decode())
            return page

        target.sim.render_metrics = capture  # type: ignore[method-assign]
        try:
            target.run(120, scrape_every=STEP)
            diagnosis = target.diagnose(window)
        finally:
            target.close()
        end = (len(pages) - 1) * STEP
        assert eval_time in (None, end)
        eval_time = end
        series.update(_series(pages, wanted, instance))
        entry = {"name": f"t{index}", "url": f"http://{instance}/metrics", "engine": engine}
        if hardware is not None:
            entry["hardware"] = hardware.model_dump(exclude_none=True)
        targets.append(entry)
        summary.append((instance, scenario, [(f.regime, f.severity) for f in diagnosis.findings]))
        # healthy only where every regime was judged (not without a profile on TGI, SGLang, trtllm-serve)
        assert diagnosis.verdict == (("not_judged" if diagnosis.not_judged else "healthy")
                                     if scenario.startswith("healthy") else scenario)

        labels = f'instance="{instance}"'
        signals = diagnosis.signals
        for key, record in SIGNAL_RECORDS.items():
            head, _, field = key.partition(".")
            value = signals.get(head)
            value = value.get(field) if field and isinstance(value, dict) else (None if field else value)
            if value is None:
                continue
            scale, expected = _rounded(value)
            expr_tests.append({"expr": f"sum(round(llm_latency:{engine}_{record}_1m{{{labels}}}{scale}))",
                               "eval_time": f"{end}s", "exp_samples": [{"labels": "{}", "value": expected}]})
        expr_tests.append({
            "expr": f'count by (alertname, severity) (ALERTS{{regime!="",{labels}}})', "eval_time": f"{end}s",
            "exp_samples": [{"labels": f'{{alertname="{name}",severity="{severity}"}}', "value": 1}
                            for name, severity in _expected_alerts(diagnosis.findings)]})

    (tmp_path / "rules.yaml").write_text(render_rules(FileConfig.model_validate({"targets": targets})))
    test_file = {"rule_files": ["rules.yaml"], "evaluation_interval": f"{STEP}s", "tests": [{
        "name": "exported rules == built-in diagnosis", "interval": f"{STEP}s",
        "input_series": [{"series": ident, "values": " ".join(values)} for ident, values in series.items()],
        "promql_expr_test": expr_tests}]}
    (tmp_path / "equivalence.test.yaml").write_text(yaml.safe_dump(test_file, sort_keys=False, width=100000))
    result = subprocess.run([exe, "test", "rules", "equivalence.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, f"{summary}\n{result.stdout[-8000:]}{result.stderr[-2000:]}"
    # the comparison was not vacuous: every regime fired somewhere, each at its built-in severity
    fired = {regime for _, _, findings in summary for regime, _ in findings}
    assert fired == EXPORTED_REGIMES
    assert len(expr_tests) > 12 * len(EQUIVALENCE_CASES)


def test_only_the_regimes_prometheus_cannot_see_have_no_rule() -> None:
    # unexplained: the absence of every other finding, with the rules that could not judge (see its no_promql)
    assert set(REGIMES) - EXPORTED_REGIMES == {*PROBE_REGIMES, "replica_imbalance", "unexplained", "lora_adapter_slots"}
    assert all(rule.no_promql for rule in RULES if rule.promql is None)


def test_module_docstring_lists_the_differences() -> None:
    doc = rules_export.__doc__ or ""
    for difference in ("for:", "ITL at small batch", "subquery", "midpoint", "0.8-era names", "SGLang"):
        assert difference in doc, difference
