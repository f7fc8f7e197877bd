"""Exact downsampling of cumulative snapshots, and windows read at the coarsest level that answers them.

Why this is exact. Prometheus' ``increase(x[w])`` (:func:`app.core.quantiles._extrapolated_rate`)
reads, of the samples inside the closed window, only: the first and the last sample (values
and timestamps), how many samples there are, and the value before every drop (a counter
reset). Those compose: for consecutive runs of samples A then B, the first of A, the last of
B, ``n_A + n_B``, and the resets of A, then of the step from A's last sample to B's first,
then of B, are what the whole run gives. So a level row (:class:`app.store.models.SampleLevel`)
keeps exactly that per series per interval (5 min, 1 h), and any window that is a union of
whole intervals (plus raw samples at its edges) is answered with the same float operations,
in the same order, as the raw samples - bit for bit, resets and engine restarts included.
Gauges keep the sum and maximum of their values too (the window's mean is then the same
value up to float summation order).

Which windows are exact (docs/operations.md#which-windows-are-exact states this for users):

* every window whose edges lie within the raw period (``raw_retention``): its interior is
  read from the coarsest level whose intervals fit, its edges from the next finer level
  and finally from raw samples (:func:`plan`);
* a window with an edge older than the raw period, when that edge falls on a 5-minute
  boundary (or on a scrape's own timestamp, or in a gap between samples at interval
  boundaries): the edge interval is then whole, or contributes exactly its first/last sample;
* otherwise the 5-minute interval that straddles the old edge is left out: the answer is
  Prometheus' over the samples of the whole 5-minute intervals inside the window,
  extrapolated to the window's real edges by Prometheus' own rule. The error is at most
  the increase of the series within the one partial interval at each old edge (under 5
  minutes of the window on each side; never events from outside the window).
  :attr:`Selection.exact` says when this happened.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.core.quantiles import WindowHistogram, extrapolate, extrapolate_all, to_millis
from app.vectors import all_le

#: Interval lengths of the downsampled levels, in seconds, finest first.
LEVELS: tuple[int, ...] = (300, 3600)
#: An interval is downsampled this long after it ends, so late-flushed scrapes are in it.
GRACE_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of consecutive raw samples of one series: one raw sample, or one level row.

    ``first``/``last`` are value vectors (a histogram's counts, then ``_sum`` and ``_count``;
    a scalar's value); ``resets`` are (component, value before the drop) inside the run, in
    time order; ``total``/``peak`` the sum and maximum of a scalar's values."""

    first_ms: int
    first: tuple[float, ...]
    last_ms: int
    last: tuple[float, ...]
    n: int
    resets: tuple[tuple[int, float], ...] = ()
    total: float = 0.0
    peak: float = -math.inf


def raw_chunk(ms: int, vector: tuple[float, ...]) -> Chunk:
    v0 = vector[0]
    return Chunk(ms, vector, ms, vector, 1, (), v0, v0)


def _first_only(c: Chunk) -> Chunk:
    return raw_chunk(c.first_ms, c.first)


def _last_only(c: Chunk) -> Chunk:
    return raw_chunk(c.last_ms, c.last)


class Run:
    """Consecutive chunks joined one at a time, in time order: the writer's accumulator of a
    series' current interval (:class:`app.store.writer.SampleWriter`), and what
    :func:`combine` folds a list with. Mutable so the writer's per-sample step allocates no
    chunk; :meth:`append` of a raw sample is exactly :meth:`add` of its :func:`raw_chunk`."""

    __slots__ = ("first_ms", "first", "last_ms", "last", "n", "resets", "total", "peak")

    def __init__(self) -> None:
        self.first_ms = self.last_ms = self.n = 0
        self.first: tuple[float, ...] = ()
        self.last: tuple[float, ...] = ()
        self.resets: list[tuple[int, float]] = []
        self.total, self.peak = 0.0, -math.inf

    def _drops(self, first: tuple[float, ...]) -> None:
        """The step from the run's last sample to the next one's ``first`` when some
        component drops: each drop is a reset of it (value before the drop), as Prometheus
        reads it. Callers test ``all_le(self.last, first)`` first: it is true for almost
        every step, and the writer takes one per sample."""
        self.resets.extend((i, a) for i, (a, b) in enumerate(zip(self.last, first)) if b < a)

    def add(self, c: Chunk) -> None:
        if not self.n:
            self.first_ms, self.first = c.first_ms, c.first
        elif not all_le(self.last, c.first):
            self._drops(c.first)
        self.resets.extend(c.resets)
        self.last_ms, self.last = c.last_ms, c.last
        self.n += c.n
        self.total += c.total
        if c.peak > self.peak:
            self.peak = c.peak

    def append(self, ms: int, vector: tuple[float, ...]) -> None:
        """``add(raw_chunk(ms, vector))`` without building the chunk."""
        if not self.n:
            self.first_ms, self.first = ms, vector
        elif not all_le(self.last, vector):
            self._drops(vector)
        self.last_ms, self.last = ms, vector
        self.n += 1
        v0 = vector[0]
        self.total += v0
        if v0 > self.peak:
            self.peak = v0

    def chunk(self) -> Chunk:
        return Chunk(self.first_ms, self.first, self.last_ms, self.last, self.n, tuple(self.resets), self.total,
                     self.peak)


def combine(chunks: Sequence[Chunk]) -> Chunk | None:
    """Consecutive chunks as one: the level row of their union. Same arithmetic order as
    :func:`app.core.quantiles._extrapolated_rate` walking the raw samples."""
    if not chunks:
        return None
    run = Run()
    for c in chunks:
        run.add(c)
    return run.chunk()


def chunks_from_samples(samples: Iterable[tuple[float, tuple[float, ...]]]) -> list[Chunk]:
    """Raw samples (seconds, vector), time-ordered, as chunks on whole milliseconds; of two
    samples in one millisecond the first is kept (Prometheus' TSDB keeps one)."""
    out: list[Chunk] = []
    last = None
    for ts, vector in samples:
        ms = to_millis(ts)
        if ms == last:
            continue
        out.append(raw_chunk(ms, vector))
        last = ms
    return out


def downsample(chunks: Sequence[Chunk], level: int) -> dict[int, Chunk]:
    """Time-ordered chunks of one series grouped into intervals of ``level`` seconds: the
    level row (a combined chunk) per interval start in milliseconds."""
    step = level * 1000
    out: dict[int, Chunk] = {}
    group: list[Chunk] = []
    bucket = None
    for c in chunks:
        b = c.first_ms // step * step
        if b != bucket and group:
            out[bucket] = combine(group)  # type: ignore[index,assignment]
            group = []
        bucket = b
        group.append(c)
    if group:
        out[bucket] = combine(group)  # type: ignore[index,assignment]
    return out


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Segment:
    """Part of a read plan: raw samples (``level == 0``) with ``lo <= ms < hi`` (``<= hi`` when
    ``closed``), or the rows of a level whose interval start is in that range."""

    level: int
    lo_ms: int
    hi_ms: int
    closed: bool


def plan(start: float, end: float, raw_since: float | None, done: dict[int, float],
         max_level: int | None = None) -> list[Segment]:
    """Which rows answer the closed window ``[start, end]``: whole intervals of the coarsest
    level that fits inside, the rest at the next finer level, the edges from raw samples.
    ``done``: level -> end of its complete intervals; ``raw_since``: raw samples exist from
    there on (None: all of them); ``max_level``: coarsest level allowed (a series of windows
    whose edges are all multiples of it)."""
    usable = [(lv * 1000, to_millis(done[lv])) for lv in sorted(LEVELS, reverse=True)
              if lv in done and (max_level is None or lv <= max_level)]
    finest = min((lv for lv in LEVELS if lv in done), default=None)
    raw_ms = None if raw_since is None else to_millis(raw_since)

    def raw_part(s: int, e: int, closed: bool) -> list[Segment]:
        if raw_ms is None or s >= raw_ms or finest is None:
            return [Segment(0, s, e, closed)]
        step = finest * 1000
        boundary = -(-raw_ms // step) * step  # raw is complete from here on, on the finest grid
        out = [Segment(finest, s // step * step, min(e, boundary), closed and e < boundary)]
        if e > boundary or (closed and e == boundary):
            out.append(Segment(0, boundary, e, closed))
        return out

    def cover(s: int, e: int, closed: bool, i: int) -> list[Segment]:
        if i == len(usable):
            return raw_part(s, e, closed)
        step, complete = usable[i]
        a = -(-s // step) * step
        b = min(e // step * step, complete // step * step)
        if a < b:
            return [*cover(s, a, False, i + 1), Segment(step // 1000, a, b, False), *cover(b, e, closed, i + 1)]
        return cover(s, e, closed, i + 1)

    s_ms, e_ms = to_millis(start), to_millis(end)
    return [seg for seg in cover(s_ms, e_ms, True, 0) if seg.hi_ms > seg.lo_ms or seg.closed]


@dataclass(slots=True)
class Selection:
    """What the chunks of one series say about a window; ``exact`` is False when an
    interval straddling an edge older than the raw period had to be left out."""

    chunk: Chunk | None
    exact: bool


class Timeline:
    """The chunks of one series, time-ordered and disjoint, loaded once for many windows."""

    __slots__ = ("chunks", "_lasts")

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self._lasts = [c.last_ms for c in chunks]

    def select(self, start_ms: int, end_ms: int) -> Selection:
        picked: list[Chunk] = []
        exact = True
        for c in self.chunks[bisect.bisect_left(self._lasts, start_ms):]:
            if c.first_ms > end_ms:
                break
            if c.first_ms >= start_ms and c.last_ms <= end_ms:
                picked.append(c)
            elif c.first_ms == end_ms:
                picked.append(_first_only(c))
            elif c.last_ms == start_ms:
                picked.append(_last_only(c))
            else:
                exact = False
        return Selection(combine(picked), exact)


def histogram(bounds: tuple[float, ...], chunk: Chunk | None, start_ms: int, end_ms: int) -> WindowHistogram | None:
    """``increase()`` of every bucket, ``_sum`` and ``_count`` over the window from the
    combined chunk of the samples inside it (None with fewer than two samples)."""
    if chunk is None or chunk.n < 2:
        return None
    result = list(map(operator.sub, chunk.last, chunk.first))
    for i, v in chunk.resets:
        result[i] += v
    values = extrapolate_all(result, chunk.first, chunk.first_ms, chunk.last_ms, chunk.n, start_ms, end_ms,
                             is_counter=True, is_rate=False)
    nb = len(bounds)
    return WindowHistogram(bounds, tuple(values[:nb]), values[nb], values[nb + 1])


def rate(chunk: Chunk | None, start_ms: int, end_ms: int) -> float | None:
    """``rate()`` of a counter over the window from its combined chunk."""
    if chunk is None or chunk.n < 2:
        return None
    result = chunk.last[0] - chunk.first[0]
    for _, v in chunk.resets:
        result += v
    return extrapolate(result, chunk.first[0], chunk.first_ms, chunk.last_ms, chunk.n, start_ms, end_ms,
                       is_counter=True, is_rate=True)
