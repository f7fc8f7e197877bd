"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.config import NAME_PATTERN, EngineName, TargetConfig
from app.core.durations import parse_duration
from app.core.limits import MAX_INTERVAL_SECONDS, MAX_SCRAPE_LIMIT, Labels, Url
from app.diagnosis.findings import CONFIDENCE_MEANING
from app.diagnosis.profile import HardwareProfile
from app.probe.canary import CanaryConfig

Seconds = Annotated[float, BeforeValidator(parse_duration)]


class TargetIn(TargetConfig):
    """A new target (same fields and rules as in the config file)."""


class TargetPatch(BaseModel):
    """Fields to change; omitted fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    url: Url | None = None
    engine: EngineName | None = None
    labels: Labels | None = None
    scrape_interval: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    scrape_timeout: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    sample_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT)
    series_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT)
    stored_series_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT)
    hardware: HardwareProfile | None = None
    canary: CanaryConfig | None = None


class ScrapeOut(BaseModel):
    ts: float
    up: bool
    duration_seconds: float
    bytes: int
    samples_seen: int
    samples_kept: int
    malformed_lines: int
    engine: str | None
    error_class: str | None
    error: str | None


class TargetOut(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    url: str
    engine: str
    detected_engine: str | None
    labels: dict[str, str]
    scrape_interval_seconds: float
    scrape_timeout_seconds: float
    sample_limit: int = Field(description="Samples of the engine's families a page may have (the target's, "
                                          "else the service's default)")
    series_limit: int = Field(description="Series a page may have (the target's, else the service's default)")
    stored_series_limit: int = Field(description="Series the target may have stored (the target's, else the "
                                                 "service's default)")
    source: str = Field(description="config | api | file_sd | http_sd | prometheus | service (the last four "
                                    "discovered)")
    origin: str | None = Field(None, description="For a discovered target: its discovery config (e.g. "
                                                 "file_sd_configs[0]) or Prometheus source")
    gone_at: float | None = Field(None, description="When a discovered target disappeared (kept for its history, "
                                                    "no longer scraped or evaluated); null while present")
    hardware: dict | None = None
    canary: dict | None = None
    created_at: float
    updated_at: float
    last_scrape: ScrapeOut | None = None


class TargetInfoOut(BaseModel):
    """One info metric of the engine (e.g. vLLM ``cache_config_info``) as last scraped."""

    name: str
    model: str
    rank: str
    labels: dict[str, str]
    ts: float


class TargetConfigOut(BaseModel):
    target: str
    info: list[TargetInfoOut]


class ScrapeHealthOut(BaseModel):
    target: str
    engine: str
    scrapes: int
    failed: int
    success_ratio: float | None = Field(description="(scrapes - failed) / scrapes; null without scrapes")
    last: ScrapeOut | None


# --------------------------------------------------------------------------- health

class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    """``targets`` (those scraped by this process plus those its Prometheus sources found) only when
    the database answers."""

    status: str = Field(description="ok | unavailable")
    database: str = Field(description="ok, or the error that reached the database")
    targets: int | None = None
    sources: dict[str, str] | None = Field(None, description="Per Prometheus source: ok, not read yet, or "
                                           "its last error (the service stays ready: its other targets work)")


class SourceOut(BaseModel):
    """A Prometheus source and how its last rounds went."""

    name: str
    kind: str
    url: str = Field(description="Without credentials")
    target_labels: list[str]
    state: str = Field(description="ok | failing | pending (not read yet)")
    last_success: float | None = Field(description="Unix time of the last round that read it")
    last_error: str | None = Field(description="Classified error of the last failed round (kind: message)")
    last_error_at: float | None
    queries_last_round: int
    bytes_last_round: int = Field(description="Answer bytes (decompressed) its last round read")
    buckets_last_round: dict[str, int] = Field(
        description="Means first: per histogram, the targets whose buckets the last round read (the others: "
                    "_sum and _count alone, as the diagnosis needed no distribution of them)")
    last_round_seconds: float | None
    targets: int = Field(description="Live targets (replicas) it reported last round")
    services: int = Field(description="Services its service_labels grouped those into")
    down: int = Field(description="Of those, scraped with up == 0")
    gone: int = Field(description="Targets whose series stopped (kept for their history)")
    bad_series: dict[str, int] = Field(description="Series of its answers dropped since the start because they "
                                                   "cannot be what the query reads, by reason: bad_bound (a bucket's "
                                                   "le is not a number), bad_count (a count of scrapes or "
                                                   "counter resets that is not a finite count), bad_label (a "
                                                   "label the query sets, altered)")
    refused_answers: dict[str, str] = Field(description="Queries (by signal) whose last answer was refused as too "
                                                        "large (max_series, max_samples, max_response_bytes): the "
                                                        "windows lack that signal")
    scrape_interval: float | None = Field(None, description="Seconds between two scrapes of its engines by its "
                                                            "Prometheus; null while unknown")
    held_series: int = Field(0, description="Series whose raw samples it keeps (histograms' _sum/_count, gauges, "
                                            "counters, up), each read once: the rounds' means are computed from them")
    held_refreshed_at: float | None = Field(None, description="Unix time those samples were last read up to")
    held_note: str = Field("", description="Why no samples are kept (an answer too large): its rounds query instead")
    native_histograms: dict[str, int] = Field(
        default_factory=dict, description="Per histogram name, the live replicas whose Prometheus holds it as a native "
                                          "histogram alone (Prometheus 3's convert_classic_histograms_to_nhcb), "
                                          "without the classic _bucket/_sum/_count series the service reads: those "
                                          "replicas lack that histogram (keep the classic series with "
                                          "always_scrape_classic_histograms: true)")
    scrape_interval_from: str | None = Field(None, description="config (the source's scrape_interval) or server "
                                                               "(its /api/v1/targets)")
    scrape_interval_note: str = Field("", description="How the interval was learned, or why it is unknown")
    diagnosis_window: float | None = Field(None, description="Seconds of the window its targets were last "
                                                             "diagnosed over: diagnosis.window, at least "
                                                             "window_intervals scrape intervals")
    window_note: str = Field("", description="Why that window")
    window_warning: str | None = Field(None, description="The rules that window holds too few scrapes for "
                                                         "(never judged), by name; null when it holds enough")
    pods_without_service_labels: int = Field(0, description="Live replicas lacking a value of one of "
                                                            "service_labels: in no service, diagnosed as replicas "
                                                            "only")
    missing_service_labels: dict[str, int] = Field(default_factory=dict, description="Per service label, the live "
                                                                                      "replicas lacking it")


# --------------------------------------------------------------------------- latency
# Routes answering these models set ``response_model_exclude_unset``: a signal the target does
# not export, or has no samples of in the window, is absent from the answer, not null.

class SignalSummary(BaseModel):
    """Percentiles, mean and count of one histogram signal over the window
    (null where the window holds no observation)."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    count: float = Field(description="observations in the window (increase of _count)")
    intervals: dict[str, list[float | None]] | None = Field(None, description=(
        "per quantile, the histogram bucket [lower, upper] that holds it (upper null: the +Inf bucket); "
        "the quantile is interpolated inside it, the buckets know no more"))
    count_estimate: bool | None = Field(None, description=(
        "true when count is extrapolated to the window's edges like Prometheus' increase() (not a whole "
        "number of observations)"))
    derived: bool | None = Field(None, description="true when computed from other signals (TGI TTFT)")
    derivation: str | None = Field(None, description="how a derived signal was computed")
    bounds: dict[str, list[float | None]] | None = Field(None, description=(
        "a derived signal's quantiles are not computed (quantiles do not add): per quantile, the interval "
        "[lower, upper] the true quantile lies in (upper null: unbounded)"))


class GaugeSummary(BaseModel):
    last: float
    mean: float
    max: float


class SignalsLatency(BaseModel):
    """Every histogram signal of :data:`app.sources.base.HISTOGRAM_SIGNALS` (seconds, or
    tokens for the ``*_tokens`` ones), counter rates and gauges over one window."""

    ttft: SignalSummary | None = None
    itl: SignalSummary | None = None
    tpot: SignalSummary | None = None
    e2e: SignalSummary | None = None
    queue_time: SignalSummary | None = None
    prefill_time: SignalSummary | None = None
    decode_time: SignalSummary | None = None
    inference_time: SignalSummary | None = None
    prompt_tokens: SignalSummary | None = None
    generation_tokens: SignalSummary | None = None
    iteration_tokens: SignalSummary | None = None
    kv_transfer_time: SignalSummary | None = None
    kv_wait_time: SignalSummary | None = None
    prealloc_time: SignalSummary | None = None
    kv_alloc_time: SignalSummary | None = None
    render_time: SignalSummary | None = None
    rates: dict[str, float] = Field(description="per-second rates of the counters (``<counter>_per_second``) "
                                                "and ``prefix_cache_hit_rate``")
    gauges: dict[str, GaugeSummary] = Field(description="per gauge signal (running, waiting, kv_usage)")


class LatencySpan(BaseModel):
    start: float
    end: float
    window_seconds: float


class TargetLatencyHead(BaseModel):
    target: str
    engine: str
    window: str


class FleetLatencyHead(BaseModel):
    targets: list[str]
    window: str
    excluded_load_balanced: list[str] = Field(default_factory=list, description=(
        "targets left out because their URL is answered by several engine processes (load_balanced)"))


class DiscoveryOut(BaseModel):
    """One ``file_sd_configs`` / ``http_sd_configs`` entry of the targets file."""

    origin: str = Field(description="e.g. file_sd_configs[0]; the targets it found carry it as origin")
    kind: str = Field(description="file_sd | http_sd")
    where: list[str] = Field(description="the file patterns, or the URL")
    refresh_interval_seconds: float
    last_refresh: float | None
    last_success: float | None
    targets: int = Field(description="targets in the last good list")
    problems: list[str] = Field(description="bad files and entries of the last refresh, each named; skipped")
    error: str | None = Field(description="why the last refresh failed as a whole; the last good list is kept")


class PdRoleOut(BaseModel):
    """A worker's part in prefill/decode disaggregation (:func:`app.latency.pd_role`)."""

    role: Literal["prefill", "decode", "both"]
    source: str = Field(description="what said so: the engine's configuration (vLLM kv_role, SGLang engine_type), "
                                    "a target label (a source's pd_role_label) or its metrics (KV transfers "
                                    "recorded on the reading side)")


# Field order follows the bases from last to first: head, span, signals, then ``models``.
class PdSplit(BaseModel):
    """A prefill/decode-disaggregated request's TTFT assembled across its two workers, as means."""

    prefill_target: str = Field(description="the prefill worker (the decode target's label "
                                            "``llm_latency_prefill_target``), or a source's prefill replicas of "
                                            "the deployment (its ``pd_pair_labels``), comma-separated")
    prefill_targets: list[str] = Field(description="the same, one name each; several are summed")
    decode_prealloc: float | None = Field(description=(
        "mean handshake and KV-memory reservation on the decode worker before the prefill starts (s; SGLang's "
        "stage decode_bootstrap, else its prealloc queue by Little's law); null for engines without one"))
    prefill_queue: float | None = Field(description="mean queue time on the prefill worker (s)")
    prefill: float | None = Field(description="mean prefill time on the prefill worker (s)")
    kv_transfer: float | None = Field(description=(
        "mean KV transfer time (s): the decode worker's transfer histogram (vLLM, TensorRT-LLM), else the prefill "
        "worker's (SGLang), else the decode worker's KV wait less the prefill worker's queue and prefill"))
    decode_queue: float | None = Field(description=(
        "mean queue time on the decode worker before its first step (s): its queue-time histogram, else its "
        "waiting gauge by Little's law"))
    first_step: float | None = Field(description="mean first scheduled -> first token on the decode worker (s)")
    kv_wait: float | None = Field(description=(
        "mean time the decode worker waited for the KV (s; SGLang's stage decode_transferred, else its transfer "
        "queue by Little's law): the prefill worker's queue and prefill and the transfer; not added to the total"))
    ttft_mean: float | None = Field(description="the sum of the terms (null when one but decode_prealloc is missing)")
    sources: dict[str, str] = Field(description="per term, what it was read from")
    note: str


class DroppedSeriesOut(BaseModel):
    """Series of a source's answer left out of the window because they cannot be what is read."""

    signal: str
    reason: str = Field(description="bad_bound | bad_count | bad_label (see GET /api/v1/sources)")
    series: int


class TargetLatencyOut(SignalsLatency, LatencySpan, TargetLatencyHead):
    """``GET /api/v1/targets/{name}/latency``: the whole target, and per model."""

    models: dict[str, SignalsLatency] = Field(description="the same numbers per served model")
    pd_role: PdRoleOut | None = Field(None, description="its part in P/D disaggregation, when anything says")
    disaggregation: PdSplit | None = Field(None, description="a P/D decode worker: TTFT split across it and its "
                                                             "prefill worker")
    dropped_series: list[DroppedSeriesOut] | None = Field(None, description="a source's series this window lacks "
                                                                            "(the numbers are without them)")


class FleetLatencyOut(SignalsLatency, LatencySpan, FleetLatencyHead):
    """``GET /api/v1/latency``: every target's histograms summed by le, and per model."""

    models: dict[str, SignalsLatency] = Field(description="the same numbers per served model")


class SeriesPoint(BaseModel):
    ts: float
    value: float | None = Field(description="the quantile (or mean); null without observations")
    count: float | None = Field(description="observations in the lookback; null without data")


class SeriesOut(BaseModel):
    target: str
    signal: str
    q: str
    step_seconds: float
    lookback_seconds: float
    model: str | None
    points: list[SeriesPoint]


# --------------------------------------------------------------------------- diagnosis

class WindowOut(BaseModel):
    start: float
    end: float
    seconds: float


class EvidenceOut(BaseModel):
    """One number a rule looked at, the threshold it was compared with, and the outcome."""

    name: str
    value: int | float | str | None
    op: str
    threshold: int | float | str | None
    unit: str
    met: bool
    note: str
    interval: list[float | None] | None = Field(None, description=(
        "for a quantile: the histogram bucket [lower, upper] that holds it (upper null: +Inf); the value is "
        "interpolated inside it, and people are shown the bucket when the value sits on one of its edges"))


class FindingOut(BaseModel):
    """A finding of a diagnosis. ``state``, ``active_since`` and ``runbook_url`` only in the
    scheduled diagnosis (not in one evaluated on request)."""

    regime: str
    severity: str
    confidence: float = Field(description=CONFIDENCE_MEANING)
    summary: str
    evidence: list[EvidenceOut]
    remedies: list[str]
    primary: bool
    caused_by: str | None
    window: WindowOut | None
    runbook: str
    state: str | None = Field(None, description="pending | active")
    active_since: float | None = None
    runbook_url: str | None = None


class NotJudgedOut(BaseModel):
    """A regime the diagnosis could not judge, and why."""

    regime: str
    reason: str


class DiagnosisOut(BaseModel):
    """The verdict for one target and model. ``active`` and ``evaluated_at`` only in the
    scheduled diagnosis."""

    target: str
    model: str
    engine: str | None
    verdict: str = Field(description="the primary finding's regime; healthy (every regime judged, none found, "
                                     "latency in its expected range), not_judged (no regime found, but some could "
                                     "not be judged), or insufficient_data (too little traffic in the window)")
    active: list[str] | None = Field(None, description="regimes of the active findings")
    evaluated_at: float | None = None
    window: WindowOut | None
    findings: list[FindingOut]
    notes: list[str]
    signals: dict[str, Any] = Field(description="the numbers the rules read (only those known in the window)")
    not_judged: list[NotJudgedOut] = Field(default_factory=list, description=(
        "regimes not judged: a signal the rule needs is not exported by this engine (or release), or the "
        "numbers cannot decide (a threshold inside the bucket that holds a quantile, fewer samples than the "
        "evidence needs); any of them makes a verdict without findings not_judged, never healthy"))


class FindingRecordOut(BaseModel):
    """A finding of the history: its lifecycle and its latest evidence."""

    id: int
    target: str
    model: str
    regime: str
    state: str = Field(description="pending | active | resolved | dropped")
    severity: str
    confidence: float = Field(description=CONFIDENCE_MEANING)
    primary: bool
    summary: str
    evidence: list[EvidenceOut]
    remedies: list[str]
    caused_by: str | None
    window: WindowOut | None
    runbook_url: str
    first_seen: float
    last_seen: float
    activated_at: float | None
    resolved_at: float | None


# --------------------------------------------------------------------------- alerts

class AlertOut(BaseModel):
    fingerprint: str
    alertname: str
    state: str = Field(description="pending | firing | resolved")
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None
    activeSince: str
    startsAt: str | None
    endsAt: str | None
    groupKey: str
    silencedBy: list[str] = Field(description="ids of the silences muting the alert")
    notifiedFiring: list[str] = Field(description="receivers last told the alert is firing")


class MatcherOut(BaseModel):
    name: str
    value: str
    isRegex: bool
    isEqual: bool


class SilenceStatus(BaseModel):
    state: str = Field(description="pending | active | expired")


class SilenceOut(BaseModel):
    id: str
    matchers: list[MatcherOut]
    startsAt: str
    endsAt: str
    createdBy: str
    comment: str
    status: SilenceStatus


class ReceiverOut(BaseModel):
    """A receiver as the API shows it: header values redacted, the secret only named."""

    name: str
    url: str
    kind: str
    headers: dict[str, str]
    timeout: float
    secret_env: str | None
    match: dict[str, str]
    send_resolved: bool
    has_secret: bool
    source: str = Field(description="config | api")


class QueuedNotification(BaseModel):
    notification: str
    state: str


class DeliveryAttemptOut(BaseModel):
    attempt: int
    ts: float
    statusCode: int | None
    latency: float
    response: str | None = Field(description="the start of the receiver's answer (token holders only)")
    error: str | None


class NotificationOut(BaseModel):
    id: str
    receiver: str
    groupKey: str
    seq: int
    status: str
    state: str = Field(description="pending | delivered | expired")
    attempts: int
    createdAt: float
    deliveredAt: float | None
    nextAttemptAt: float | None
    lastError: str | None
    attemptLog: list[DeliveryAttemptOut]


# --------------------------------------------------------------------------- probes

class ProbeStarted(BaseModel):
    id: int
    state: str
    href: str


class ProbeRequestOut(BaseModel):
    level: int
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    seq: int
    started_at: float
    ttft: float | None
    e2e: float | None
    itl_mean: float | None
    itl_p50: float | None
    itl_p99: float | None
    itl_max: float | None
    tokens: int
    prompt_tokens_seen: int | None
    completion_tokens: int | None
    finish_reason: str | None
    status_code: int | None
    error: str | None
    detail: str | None


class ConsistencyOut(BaseModel):
    """Client-side probe TTFT against the engine's TTFT over the same periods (seconds)."""

    target_id: int
    probe_start: float
    probe_end: float
    window_start: float | None
    window_end: float | None
    client_requests: int
    client_mean: float | None
    server_requests: float | None
    server_mean: float | None
    server_queue_mean: float | None
    gap_seconds: float | None
    gap_share: float | None
    threshold_seconds: int | float  # as configured (a default may be an int)
    threshold_share: int | float
    min_requests: int | float
    finding: bool
    status: str = Field(description="ok | finding | insufficient_data | unreliable")
    message: str
    other_traffic: bool
    runs: list[int]
    models: list[str]


class ProbeRunOut(BaseModel):
    """A probe run. ``params`` and ``summary`` are the stored documents of the run, whose
    shape depends on its kind (adhoc, sweep, canary); ``requests`` only with ``?requests=true``,
    ``consistency`` only for a finished run of a monitored target."""

    id: int
    target: str
    target_id: int | None
    url: str
    kind: str
    state: str = Field(description="running | done | error | cancelled")
    params: dict[str, Any]
    started_at: float
    finished_at: float | None
    summary: dict[str, Any] | None
    error: str | None
    requests: list[ProbeRequestOut] | None = None
    consistency: ConsistencyOut | None = None


class TargetConsistencyOut(BaseModel):
    """``status`` ``no_probes`` (with only ``message``) when no run finished in the window;
    otherwise every field of the comparison."""

    target: str
    window: str
    target_id: int | None = None
    probe_start: float | None = None
    probe_end: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    client_requests: int | None = None
    client_mean: float | None = None
    server_requests: float | None = None
    server_mean: float | None = None
    server_queue_mean: float | None = None
    gap_seconds: float | None = None
    gap_share: float | None = None
    threshold_seconds: int | float | None = None
    threshold_share: int | float | None = None
    min_requests: int | float | None = None
    finding: bool | None = None
    status: str = Field(description="ok | finding | insufficient_data | unreliable | no_probes")
    message: str
    other_traffic: bool | None = None
    runs: list[int] | None = None
    models: list[str] | None = None


class CapacityOut(BaseModel):
    """The capacity signal of one target (or Prometheus-source service) and model
    (:mod:`app.diagnosis.capacity`): what ``llm_latency_capacity_*`` exports."""

    target: str
    model: str
    kind: str = Field(description="engine (one replica) | service (a Prometheus source's replicas as one)")
    current_replicas: int
    desired_replicas: int = Field(description="replicas the load needs; current_replicas when scaling_helps is false")
    scaling_helps: bool = Field(description="false: more replicas do not fix what the diagnosis found, or too "
                                            "little data; the count is held")
    reason: str = Field(description="the verdict that decided (a regime, healthy, not_judged, insufficient_data) or "
                                    "no_load_data")
    utilization: float | None = Field(description="the largest input; 1.0 = exactly current_replicas")
    bound_by: str | None = Field(description="the input that was largest, or slo_burn when an SLO's burn raised "
                                             "desired_replicas")
    inputs: dict[str, float] = Field(description="slots, kv_cache, arrival: each a utilization")
    evaluated_at: float | None = Field(description="when the diagnosis it comes from was made (unix seconds)")
    summary: str
    slo: str | None = Field(description="the SLO on this target burning fastest over its two shortest windows")
    slo_burn_rate: float | None = Field(description="the lower of those two windows' burn rates; above 1 "
                                                    "desired_replicas is at least current_replicas + 1")


# --------------------------------------------------------------------------- SLOs (app/slo/)

class SloWindowOut(BaseModel):
    window: str = Field(description="Prometheus duration: 5m, 1h, ... or the period")
    seconds: float
    good: float = Field(description="requests at or under the threshold")
    total: float
    sli: float | None = Field(description="good / total; null without requests")
    burnRate: float | None = Field(description="(1 - sli) / (1 - objective); 1 spends the budget exactly over "
                                               "the period")
    coveredSeconds: float = Field(description="how much of the window has data")


class BurnAlertOut(BaseModel):
    kind: str = Field(description="page | ticket")
    severity: str
    longWindow: str
    shortWindow: str
    factor: float
    longBurnRate: float | None
    shortBurnRate: float | None
    firing: bool = Field(description="both burn rates above the factor (the alert's condition now)")


class SloTargetOut(BaseModel):
    target: str
    labels: dict[str, str]
    sli: float | None
    budgetRemaining: float | None
    windows: list[SloWindowOut]
    alerts: list[BurnAlertOut]
    error: str | None = Field(description="why the SLO is not evaluated on this target (e.g. no bucket at the "
                                          "threshold); null when it is")


class SloOut(BaseModel):
    name: str
    signal: str
    threshold: float = Field(description="seconds; a bucket bound of the histogram")
    objective: float
    period: str
    periodSeconds: float
    sli: float | None = Field(description="over the period (what of it has data, see coverage)")
    budgetRemaining: float | None = Field(description="share of the error budget left; negative when overspent")
    burnRates: dict[str, float | None] = Field(description="per alert window")
    currentBurnRate: float | None = Field(description="over the shortest window with requests")
    timeToExhaustion: float | None = Field(description="seconds until the budget left is spent at the current burn; "
                                                       "null when nothing burns")
    coverage: float = Field(description="share of the period with data; below 1 the numbers are over what exists")
    note: str | None
    periodWindow: SloWindowOut
    windows: list[SloWindowOut]
    targets: list[SloTargetOut] = Field(description="each matched target's part (built-in SLOs are evaluated "
                                                    "per target, and summed over them for the totals)")
    errors: list[str]
