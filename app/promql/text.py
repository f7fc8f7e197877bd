"""PromQL text: number, duration and instance-selector literals, and joining conditions.

Shared by ``llm-latency rules export`` (:mod:`app.rules_export`) and the PromQL
twins the regime modules declare (``Rule.promql`` in :mod:`app.diagnosis.rules.base`);
it imports nothing of the application, so a rule module can use it without importing
the export (which imports the rule registry).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Protocol
from urllib.parse import urlsplit


class Scraped(Protocol):
    """A target as the text helpers see it: where it is scraped (a ``TargetConfig``)."""

    @property
    def url(self) -> str: ...


class DecodeFloor(Protocol):
    """A hardware profile as the text helpers see it (a ``HardwareProfile``)."""

    @property
    def decode_floor_seconds(self) -> float: ...

    def describe(self) -> str: ...


def prom_duration(seconds: float) -> str:
    """Prometheus duration for a number of seconds: whole milliseconds, largest exact unit."""
    ms = round(seconds * 1000)
    if ms < 0 or abs(ms - seconds * 1000) > 1e-6:
        raise ValueError(f"duration {seconds!r}s is not a whole number of milliseconds")
    return millis_duration(ms)


def millis_duration(ms: int) -> str:
    """Prometheus duration for a whole number of milliseconds (>= 0), largest exact unit."""
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


def instance_regex(targets: Sequence[Scraped]) -> str:
    alternatives: list[str] = []
    for target in targets:
        for alternative in instance_of(target.url).split("|"):
            escaped = re.sub(r"([.\[\]])", r"\\\\\1", alternative)
            if escaped not in alternatives:
                alternatives.append(escaped)
    return "|".join(alternatives)


def instance_selector(targets: Sequence[Scraped], negate: bool = False) -> str:
    """``{instance="h:p"}`` / ``{instance=~"a|b"}`` (``!~`` with ``negate``), empty for no targets."""
    if not targets:
        return ""
    if len(targets) == 1 and "|" not in instance_of(targets[0].url) and not negate:
        return f'{{instance="{instance_of(targets[0].url)}"}}'
    return f'{{instance{"!~" if negate else "=~"}"{instance_regex(targets)}"}}'


def and_on(*parts: str, on: str) -> str:
    """``a and on(labels) (b) and on(labels) (c)``: every condition holds for the same series."""
    return f"\nand on({on}) ".join(f"({p})" if i else p for i, p in enumerate(parts))


def decode_floor_text(profile: DecodeFloor) -> str:
    """``the 3.2ms decode floor (<profile>)``, as the alerts against a target's floor say it."""
    return f"the {human_seconds(float(f'{profile.decode_floor_seconds:.3g}'))} decode floor ({profile.describe()})"


# ---------------------------------------------------------------- label selectors
_SELECTOR_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v"}
MAX_SELECTOR_LENGTH = 4096


def _string_literal(text: str, i: int) -> tuple[str, int]:
    """A PromQL string at ``text[i]`` (double, single or back quotes) -> (value, index after)."""
    quote = text[i] if i < len(text) else ""
    if quote not in ('"', "'", "`"):
        raise ValueError(f"expected a quoted label value at character {i + 1}")
    out: list[str] = []
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == quote:
            return "".join(out), j + 1
        if c == "\\" and quote != "`":
            nxt = text[j + 1] if j + 1 < len(text) else ""
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                j += 2
                continue
            if nxt in ("u", "x"):
                width = 4 if nxt == "u" else 2
                digits = text[j + 2:j + 2 + width]
                if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise ValueError(f"invalid escape at character {j + 1}")
                out.append(chr(int(digits, 16)))
                j += 2 + width
                continue
            raise ValueError(f"invalid escape at character {j + 1}")
        if c == "\n" and quote != "`":
            raise ValueError(f"unterminated string at character {i + 1}")
        out.append(c)
        j += 1
    raise ValueError(f"unterminated string at character {i + 1}")


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    """``{a="x", b=~"y|z"}`` -> ``[("a", "=", "x"), ("b", "=~", "y|z")]``.

    The label-matcher part of a PromQL vector selector, as a user writes it in a source's
    ``selector`` (braces optional, empty allowed). No metric name: the source adds its own.
    Raises ValueError naming the position of the first problem; regular expressions are
    checked by the Prometheus server itself (RE2, linear time) when it is reachable.
    """
    if len(text) > MAX_SELECTOR_LENGTH:
        raise ValueError(f"selector longer than {MAX_SELECTOR_LENGTH} characters")
    body = text.strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise ValueError("selector opens '{' but does not end with '}'")
        body = body[1:-1]
    matchers: list[tuple[str, str, str]] = []
    i = 0
    while body[i:].strip():
        m = _SELECTOR_NAME.match(body, i)
        if m is None:
            raise ValueError(f"expected label=\"value\" at character {i + 1} of the matchers")
        name, op = m.group(1), m.group(2)
        if name == "__name__":
            raise ValueError("the selector must not choose a metric name (__name__): the source queries "
                             "every engine metric itself")
        value, i = _string_literal(body, m.end())
        matchers.append((name, op, value))
        rest = body[i:].lstrip()
        if rest.startswith(","):
            i = len(body) - len(rest) + 1
        elif rest:
            raise ValueError(f"expected ',' or the end at character {len(body) - len(rest) + 1} of the matchers")
        else:
            break
    return matchers


def any_of(values: Sequence[str]) -> str:
    """An RE2 pattern matching exactly these values (for ``label=~"..."``): each value's
    metacharacters escaped, the values joined with ``|``."""
    return "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", v) for v in sorted(set(values)))


def union(parts: Sequence[str]) -> str:
    """``a or b or c ...`` as a balanced tree of ``or`` - the same answer (``or`` is associative),
    for less of the server's CPU: Prometheus 2.x handles every series of an ``or``'s left side
    at each level, so in a chain of k parts the first part's series are handled k - 1 times,
    in a balanced tree about log2(k) times (``bench/prometheus_source.py`` measures both)."""
    if len(parts) <= 2:
        return " or ".join(parts)
    middle = len(parts) // 2
    return f"({union(parts[:middle])}) or ({union(parts[middle:])})"


def format_matchers(matchers: list[tuple[str, str, str]]) -> str:
    """Matchers back to PromQL (no braces): ``a="x",b=~"y|z"``; values JSON-quoted, which is a
    valid PromQL double-quoted string."""
    return ",".join(f"{name}{op}{json.dumps(value, ensure_ascii=False)}" for name, op, value in matchers)
