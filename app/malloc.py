"""Memory the process freed goes back to the system: the C allocator's settings and a full
collection of cyclic garbage.

Why: at 1,000 targets under 50 API clients (``bench/load.py``) RSS kept growing after warm-up,
for two reasons. glibc's heap: with ``tracemalloc`` on, Python's traced memory stayed at
630-632 MB while glibc's own figures (``mallinfo2``) showed 1.74 GB of heap arenas, 0.95 GB of
it free and kept. Large short-lived buffers (a 5 MB ``/metrics`` body, a round's query
results) are the cause: glibc serves a block above its mmap threshold with ``mmap`` and unmaps
it on free, but every such free raises the threshold to that block's size (up to 32 MB), so
afterwards the same buffers come from the arenas of the 40+ threads, and the holes they leave
between long-lived blocks are never given back. And cyclic garbage: with the service's
collector thresholds (``tune_collector``: 50,000, 20, 100) a full collection comes only every
~100 million allocations, so objects in reference cycles that were alive when the young
generations were collected wait in the oldest one (the tracked objects went from 0.88 to 1.43
million in 9 minutes and RSS grew 250 MB while glibc's heap stayed at about 270 MB).

:func:`configure` fixes the threshold (``M_MMAP_THRESHOLD``; setting it turns the dynamic
raise off), so a block of 256 KiB or more is always mapped and always returned on free.
:func:`trim` (``malloc_trim``) returns the free whole pages inside the arenas; both are no-ops
where the C library is not glibc. :func:`release`, after each summary round, runs a full
collection and then trims. A collection of everything held the interpreter for 0.5-0.7 s at
1,000 targets (README, "The built-in store under load"), so what survives a collection is
frozen (``gc.freeze``: left out of later collections, still freed when its last reference
goes) and the next collection scans only what was made since; every :data:`FULL_EVERY`-th
release unfreezes first, so cycles among the frozen are collected too, at most that many
releases late.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
MMAP_THRESHOLD = 256 * 1024  # bytes: blocks from here up are mapped on their own
FULL_EVERY = 40  # releases between collections of everything: 10 minutes at the 15 s summary interval


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim, macOS no mallopt)
        return None
    return libc


_LIBC = _glibc()


def configure() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD`; False where that is not possible."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    if not ok:
        log.warning("mallopt(M_MMAP_THRESHOLD) was refused; freed memory may stay with the process")
    return ok


def trim() -> bool:
    """Give the arenas' free whole pages back to the system; True if any were."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False


_releases = 0


def release() -> None:
    """Collect the cyclic garbage made since the last release (of everything, every
    :data:`FULL_EVERY`-th call, the first included), freeze what survived, then give the freed
    pages back."""
    global _releases
    if _releases % FULL_EVERY == 0:
        gc.unfreeze()
    _releases += 1
    gc.collect()
    gc.freeze()
    trim()
