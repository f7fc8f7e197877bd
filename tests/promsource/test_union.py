"""A source's queries join their branches (engine families, statistics, jobs) as a balanced tree
of ``or``: the same answer as a chain, each series handled at about log2(k) levels instead of up
to k - 1. That the answers are Prometheus' own is what the agreement tests against Prometheus 2.42
and VictoriaMetrics check (``tests/promsource/test_matrix_both_modes.py``)."""

from __future__ import annotations

import math
import re

from app.promql.text import union
from app.promsource.queries import SourceQueries


def _depth(text: str) -> int:
    deepest = depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


def test_every_part_once_in_order_and_log2_deep() -> None:
    for k in range(1, 41):
        parts = [f"p{i}" for i in range(k)]
        text = union(parts)
        assert re.findall(r"p\d+", text) == parts
        assert text.count(" or ") == k - 1
        assert _depth(text) <= max(0, math.ceil(math.log2(k)) - 1), (k, text)
    assert union(["a"]) == "a" and union(["a", "b"]) == "a or b"
    assert union(["a", "b", "c", "d", "e"]) == "(a or b) or ((c) or (d or e))"


def test_a_histogram_query_of_every_engine_is_a_shallow_tree() -> None:
    """The prefill-time histogram of six engine families (bucket, sum and count each: 18 parts) is
    a tree 5 levels deep (ceil(log2(18))), 3 levels more than one family's (3 parts: 2 levels)."""
    queries = SourceQueries(("namespace", "pod"), (("namespace", "=", "llm"),))
    every, one = queries.histogram("prefill_time", 60.0), queries.histogram("iteration_tokens", 60.0)
    assert every.count(" or ") + 1 == 18 and one.count(" or ") + 1 == 3
    assert _depth(every) - _depth(one) == (5 - 1) - (2 - 1)
