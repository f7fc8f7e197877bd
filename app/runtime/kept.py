"""Values kept between reads because they are made from inputs that rarely change: the parts
of a list answer by what each is made of (:class:`KeptParts`), values made once per round from
its result (:class:`RoundMemo`). No imports from the rest of the service, so the store and the
API both use them."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Made = TypeVar("Made")
Part = TypeVar("Part")


class KeptParts(Generic[Key, Made, Part]):
    """The parts of a list answer (a diagnosis' JSON, a target's JSON, a fleet table row's
    HTML, a stored diagnosis' decoded details) kept by what each is made of, so that a read
    makes only the parts that changed since the last read. At 1,000 targets most of an answer
    is the same from one read to the next, and making every part again would be most of what
    the diagnoses, the targets list and the status page cost under load. Each
    kept read replaces what is kept by its own parts, so at most one answer's parts are held;
    a key must hold everything its part shows."""

    def __init__(self, make: Callable[[Made], Part]) -> None:
        self._make = make
        self._kept: dict[Key, Part] = {}

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def kept(self) -> Mapping[Key, Part]:
        """What the last kept read kept. A read replaces the mapping, never changes it, so a
        caller may hold it while other reads go on."""
        return self._kept

    def parts(self, items: Iterable[tuple[Key, Made]], keep: bool = True) -> list[Part]:
        """Each item's part, in order: the kept one for a key seen by the last kept read, else
        ``make(made)``. ``keep`` False: a read of a subset (one target's) uses what is kept but
        does not replace it."""
        kept, seen, out = self._kept, dict[Key, Part](), []
        for key, made in items:
            part = seen.get(key)
            if part is None:
                part = kept.get(key)
            if part is None:
                part = self._make(made)
            seen[key] = part
            out.append(part)
        if keep:
            self._kept = seen
        return out


class RoundMemo(Generic[Key, Part]):
    """Values made from one round's result (its fleet answer per spelling of the window, a
    target's percentile cells on the status page), kept until a newer result is asked about:
    made once per round, not for every read. The result and its values are one tuple, replaced
    in one assignment, so a reader never gets a value made from another round's result."""

    def __init__(self, limit: int) -> None:
        self._limit = limit  # values kept per round
        self._state: tuple[object | None, dict[Key, Part]] = (None, {})

    def get(self, owner: object, key: Key, make: Callable[[], Part]) -> Part:
        """The value for ``key`` made from ``owner`` (the round's result, by identity)."""
        kept_owner, values = self._state
        if kept_owner is not owner:
            values = {}
            self._state = (owner, values)
        value = values.get(key)
        if value is None:
            value = make()
            if len(values) < self._limit:
                values[key] = value
        return value
