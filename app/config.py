"""The YAML config file: what to monitor.

Example::

    targets:
      - name: vllm-a
        url: http://10.0.0.5:8000/metrics
        engine: auto            # auto | vllm | tgi | sglang | trtllm
        labels: {cluster: prod}
        scrape_interval: 15s
        scrape_timeout: 5s
        sample_limit: 50000     # optional limits (defaults: the settings' default_*_limit)
        series_limit: 5000
        stored_series_limit: 10000
        hardware: {gpu: A100-80G, model: llama-3.1-8b, weight_dtype: bf16}   # optional
    diagnosis:                  # optional; defaults shown
      interval: 30s
      window: 1m
      thresholds: {queue_share: 0.5}   # see app/core/thresholds.py
      overrides:                       # expected latency ranges per target (target names, wildcards)
        - {targets: [batch-*], thresholds: {expected_ttft_seconds: 120}}
    alerts: {...}               # optional; see app/alerts/config.py
    slos: [...]                 # optional: latency SLOs with error budgets; see app/slo/config.py
    file_sd_configs:            # optional: Prometheus' file-based discovery (app/scrape/discovery.py)
      - files: [/etc/llm-latency/targets/*.json]
        refresh_interval: 1m
    http_sd_configs:            # optional: Prometheus' HTTP discovery
      - url: http://inventory.internal/sd
        refresh_interval: 1m

A bad file is refused at start with every problem on its own line as
``file:line: field.path: reason``, so nobody has to guess which of forty targets has the
typo. Durations need a unit (``15s``, not ``15``); an empty file is refused (``targets: []``
is how to say "no targets from the file").
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.alerts.config import AlertsConfig
from app.core.durations import UNITS_REQUIRED_CONTEXT, Seconds
from app.core.limits import (
    LABEL_NAME,
    MAX_INTERVAL_SECONDS,
    MAX_LIST_LENGTH,
    MAX_SCRAPE_LIMIT,
    NAME_PATTERN,
    RESERVED_LABELS,
    Labels,
    Url,
    unique_names,
)
from app.core.urls import ALLOWED_HOSTS_CONTEXT, check_url_in_file
from app.core.validation import validation_messages
from app.diagnosis.config import DiagnosisConfig
from app.diagnosis.profile import HardwareProfile
from app.probe.canary import CanaryConfig
from app.promsource.config import PrometheusSourceConfig
from app.scrape.discovery import FileSDConfig, HttpSDConfig
from app.slo.config import SloObjective, threshold_problems

EngineName = Literal["auto", "vllm", "tgi", "sglang", "trtllm"]
_LABEL_NAME = LABEL_NAME
#: A targets file is a few kB per hundred targets; past this it is the wrong file (or an attack
#: on the YAML parser), refused before parsing.
MAX_CONFIG_BYTES = 1 << 20
#: The deepest real nesting is five levels (alerts.receivers[].headers); 10,000 nested ``[``
#: would exhaust the parser's recursion.
MAX_CONFIG_DEPTH = 32
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster


class ConfigError(ValueError):
    """A config file that cannot be used: ``problems`` has one line per problem, each
    ``file:line: field.path: reason`` (the line when it is known), ``str()`` all of them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class TargetConfig(BaseModel):
    """One scrape target, as written in the YAML file or sent to the API."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    url: Url
    engine: EngineName = "auto"
    labels: Labels = Field(default_factory=dict)
    scrape_interval: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    scrape_timeout: Seconds | None = Field(None, gt=0, le=MAX_INTERVAL_SECONDS)
    sample_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Samples of the engine's families a page may have; past it the scrape fails (`too_many_samples`) and "
        "nothing of the page is stored. Default: `LLM_LATENCY_DEFAULT_SAMPLE_LIMIT`."))
    series_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Series (histograms, gauges, counters and infos per model and rank) a page may have; past it the "
        "scrape fails (`too_many_series`). Default: `LLM_LATENCY_DEFAULT_SERIES_LIMIT`."))
    stored_series_limit: int | None = Field(None, gt=0, le=MAX_SCRAPE_LIMIT, description=(
        "Series the target may have stored (kept while it exists); a scrape with new series past it fails "
        "(`too_many_series`). Default: `LLM_LATENCY_DEFAULT_STORED_SERIES_LIMIT`."))
    hardware: HardwareProfile | None = Field(None, description="GPU and model, for the decode roofline floor")
    canary: CanaryConfig | None = Field(None, description="A periodic single-request probe (off by default)")

    @field_validator("url")
    @classmethod
    def _url_allowed(cls, url: str, info: ValidationInfo) -> str:
        return check_url_in_file(url, info)  # type: ignore[return-value]

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
    def _timeout_fits(self) -> TargetConfig:
        if self.scrape_interval and self.scrape_timeout and self.scrape_timeout > self.scrape_interval:
            raise ValueError("scrape_timeout must not exceed scrape_interval")
        return self


class FileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[TargetConfig] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)
    diagnosis: DiagnosisConfig = Field(default_factory=DiagnosisConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    sources: list[PrometheusSourceConfig] = Field(default_factory=list, max_length=64)

    @field_validator("sources")
    @classmethod
    def _unique_sources(cls, sources: list[PrometheusSourceConfig]) -> list[PrometheusSourceConfig]:
        return unique_names(sources, "sources", "source")
    file_sd_configs: list[FileSDConfig] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)
    http_sd_configs: list[HttpSDConfig] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)
    slos: list[SloObjective] = Field(default_factory=list, max_length=MAX_LIST_LENGTH)

    @field_validator("slos")
    @classmethod
    def _unique_slos(cls, slos: list[SloObjective]) -> list[SloObjective]:
        return unique_names(slos, "slos", "SLO")

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[TargetConfig]) -> list[TargetConfig]:
        return unique_names(targets, "targets", "target")


def load_config(path: Path, allowed_hosts: list[str] | None = None) -> FileConfig:
    """Read, parse and validate the targets file; :class:`ConfigError` lists every problem.

    An empty file (or one with only comments) is refused: the service deletes config-file
    targets that the file no longer names, so a truncated file must not read as "monitor
    nothing". ``targets: []`` says that on purpose. Durations need a unit (``15s``); target,
    canary and receiver URLs pass :func:`app.core.urls.validate_target_url` with ``allowed_hosts``.
    """
    raw, lines = _read_yaml(path)
    if raw is None:
        raise ConfigError([f"{path}: the file is empty; write 'targets: []' to run with no targets from "
                           "the file (targets can still be added through the API)"])
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}:1: the top level must be a mapping with a 'targets' list"])
    context = {ALLOWED_HOSTS_CONTEXT: allowed_hosts or [], UNITS_REQUIRED_CONTEXT: True}
    try:
        config = FileConfig.model_validate(raw, context=context)
    except ValidationError as exc:
        problems = [(_line_of(loc, lines), message) for loc, message in validation_messages(exc)]
    else:
        # thresholds against the engines' bucket layouts: needs the SLOs and the targets together
        problems = [(_line_of(loc, lines), message) for loc, message in threshold_problems(config.slos, config.targets)]
        if not problems:
            return config
    raise ConfigError([f"{path}:{line}: {message}" for line, message in sorted(problems, key=lambda p: p[0])])


def field_line(path: Path, loc: tuple) -> int:
    """The line of a field of a file :func:`load_config` accepted (for problems found later)."""
    _, lines = _read_yaml(path)
    return _line_of(loc, lines)


def _read_yaml(path: Path) -> tuple[object, dict[tuple, int]]:
    """The file's data and the line of every mapping key and list item, by field path.

    One-line errors for what would otherwise be a traceback: unreadable, oversized,
    not UTF-8, nested too deeply, not YAML.
    """
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc.strerror}"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB, too large for a targets file"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                           "save the file as UTF-8"]) from None
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_YAML_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark is not None else 1
                    raise ConfigError([f"{path}:{line}: nested deeper than "
                                       f"{MAX_CONFIG_DEPTH} levels"])
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        loader = _YAML_LOADER(text)
        try:
            node = loader.get_single_node()
            raw = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        if exc.problem and "nesting depth" in exc.problem:
            # PyYAML >= 6.0.4 stops very deep nesting itself, before the events counted above
            raise ConfigError([f"{path}{where}: nested deeper than {MAX_CONFIG_DEPTH} levels"]) from None
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError([f"{path}{where}: not valid YAML: {what}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {' '.join(str(exc).split())}"]) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return raw, lines


def _collect_lines(node: yaml.Node, loc: tuple, lines: dict[tuple, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)  # a mapping value: its key's line, set below
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                lines[(*loc, key.value)] = key.start_mark.line + 1
                _collect_lines(value, (*loc, key.value), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(item, (*loc, index), lines)


def _line_of(loc: tuple, lines: dict[tuple, int]) -> int:
    """The line of the field, or of its nearest enclosing field (a missing field: its parent)."""
    while loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)
