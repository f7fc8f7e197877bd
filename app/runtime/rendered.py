"""Self-metric families a round replaces whole, rendered once per replacement."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector


class RenderedPerRound(Collector):
    """A collector whose data a round replaces whole (never changes in place): its text on
    ``/metrics`` is rendered once per replacement and reused by every scrape until the next.
    At 1,000 targets these families are tens of thousands of lines; rendering them for each
    of many concurrent readers of ``/metrics`` would cost more than everything else the
    endpoint does. ``_data``: the attributes a round assigns."""

    _data: tuple[str, ...] = ()
    _rendered: tuple[tuple[object, ...], bytes] | None = None

    def rendered(self) -> bytes:
        state = tuple(getattr(self, name) for name in self._data)
        cached = self._rendered
        if cached is None or any(a is not b for a, b in zip(cached[0], state, strict=True)):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(self)
            cached = self._rendered = (state, generate_latest(registry))  # holds the data it was made of
        return cached[1]
