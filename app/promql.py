"""PromQL text: number, duration and instance-selector literals, and joining conditions.

Shared by ``llm-latency rules export`` (:mod:`app.rules_export`) and the PromQL
twins the regime modules declare (``Rule.promql`` in :mod:`app.diagnosis.rules.base`);
it imports nothing of the application, so a rule module can use it without importing
the export (which imports the rule registry).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from app.config import TargetConfig
    from app.diagnosis.profile import HardwareProfile


def prom_duration(seconds: float) -> str:
    """Prometheus duration for a number of seconds: whole milliseconds, largest exact unit."""
    ms = round(seconds * 1000)
    if ms < 0 or abs(ms - seconds * 1000) > 1e-6:
        raise ValueError(f"duration {seconds!r}s is not a whole number of milliseconds")
    if ms == 0:
        return "0s"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def num(x: float) -> str:
    """A PromQL number literal (shortest readable form)."""
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return f"{float(x):.15g}"


def quantile_name(q: float) -> str:
    """0.99 -> ``p99``, 0.5 -> ``p50``, 0.999 -> ``p99_9``."""
    text = format((Decimal(str(q)) * 100).normalize(), "f")
    return "p" + text.replace(".", "_")


def human_seconds(s: float) -> str:
    return f"{s * 1000:g}ms" if s < 1 else f"{s:g}s"


def human_share(x: float) -> str:
    return f"{x * 100:g}%"


def le_matcher(bound: float) -> str:
    """Matches a bucket bound however it is rendered: ``le="1.0"`` (prometheus_client,
    Prometheus 2.x) or ``le="1"`` (Prometheus 3 normalises float labels)."""
    if math.isinf(bound):
        return 'le="+Inf"'
    if float(bound).is_integer():
        whole = int(bound)
        return f'le=~"{whole}|{whole}\\\\.0"'
    return f'le="{bound!r}"'


def instance_of(url: str) -> str:
    """The ``instance`` label Prometheus gives a target scraped at ``url`` (host:port)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if parts.port is None:  # Prometheus 2.x adds the scheme's default port, 3.x does not
        return f"{netloc}|{netloc}:{443 if parts.scheme == 'https' else 80}"
    return netloc


def instance_regex(targets: list[TargetConfig]) -> str:
    alternatives: list[str] = []
    for target in targets:
        for alternative in instance_of(target.url).split("|"):
            escaped = re.sub(r"([.\[\]])", r"\\\\\1", alternative)
            if escaped not in alternatives:
                alternatives.append(escaped)
    return "|".join(alternatives)


def instance_selector(targets: list[TargetConfig], negate: bool = False) -> str:
    """``{instance="h:p"}`` / ``{instance=~"a|b"}`` (``!~`` with ``negate``), empty for no targets."""
    if not targets:
        return ""
    if len(targets) == 1 and "|" not in instance_of(targets[0].url) and not negate:
        return f'{{instance="{instance_of(targets[0].url)}"}}'
    return f'{{instance{"!~" if negate else "=~"}"{instance_regex(targets)}"}}'


def and_on(*parts: str, on: str) -> str:
    """``a and on(labels) (b) and on(labels) (c)``: every condition holds for the same series."""
    return f"\nand on({on}) ".join(f"({p})" if i else p for i, p in enumerate(parts))


def decode_floor_text(profile: HardwareProfile) -> str:
    """``the 3.2ms decode floor (<profile>)``, as the alerts against a target's floor say it."""
    return f"the {human_seconds(float(f'{profile.decode_floor_seconds:.3g}'))} decode floor ({profile.describe()})"
