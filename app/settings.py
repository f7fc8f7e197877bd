"""The one settings object, read from the environment (prefix ``LLM_LATENCY_``).

This module is the only reader of ``os.environ`` in the service. Everything that
describes *what to monitor* (targets, later receivers and SLOs) lives in the YAML
config file (see :mod:`app.config`); everything that describes *how the service
runs* (database, listen address, limits, security) lives here.
"""

from __future__ import annotations

import ipaddress
import os
from functools import cached_property
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.core.durations import Seconds
from app.core.limits import (
    DEFAULT_SAMPLE_LIMIT,
    DEFAULT_SERIES_LIMIT,
    DEFAULT_STORED_SERIES_LIMIT,
    MAX_REQUEST_BYTES,
    MAX_SCRAPE_LIMIT,
)
from app.scrape.client import DEFAULT_MAX_PAGE_BYTES


def _split_list(value: object) -> object:
    """Environment lists are comma separated: ``LLM_LATENCY_ALLOWED_TARGET_HOSTS=a,10.0.0.0/8``."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLM_LATENCY_", extra="forbid")

    data_dir: Path = Field(Path("data"), description="Directory for the default SQLite database.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/llm-latency.db. "
        "PostgreSQL: postgresql+psycopg://user@host/db"
    )
    config_file: Path | None = Field(None, description="YAML file with targets.")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_token: SecretStr | None = Field(
        None, description="When set, every write endpoint needs 'Authorization: Bearer <token>'; "
        "empty or blank counts as not set."
    )
    allow_unauthenticated_public: bool = Field(
        False, description="Allow listening beyond loopback without an API token."
    )
    allowed_target_hosts: Annotated[list[str], NoDecode, BeforeValidator(_split_list)] = Field(
        default_factory=list,
        description="If non-empty, target URLs must use one of these hosts: exact names, "
        "'*.suffix' wildcards, IP addresses or CIDR networks.",
    )
    retention: Seconds = Field(7 * 86400.0, gt=0, description="How long samples are kept "
                               "(downsampled to 5 min and 1 h intervals after raw_retention).")
    raw_retention: Seconds = Field(86400.0, ge=3600, description="How long every raw scrape's samples are "
                                   "kept; windows older than this are answered from the 5 min / 1 h levels.")
    downsample_interval: Seconds = Field(60.0, gt=0, description="How often finished intervals are downsampled.")
    prune_interval: Seconds = Field(3600.0, gt=0)
    default_scrape_interval: Seconds = Field(15.0, gt=0)
    default_scrape_timeout: Seconds = Field(10.0, gt=0)
    default_sample_limit: int = Field(DEFAULT_SAMPLE_LIMIT, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Samples of the engine's families a page may have, for targets that set no `sample_limit`; past it "
        "the scrape fails (`too_many_samples`). 1.6x the largest real engine page the 4 MiB page cap lets "
        "through (vLLM's page at 123 models and ranks: 30,628 samples)."))
    default_series_limit: int = Field(DEFAULT_SERIES_LIMIT, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Series (histograms, gauges, counters and infos per model and rank) a page may have, for targets "
        "that set no `series_limit`; past it the scrape fails (`too_many_series`). 1.9x that largest page "
        "(2,584)."))
    default_stored_series_limit: int = Field(DEFAULT_STORED_SERIES_LIMIT, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Series a target may have stored (kept while it exists), for targets that set no "
        "`stored_series_limit`; a scrape with new series past it fails (`too_many_series`), so a page that "
        "renames its models every scrape cannot grow the database and the process without bound. Twice "
        "the series limit: ~475 models and ranks of vLLM's page over a target's life."))
    connect_timeout: Seconds = Field(3.0, gt=0)
    max_page_bytes: int = Field(DEFAULT_MAX_PAGE_BYTES, gt=0, description="Larger pages are refused.")
    max_concurrent_scrapes: int = Field(64, gt=0)
    max_request_bytes: int = Field(MAX_REQUEST_BYTES, gt=0, description="Larger request bodies are refused (413) "
                                   "before they are read in full.")
    scrape_jitter: float = Field(0.1, ge=0, le=1, description="Fraction of the interval.")
    write_batch_interval: Seconds = Field(0.5, gt=0, description="How often scrapes are flushed.")
    latency_window: Seconds = Field(300.0, gt=0, description="Window of the /metrics quantile gauges.")
    summary_interval: Seconds = Field(15.0, gt=0, description="How often those gauges are recomputed.")
    api_request_budget: Seconds = Field(30.0, gt=0, description="Time budget of one expensive read (latency, fleet "
                                        "view, series): past it the request ends with 503; a client that "
                                        "disconnects stops the work sooner.")
    read_max_age: Seconds = Field(1.0, ge=0, le=60, description="A read answered at most this long ago is "
                                  "answered again the same way when nothing changed since (no commit, round "
                                  "or write request of this replica); 0 computes every read.")
    public_url: str = Field("", description="External base URL used in links (runbooks, alerts).")
    alert_interval: Seconds = Field(15.0, gt=0, description="How often alert conditions are evaluated.")
    changes_interval: Seconds = Field(30.0, ge=5, le=3600, description="How often each target's window since the "
                                      "last round is read for change events (restarts, configuration, replicas, load "
                                      "and workload steps); the change-point test's round.")
    delivery_interval: Seconds = Field(1.0, gt=0, description="How often the outbox is polled.")
    replica_heartbeat: Seconds = Field(5.0, gt=0, description="How often a replica renews its heartbeat and "
                                       "the leader lease, and recomputes which targets it scrapes.")
    replica_expiry: Seconds = Field(15.0, gt=0, description="A replica whose heartbeat (or a lease whose renewal) "
                                    "is older than this is dead: its targets and the lease are taken over.")
    replica_id: str | None = Field(None, max_length=64, description="This replica's name in the replicas table; "
                                   "default <host>-<pid>-<random>.")

    @field_validator("api_token", mode="before")
    @classmethod
    def _blank_token_is_no_token(cls, value: object) -> object:
        """``LLM_LATENCY_API_TOKEN=`` (a template left unfilled, an empty Secret) is no token:
        it must neither satisfy the public-listen guard nor let an empty Bearer through."""
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str) and not text.strip():
            return None
        return value

    @field_validator("allowed_target_hosts")
    @classmethod
    def _valid_hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if "/" in host:
                try:
                    ipaddress.ip_network(host, strict=False)
                except ValueError as exc:
                    raise ValueError(f"not a valid network: {host!r} ({exc})") from None
        return hosts

    @model_validator(mode="after")
    def _scrape_timeout_fits(self) -> Settings:
        if self.default_scrape_timeout > self.default_scrape_interval:
            raise ValueError(
                "default_scrape_timeout must not exceed default_scrape_interval "
                f"({self.default_scrape_timeout}s > {self.default_scrape_interval}s)"
            )
        return self

    @model_validator(mode="after")
    def _expiry_outlives_heartbeats(self) -> Settings:
        if self.replica_expiry < 2 * self.replica_heartbeat:
            raise ValueError(
                "replica_expiry must be at least twice replica_heartbeat, or a replica is declared dead "
                f"between two of its own heartbeats ({self.replica_expiry}s < 2 x {self.replica_heartbeat}s)"
            )
        return self

    @cached_property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'llm-latency.db').as_posix()}"

    @staticmethod
    def secret(env_name: str) -> str | None:
        """A secret named in the config (e.g. a receiver's ``secret_env``), read from the environment."""
        return os.environ.get(env_name) or None

    def check_listen_security(self, host: str) -> None:
        """Refuse to expose write endpoints beyond loopback without a token.

        A monitor that can be told to fetch URLs is a server-side request forgery
        risk when anyone on the network can add targets; the safe default is to
        demand a token before listening anywhere but loopback.
        """
        if self.api_token is not None or self.allow_unauthenticated_public:
            return
        if not is_loopback_host(host):
            raise ValueError(
                f"refusing to listen on {host!r} without LLM_LATENCY_API_TOKEN; set a token, "
                "or LLM_LATENCY_ALLOW_UNAUTHENTICATED_PUBLIC=true to accept the risk"
            )


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
