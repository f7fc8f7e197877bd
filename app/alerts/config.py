"""Alerting configuration (the ``alerts:`` section of the targets YAML).

Example::

    alerts:
      external_url: https://llm-latency.example.com     # links in notifications
      dashboard_url: https://grafana.example.com/d/llm-latency-target
      slos:
        - {name: ttft_p99, signal: ttft, quantile: 0.99, threshold: 2s, window: 5m, for: 2m}
        - {name: itl_p99, signal: itl, quantile: 0.99, threshold: 150ms, window: 5m, for: 2m}
      target_down_for: 1m
      group_by: [alertname, target]
      group_interval: 30s
      repeat_interval: 4h                        # webhooks: re-notify still-firing alerts
      resend_interval: 1m                        # kind: alertmanager: re-post them (endsAt)
      receivers:
        - name: oncall
          url: https://hooks.example.com/llm
          secret_env: ONCALL_WEBHOOK_SECRET      # HMAC-SHA256 key, read from the environment
          match: {severity: critical}
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.core.durations import Seconds
from app.core.limits import (
    MAX_HEADER_VALUE_LENGTH,
    MAX_HEADERS,
    MAX_LIST_LENGTH,
    MAX_TEXT_LENGTH,
    LabelName,
    Labels,
    Url,
)
from app.core.urls import check_url_in_file
from app.diagnosis.findings import REGIMES, RUNBOOK_DIR, runbook_link
from app.slo.config import SLO_BURN_ALERT

Severity = Literal["critical", "warning", "info"]
PRODUCT_PREFIX = "LLMLatency"
SLO_SIGNALS = ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time")
_SIGNAL_WORD = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E", "queue_time": "QueueTime",
                "prefill_time": "PrefillTime", "decode_time": "DecodeTime"}


def camel(words: str) -> str:
    """``kv_cache_pressure`` -> ``KVCachePressure`` (known acronyms stay upper case)."""
    acronyms = {"kv": "KV", "ttft": "TTFT", "itl": "ITL", "slo": "SLO", "tpot": "TPOT", "e2e": "E2E"}
    return "".join(acronyms.get(w, w.capitalize()) for w in re.split(r"[_\-\s]+", words) if w)


def regime_alertname(regime: str) -> str:
    return PRODUCT_PREFIX + camel(regime)


def slo_alertname(signal: str) -> str:
    return f"{PRODUCT_PREFIX}{_SIGNAL_WORD[signal]}High"


TARGET_DOWN = PRODUCT_PREFIX + "TargetDown"
#: The burn-rate alert of the ``slos:`` section (app/slo/): one name, ``burn`` = page | ticket.
SLO_BURN = SLO_BURN_ALERT

#: Every alert the service (app/alerts/engine.py) or the exported Prometheus rules
#: (app/rules_export.py) can raise -> its runbook, ``docs/runbooks/<name>.md``,
#: served at ``/runbooks/<name>``. Both look alerts up here, so an alert without a
#: runbook cannot be built.
ALERT_RUNBOOKS: dict[str, str] = {
    **{regime_alertname(regime): regime for regime in REGIMES},
    **{slo_alertname(signal): f"slo_{signal}" for signal in SLO_SIGNALS},
    TARGET_DOWN: "target_down",
    SLO_BURN: "slo_burn",
}


def runbook_url(external_url: str, alertname: str) -> str:
    """The alert's runbook on this service when its external URL is known, else the path
    in the source tree."""
    name = ALERT_RUNBOOKS[alertname]
    return runbook_link(name, external_url) if external_url.rstrip("/") else f"{RUNBOOK_DIR}/{name}.md"


class SloConfig(BaseModel):
    """A latency objective: quantile ``quantile`` of ``signal`` over ``window`` must stay
    at or below ``threshold``; breached for ``for`` -> the alert fires."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    signal: Literal[SLO_SIGNALS]  # type: ignore[valid-type]
    quantile: float = Field(0.99, gt=0, lt=1)
    threshold: Seconds = Field(gt=0)
    window: Seconds = Field(300.0, gt=0)
    for_: Seconds = Field(120.0, ge=0, alias="for")
    severity: Severity = "warning"
    targets: list[Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]] | None = Field(
        None, max_length=MAX_LIST_LENGTH, description="Target names; omitted = every target.")

    @property
    def alertname(self) -> str:
        return slo_alertname(self.signal)

    def covers(self, target: str) -> bool:
        """Whether the objective applies to the target named ``target``."""
        return self.targets is None or target in self.targets


def default_slos() -> list[SloConfig]:
    return [
        SloConfig(name="ttft_p99", signal="ttft", quantile=0.99, threshold=2.0, window=300, **{"for": 120}),
        SloConfig(name="itl_p99", signal="itl", quantile=0.99, threshold=0.15, window=300, **{"for": 120}),
    ]


class ReceiverConfig(BaseModel):
    """Where notifications go. ``kind: webhook`` posts Alertmanager's webhook format
    (version 4); ``kind: alertmanager`` posts the alerts to an Alertmanager's
    ``/api/v2/alerts`` instead, letting it route and deduplicate."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    url: Url
    kind: Literal["webhook", "alertmanager"] = "webhook"
    headers: dict[Annotated[str, Field(max_length=MAX_TEXT_LENGTH)],
                  Annotated[str, Field(max_length=MAX_HEADER_VALUE_LENGTH)]] = Field(default_factory=dict,
                                                                                    max_length=MAX_HEADERS)
    timeout: Seconds = Field(10.0, gt=0, le=120)
    secret_env: str | None = Field(None, max_length=MAX_TEXT_LENGTH,
                                   description="Environment variable holding the HMAC-SHA256 key.")
    match: Labels = Field(default_factory=dict, description="Label equality matchers; empty = all.")
    send_resolved: bool = True

    @field_validator("url")
    @classmethod
    def _url_allowed(cls, url: str, info: ValidationInfo) -> str:
        return check_url_in_file(url, info)  # type: ignore[return-value]

    @field_validator("headers")
    @classmethod
    def _no_reserved_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        reserved = {"content-type", "content-length", "host", "x-llm-latency-signature", "x-llm-latency-timestamp",
                    "idempotency-key"}
        for key in headers:
            if key.lower() in reserved:
                raise ValueError(f"header {key!r} is set by the service")
        return headers


class AlertsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    external_url: Url = Field("", description="This service's external URL, for links.")
    dashboard_url: Url = Field("", description="Grafana drill-down dashboard URL; ?var-target=... is appended.")
    slos: list[SloConfig] = Field(default_factory=default_slos, max_length=MAX_LIST_LENGTH)
    target_down_for: Seconds = Field(60.0, ge=0)
    diagnosis_for: Seconds = Field(0.0, ge=0, description="Extra hold time after a finding becomes active.")
    group_by: list[LabelName] = Field(default_factory=lambda: ["alertname", "target"], max_length=MAX_LIST_LENGTH)
    group_interval: Seconds = Field(30.0, gt=0)
    repeat_interval: Seconds = Field(4 * 3600.0, gt=0, description="Re-notify webhooks of still-firing alerts.")
    resend_interval: Seconds = Field(60.0, gt=0, description=(
        "Re-post still-firing alerts to kind: alertmanager receivers this often, with endsAt = now + 4 x "
        "max(evaluation interval, resend_interval), as Prometheus does (Alertmanager resolves alerts it stops "
        "hearing about)."))
    receivers: list[ReceiverConfig] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)
    max_delivery_age: Seconds = Field(24 * 3600.0, gt=0, description="Stop retrying a notification after this.")
