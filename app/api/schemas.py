"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.config import NAME_PATTERN, EngineName, TargetConfig
from app.diagnosis.profile import HardwareProfile
from app.durations import parse_duration
from app.limits import MAX_INTERVAL_SECONDS, Labels, Url
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
    source: str
    hardware: dict | None = None
    canary: dict | None = None
    created_at: float
    updated_at: float
    last_scrape: ScrapeOut | None = None
