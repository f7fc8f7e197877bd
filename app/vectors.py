"""Element-wise checks and the count encoding of the number vectors a scrape carries, in C
where the package was built with a compiler (``app/_vectors.c``), else in Python here.

Used once per histogram series and scrape: :func:`any_decrease` by the adapters (bucket
counts that go down are reported), :func:`all_le` by the writer's 5-minute level (a number
below the series' previous one is a counter reset), :data:`encode_float_counts` for the
stored row (:func:`app.store.encoding.encode_counts`). In Python each is a loop of one call per
number; without the C extensions the whole ingest path takes 1.5-1.8 times the CPU per scrape
(``bench/ingest.py``, docs/benchmarks.md#ingest). Both give the same answers
(tests/test_vectors.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import gt, le
from types import ModuleType

_vectors: ModuleType | None
try:
    import app._vectors as _vectors
except ImportError:  # installed without a C compiler
    _vectors = None


def all_le_python(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a[i] <= b[i]`` for every ``i`` below the shorter length."""
    return all(map(le, a, b))


def any_decrease_python(c: Sequence[float]) -> bool:
    """``c[i] > c[i + 1]`` for some ``i``."""
    return any(map(gt, c, c[1:]))


all_le: Callable[[Sequence[float], Sequence[float]], bool] = (
    _vectors.all_le if _vectors is not None else all_le_python)
any_decrease: Callable[[Sequence[float]], bool] = (
    _vectors.any_decrease if _vectors is not None else any_decrease_python)
#: the stored encoding of counts that are all floats (b"I" + uint32 or b"d" + float64, as
#: :func:`app.store.encoding.encode_counts` gives), else None; None itself without the C module
encode_float_counts: Callable[[Sequence[float]], bytes | None] | None = (
    _vectors.encode_counts if _vectors is not None else None)
