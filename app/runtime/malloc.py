"""Memory the process freed goes back to the system: the C allocator's settings and a full
collection of cyclic garbage.

Why: under load RSS kept growing after warm-up. glibc raises its mmap threshold to the size
of every large block freed, so short-lived buffers (a 5 MB ``/metrics`` body, a round's query
results) end up in the arenas of the 40+ threads, whose holes are never given back; and with
the service's collector thresholds (``tune_collector``) a full collection is so rare that
objects in reference cycles pile up in the oldest generation.

:func:`configure` fixes the threshold (``M_MMAP_THRESHOLD``; setting it turns the dynamic
raise off), so a block of 256 KiB or more is always mapped and always returned on free.
:func:`trim` (``malloc_trim``) returns the free whole pages inside the arenas; both are no-ops
where the C library is not glibc. :func:`release`, after each summary round, collects and
then trims. A collection of everything holds the interpreter for most of a second at 1,000
targets, so what survives a collection is frozen (``gc.freeze``: left out of later
collections, still freed when its last reference goes) and the next collection scans only
what was made since; every :data:`FULL_EVERY`-th release unfreezes first, so cycles among the
frozen are collected too, at most that many releases late. Effect on RSS:
docs/operations.md#memory.
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
