"""Metrics pages in Prometheus' protobuf exposition (``io.prometheus.client.MetricFamily``,
length-delimited), the only format that carries native histograms to Prometheus 2.x (scraped with
``--enable-feature=native-histograms``). Encoded here field by field (no protobuf library), for the
few message types a test page needs: gauges, classic histograms and native histograms."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

PROTOBUF_EXPOSITION = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
GAUGE, HISTOGRAM = 1, 4  # io.prometheus.client.MetricType


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _uint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _message(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _labels(labels: Mapping[str, str]) -> bytes:
    return b"".join(_message(1, _message(1, k.encode()) + _message(2, v.encode())) for k, v in labels.items())


def gauge(labels: Mapping[str, str], value: float) -> bytes:
    """A ``Metric`` holding a gauge."""
    return _labels(labels) + _message(2, _double(1, value))


def classic_histogram(labels: Mapping[str, str], count: int, total: float,
                      buckets: Sequence[tuple[float, int]]) -> bytes:
    """A ``Metric`` holding a classic histogram: cumulative counts by upper bound (+Inf implied)."""
    body = _uint(1, count) + _double(2, total)
    body += b"".join(_message(3, _uint(1, cumulative) + _double(2, bound)) for bound, cumulative in buckets)
    return _labels(labels) + _message(7, body)


def native_histogram(labels: Mapping[str, str], count: int, total: float, schema: int,
                     spans: Sequence[tuple[int, int]], counts: Sequence[int], zero_threshold: float = 1e-128) -> bytes:
    """A ``Metric`` holding a native (sparse) histogram: positive buckets in ``spans`` (offset,
    length) with these absolute counts (sent as deltas, as the format wants)."""
    body = _uint(1, count) + _double(2, total) + _uint(5, _zigzag(schema)) + _double(6, zero_threshold) + _uint(7, 0)
    body += b"".join(_message(12, _uint(1, _zigzag(offset)) + _uint(2, length)) for offset, length in spans)
    deltas = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    body += _message(13, b"".join(_varint(_zigzag(d)) for d in deltas))
    return _labels(labels) + _message(7, body)


def family(name: str, kind: int, metrics: Sequence[bytes]) -> bytes:
    """A ``MetricFamily`` of these ``Metric`` messages."""
    return _message(1, name.encode()) + _uint(3, kind) + b"".join(_message(4, m) for m in metrics)


def page(families: Sequence[bytes]) -> bytes:
    """The delimited page: each family prefixed by its length."""
    return b"".join(_varint(len(f)) + f for f in families)
