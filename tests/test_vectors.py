"""app/_vectors.c answers exactly what its Python twins in app/vectors.py and
app/store/encoding.py answer, on every kind of number a page can hold."""

from __future__ import annotations

import math
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import vectors
from app.store import encoding
from tests.support import python_twins

native = vectors._vectors
needs_native = pytest.mark.skipif(native is None and (os.environ.get("CI") != "true" or python_twins.forced()),
                                  reason="app/_vectors.c was not built (no C compiler at install), "
                                         f"or is hidden ({python_twins.ENV})")

EDGES = [0.0, -0.0, 1.0, 0.5, -1.0, 2.0**32 - 1, 2.0**32, 2.0**53, 1e300, math.inf, -math.inf, math.nan]
NUMBERS = st.one_of(
    st.sampled_from(EDGES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**32 + 5).map(float),  # whole counts, around the uint32 limit
    st.integers(-(2**40), 2**40),  # ints, as an adapter without a plan may hand
    st.booleans(),
)
VECTORS = st.lists(NUMBERS, max_size=40).flatmap(lambda v: st.sampled_from([v, tuple(v)]))


def _same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_the_c_module_is_built_wherever_the_test_suite_runs_in_ci() -> None:
    if os.environ.get("CI") == "true" and not python_twins.forced():
        assert native is not None, "app/_vectors.c was not built"


@needs_native
@settings(max_examples=500, deadline=None)
@given(VECTORS, VECTORS)
def test_all_le_is_the_python_comparison(a, b) -> None:
    assert native.all_le(a, b) is vectors.all_le_python(a, b)
    assert native.all_le(a, a) is vectors.all_le_python(a, a)  # NaN is not <= itself


@needs_native
@settings(max_examples=500, deadline=None)
@given(VECTORS)
def test_any_decrease_is_the_python_comparison(c) -> None:
    assert native.any_decrease(c) is vectors.any_decrease_python(c)
    ordered = sorted(x for x in c if not (isinstance(x, float) and math.isnan(x)))
    assert native.any_decrease(ordered) is False


@needs_native
@pytest.mark.parametrize(("a", "b", "expected"), [
    ((1.0, 2.0, 3.0), (1.0, 2.5, 3.0), True),
    ((1.0, 2.0, 3.0), (1.0, 1.5, 3.0), False),
    ((1.0, 2.0), (1.0, 2.0, 0.0), True),  # the shorter length decides, as zip does
    ((math.nan,), (math.nan,), False),
    ((), (), True),
    ((1, 2.0), (1.0, 2), True),  # ints and floats compare by value
])
def test_all_le_examples(a, b, expected: bool) -> None:
    assert native.all_le(a, b) is expected


@needs_native
def test_all_le_and_any_decrease_refuse_what_python_refuses() -> None:
    with pytest.raises(TypeError):
        native.all_le((1.0, "a"), (2.0, 1.0))
    with pytest.raises(TypeError):
        vectors.all_le_python((1.0, "a"), (2.0, 1.0))
    with pytest.raises(TypeError):
        native.any_decrease(("b", 1.0))
    with pytest.raises(TypeError):
        native.all_le(1.0, (1.0,))


def _python_encoding(counts) -> bytes:
    saved = encoding.encode_float_counts
    encoding.encode_float_counts = None
    try:
        return encoding.encode_counts(counts)
    finally:
        encoding.encode_float_counts = saved


@needs_native
@settings(max_examples=500, deadline=None)
@given(VECTORS)
def test_encode_counts_gives_the_python_bytes(counts) -> None:
    expected = _python_encoding(counts)
    got = native.encode_counts(counts)
    if all(type(x) is float for x in counts):
        assert got == expected
    else:
        assert got is None  # ints or bools among them: the caller encodes in Python
    assert encoding.encode_counts(counts) == expected
    assert _same_vector(encoding.decode_counts(expected), counts)


def _same_vector(decoded, counts) -> bool:
    return len(decoded) == len(counts) and all(map(_same, map(float, decoded), map(float, counts)))


@needs_native
def test_encode_counts_examples() -> None:
    assert native.encode_counts((0.0, -0.0, 7.0, 2.0**32 - 1)) == b"I" + struct.pack("<4I", 0, 0, 7, 2**32 - 1)
    for odd in (2.0**32, -1.0, 0.5, math.inf, math.nan):  # one count outside uint32: all float64
        counts = (1.0, odd)
        assert native.encode_counts(counts) == b"d" + struct.pack("<2d", *counts)
    assert native.encode_counts(()) == b"I"
    assert native.encode_counts([3.0]) == b"I" + struct.pack("<I", 3)
