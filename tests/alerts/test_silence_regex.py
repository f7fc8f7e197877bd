"""Silence matchers: Alertmanager's semantics, RE2 regexes (linear time, anchored)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from app.alerts.silences import MatcherError, matches, parse_matcher, silenced_by

LABELS = {"alertname": "LLMLatencyQueueing", "target": "vllm-a", "severity": "warning"}


@pytest.mark.parametrize(("text", "expected"), [
    ('target="vllm-a"', True),
    ('target="vllm"', False),
    ('target!="vllm-a"', False),
    ('target!="vllm-b"', True),
    ('target=~"vllm-.*"', True),
    ('target=~"vllm"', False),             # anchored: a prefix is not a match
    ('target=~"llm-a"', False),            # anchored at the start too
    ('target=~"vllm-a|tgi-b"', True),      # the alternation is anchored as a whole
    ('target=~"x|vllm-(a|b)"', True),
    ('target!~"vllm-.*"', False),
    ('target!~"tgi-.*"', True),
    ('alertname=~"LLMLatency.*"', True),
    ('alertname=~"llmlatency.*"', False),  # case-sensitive
    ('alertname=~"(?i)llmlatency.*"', True),
    ('model=""', True),                    # a missing label is the empty string
    ('model=~".*"', True),
    ('model=~".+"', False),
    ('model!=""', False),
    ('target=~"vllm\\.a"', False),         # \. is kept for the regex: a literal dot
    ('target=~"vllm.a"', True),
])
def test_matcher_semantics(text: str, expected: bool) -> None:
    assert matches(parse_matcher(text), LABELS) is expected


def test_quoted_values_unescape_as_in_alertmanager() -> None:
    assert parse_matcher('target="a\\"b"')["value"] == 'a"b'
    assert parse_matcher('target="a\\\\b"')["value"] == "a\\b"
    assert parse_matcher('target="a\\nb"')["value"] == "a\nb"
    assert parse_matcher('target="é-1"')["value"] == "é-1"
    assert matches(parse_matcher('target="é-1"'), {"target": "é-1"}) is True


def test_object_form_matches_like_the_text_form() -> None:
    matcher = parse_matcher({"name": "target", "value": "vllm-.*", "isRegex": True, "isEqual": False})
    assert matcher == {"name": "target", "value": "vllm-.*", "isRegex": True, "isEqual": False}
    assert matches(matcher, LABELS) is False
    assert matches(matcher, {"target": "tgi-a"}) is True


@pytest.mark.parametrize(("text", "reason"), [
    ('target=~"(a)\\1"', "invalid escape sequence: \\1"),          # backreference
    ('target=~"vllm(?=-a)"', "invalid perl operator: (?="),        # lookahead
    ('target=~"(?<!x)a"', "invalid perl operator: (?<"),           # lookbehind
    ('target=~"a{1001}"', "invalid repetition size: {1001}"),
    ('target=~"("', "missing ): ("),
])
def test_patterns_re2_refuses_name_the_matcher(text: str, reason: str) -> None:
    with pytest.raises(MatcherError) as error:
        parse_matcher(text)
    assert str(error.value).startswith(f"bad regex in matcher target: {reason}")


def test_silence_with_a_regex_re2_refuses_mutes_nothing() -> None:
    """A silence stored before regexes were RE2 may hold a lookahead; it must not mute
    (nor break the evaluation of the other silences)."""
    stored = SimpleNamespace(id="old", starts_at=0.0, ends_at=100.0,
                             matchers=[{"name": "target", "value": "vllm(?=-a)", "isRegex": True, "isEqual": True}])
    good = SimpleNamespace(id="good", starts_at=0.0, ends_at=100.0, matchers=[parse_matcher('target=~"vllm-.*"')])
    assert silenced_by([stored, good], LABELS, now=50.0) == ["good"]


# Python's backtracking ``re`` needs ~2^n steps for (a+)+ against n a's and a '-' (the
# label of the incident had n = 30 and kept the process busy for minutes); RE2 is linear.
REDOS_CHECK = """
import json, sys
from types import SimpleNamespace
from app.alerts.silences import matches, parse_matcher, silenced_by
labels = {"target": "a" * 100 + "-", "alertname": "LLMLatencyTargetDown"}
muting = SimpleNamespace(id="s1", starts_at=0.0, ends_at=100.0, matchers=[parse_matcher('target=~"(a+)+"')])
negated = parse_matcher('target!~"(a|aa)+"')
print(json.dumps({"silenced_by": silenced_by([muting], labels, 50.0), "negated": matches(negated, labels),
                  "whole": matches(parse_matcher('target=~"(a+)+-"'), labels)}))
"""


def test_catastrophic_pattern_is_matched_in_bounded_time() -> None:
    done = subprocess.run([sys.executable, "-c", REDOS_CHECK], capture_output=True, text=True, timeout=20,
                          check=True)
    assert json.loads(done.stdout) == {"silenced_by": [], "negated": True, "whole": True}


def test_the_same_input_is_catastrophic_for_backtracking_re() -> None:
    """The input above is a real ReDoS: Python's re does not finish it in 2 s (it needs
    about 2^40 steps at n = 40, hours; the test above uses n = 100)."""
    code = 'import re; print(re.fullmatch("(a+)+", "a" * 40 + "-"))'
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=2)
