"""Binary row encoding of samples (``scrape_samples.samples``, ``sample_levels``).

Cumulative bucket counts of a real engine are whole numbers below 2**32, so they are
stored as little-endian uint32 (4 bytes a count) behind a one-byte format tag; anything
else (a fractional or negative count, NaN, more than 2**32) falls back to float64 (8
bytes, exact): about half the bytes of comma-joined ``repr`` text
(docs/benchmarks.md#query-and-storage), and ``struct`` packs in C, so encoding costs less
CPU at ingest than formatting text.

A scrape's samples are one row (:func:`encode_scrape`): each series' entry behind its id,
kind and length. Twenty rows a scrape (one per histogram and scalar series) cost
PostgreSQL a 24-byte tuple header, alignment and a primary-key entry each, more than
the samples themselves (docs/operations.md#encoding). The length is a uint16; a histogram
entry of 64 KiB or more (16,380 uint32 counts, 8,190 float64 ones) takes a kind of its own
whose uint32 length follows the head, so every row written before that kind existed reads
back as it was.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container, Iterator, Sequence
from functools import lru_cache

from app.vectors import encode_float_counts

UINT32 = b"I"
FLOAT64 = b"d"
_PAIR = struct.Struct("<dd")
_ONE = struct.Struct("<d")
_RESET = struct.Struct("<Id")
_ENTRY = struct.Struct("<IBH")  # series id, kind, payload bytes (0 for LONG_HISTOGRAM_ENTRY)
_SCALAR_ENTRY = struct.Struct("<IBHd")
_LONG_SIZE = struct.Struct("<I")  # LONG_HISTOGRAM_ENTRY: payload bytes, after the head
HISTOGRAM_ENTRY, SCALAR_ENTRY, LONG_HISTOGRAM_ENTRY = 0, 1, 2
_SHORT = 1 << 16  # payloads from this size on are LONG_HISTOGRAM_ENTRY


@lru_cache(maxsize=256)
def _codec(tag: bytes, n: int) -> struct.Struct:
    return struct.Struct(f"<{n}{tag.decode()}")


def encode_counts(counts: Sequence[float]) -> bytes:
    """Counts as uint32 when every one is a whole number in range, float64 otherwise.

    ``float.is_integer`` over the counts (C) decides, and ``struct`` refuses what does not
    fit (negative or >= 2**32). Floats become ints with ``float.__trunc__`` (exact for a
    whole number, and cheaper than ``int``, whose call goes through the type's constructor).
    Where ``app/_vectors.c`` is built, counts that are all floats (what the adapters hand) are
    encoded there."""
    if encode_float_counts is not None:
        encoded = encode_float_counts(counts)
        if encoded is not None:
            return encoded
    n = len(counts)
    to_int: Callable[[float], int]
    try:
        whole, to_int = all(map(float.is_integer, counts)), float.__trunc__
    except TypeError:  # ints among the floats: compare each with its int()
        whole, to_int = _whole_mixed(counts), int
    if whole:
        try:
            return UINT32 + _codec(UINT32, n).pack(*map(to_int, counts))
        except struct.error:
            pass
    return FLOAT64 + _codec(FLOAT64, n).pack(*counts)


def _whole_mixed(counts: Sequence[float]) -> bool:
    try:
        return tuple(map(int, counts)) == tuple(counts)
    except (ValueError, OverflowError):
        return False


def decode_counts(blob: bytes) -> tuple[float, ...]:
    """The counts of :func:`encode_counts` (uint32 ones come back as ints: same values)."""
    if not blob:
        return ()
    tag = blob[:1]
    width = 4 if tag == UINT32 else 8
    if tag not in (UINT32, FLOAT64):
        raise ValueError(f"unknown bucket count encoding {tag!r}")
    return _codec(tag, (len(blob) - 1) // width).unpack_from(blob, 1)


def encode_snapshot(counts: Sequence[float], total: float, count: float) -> bytes:
    """A histogram snapshot in one blob: counts, then ``_sum`` and ``_count`` as float64."""
    return snapshot_blob(encode_counts(counts), total, count)


def snapshot_blob(counts: bytes, total: float, count: float) -> bytes:
    """:func:`encode_snapshot` of counts already encoded (the writer has them for the raw row)."""
    return counts + _PAIR.pack(total, count)


def decode_snapshot(blob: bytes) -> tuple[float, ...]:
    """The vector ``counts + (sum, count)`` of :func:`encode_snapshot`."""
    return decode_counts(blob[:-16]) + _PAIR.unpack_from(blob, len(blob) - 16)


def encode_value(value: float) -> bytes:
    return _ONE.pack(value)


def decode_value(blob: bytes) -> tuple[float, ...]:
    return _ONE.unpack(blob)


def encode_resets(resets: Sequence[tuple[int, float]]) -> bytes | None:
    """Counter resets inside an interval, in time order: (component, value before the drop)."""
    return b"".join(_RESET.pack(i, v) for i, v in resets) if resets else None


def decode_resets(blob: bytes | None) -> tuple[tuple[int, float], ...]:
    if not blob:
        return ()
    return tuple(_RESET.iter_unpack(blob))


def encode_scrape(histograms: Sequence[tuple[int, bytes]], scalars: Sequence[tuple[int, float]]) -> bytes:
    """One scrape's samples: ``histograms`` as (series id, :func:`snapshot_blob`),
    ``scalars`` as (series id, value)."""
    parts = []
    for sid, blob in histograms:
        if len(blob) < _SHORT:
            parts.append(_ENTRY.pack(sid, HISTOGRAM_ENTRY, len(blob)))
        else:  # struct refuses a payload of 4 GiB or more: no database stores such a row
            parts.append(_ENTRY.pack(sid, LONG_HISTOGRAM_ENTRY, 0) + _LONG_SIZE.pack(len(blob)))
        parts.append(blob)
    parts.extend(_SCALAR_ENTRY.pack(sid, SCALAR_ENTRY, 8, value) for sid, value in scalars)
    return b"".join(parts)


def decode_scrape(blob: bytes, wanted: Container[int]) -> Iterator[tuple[int, tuple[float, ...]]]:
    """(series id, vector) of the entries of :func:`encode_scrape` whose series is
    ``wanted``, in stored order: a histogram's vector is its counts, ``_sum`` and
    ``_count`` (:func:`decode_snapshot`), a scalar's its value."""
    at, end, entry, head = 0, len(blob), _ENTRY, _ENTRY.size
    while at < end:
        sid, kind, size = entry.unpack_from(blob, at)
        at += head
        if kind == LONG_HISTOGRAM_ENTRY:
            (size,) = _LONG_SIZE.unpack_from(blob, at)
            at += _LONG_SIZE.size
            kind = HISTOGRAM_ENTRY
        if sid in wanted:
            if kind == SCALAR_ENTRY:
                yield sid, _ONE.unpack_from(blob, at)
            elif kind == HISTOGRAM_ENTRY:
                yield sid, decode_snapshot(blob[at:at + size])
            else:
                raise ValueError(f"unknown sample entry kind {kind}")
        at += size
