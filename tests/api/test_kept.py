"""The answer parts kept between reads (``app.api.common``): made again only when their key
or round changed, and never more than one answer's (one round's) worth held."""

from __future__ import annotations

from app.runtime.kept import KeptParts, RoundMemo


def test_kept_parts_make_only_what_changed_and_hold_only_the_last_answer() -> None:
    made: list[int] = []

    def make(n: int) -> str:
        made.append(n)
        return f"<{n}>"

    kept = KeptParts[str, int, str](make)
    assert kept.parts([("a", 1), ("b", 2), ("a", 1)]) == ["<1>", "<2>", "<1>"] and made == [1, 2]  # a twice: once
    assert kept.parts([("a", 1), ("c", 3)]) == ["<1>", "<3>"] and made == [1, 2, 3]  # a reused, c new
    assert len(kept) == 2  # b, absent from the last answer, is gone
    assert kept.parts([("b", 2)]) == ["<2>"] and made == [1, 2, 3, 2] and len(kept) == 1
    # a read of a subset uses what is kept and leaves it: b reused, d made, b still the only one kept
    assert kept.parts([("b", 2), ("d", 4)], keep=False) == ["<2>", "<4>"] and made == [1, 2, 3, 2, 4]
    assert len(kept) == 1 and kept.parts([("b", 2)]) == ["<2>"] and made == [1, 2, 3, 2, 4]


def test_round_memo_makes_a_value_once_per_round_up_to_its_limit() -> None:
    made: list[tuple[str, str]] = []
    memo = RoundMemo[str, str](2)
    first, second = object(), object()

    def get(owner: object, key: str) -> str:
        return memo.get(owner, key, lambda: made.append((key, "first" if owner is first else "second"))
                        or f"{key}@{len(made)}")

    assert [get(first, "5m"), get(first, "5m"), get(first, "1h")] == ["5m@1", "5m@1", "1h@2"]
    assert get(first, "300s") == "300s@3" and get(first, "300s") == "300s@4"  # past the limit: made, not kept
    assert get(second, "5m") == "5m@5" and made[-1] == ("5m", "second")  # a new round: made from it
    assert get(second, "5m") == "5m@5" and len(made) == 5
