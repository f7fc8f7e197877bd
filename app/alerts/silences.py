"""Silence matchers, Alertmanager style: ``name="value"``, ``!=``, ``=~`` (regex), ``!~``.

Accepted as strings (``'target=~"vllm-.*"'``) or as Alertmanager API objects
(``{"name": "target", "value": "vllm-.*", "isRegex": true, "isEqual": true}``).

Regexes have RE2 semantics and are anchored at both ends, as in Alertmanager (Go's
``regexp``): ``target=~"vllm-.*"`` matches ``vllm-a`` but not ``x-vllm-a``. RE2 runs in time
linear in the label value, so no pattern a user sends can make matching back-track for
minutes (Python's ``re`` takes exponential time on ``(a+)+`` against ``aaaa…a-``); the
price is RE2's syntax: backreferences and lookarounds are refused when the silence is made.

Compiled programs are bounded in memory, not only in count: each regex compiles within
:data:`REGEX_MAX_MEM` (RE2 refuses a larger program, a 422 naming the matcher), and the
compiled programs of all silences together within :data:`COMPILED_BUDGET` (a silence that would
pass it is refused: :func:`check_budget`); the cache of compiled programs evicts the least
recently used past the same budget.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import re2

from app.core.limits import MAX_LABEL_NAME_LENGTH, MAX_MATCHER_LENGTH

log = logging.getLogger(__name__)
_warned: set[str] = set()  # silences already logged as muting nothing

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s=~!]*))\s*$')
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ESCAPED = {"n": "\n", '"': '"', "\\": "\\"}


def _unescape(quoted: str) -> str:
    """Alertmanager's unescaping of a quoted value: ``\\n``, ``\\"`` and ``\\\\``; any other
    backslash stays, so ``"vllm\\.a"`` reaches the regex as ``vllm\\.a``."""
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(0)), quoted)


class MatcherError(ValueError):
    """A matcher that cannot be used; the message says which and why."""


def parse_matcher(item: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(item, str):
        m = _MATCHER.match(item)
        if not m:
            raise MatcherError(f"bad matcher {item[:MAX_MATCHER_LENGTH]!r}: expected name=\"value\", name!=\"value\", "
                               "name=~\"regex\" or name!~\"regex\"")
        name, op, quoted, bare = m.groups()
        value = _unescape(quoted) if quoted is not None else bare
        matcher: dict[str, Any] = {"name": name, "value": value, "isRegex": "~" in op,
                                   "isEqual": not op.startswith("!")}
    else:
        unknown = set(item) - {"name", "value", "isRegex", "isEqual"}
        if unknown or "name" not in item or "value" not in item:
            raise MatcherError(f"bad matcher {str(dict(item))[:MAX_MATCHER_LENGTH]}: needs name and value "
                               "(optional isRegex, isEqual)")
        matcher = {"name": str(item["name"]), "value": str(item["value"]), "isRegex": bool(item.get("isRegex", False)),
                   "isEqual": bool(item.get("isEqual", True))}
        if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", matcher["name"]):
            raise MatcherError(f"bad matcher name {matcher['name'][:MAX_LABEL_NAME_LENGTH]!r}")
    if len(matcher["name"]) > MAX_LABEL_NAME_LENGTH or len(matcher["value"]) > MAX_MATCHER_LENGTH:
        raise MatcherError(f"matcher {matcher['name'][:MAX_LABEL_NAME_LENGTH]!r} too long: names have at most "
                           f"{MAX_LABEL_NAME_LENGTH} characters, values at most {MAX_MATCHER_LENGTH}")
    if matcher["isRegex"]:
        compile_regex(matcher["name"], matcher["value"])
    return matcher


#: RE2's memory bound for one regex (its program, and the DFA it builds while matching): a
#: program that needs more is refused. Alertmanager-style matchers are far below it.
REGEX_MAX_MEM = 1 << 20
#: All silences' compiled programs together (see :func:`program_bytes`).
COMPILED_BUDGET = 64 << 20
_INST_BYTES = 8  # bytes of one RE2 program instruction


def program_bytes(regex: re2._Regexp) -> int:
    """What a compiled regex may hold, estimated from its program's size: the forward program and
    a reverse one of the same size, which RE2 builds when a match needs it (at least 1 KiB)."""
    return max(1024, 2 * int(regex.programsize) * _INST_BYTES)


class _Compiled:
    """Compiled regexes by pattern, least recently used evicted past :data:`COMPILED_BUDGET` bytes."""

    def __init__(self) -> None:
        self._programs: OrderedDict[str, tuple[re2._Regexp, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, name: str, pattern: str) -> re2._Regexp:
        with self._lock:
            hit = self._programs.get(pattern)
            if hit is not None:
                self._programs.move_to_end(pattern)
                return hit[0]
        regex = _compile(name, pattern)
        size = program_bytes(regex)
        with self._lock:
            if pattern not in self._programs:
                self._programs[pattern] = (regex, size)
                self._bytes += size
                while self._bytes > COMPILED_BUDGET and len(self._programs) > 1:
                    _, (_, freed) = self._programs.popitem(last=False)
                    self._bytes -= freed
        return regex


_compiled = _Compiled()


def _compile(name: str, pattern: str) -> re2._Regexp:
    options = re2.Options()
    options.log_errors = False  # the error is raised with the matcher's name instead
    options.max_mem = REGEX_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise MatcherError(f"bad regex in matcher {name}: {reason} (regexes use RE2 syntax: no backreferences or "
                           f"lookarounds, and compile within {REGEX_MAX_MEM >> 10} KiB)") from None


def compile_regex(name: str, pattern: str) -> re2._Regexp:
    """The RE2 program of matcher ``name``'s regex; MatcherError when RE2 refuses it
    (backreferences, lookarounds, repetition counts above 1000, a program past
    :data:`REGEX_MAX_MEM`...). Cached: every alert evaluation matches every silence again."""
    return _compiled.get(name, pattern)


def check_budget(existing: Iterable[Sequence[Mapping[str, Any]]], new: Sequence[Mapping[str, Any]]) -> None:
    """MatcherError when the compiled regexes of the silences still in force (``existing``:
    each one's matchers) and ``new`` together pass :data:`COMPILED_BUDGET`."""
    patterns = {m["value"]: m["name"] for matchers in (*existing, new) for m in matchers if m["isRegex"]}
    total = sum(program_bytes(compile_regex(name, pattern)) for pattern, name in patterns.items())
    if total > COMPILED_BUDGET:
        raise MatcherError(f"the silences' regexes would take {total / 2**20:.1f} MiB compiled; the budget for all "
                           f"silences in force is {COMPILED_BUDGET >> 20} MiB (expire some, or use simpler regexes)")


def matches(matcher: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Alertmanager's rule: a missing label is the empty string; a regex must match the
    whole value."""
    value = labels.get(matcher["name"], "")
    if matcher["isRegex"]:
        hit = compile_regex(matcher["name"], matcher["value"]).fullmatch(value) is not None
    else:
        hit = value == matcher["value"]
    return hit if matcher["isEqual"] else not hit


class SilenceLike(Protocol):
    """What :func:`silenced_by` reads of a silence (a stored row or a test double)."""

    @property
    def id(self) -> str: ...

    @property
    def matchers(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def starts_at(self) -> float: ...

    @property
    def ends_at(self) -> float: ...


def silenced_by(silences: Iterable[SilenceLike], labels: Mapping[str, str], now: float) -> list[str]:
    """Ids of the silences muting these labels.

    A stored silence whose regex RE2 refuses (made before regexes were RE2) mutes nothing:
    muting by a pattern that cannot be evaluated safely would hide alerts."""
    muting = []
    for silence in silences:
        if not silence.starts_at <= now < silence.ends_at:
            continue
        try:
            if all(matches(m, labels) for m in silence.matchers):
                muting.append(silence.id)
        except MatcherError as exc:
            if silence.id not in _warned:
                _warned.add(silence.id)
                log.warning("silence %s mutes nothing: %s", silence.id, exc)
    return muting
