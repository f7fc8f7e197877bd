#!/usr/bin/env python3
"""Writes docs/reference/configuration.md from the models the service validates with.

Every environment variable is a field of the settings class (``app.settings.Settings``,
prefix ``LLM_LATENCY_``) and every key of the targets YAML a field of the file's model
(``app.config.FileConfig``) or of a model nested in it (targets, diagnosis thresholds,
alerts, sources, discovery, SLOs). The page is generated from those classes (type,
default, bounds, description), so it cannot drift from what the service accepts:

    python3 scripts/gen_config_reference.py            # rewrite the page
    python3 scripts/gen_config_reference.py --check    # exit 1 when the page is stale

``tests/test_docs.py`` runs the check. A field the models leave without a description gets
one from ``NOTES`` below; a note naming a field that no longer exists stops the script.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import annotated_types  # noqa: E402 (after the path set-up above)
from pydantic import BaseModel, SecretStr  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from app.config import FileConfig  # noqa: E402
from app.core.durations import format_duration  # noqa: E402
from app.settings import Settings  # noqa: E402

OUT = ROOT / "docs" / "reference" / "configuration.md"
ENV_PREFIX = str(Settings.model_config.get("env_prefix", ""))

#: Descriptions of the fields whose models give none, by ``Model.field``.
NOTES: dict[str, str] = {
    "Settings.host": "Listen address. Beyond loopback the service needs `LLM_LATENCY_API_TOKEN` (or "
                     "`LLM_LATENCY_ALLOW_UNAUTHENTICATED_PUBLIC=true`).",
    "Settings.port": "Listen port; `serve` binds it before anything else and exits 1 when it is busy.",
    "Settings.prune_interval": "How often the prune round drops data older than the retention.",
    "Settings.default_scrape_interval": "Scrape interval of targets that set none.",
    "Settings.default_scrape_timeout": "Scrape timeout of targets that set none; at most the default interval.",
    "Settings.connect_timeout": "TCP connect timeout of a scrape.",
    "Settings.max_concurrent_scrapes": "Bound on simultaneous fetches.",
    "FileConfig.targets": "Static scrape targets.",
    "FileConfig.diagnosis": "When and over which window regimes are judged, and with which thresholds.",
    "FileConfig.alerts": "Percentile alerts, grouping, receivers and notification delivery.",
    "FileConfig.sources": "Prometheus HTTP APIs whose engine series become targets (no second scrape).",
    "FileConfig.file_sd_configs": "Prometheus' file-based service discovery: target-group files.",
    "FileConfig.http_sd_configs": "Prometheus' HTTP service discovery: a URL answering target groups.",
    "FileConfig.slos": "Latency SLOs with error budgets and multiwindow burn-rate alerts.",
    "TargetConfig.name": "Unique target name; the `target` label of everything about it.",
    "TargetConfig.url": "The engine's metrics page, http(s); the host must pass `LLM_LATENCY_ALLOWED_TARGET_HOSTS`.",
    "TargetConfig.engine": "Which adapter reads the page; `auto` detects it from the page's metric names.",
    "TargetConfig.labels": "Extra labels of the target (shown, exported, matched by SLOs and receivers).",
    "TargetConfig.scrape_interval": "Default: `LLM_LATENCY_DEFAULT_SCRAPE_INTERVAL`.",
    "TargetConfig.scrape_timeout": "Default: `LLM_LATENCY_DEFAULT_SCRAPE_TIMEOUT`; at most the interval.",
    "HardwareProfile.tensor_parallel": "GPUs the weights are sharded over.",
    "CanaryConfig.enabled": "Canaries send real requests; off unless enabled.",
    "CanaryConfig.prompt_tokens": "Prompt length of each canary request (tokens).",
    "CanaryConfig.max_tokens": "Output length of each canary request (tokens).",
    "CanaryConfig.chat": "Use the chat completions endpoint.",
    "DiagnosisConfig.thresholds": "The regime rules' thresholds; every one can be overridden.",
    "AlertsConfig.slos": "Percentile alerts (quantile of a signal over a window above a threshold).",
    "AlertsConfig.target_down_for": "How long a target must fail its scrapes before `LLMLatencyTargetDown` fires.",
    "AlertsConfig.group_by": "Labels that group alerts into one notification.",
    "AlertsConfig.group_interval": "At most one notification per receiver and group this often.",
    "AlertsConfig.receivers": "Where notifications go.",
    "SloConfig.name": "Unique name of the percentile alert.",
    "SloConfig.signal": "The latency signal the quantile is taken of.",
    "SloConfig.quantile": "Which quantile (0.99 = p99).",
    "SloConfig.threshold": "The alert fires while the quantile is above this.",
    "SloConfig.window": "Window of the quantile.",
    "SloConfig.for_": "How long the breach must hold before the alert fires.",
    "SloConfig.severity": "Severity label of the alert.",
    "ReceiverConfig.name": "Unique receiver name.",
    "ReceiverConfig.url": "Webhook URL, or an Alertmanager's base URL with `kind: alertmanager`.",
    "ReceiverConfig.kind": "`webhook`: Alertmanager's webhook payload (version 4); `alertmanager`: posts to "
                           "the Alertmanager's `/api/v2/alerts`.",
    "ReceiverConfig.headers": "Extra request headers; never shown back (values read as `<redacted>`).",
    "ReceiverConfig.timeout": "Timeout of one delivery attempt.",
    "ReceiverConfig.send_resolved": "Also notify when an alert resolves.",
    "PrometheusSourceConfig.kind": "The only kind: any Prometheus HTTP API (Prometheus, Thanos Query, Mimir, "
                                   "VictoriaMetrics).",
    "PrometheusSourceConfig.url": "Base URL of the API (a path prefix such as `/prometheus` is kept); the "
                                  "target host allow-list applies.",
    "PrometheusSourceConfig.selector": "Label matchers added to every engine query (`{a=\"x\", b=~\"y\"}`, braces "
                                       "optional, no metric name); checked offline and by the server's parser in "
                                       "`check-config`.",
    "PrometheusSourceConfig.target_labels": "One target per distinct value set of these labels; not `le`, "
                                            "`model_name`, `engine`, `dp_rank`, `quantile`.",
    "PrometheusSourceConfig.service_labels": "Replicas sharing these values form a service, a target of its own "
                                             "diagnosed as a whole and compared replica by replica "
                                             "(`replica_imbalance`).",
    "PrometheusSourceConfig.headers": "Sent with every request (e.g. `X-Scope-OrgID`); shown to API readers, so "
                                      "never credentials: an `Authorization` header is refused.",
    "PrometheusSourceConfig.bearer_token_env": "Environment variable holding a bearer token (not with "
                                               "`basic_auth`).",
    "PrometheusSourceConfig.basic_auth": "Basic authentication, the password from the environment.",
    "PrometheusSourceConfig.tls": "A CA file for a private CA, or (for tests only) no verification.",
    "PrometheusSourceConfig.query_timeout": "Per query, also sent to the server.",
    "BasicAuth.username": "User name.",
    "TlsConfig.ca_file": "PEM file of the CA that signed the server's certificate.",
    "TlsConfig.insecure_skip_verify": "Skip certificate verification (tests only).",
    "FileSDConfig.files": "Target-group files (`.json`, `.yml`, `.yaml`); globs in the file name; relative to "
                          "the targets YAML.",
    "FileSDConfig.refresh_interval": "How often the files are checked for changes (set, mtime or size).",
    "HttpSDConfig.url": "URL answering Prometheus' target-group JSON list.",
    "HttpSDConfig.refresh_interval": "How often the URL is fetched.",
    "SloObjective.name": "Unique SLO name (label `slo`).",
    "SloObjective.signal": "The latency histogram the SLI is read from.",
    "SloObjective.threshold": "A good request is at or under this; must be a bucket bound of the engine's "
                              "histogram.",
    "SloObjective.period": "The error budget's period.",
    "SloObjective.severities": "How `page` and `ticket` burn alerts map onto alert severities.",
    "SloObjective.burn_alerts": "Multiwindow burn-rate alerts; default: the Google SRE workbook's four.",
    "SloObjective.description": "Free text, shown with the SLO.",
    "BurnAlert.kind": "`page` or `ticket` (its severity comes from `severities`).",
    "BurnAlert.long": "The long window: makes the burn significant.",
    "BurnAlert.short": "The short window: lets the alert resolve minutes after the burn stops.",
    "BurnAlert.factor": "Fires while the burn rate exceeds this over both windows.",
}

#: Sections of the YAML: a model's place in the file, as its heading and anchor.
PATH_SUFFIX = {list: "[]"}


# ----------------------------------------------------------------------------- types

def _is_seconds(tp: object) -> bool:
    """``app.core.durations.Seconds``: a float read through its duration validator."""
    if typing.get_origin(tp) is typing.Annotated:
        return any(getattr(getattr(m, "func", None), "__name__", "") == "_seconds" for m in typing.get_args(tp)[1:])
    return False


def _field_is_seconds(field: FieldInfo) -> bool:
    if any(getattr(getattr(m, "func", None), "__name__", "") == "_seconds" for m in field.metadata):
        return True
    return any(_is_seconds(arg) for arg in typing.get_args(field.annotation))


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def type_text(tp: Any, anchors: dict[type[BaseModel], str], seconds: bool = False) -> str:
    """A field type as people read it: ``duration``, ``list of string``, a link to a section."""
    if _is_seconds(tp):
        return "duration"
    tp = _strip_annotated(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a, anchors, seconds) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(parts)
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in typing.get_args(tp))
    if origin is list:
        return "list of " + type_text(typing.get_args(tp)[0], anchors)
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"map of {type_text(key, anchors)} to {type_text(value, anchors)}"
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{anchors[tp]})" if tp in anchors else tp.__name__
    if seconds and tp is float:
        return "duration"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "secret"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _bound(value: float, seconds: bool) -> str:
    if seconds:
        return format_duration(value)
    return str(int(value)) if value.is_integer() else f"{value:g}"  # 2147483647, not 2.14748e+09


def _plural(count: int, what: str) -> str:
    return f"{count} {what}" if count != 1 else f"{count} {what.removesuffix('s')}"


def _value_type(tp: Any) -> Any:
    """The type of a value that is not None: ``str`` for ``Url | None``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if _is_optional(tp) else [tp]
    return args[0] if len(args) == 1 else tp


def _inner_metadata(tp: Any) -> list[Any]:
    """Constraints carried by the type itself (``Url``: a string of at most 2,048 characters)."""
    tp = _value_type(tp)
    out: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        tp, *metadata = typing.get_args(tp)
        out += metadata
    return out


def constraints(field: FieldInfo, seconds: bool) -> list[str]:
    """Bounds and patterns a value must meet, as ``> 0``, ``≤ 64``, ``at most 8 items``."""
    out: list[str] = []
    is_text = _strip_annotated(_value_type(field.annotation)) is str
    for meta in [*_inner_metadata(field.annotation), *field.metadata]:
        if is_text and hasattr(meta, "max_length") and not isinstance(meta, annotated_types.MaxLen):
            if getattr(meta, "min_length", None):
                out.append(f"at least {_plural(meta.min_length, 'characters')}")
            if meta.max_length is not None:
                out.append(f"at most {_plural(meta.max_length, 'characters')}")
        if isinstance(meta, annotated_types.Gt):
            out.append(f"> {_bound(float(meta.gt), seconds)}")  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Ge):
            out.append(f"≥ {_bound(float(meta.ge), seconds)}")  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Lt):
            out.append(f"< {_bound(float(meta.lt), seconds)}")  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Le):
            out.append(f"≤ {_bound(float(meta.le), seconds)}")  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.MinLen) and meta.min_length:
            out.append(f"at least {_plural(meta.min_length, 'characters' if is_text else 'items')}")
        elif isinstance(meta, annotated_types.MaxLen):
            out.append(f"at most {_plural(meta.max_length, 'characters' if is_text else 'items')}")
        pattern = getattr(meta, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"pattern `{pattern}`")
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- values

def value_text(value: Any, seconds: bool) -> str:
    """A default as it would be written in the file: durations with their unit."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        parts = [f"{fields[k].alias or k}: {value_text(v, _field_is_seconds(fields[k]))}"
                 for k, v in value if v is not None and v != fields[k].get_default(call_default_factory=True)
                 or k in _required(type(value))]
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v, seconds) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v, False)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if seconds and isinstance(value, (int, float)):
        return format_duration(float(value))
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Path):
        return value.as_posix()
    return str(value)


def _required(model: type[BaseModel]) -> set[str]:
    return {name for name, field in model.model_fields.items() if field.is_required()}


def default_text(field: FieldInfo, seconds: bool) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is None and field.default is PydanticUndefined:
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if isinstance(value, BaseModel) and value == type(value)():
        return "(defaults below)"
    if value in ("", [], {}):
        return "empty"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{value_text(value, seconds)}`"


# ----------------------------------------------------------------------------- text

def md(text: str) -> str:
    """Plain text for a Markdown table cell: ``<`` (an HTML tag otherwise), ``*`` and ``|``
    escaped outside code (Python-Markdown's tables keep a code span's ``|`` in its cell)."""
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("*", r"\*").replace("|", r"\|")
    return "`".join(parts)


def describe(model: type[BaseModel], name: str, field: FieldInfo, used: set[str]) -> str:
    key = f"{model.__name__}.{name}"
    if field.description:
        return " ".join(field.description.split())
    if key in NOTES:
        used.add(key)
        return NOTES[key]
    raise SystemExit(f"gen_config_reference: {key} has no description; add one to the model or to NOTES")


def doc_summary(model: type[BaseModel]) -> str:
    """The first paragraph of a model's own docstring (pydantic's inherited one is skipped)."""
    doc = model.__dict__.get("__doc__")
    if not doc:
        return ""
    first = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(first.split())


# ----------------------------------------------------------------------------- the file's models

def nested_models(tp: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """Models inside a field's type, with the path suffix (``[]`` for list items)."""
    tp = _strip_annotated(tp)
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        yield tp, ""
        return
    origin = typing.get_origin(tp)
    for arg in typing.get_args(tp):
        for model, suffix in nested_models(arg):
            yield model, ("[]" if origin is list else "") + suffix


def sections(root: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """Every model of the file, depth first in field order, with its YAML path."""
    out: list[tuple[str, type[BaseModel]]] = []
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], path: str) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((path, model))
        for name, field in model.model_fields.items():
            key = field.alias or name
            for sub, suffix in nested_models(field.annotation):
                walk(sub, f"{path}.{key}{suffix}" if path else f"{key}{suffix}")

    walk(root, "")
    return out


def anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top-level"


def field_table(model: type[BaseModel], anchors: dict[type[BaseModel], str], used: set[str]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        seconds = _field_is_seconds(field)
        kind = type_text(field.annotation, anchors, seconds)
        if _is_optional(field.annotation) and not field.is_required():
            kind += ", optional"
        kind = ", ".join([kind, *constraints(field, seconds)])
        lines.append(f"| `{field.alias or name}` | {md(kind) if '](#' not in kind else kind} | "
                     f"{default_text(field, seconds)} | {md(describe(model, name, field, used))} |")
    return lines


def settings_table(used: set[str]) -> list[str]:
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        seconds = _field_is_seconds(field)
        kind = "comma-separated list" if typing.get_origin(field.annotation) is list else \
            type_text(field.annotation, {}, seconds)
        kind = ", ".join([kind, *constraints(field, seconds)])
        lines.append(f"| `{ENV_PREFIX}{name.upper()}` | {md(kind)} | {default_text(field, seconds)} | "
                     f"{md(describe(Settings, name, field, used))} |")
    return lines


HEADER = """\
# Configuration reference

<!-- Generated by scripts/gen_config_reference.py from app/settings.py and the models of the
targets YAML. Do not edit by hand: change the models, then run
`python3 scripts/gen_config_reference.py` (tests/test_docs.py fails when this page is stale). -->

The service reads two things: **environment variables** say how it runs (database, listen
address, limits, security, replicas) and the **targets YAML** (`LLM_LATENCY_CONFIG_FILE`)
says what it monitors (targets, sources, discovery, diagnosis, alerts, SLOs). This page
lists every setting and every key, generated from the classes that validate them; the
[configuration guide](../configuration.md) explains how they fit together.

Durations are written the way Prometheus writes them (`500ms`, `15s`, `5m`, `1h30m`, `7d`).
In the YAML file a duration needs its unit (a bare `15` is refused); environment variables
and the API also take plain seconds.
"""


def render() -> str:
    used: set[str] = set()
    found = sections(FileConfig)
    anchors = {model: anchor(path) for path, model in found}
    out = [HEADER, "## Environment variables", "",
           f"Every variable has the prefix `{ENV_PREFIX}`; an unknown one is refused at start.", "",
           *settings_table(used), "", "## The targets YAML", ""]
    for path, model in found:
        title = f"`{path}`" if path else "Top level"
        out += [f"### {title} {{#{anchors[model]}}}", ""]
        summary = doc_summary(model)
        if summary:
            out += [md(summary), ""]
        out += [*field_table(model, anchors, used), ""]
    models: list[type[BaseModel]] = [Settings, *(model for _, model in found)]
    fields = {f"{model.__name__}.{name}" for model in models for name in model.model_fields}
    stale = sorted(set(NOTES) - fields)
    if stale:
        raise SystemExit(f"gen_config_reference: NOTES names fields that no longer exist: {', '.join(stale)}")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page differs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python3 scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
