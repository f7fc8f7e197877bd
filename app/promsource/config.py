"""``sources:`` in the targets YAML: where a cluster's Prometheus is and which series are engines.

Example::

    sources:
      - name: prod
        kind: prometheus                 # any Prometheus HTTP API
        url: http://prometheus-operated.monitoring:9090
        selector: '{namespace="llm"}'    # added to every engine query
        target_labels: [namespace, pod]  # one target per distinct value set
        service_labels: [namespace, service]
        headers: {X-Scope-OrgID: tenant-a}
        bearer_token_env: PROM_TOKEN     # or basic_auth: {username, password_env}
        tls: {ca_file: /etc/ssl/prom-ca.pem, insecure_skip_verify: false}
        query_timeout: 20s
        scrape_interval: 30s             # optional: else learned from the server's /api/v1/targets
        pd_pair_labels: [namespace, llm_d_ai_model]  # P/D: replicas sharing these form one deployment
        pd_role_label: llm_d_ai_role     # prefill | decode | both, where the engine does not say
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator, model_validator

from app.core.durations import Seconds
from app.core.limits import (
    MAX_HEADER_VALUE_LENGTH,
    MAX_HEADERS,
    MAX_INTERVAL_SECONDS,
    MAX_LABEL_NAME_LENGTH,
    MAX_TEXT_LENGTH,
    Url,
)
from app.core.urls import check_url_in_file
from app.promql.client import DEFAULT_MAX_SAMPLES, DEFAULT_MAX_SERIES
from app.promql.text import parse_selector

SOURCE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,23}$"  # short: it prefixes every target name
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Labels the source's queries group or match by themselves: a target label of that name would
# be ambiguous (``le`` buckets, the engines' model and data-parallel-rank labels).
RESERVED_TARGET_LABELS = frozenset({"le", "model_name", "engine", "dp_rank", "quantile", "__name__",
                                    "llm_latency_family", "llm_latency_stat"})
MAX_GROUP_LABELS = 8
#: A diagnosis window holds at least this many scrape intervals of a source's targets by default:
#: the most any rule needs (bandwidth_bound's steady_min_scrapes), and Prometheus' own advice
#: for a ``rate`` range.
WINDOW_INTERVALS = 4

LabelName = Annotated[str, StringConstraints(max_length=MAX_LABEL_NAME_LENGTH)]
EnvName = Annotated[str, StringConstraints(max_length=MAX_TEXT_LENGTH)]


class BasicAuth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_LENGTH)]
    password_env: EnvName = Field(description="Environment variable holding the password")


class TlsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ca_file: Annotated[str, StringConstraints(max_length=4096)] | None = None
    insecure_skip_verify: bool = False


def _label_list(names: list[str], field: str) -> list[str]:
    seen = set()
    for name in names:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"invalid label name {name!r}")
        if name in RESERVED_TARGET_LABELS:
            raise ValueError(f"label {name!r} cannot be one of the {field}: the engine queries group by it "
                             "themselves")
        if name in seen:
            raise ValueError(f"label {name!r} listed twice")
        seen.add(name)
    return names


#: the histograms whose buckets a source's raw samples can keep (kept by default)
HoldableBuckets = Literal["ttft", "itl"]
HOLDABLE: frozenset[str] = frozenset(get_args(HoldableBuckets))


class PrometheusSourceConfig(BaseModel):
    """One Prometheus-compatible HTTP API whose engine series become targets."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="Unique; prefixes the names of its targets")
    kind: Literal["prometheus"] = "prometheus"
    url: Url
    selector: Annotated[str, StringConstraints(max_length=4096)] = ""
    target_labels: list[LabelName] = Field(min_length=1, max_length=MAX_GROUP_LABELS)
    service_labels: list[LabelName] = Field(default_factory=list, max_length=MAX_GROUP_LABELS)
    headers: dict[Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL_NAME_LENGTH)],
                  Annotated[str, StringConstraints(max_length=MAX_HEADER_VALUE_LENGTH)]] = Field(
        default_factory=dict, max_length=MAX_HEADERS)
    bearer_token_env: EnvName | None = None
    basic_auth: BasicAuth | None = None
    tls: TlsConfig = Field(default_factory=TlsConfig)
    query_timeout: Seconds = Field(20.0, gt=0, le=300)
    max_concurrency: int = Field(8, ge=1, le=64, description="Queries in flight at once")
    max_series: int = Field(DEFAULT_MAX_SERIES, ge=1, le=10_000_000,
                            description="Series one answer may hold; a larger answer is refused (too_large) and the "
                                        "round goes on without it")
    max_samples: int = Field(DEFAULT_MAX_SAMPLES, ge=1, le=100_000_000,
                             description="Points one answer may hold (series x points of a range query)")
    scrape_interval: Seconds | None = Field(
        None, gt=0, le=MAX_INTERVAL_SECONDS,
        description="How often the source's Prometheus scrapes the engines. Unset: learned from its "
                    "/api/v1/targets (the slowest interval of the targets that carry the engines); set it for a "
                    "server without that endpoint (Mimir, a Thanos Query without targets)")
    window_intervals: int = Field(
        WINDOW_INTERVALS, ge=1, le=100,
        description="The diagnosis window of this source's targets is at least this many scrape intervals (a "
                    "longer diagnosis.window is kept); so are the range selectors of the rules exported for it")
    hold_buckets: list[HoldableBuckets] = Field(
        default_factory=lambda: list[HoldableBuckets](get_args(HoldableBuckets)), max_length=len(HOLDABLE),
        description="Histograms whose buckets the source's raw samples keep too, every replica's (the means "
                    "series are always kept): the SLO alerts, the stall probe and the attributions read them with "
                    "no query. [] queries them for the replicas that need them instead: less CPU and fewer bytes "
                    "for the service where few replicas breach an objective or show a tail, more CPU for "
                    "Prometheus where many do")
    pd_pair_labels: list[LabelName] = Field(
        default_factory=list, max_length=MAX_GROUP_LABELS,
        description="P/D disaggregation: the replicas sharing these label values form one deployment; a decode "
                    "replica's TTFT is assembled with the prefill replicas of its deployment")
    pd_role_label: LabelName | None = Field(
        None, description="a label whose value (prefill / decode / both) is a replica's P/D role where the "
                          "engine's own metrics do not say (vLLM)")

    @field_validator("url")
    @classmethod
    def _url_allowed(cls, url: str, info: ValidationInfo) -> str:
        checked = check_url_in_file(url, info)
        assert checked is not None
        if not re.match(r"^https?://[^/?#]+", checked):
            raise ValueError("must be an http:// or https:// URL")
        return checked

    @field_validator("selector")
    @classmethod
    def _selector_syntax(cls, selector: str) -> str:
        parse_selector(selector)  # ValueError names the position
        return selector

    @field_validator("target_labels", "service_labels", "pd_pair_labels")
    @classmethod
    def _label_lists(cls, names: list[str], info: ValidationInfo) -> list[str]:
        return _label_list(names, info.field_name or "labels")

    @field_validator("pd_role_label")
    @classmethod
    def _pd_role_label(cls, name: str | None) -> str | None:
        return name if name is None else _label_list([name], "pd_role_label")[0]

    @model_validator(mode="after")
    def _pd_labels_known(self) -> PrometheusSourceConfig:
        """The pairing reads label values each target keeps: its target_labels and service_labels."""
        known = [*self.target_labels, *self.service_labels]
        for field, names in (("pd_pair_labels", self.pd_pair_labels),
                             ("pd_role_label", [self.pd_role_label] if self.pd_role_label else [])):
            for name in names:
                if name not in known:
                    raise ValueError(f"{field}: label {name!r} is not one of target_labels or service_labels "
                                     f"({', '.join(known)}); a target keeps only those label values")
        if self.pd_pair_labels and set(self.target_labels) <= set(self.pd_pair_labels):
            raise ValueError("pd_pair_labels: they include every target label, so no two targets share them and "
                             "no prefill replica could be paired with a decode replica")
        if self.pd_role_label and self.pd_role_label in self.pd_pair_labels:
            raise ValueError(f"pd_role_label {self.pd_role_label!r} cannot be one of pd_pair_labels: a deployment's "
                             "prefill and decode replicas differ in it")
        return self

    @field_validator("bearer_token_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
        return name

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusSourceConfig:
        if self.bearer_token_env and self.basic_auth:
            raise ValueError("set bearer_token_env or basic_auth, not both")
        lowered = {h.lower() for h in self.headers}
        if "authorization" in lowered:
            raise ValueError("headers: put credentials in bearer_token_env or basic_auth, not an "
                             "Authorization header (headers are shown to API readers)")
        return self

    def fitted_window(self, window: float, interval: float | None) -> float:
        """``window`` (diagnosis.window), made at least ``window_intervals`` scrape intervals
        long when the interval is known: a window of two scrapes judges no rule that needs four."""
        return window if interval is None else max(window, self.window_intervals * interval)

    def bearer_token(self) -> str | None:
        """The token from the environment, read when the source's client is built (at start)."""
        return os.environ.get(self.bearer_token_env) if self.bearer_token_env else None

    def basic_credentials(self) -> tuple[str, str] | None:
        if self.basic_auth is None:
            return None
        return self.basic_auth.username, os.environ.get(self.basic_auth.password_env, "")

