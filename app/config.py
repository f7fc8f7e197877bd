"""The YAML config file: what to monitor.

Example::

    targets:
      - name: vllm-a
        url: http://10.0.0.5:8000/metrics
        engine: auto            # auto | vllm | tgi | sglang
        labels: {cluster: prod}
        scrape_interval: 15s
        scrape_timeout: 5s
        hardware: {gpu: A100-80G, model: llama-3.1-8b, weight_dtype: bf16}   # optional
    diagnosis:                  # optional; defaults shown
      interval: 30s
      window: 1m
      thresholds: {queue_share: 0.5}   # see app/diagnosis/thresholds.py
    alerts: {...}               # optional; see app/alerts/config.py

A bad file is refused at start with every problem listed as ``field.path: reason``,
so nobody has to guess which of forty targets has the typo.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.alerts.config import AlertsConfig
from app.diagnosis.profile import HardwareProfile
from app.probe.canary import CanaryConfig
from app.diagnosis.thresholds import Thresholds
from app.durations import parse_duration
from app.limits import MAX_INTERVAL_SECONDS, MAX_LIST_LENGTH, Labels, Url

Seconds = Annotated[float, BeforeValidator(parse_duration)]
EngineName = Literal["auto", "vllm", "tgi", "sglang"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = {"target", "model", "engine", "le", "quantile", "signal"}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names every bad field."""


def validate_target_url(url: str, allowed_hosts: list[str]) -> str:
    """Accept only http(s) URLs, optionally restricted to an allow-list of hosts.

    The API lets users add targets, so without this the service could be told to
    fetch arbitrary internal URLs (server-side request forgery).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL scheme must be http or https, got {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("URL has no host")
    try:
        parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in URL: {exc}") from None
    if allowed_hosts and not host_allowed(parts.hostname, allowed_hosts):
        raise ValueError(f"host {parts.hostname!r} is not in allowed_target_hosts")
    return url


def host_allowed(host: str, allowed: list[str]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in allowed:
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        elif fnmatch.fnmatchcase(host.lower(), entry.lower()):
            return True
    return False


class TargetConfig(BaseModel):
    """One scrape target, as written in the YAML file or sent to the API."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    url: Url
    engine: EngineName = "auto"
    labels: Labels = Field(default_factory=dict)
    scrape_interval: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    scrape_timeout: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    hardware: HardwareProfile | None = Field(None, description="GPU and model, for the decode roofline floor")
    canary: CanaryConfig | None = Field(None, description="A periodic single-request probe (off by default)")

    @field_validator("labels")
    @classmethod
    def _label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if not _LABEL_NAME.match(key):
                raise ValueError(f"invalid label name {key!r}")
            if key in RESERVED_LABELS:
                raise ValueError(f"label name {key!r} is reserved")
        return labels

    @model_validator(mode="after")
    def _timeout_fits(self) -> "TargetConfig":
        if self.scrape_interval and self.scrape_timeout and self.scrape_timeout > self.scrape_interval:
            raise ValueError("scrape_timeout must not exceed scrape_interval")
        return self


class DiagnosisConfig(BaseModel):
    """How often regimes are evaluated, over which window, with which thresholds."""

    model_config = ConfigDict(extra="forbid")

    interval: Seconds = Field(30.0, gt=0, description="Evaluation interval.")
    window: Seconds = Field(60.0, gt=0, description="Window each evaluation looks at. Keep it at most ~2.5 "
                            "intervals: a regime is detected once it fills most of the window.")
    thresholds: Thresholds = Field(default_factory=Thresholds)


class FileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[TargetConfig] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)
    diagnosis: DiagnosisConfig = Field(default_factory=DiagnosisConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    @model_validator(mode="after")
    def _unique_names(self) -> "FileConfig":
        seen: set[str] = set()
        for index, target in enumerate(self.targets):
            if target.name in seen:
                raise ValueError(f"targets[{index}].name: duplicate target name {target.name!r}")
            seen.add(target.name)
        return self


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{path or '<root>'}: {message}")
    return "; ".join(lines)


def load_config(path: Path, allowed_hosts: list[str] | None = None) -> FileConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with a 'targets' list")
    try:
        config = FileConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_validation_error(exc)}") from None
    problems = []
    for index, target in enumerate(config.targets):
        try:
            validate_target_url(target.url, allowed_hosts or [])
        except ValueError as exc:
            problems.append(f"targets[{index}].url: {exc}")
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return config
