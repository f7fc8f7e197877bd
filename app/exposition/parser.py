"""Fast, tolerant parser for Prometheus text exposition pages (format 0.0.4, OpenMetrics 1.0 text).

Why not ``prometheus_client.parser``? It parses everything, character by character, and
raises on the first bad line. A scraper needs something else: it reads the same page
shape every 15 s from every target, wants only the engine's families, and must survive
pages that are partly garbage (documentation excerpts with ``...`` lines, truncated
bodies, HTML error pages). This module is built around three observations:

1. **Unwanted families need not be parsed at all.** Every family starts with a
   ``# TYPE`` line; if ``keep`` rejects it, the sample lines up to the next comment line
   are located with one ``str.find("\\n#")`` and only counted (after one C-level check
   that they all start with the family's name; otherwise they are looked at line by line,
   so a TYPE-less sample hiding there still becomes its own untyped family).
2. **A series line's identity never changes; only its value does.** The text before the
   value (``name{labels}``) is cached -> ``(sample name, labels dict)``, as Prometheus'
   own scrape cache does, so a repeat parse of a known line is ``rpartition`` + dict
   lookup + ``float()``; the slow label parser only runs for new series.
3. **A target's whole page keeps its shape between scrapes.** After a successful parse
   the parser records a *plan*: for every line of the page, whether it is comment/other
   text that must reappear verbatim, a line of a skipped block that must start with the
   block's name, or a sample line that must start with its cached identity plus a space
   (the rest being the value). The next parse verifies the new page against the plan
   in C (``_planned.c``: every line compared in place, every value converted from the
   page's bytes by CPython's own ``float()`` conversion) or, where that extension was not
   built, with a handful of C-level bulk operations (``split``, ``itemgetter``, tuple
   comparison, ``map(str.removeprefix, ...)``) instead of a Python loop; then it creates
   the families. Any difference in shape (a new series, a moved
   line, a timestamp, an odd value) fails verification and the page takes the
   line-by-line path above, which records a fresh plan. The plan therefore can never
   hand out stale labels or values: everything except the value text is compared, and
   the value text is always converted anew.

A warm parse of the real vLLM page costs about 1/200 of ``prometheus_client``'s, a cold
one about 1/4 (``bench/ingest.py`` rows a1-a6 and ``bench/parse_bench.py``;
docs/benchmarks.md#ingest).

Semantics (matching ``prometheus_client.parser.text_string_to_metric_families`` on
every page it accepts, except where noted):

* Counters are exposed under a name ending in ``_total``: ``# TYPE x counter`` with
  samples ``x`` (0.0.4, renamed to ``x_total`` like prometheus_client does) or ``x_total``
  and ``x_created`` (OpenMetrics) forms family ``x_total``; so does ``# TYPE x_total
  counter``.
* ``_bucket``/``_sum``/``_count``/``_created`` (histogram), ``_sum``/``_count``/
  ``_created`` plus the bare name (summary), ``_bucket``/``_gsum``/``_gcount``
  (gaugehistogram) and ``_info`` (info) belong to the preceding TYPE block; a sample
  that does not belong to the current block starts an untyped family named after it.
  (prometheus_client's 0.0.4 parser does not attach ``_created`` to histograms,
  summaries and counters; OpenMetrics does, and so do we.)
* OpenMetrics ``unknown`` is reported as ``untyped``; ``# EOF``, ``# UNIT``, exemplars
  (``... # {trace_id="..."} 1.0``) and timestamps are accepted and ignored.
* A kept TYPE block with no samples still yields an (empty) family, as in
  prometheus_client. Two blocks with the same family name are merged.
* Malformed lines are counted, reported (first 20: line number and a reason from a fixed
  vocabulary, never the line's text) and skipped; nothing in the page content can make
  :meth:`PageParser.parse` raise. The reports end up in scrape records that anyone who can
  read the API sees, and a page that is not a metrics page (an ``.env`` file, an error
  page with a stack trace) may hold secrets, so its text is never quoted. Lines inside
  skipped blocks are counted in ``samples_seen`` without being validated.
* ``keep`` must be a pure function of the family name: its answers are memoized per
  :class:`PageParser` (so it is called at most once per family name, not per scrape).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from types import ModuleType
from typing import Any

_planned: ModuleType | None
try:  # the plan applied to a page's bytes in C (_planned.c), built with the package by a C compiler
    from app.exposition import _planned
except ImportError:  # installed without one: the same plan, applied in Python (_Plan.values)
    _planned = None

__all__ = [
    "MetricFamily",
    "PageParser",
    "ParsedPage",
    "Sample",
    "keep_prefixes",
    "parse_page",
]

MAX_ERRORS = 20


@dataclass(slots=True)
class Sample:
    name: str  # full sample name, e.g. "vllm:time_to_first_token_seconds_bucket"
    labels: dict[str, str]  # may be shared with the line cache: callers must not mutate it
    value: float


_VALUE = attrgetter("value")


class MetricFamily:
    """One kept family: ``name`` (the TYPE name; counters always end in "_total"; untyped:
    the sample name), ``type`` (counter|gauge|histogram|summary|untyped, + info, stateset,
    gaugehistogram), its ``samples`` and their ``values`` in page order.

    ``memo`` holds facts derived from the samples' names and labels, never their values:
    the same dict on every page whose plan verified exactly these names and labels in
    this order (point 3 of the module docstring), None when the page has no plan. The
    adapters keep their series layouts there, so a repeat page is not regrouped, and then
    they read only ``values``. That is why a family made by the plan (:meth:`planned`)
    creates its ``Sample`` objects only when ``samples`` is first read: creating them would
    be the largest single cost of a scrape of a known page shape, and the adapters never
    read them.
    """

    __slots__ = ("name", "type", "memo", "_samples", "_names", "_labels", "_values")

    def __init__(self, name: str, type: str, samples: list[Sample],
                 memo: dict[Hashable, Any] | None = None) -> None:
        self.name = name
        self.type = type
        self.memo = memo
        self._samples: list[Sample] | None = samples
        self._names: tuple[str, ...] = ()
        self._labels: tuple[dict[str, str], ...] = ()
        self._values: list[float] | None = None

    @classmethod
    def planned(cls, name: str, type_: str, names: tuple[str, ...], labels: tuple[dict[str, str], ...],
                values: list[float], memo: dict[Hashable, Any] | None) -> MetricFamily:
        """A family of samples given as parallel names, labels and values (built lazily)."""
        family = cls.__new__(cls)
        family.name, family.type, family.memo = name, type_, memo
        family._samples = None
        family._names, family._labels, family._values = names, labels, values
        return family

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = list(map(Sample, self._names, self._labels, self._values or ()))
        return self._samples

    @property
    def values(self) -> list[float]:
        """The samples' values in page order (read-only: a planned family hands out its own list)."""
        if self._values is not None:
            return self._values
        return list(map(_VALUE, self._samples or ()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetricFamily):
            return NotImplemented
        return (self.name, self.type, self.samples) == (other.name, other.type, other.samples)

    __hash__ = None  # type: ignore[assignment]  # mutable, so not hashable

    def __repr__(self) -> str:
        return f"MetricFamily(name={self.name!r}, type={self.type!r}, samples={self.samples!r})"


@dataclass(slots=True)
class ParsedPage:
    families: dict[str, MetricFamily]  # only the kept ones
    samples_seen: int  # sample lines in the page (kept + skipped)
    samples_kept: int
    malformed: int  # lines that could not be parsed (counted, skipped)
    errors: list[str]  # first 20 messages like "line 13: invalid metric name" (never the line's text)
    # Like MetricFamily.memo, for facts about the whole page's names and labels (which family
    # an adapter reads for each signal): the same dict on every page of one plan, else None.
    memo: dict[Hashable, Any] | None = field(default=None, compare=False, repr=False)


Keep = Callable[[str], bool]


def keep_prefixes(*prefixes: str) -> Keep:
    """A ``keep`` function accepting family names that start with any of ``prefixes``."""
    wanted = tuple(prefixes)

    def keep(name: str) -> bool:
        return name.startswith(wanted)

    keep.__qualname__ = f"keep_prefixes{wanted!r}"
    return keep


def parse_page(page: bytes | str, keep: Keep | None = None) -> ParsedPage:
    """Convenience: one-shot parse without a persistent cache."""
    return PageParser(keep)._parse_text(_prepare(page), build_plan=False)[0]


# --------------------------------------------------------------------------- grammar

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
# The shape almost every exporter writes: name{a="x",b="y"} with no blanks and no
# quoted names. One regex match parses it; anything else goes to the careful parser.
_SIMPLE_IDENTITY_RE = re.compile(rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_PAIR}(?:,{_PAIR})*,?)?)\}})?")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "n": "\n", '"': '"'}
_COMMENT_HEAD_RE = re.compile(r"[ \t]*#[ \t]+(TYPE|HELP)(?:[ \t]+|$)")
_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "histogram": "histogram",
    "summary": "summary",
    "untyped": "untyped",
    "unknown": "untyped",
    "info": "info",
    "stateset": "stateset",
    "gaugehistogram": "gaugehistogram",
}
_SUFFIXES = {
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("", "_info"),
}
_BLANKS = " \t"


class _Malformed(Exception):
    """A line that cannot be parsed; the message is the reason shown in ParsedPage.errors."""


def _unescape(value: str) -> str:
    """Label-value escapes: \\\\, \\" and \\n; any other backslash pair is kept verbatim
    (as prometheus_client does)."""
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def _to_float(text: str) -> float:
    # float() also accepts "1_000"; Prometheus and prometheus_client do not.
    if "_" in text:
        raise ValueError(text)
    return float(text)


def _skip_blanks(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _BLANKS:
        i += 1
    return i


def _parse_identity(s: str) -> tuple[str, dict[str, str], int]:
    """Parse ``name{labels}`` at the start of sample line ``s``.

    Returns (sample name, labels, end) where ``s[:end]`` is the identity text (the
    line cache key). Whatever follows ``end`` is the value part.
    """
    m = _SIMPLE_IDENTITY_RE.match(s)
    if m is not None:
        end = m.end()
        inner = m.group(2)
        if inner is not None:
            pairs = _PAIR_RE.findall(inner)
            labels = dict(pairs)
            if "\\" in inner:
                labels = {k: _unescape(v) for k, v in pairs}
            if len(labels) != len(pairs):
                raise _Malformed("duplicate label name")
            if "__name__" not in labels:
                return m.group(1), labels, end
        else:
            rest = s[end:end + 1]
            if rest == "":
                return m.group(1), {}, end
            if rest in _BLANKS:
                j = _skip_blanks(s, end)
                if s[j:j + 1] != "{":  # "name value"; "name {labels}" needs the full parser
                    return m.group(1), {}, end
            elif rest != "{":
                raise _Malformed("invalid metric name")
    return _parse_identity_slow(s)


def _parse_identity_slow(s: str) -> tuple[str, dict[str, str], int]:
    """The general form: blanks around tokens, quoted (UTF-8) names, ``__name__``."""
    n = len(s)
    i = _skip_blanks(s, 0)
    name = None
    m = _NAME_RE.match(s, i)
    if m is not None:
        name = m.group()
        i = m.end()
    j = _skip_blanks(s, i)
    if j >= n or s[j] != "{":
        if name is None:
            raise _Malformed("invalid metric name")
        if i < n and s[i] not in _BLANKS:
            raise _Malformed("invalid metric name")
        return name, {}, i
    i = j + 1
    labels: dict[str, str] = {}
    while True:
        i = _skip_blanks(s, i)
        if i >= n:
            raise _Malformed("unterminated label set")
        if s[i] == "}":
            break
        if s[i] == '"':
            q = _QUOTED_RE.match(s, i)
            if q is None:
                raise _Malformed("unterminated quoted string")
            label, quoted, i = _unescape(q.group(1)), True, q.end()
        else:
            q = _LABEL_NAME_RE.match(s, i)
            if q is None:
                raise _Malformed("invalid label name")
            label, quoted, i = q.group(), False, q.end()
        i = _skip_blanks(s, i)
        if i < n and s[i] == "=":
            i = _skip_blanks(s, i + 1)
            q = _QUOTED_RE.match(s, i)
            if q is None:
                raise _Malformed("label value is not a terminated quoted string")
            value, i = _unescape(q.group(1)), q.end()
            if label == "__name__":
                if name is not None:
                    raise _Malformed("metric name given twice")
                name = value
            elif label in labels:
                raise _Malformed("duplicate label name")
            else:
                labels[label] = value
        elif quoted:  # {"metric.name", a="b"}: the OpenMetrics/Prometheus 3 UTF-8 form
            if name is not None:
                raise _Malformed("metric name given twice")
            name = label
        else:
            raise _Malformed("expected '=' after label name")
        i = _skip_blanks(s, i)
        if i < n and s[i] == ",":
            i += 1
        elif i >= n or s[i] != "}":
            raise _Malformed("expected ',' or '}' in label set")
    if not name:
        raise _Malformed("invalid metric name")
    return name, labels, i + 1


def _parse_value_part(s: str, end: int) -> tuple[float, bool]:
    """Parse ``value [timestamp] [# exemplar]`` after the identity ``s[:end]``.

    Returns (value, plain) where ``plain`` means the line is exactly identity, one
    blank, value (what the plan path can verify with ``startswith``).
    """
    tokens = s[end:].split()
    if not tokens or tokens[0][0] == "#":
        raise _Malformed("missing value")
    try:
        value = _to_float(tokens[0])
    except ValueError:
        raise _Malformed("invalid value") from None
    if len(tokens) > 1 and tokens[1][0] != "#":
        try:
            _to_float(tokens[1])  # ms since epoch (0.0.4) or s (OpenMetrics); unused
        except ValueError:
            raise _Malformed("invalid timestamp") from None
        if len(tokens) > 2 and tokens[2][0] != "#":
            raise _Malformed("unexpected text after timestamp")
    return value, len(tokens) == 1 and s[end:end + 1] == " "


def _getter(indices: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    """itemgetter that always returns a tuple (itemgetter(i) alone returns the item)."""
    if len(indices) >= 2:
        return itemgetter(*indices)
    if len(indices) == 1:
        i = indices[0]
        return lambda seq: (seq[i],)
    return lambda seq: ()


# --------------------------------------------------------------------------- blocks


class _Block:
    """What a ``# TYPE`` line (or a TYPE-less sample) means for the samples after it."""

    __slots__ = ("name", "family", "type", "allowed", "keep", "base")

    def __init__(self, name: str, family: str, type_: str, allowed: dict[str, str], keep: bool) -> None:
        self.name = name  # the name as written on the TYPE line
        self.family = family  # the name we expose (counters: ..._total)
        self.type = type_
        self.allowed = allowed  # sample name on the page -> sample name we report
        self.keep = keep
        # Every sample of the block starts with this; used to skip blocks unparsed.
        # (All allowed names are name + suffix, except x_created for counter x_total.)
        self.base = name[:-5] if type_ == "counter" and name.endswith("_total") else name


_PLAIN, _TYPE, _HELP, _BAD = range(4)
_NOTHING: dict[str, str] = {}  # "allowed" when there is no current block


class _State:
    """Mutable state of one line-by-line parse (the general path)."""

    __slots__ = ("families", "malformed", "errors", "block", "fam",
                 "plannable", "skip_runs", "sample_lines", "kept_runs")

    def __init__(self, build_plan: bool) -> None:
        self.families: dict[str, MetricFamily] = {}
        self.malformed = 0
        self.errors: list[str] = []
        self.block: _Block | None = None
        self.fam: MetricFamily | None = None  # family of the current block if kept
        self.plannable = build_plan
        self.skip_runs: list[tuple[int, int, str]] = []  # (first line, count, base)
        self.sample_lines: list[tuple[int, str, bool]] = []  # (line index, identity, kept)
        self.kept_runs: list[tuple[MetricFamily, int]] = []  # (family, first kept sample)

    def enter(self, block: _Block | None) -> None:
        self.block = block
        if block is None or not block.keep:
            self.fam = None
            return
        fam = self.families.get(block.family)
        if fam is None:
            fam = self.families[block.family] = MetricFamily(block.family, block.type, [])
        self.fam = fam

    def bad(self, lineno: int, reason: str) -> None:
        self.malformed += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"line {lineno + 1}: {reason}")


# --------------------------------------------------------------------------- parser


def _prepare(page: bytes | str) -> str:
    if not isinstance(page, str):
        page = bytes(page).decode("utf-8", errors="replace")
    if "\r" in page:
        page = page.replace("\r\n", "\n")
    if page.endswith("\n"):
        page = page[:-1]  # so the last block's lines look like every other block's
    return page


class PageParser:
    """One instance per scrape target; holds the series-line cache (bounded size, e.g.
    10k entries, cleared when full) and the plan of the last page's shape."""

    def __init__(self, keep: Keep | None = None, max_cache: int = 10_000) -> None:
        self._keep = keep
        self._max_cache = max(1, int(max_cache))
        # identity text ("name{a=\"b\"}") -> (sample name, labels); see module docstring
        self._series: dict[str, tuple[str, dict[str, str]]] = {}
        # comment line -> (kind, payload); TYPE lines carry their _Block (and thereby
        # the memoized keep decision), so a known TYPE line costs one dict lookup
        self._comments: dict[str, tuple[int, object]] = {}
        self._untyped: dict[str, _Block] = {}
        self._plan: _Plan | None = None

    def parse(self, page: bytes | str) -> ParsedPage:
        plan = self._plan
        if plan is not None:
            result = plan.apply(page)
            if result is not None:
                return result
        result, self._plan = self._parse_text(_prepare(page), build_plan=True)
        return result

    # ----------------------------------------------------------------- general path

    def _parse_text(self, text: str, build_plan: bool) -> tuple[ParsedPage, _Plan | None]:
        """Line by line, skipping unwanted blocks; records a plan if asked to.

        The text alternates between comment lines (handled one by one) and runs of
        sample lines (up to the next line starting with "#", found with one
        ``str.find``). A run in a dropped block is only counted; a run in a kept block
        goes through the loop below, the hot path of a scrape whose page shape changed
        (or that carries timestamps/exemplars): rpartition, one cache lookup, float().
        Its locals mirror ``st.block``/``st.fam`` and are reloaded whenever a comment or
        a TYPE-less sample may have changed them.
        """
        st = _State(build_plan)
        series_get = self._series.get
        slow_line = self._slow_line
        sample_lines = st.sample_lines
        kept_runs = st.kept_runs
        seen = kept = 0
        n = len(text)
        pos = 0
        lineno = 0
        find = text.find
        while pos < n:
            if text[pos] == "#":
                eol = find("\n", pos)
                if eol < 0:
                    eol = n
                self._comment(st, text[pos:eol], lineno)
                lineno += 1
                pos = eol + 1
                continue
            end = find("\n#", pos)
            if end < 0:
                end = n
            run = text[pos:end]
            pos = end + 1
            block = st.block
            if block is not None and not block.keep:
                base = block.base
                count = run.count("\n") + 1
                if run.startswith(base) and run.count("\n" + base) == count - 1:
                    seen += count
                    st.skip_runs.append((lineno, count, base))
                    lineno += count
                    continue
            allowed = block.allowed if block is not None else _NOTHING
            fam = st.fam
            planning = st.plannable
            for line in run.split("\n"):
                key, _, value_text = line.rpartition(" ")
                entry = series_get(key)
                if entry is not None and "_" not in value_text:
                    try:
                        value = float(value_text)
                    except ValueError:
                        entry = None
                    plain = True
                else:
                    entry = None
                if entry is None:
                    found = slow_line(st, line, lineno)
                    if found is None:  # blank, comment or malformed line
                        lineno += 1
                        allowed = st.block.allowed if st.block is not None else _NOTHING
                        fam = st.fam
                        planning = st.plannable
                        continue
                    key, entry, value, plain = found
                name = entry[0]
                reported = allowed.get(name)
                if reported is None:  # not this block's: starts an untyped family
                    block = self._untyped_block(name)
                    st.enter(block)
                    allowed = block.allowed
                    fam = st.fam
                    reported = name
                seen += 1
                if fam is not None:
                    sample = Sample(reported, entry[1], value)
                    fam.samples.append(sample)
                    kept += 1
                    if planning and (not kept_runs or kept_runs[-1][0] is not fam):
                        kept_runs.append((fam, kept - 1))  # while planning, every kept sample is counted
                if planning:
                    if plain:
                        sample_lines.append((lineno, key, fam is not None))
                    else:
                        planning = st.plannable = False
                lineno += 1
        page = ParsedPage(st.families, seen, kept, st.malformed, st.errors)
        plan = _Plan.build(text, page, st) if st.plannable else None
        if plan is not None:
            page.memo = plan.memo
        return page, plan

    def _comment(self, st: _State, line: str, lineno: int) -> None:
        entry = self._comments.get(line)
        if entry is None:
            entry = self._parse_comment(line)
            if len(self._comments) >= self._max_cache:
                self._comments.clear()
            self._comments[line] = entry
        kind, payload = entry
        if kind == _TYPE:
            st.enter(payload)  # type: ignore[arg-type]
        elif kind == _HELP:
            # A HELP line for another name ends the current block (as in prometheus_client).
            if st.block is not None and st.block.name != payload:
                st.enter(None)
        elif kind == _BAD:
            st.bad(lineno, payload)  # type: ignore[arg-type]

    def _parse_comment(self, line: str) -> tuple[int, object]:
        m = _COMMENT_HEAD_RE.match(line)
        if m is None:
            return _PLAIN, None  # any other comment, "# EOF", "# UNIT ..."
        kind = m.group(1)
        i = m.end()
        if i >= len(line):
            return _BAD, f"{kind} line without metric name"
        if line[i] == '"':  # quoted UTF-8 name
            quoted = _QUOTED_RE.match(line, i)
            name = _unescape(quoted.group(1)) if quoted else ""
            tail = line[quoted.end():] if quoted else ""
            if tail and tail[0] not in _BLANKS:
                name = ""
        else:
            name, _, tail = line[i:].partition(" ")
            if "\t" in name:
                name, _, more = name.partition("\t")
                tail = more + " " + tail
            if not _NAME_RE.fullmatch(name):
                name = ""
        if not name:
            return _BAD, f"invalid metric name in {kind} line"
        if kind == "HELP":
            return _HELP, name
        type_word = tail.strip()
        if not type_word:
            return _BAD, "TYPE line without metric type"
        type_ = _TYPES.get(type_word)
        if type_ is None:
            return _BAD, "unknown metric type"
        return _TYPE, self._typed_block(name, type_)

    def _decide(self, family: str) -> bool:
        return True if self._keep is None else bool(self._keep(family))

    def _typed_block(self, name: str, type_: str) -> _Block:
        if type_ == "counter":
            base = name[:-6] if name.endswith("_total") else name
            family = base + "_total"
            allowed = {name: family, family: family, base + "_created": base + "_created"}
        else:
            family = name
            allowed = {name + s: name + s for s in _SUFFIXES.get(type_, ("",))}
        return _Block(name, family, type_, allowed, self._decide(family))

    def _untyped_block(self, name: str) -> _Block:
        block = self._untyped.get(name)
        if block is None:
            if len(self._untyped) >= self._max_cache:
                self._untyped.clear()
            block = self._untyped[name] = _Block(name, name, "untyped", {name: name}, self._decide(name))
        return block

    def _slow_line(self, st: _State, line: str, lineno: int
                   ) -> tuple[str, tuple[str, dict[str, str]], float, bool] | None:
        """A line whose ``rpartition`` prefix is not a cached identity (or whose value
        did not convert): blank, comment, new series, timestamp/exemplar, or malformed.
        Returns (identity text, cache entry, value, plain) for a sample, else None."""
        if not line or line.isspace():
            return None
        if line.lstrip()[0] == "#":  # an indented comment line
            self._comment(st, line, lineno)
            return None
        try:
            return self._identify(line)
        except _Malformed as exc:
            st.bad(lineno, str(exc))
            return None

    def _identify(self, line: str) -> tuple[str, tuple[str, dict[str, str]], float, bool]:
        """Slow path for a line whose ``rpartition`` prefix is not a cached identity:
        timestamps, exemplars, odd blanks, or simply a series not seen before."""
        series = self._series
        # Cheap guess at the identity end, so timestamped/exemplar lines still hit the cache.
        if "{" in line:
            cut = line.find("} ") + 1
        else:
            cut = line.find(" ")
        if cut > 0:
            entry = series.get(line[:cut])
            if entry is not None:
                try:
                    value, plain = _parse_value_part(line, cut)
                    return line[:cut], entry, value, plain
                except _Malformed:
                    pass  # e.g. "name {labels} 1" cached as "name": parse properly below
        name, labels, end = _parse_identity(line)
        key = line[:end]
        value, plain = _parse_value_part(line, end)
        entry = series.get(key)
        if entry is None:
            if len(series) >= self._max_cache:
                series.clear()
            entry = series[key] = (name, labels)
        return key, entry, value, plain


# --------------------------------------------------------------------------- plan


class _Plan:
    """The verified shape of the last page (see point 3 of the module docstring).

    Line kinds: *exact* lines (comments, blank and malformed lines) must reappear
    verbatim; *skip* lines (inside skipped blocks) must start with their block's base
    name; *sample* lines must start with their identity plus one blank, the remainder
    being the value. Given the same exact lines at the same positions and the same
    identities, the line-by-line parser would make exactly the same decisions, so only
    the values need converting.
    """

    __slots__ = ("kinds", "patterns", "n_samples", "n_lines", "exact", "exact_lines", "skip", "skip_bases",
                 "sample", "prefixes", "prefix_chars", "kept_mask", "families", "seen", "kept", "malformed", "errors",
                 "memo")
    # the plan for _planned.values (C): per line its kind and its text, as UTF-8
    kinds: bytes
    patterns: tuple[bytes, ...]
    n_samples: int
    # the plan for _Plan.values (Python, where the C module was not built)
    n_lines: int
    exact: Callable[[list[str]], tuple[str, ...]]
    exact_lines: tuple[str, ...]
    skip: Callable[[list[str]], tuple[str, ...]]
    skip_bases: tuple[str, ...]
    sample: Callable[[list[str]], tuple[str, ...]]
    prefixes: tuple[str, ...]
    prefix_chars: int
    kept_mask: tuple[bool, ...] | None
    # per kept family: name, type, its values' slice, memo, its samples' names and labels
    families: tuple[tuple[str, str, slice, dict[Hashable, Any], tuple[str, ...], tuple[dict[str, str], ...]], ...]
    seen: int
    kept: int
    malformed: int
    errors: tuple[str, ...]
    memo: dict[Hashable, Any]

    @classmethod
    def build(cls, text: str, page: ParsedPage, st: _State) -> _Plan | None:
        # Each family must be one contiguous run of the kept samples (one slice each).
        starts = {id(fam): first for fam, first in st.kept_runs}
        if len(starts) != len(st.kept_runs):
            return None
        lines = text.split("\n")
        plan = cls()
        sample_idx, keys, kept_mask = zip(*st.sample_lines) if st.sample_lines else ((), (), ())
        prefixes = tuple(map(str.__add__, keys, repeat(" ")))
        if _planned is not None:
            plan._build_for_c(lines, st.skip_runs, sample_idx, prefixes)
        else:
            plan._build_for_python(lines, st.skip_runs, sample_idx, prefixes)
        plan.n_samples = len(sample_idx)
        plan.kept_mask = None if all(kept_mask) else kept_mask
        families = []
        for fam in st.families.values():
            first = starts.get(id(fam), 0)
            fam.memo = {}
            samples = fam.samples
            families.append((fam.name, fam.type, slice(first, first + len(samples)), fam.memo,
                             tuple(map(attrgetter("name"), samples)), tuple(map(attrgetter("labels"), samples))))
        plan.families = tuple(families)
        plan.seen, plan.kept = page.samples_seen, page.samples_kept
        plan.memo = {}
        plan.malformed, plan.errors = st.malformed, tuple(st.errors)
        return plan

    def _build_for_c(self, lines: list[str], skip_runs: list[tuple[int, int, str]], sample_idx: tuple[int, ...],
                     prefixes: tuple[str, ...]) -> None:
        def utf8(line: str) -> bytes:
            return line.encode("utf-8", "surrogatepass")

        kinds = bytearray(len(lines))  # 0: the line itself must reappear
        patterns = list(map(utf8, lines))
        for first, count, base in skip_runs:
            kinds[first:first + count] = b"\x01" * count  # 1: starts with the base name
            patterns[first:first + count] = [utf8(base)] * count
        for i, prefix in zip(sample_idx, prefixes):
            kinds[i] = 2  # 2: the identity and a blank, then the value
            patterns[i] = utf8(prefix)
        self.kinds, self.patterns = bytes(kinds), tuple(patterns)

    def _build_for_python(self, lines: list[str], skip_runs: list[tuple[int, int, str]],
                          sample_idx: tuple[int, ...], prefixes: tuple[str, ...]) -> None:
        self.n_lines = len(lines)
        exact = bytearray(b"\x01") * len(lines)
        skip_idx: list[int] = []
        skip_bases: list[str] = []
        for first, count, base in skip_runs:
            skip_idx.extend(range(first, first + count))
            skip_bases.extend([base] * count)
            exact[first:first + count] = bytes(count)
        for i in sample_idx:
            exact[i] = 0
        self.exact = _getter(list(compress(range(len(lines)), exact)))
        self.exact_lines = self.exact(lines)
        self.skip = _getter(skip_idx)
        self.skip_bases = tuple(skip_bases)
        self.sample = _getter(list(sample_idx))
        self.prefixes = prefixes
        self.prefix_chars = sum(map(len, prefixes))

    def apply(self, page: bytes | str) -> ParsedPage | None:
        """The page parsed by the plan, or None if the page does not have its shape."""
        if _planned is not None:
            data = page if isinstance(page, bytes) else (
                page.encode("utf-8", "surrogatepass") if isinstance(page, str) else bytes(page))
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n")  # as _prepare does
            floats = _planned.values(data, self.kinds, self.patterns, self.n_samples)
        else:
            floats = self.values(_prepare(page))
        if floats is None:
            return None
        if self.kept_mask is not None:
            floats = list(compress(floats, self.kept_mask))
        planned = MetricFamily.planned
        families = {name: planned(name, type_, names, labels, floats[span], memo)
                    for name, type_, span, memo, names, labels in self.families}
        return ParsedPage(families, self.seen, self.kept, self.malformed, list(self.errors), self.memo)

    def values(self, text: str) -> list[float] | None:
        """The sample lines' values (text as :func:`_prepare` leaves it), or None if the page
        does not have the plan's shape: what ``_planned.values`` does, in Python."""
        lines = text.split("\n")
        if len(lines) != self.n_lines or self.exact(lines) != self.exact_lines:
            return None
        if self.skip_bases and not all(map(str.startswith, self.skip(lines), self.skip_bases)):
            return None
        found = self.sample(lines)
        # removeprefix leaves a line unchanged when its identity prefix is missing, so
        # every miss makes the values longer by that prefix's length: one comparison of
        # total lengths verifies all identities at C speed.
        values = list(map(str.removeprefix, found, self.prefixes))
        joined = "".join(values)
        if len(joined) + self.prefix_chars != sum(map(len, found)) or "_" in joined:
            return None
        try:
            return list(map(float, values))
        except ValueError:
            return None
