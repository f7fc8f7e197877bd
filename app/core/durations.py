"""Durations written the way Prometheus writes them ("15s", "5m", "1h30m", "7d"), and
points in time written as ISO 8601 UTC.

Users already type these in Prometheus and Grafana; accepting the same syntax in the
config file, the environment and API query parameters means one less thing to learn.
"""

from __future__ import annotations

import re
import time
from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str | int | float) -> float:
    """Return seconds for a Prometheus-style duration; plain numbers are seconds.

    Raises ValueError with the offending text so config and API errors can name it.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = text.strip()
        try:
            seconds = float(s)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(s):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if pos != len(s) or not s:
                raise ValueError(
                    f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 7d)"
                ) from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ValueError(f"duration must be a finite, non-negative number of seconds: {text!r}")
    return seconds


#: Validation-context key: set by the config-file loader, where a bare number is refused.
UNITS_REQUIRED_CONTEXT = "duration_units_required"
_BARE_NUMBER = re.compile(r"\s*\d+(?:\.\d+)?\s*")


def _seconds(value: object, info: ValidationInfo) -> float:
    """Pydantic hook of :data:`Seconds`. In the config file ``scrape_interval: 15`` is refused:
    a monitoring user reads it as Prometheus would (no unit, no duration), and the file is
    the place a misread unit costs most. Environment variables, API bodies and stored rows
    (written back as numbers) still take plain seconds."""
    if info.context and info.context.get(UNITS_REQUIRED_CONTEXT):
        bare = isinstance(value, (int, float)) and not isinstance(value, bool)
        if bare or (isinstance(value, str) and _BARE_NUMBER.fullmatch(value)):
            raise ValueError(f"a duration needs a unit, e.g. {str(value).strip()}s")
    return parse_duration(value)  # type: ignore[arg-type]


#: A duration field of a model: ``15s``, ``5m``, ``1h30m`` (see :func:`parse_duration`).
Seconds = Annotated[float, BeforeValidator(_seconds)]


def format_duration(seconds: float) -> str:
    """Shortest Prometheus-style spelling of a whole number of seconds (e.g. 300 -> "5m")."""
    s = int(round(seconds))
    if s != seconds or s == 0:
        return f"{seconds:g}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def format_utc(ts: float) -> str:
    """A unix time as ISO 8601 UTC to the second (``2026-12-03T06:20:57Z``), as evidence,
    alert descriptions, API messages and the status page write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
