"""Engine adapters: parsed /metrics families -> canonical signals (see base.py).

To support a new engine, add a module with an adapter class (name, family_prefixes,
families, detect, to_canonical) and register it in ``ADAPTERS``.
"""

from __future__ import annotations

from app.exposition.parser import ParsedPage
from app.sources import sglang, tgi, trtllm, vllm
from app.sources.base import Adapter
from app.sources.sglang import SglangAdapter
from app.sources.tgi import TgiAdapter
from app.sources.trtllm import TrtllmAdapter
from app.sources.vllm import VllmAdapter

_ALL: tuple[Adapter, ...] = (VllmAdapter(), TgiAdapter(), SglangAdapter(), TrtllmAdapter())
ADAPTERS: dict[str, Adapter] = {a.name: a for a in _ALL}
_HISTOGRAM_SIGNALS: dict[str, frozenset[str]] = {
    "vllm": frozenset(vllm.HISTOGRAMS), "sglang": frozenset({*sglang.HISTOGRAMS, *sglang.TABLE}),
    "trtllm": frozenset(trtllm.HISTOGRAMS), "tgi": frozenset(tgi.HISTOGRAMS)}
DETECTION_PREFIXES = tuple(p for a in ADAPTERS.values() for p in a.family_prefixes)


def exports_histogram(engine: str | None, signal: str) -> bool | None:
    """Whether ``engine``'s metrics carry a ``signal`` histogram under any release's name (None:
    the engine is not known, ``auto`` not yet detected)."""
    return None if engine not in _HISTOGRAM_SIGNALS else signal in _HISTOGRAM_SIGNALS[engine]


def detect_engine(page: ParsedPage) -> str | None:
    """Which engine served this page, judged by the family prefixes present; None if none."""
    for adapter in ADAPTERS.values():
        if adapter.detect(page):
            return adapter.name
    return None
