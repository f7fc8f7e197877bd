"""Silence matchers, Alertmanager style: ``name="value"``, ``!=``, ``=~`` (regex), ``!~``.

Accepted as strings (``'target=~"vllm-.*"'``) or as Alertmanager API objects
(``{"name": "target", "value": "vllm-.*", "isRegex": true, "isEqual": true}``). Regexes
are anchored, as in Alertmanager.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s=~!]*))\s*$')


class MatcherError(ValueError):
    """A matcher that cannot be used; the message says which and why."""


def parse_matcher(item: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(item, str):
        m = _MATCHER.match(item)
        if not m:
            raise MatcherError(f"bad matcher {item!r}: expected name=\"value\", name!=\"value\", name=~\"regex\" "
                               "or name!~\"regex\"")
        name, op, quoted, bare = m.groups()
        value = bytes(quoted, "utf-8").decode("unicode_escape") if quoted is not None else bare
        matcher = {"name": name, "value": value, "isRegex": "~" in op, "isEqual": not op.startswith("!")}
    else:
        unknown = set(item) - {"name", "value", "isRegex", "isEqual"}
        if unknown or "name" not in item or "value" not in item:
            raise MatcherError(f"bad matcher {dict(item)!r}: needs name and value (optional isRegex, isEqual)")
        matcher = {"name": str(item["name"]), "value": str(item["value"]), "isRegex": bool(item.get("isRegex", False)),
                   "isEqual": bool(item.get("isEqual", True))}
        if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", matcher["name"]):
            raise MatcherError(f"bad matcher name {matcher['name']!r}")
    if matcher["isRegex"]:
        try:
            re.compile(matcher["value"])
        except re.error as exc:
            raise MatcherError(f"bad regex in matcher {matcher['name']}: {exc}") from None
    return matcher


def matches(matcher: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    value = labels.get(matcher["name"], "")
    if matcher["isRegex"]:
        hit = re.fullmatch(matcher["value"], value) is not None
    else:
        hit = value == matcher["value"]
    return hit if matcher["isEqual"] else not hit


def silenced_by(silences: list, labels: Mapping[str, str], now: float) -> list[str]:
    """Ids of the silences (rows with .id, .matchers, .starts_at, .ends_at) muting these labels."""
    return [s.id for s in silences if s.starts_at <= now < s.ends_at and all(matches(m, labels) for m in s.matchers)]
