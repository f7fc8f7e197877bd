"""app.runtime.malloc: memory freed by large short-lived buffers goes back to the system.

Each case runs in a fresh interpreter: the allocator's state is per process. The buffers
are 1 MB ``bytearray``s allocated after a 16 MB one was freed (as a ``/metrics`` body or a
round's result does: glibc then raises its mmap threshold to that size and serves 1 MB from the heap),
each followed by a 2 kB block that stays (the long-lived state between them), so the freed
buffers are holes that trimming the heap's top cannot give back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.runtime import malloc

pytestmark = pytest.mark.skipif(malloc._LIBC is None, reason="the C library is not glibc")

SCRIPT = """
import sys
from app.runtime import malloc

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

if sys.argv[1] == "configure":
    assert malloc.configure()
big = bytearray(16 << 20)
del big  # freed: without configure() the mmap threshold is now 16 MB
before = rss_mb()
kept, buffers = [], []
for i in range(200):
    buffer = bytearray(1 << 20)
    buffer[::4096] = b"x" * 256  # every page resident, with no 1 MB temporary
    buffers.append(buffer)
    kept.append(bytes(2048 + i))  # above pymalloc's 512 bytes: from the same heap, between the buffers
peak = rss_mb()
del buffers
freed = rss_mb()
trimmed = malloc.trim()
print(before, peak, freed, rss_mb(), trimmed)
"""


def run(mode: str) -> tuple[float, float, float, float]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True).stdout
    before, peak, freed, after, _ = out.split()
    return float(before), float(peak), float(freed), float(after)


def test_without_settings_freed_buffers_stay_until_trimmed() -> None:
    before, peak, freed, after = run("default")
    assert peak - before >= 190  # 200 MB of buffers were resident
    assert freed - before >= 150  # freed, yet still held by the process
    assert after - before <= 30  # malloc_trim gave the free pages back


def test_a_fixed_mmap_threshold_returns_large_buffers_on_free() -> None:
    before, peak, freed, after = run("configure")
    assert peak - before >= 190
    assert freed - before <= 30  # mapped on their own, unmapped on free: no trim needed


def test_release_collects_cycles_that_died_in_the_oldest_generation() -> None:
    """Objects in cycles that were alive when the young generations were collected reach the
    oldest one; with the service's thresholds they would wait there for a rare full
    collection. release() collects them."""
    import gc

    from app.scrape.scheduler import tune_collector

    class Node:
        def __init__(self) -> None:
            self.me = self

    thresholds = gc.get_threshold()
    tune_collector()
    try:
        alive = [Node() for _ in range(20_000)]
        gc.collect(1)  # they survive the young collections: now in the oldest generation
        del alive  # garbage, but only a full collection finds cycles there
        gc.collect(1)
        assert sum(isinstance(o, Node) for o in gc.get_objects(2)) == 20_000
        malloc.release()
        assert sum(isinstance(o, Node) for o in gc.get_objects()) == 0
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()  # release() froze this test process' objects


FREEZE_SCRIPT = """
import gc, weakref
from app.runtime import malloc
from app.scrape.scheduler import tune_collector

class Node:
    def __init__(self):
        self.me = self

def alive(refs):
    return sum(r() is not None for r in refs)

tune_collector()
long_lived = [Node() for _ in range(20_000)]
old = [weakref.ref(n) for n in long_lived]
malloc.release()  # the first release collects everything and freezes what survives
frozen, unfrozen = gc.get_freeze_count(), len(gc.get_objects())
del long_lived  # 20,000 cycles die among the frozen
young = [Node() for _ in range(5_000)]
new = [weakref.ref(n) for n in young]
del young  # 5,000 cycles die among what was made since
malloc.release()
after_second = (alive(old), alive(new))
for _ in range(malloc.FULL_EVERY - 2):
    malloc.release()
before_full = alive(old)
malloc.release()  # the FULL_EVERY-th after the first: everything again
print(frozen, unfrozen, *after_second, before_full, alive(old))
"""


def test_release_scans_only_what_was_made_since_and_everything_every_full_every() -> None:
    """After a release what survived is frozen, so the next collection scans only newer objects
    (a collection of everything held the interpreter for 0.5-0.7 s at 1,000 targets); cycles
    that die among the frozen wait for the next release that unfreezes, FULL_EVERY later."""
    out = subprocess.run([sys.executable, "-c", FREEZE_SCRIPT], capture_output=True, text=True, check=True).stdout
    frozen, unfrozen, old_after, new_after, old_before_full, old_after_full = map(int, out.split())
    assert frozen >= 20_000 and unfrozen < 1_000  # the next collection scans under 1,000 objects, not 20,000+
    assert new_after == 0  # cycles made since the last release: collected by the next
    assert old_after == old_before_full == 20_000  # cycles among the frozen: kept until the full release
    assert old_after_full == 0
