"""A Prometheus source's targets get one name per label-value tuple: two replicas never share a
name (no merging of their numbers), plain values stay readable, every name is a valid target name."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.limits import NAME_PATTERN
from app.promsource import service
from app.promsource.service import named, target_name

VALUES = st.one_of(st.sampled_from(["a", "b", "a.b", "b.c", "x/y", "x_y", "x y", "x:y", "_", "", "-", "llm", "vllm-0"]),
                   st.text(max_size=70))


def test_plain_values_read_back_and_the_tricky_ones_do_not_meet() -> None:
    assert target_name("prod", ("llm", "vllm-0")) == "prod.llm.vllm-0"
    tricky = [("a.b", "c"), ("a", "b.c"), ("a_b", "c"), ("x/y", "z"), ("x_y", "z"), ("x y", "z"), ("", "z"), ("_", "z")]
    names = [target_name("prod", key) for key in tricky]
    assert len(set(names)) == len(tricky), names
    assert names[2] == "prod.a_b.c" and names[4] == "prod.x_y.z"  # plain: as they are
    assert re.fullmatch(r"prod\.x_y\.z\.[0-9a-f]{10}", names[3])  # made safe, and the exact values hashed


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(VALUES, VALUES), min_size=2, max_size=20, unique=True))
def test_distinct_values_get_distinct_valid_names(keys: list[tuple[str, str]]) -> None:
    names = named("prod", keys, "targets")
    assert len(names) == len(keys)
    assert all(re.fullmatch(NAME_PATTERN, name) for name in names), names


def test_a_name_two_tuples_would_share_is_refused_not_merged(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(service, "target_name", lambda source, key: f"{source}.same")
    assert named("prod", [("a",), ("b",)], "targets") == {"prod.same": ("a",)}
    assert "two targets would be named prod.same; the second is left out" in caplog.text
