"""app.exposition.parser against prometheus_client's parsers (the oracle), on real pages and
on generated ones, plus the cache, the keep filter, OpenMetrics and garbage input."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from app.exposition import parser as parser_module
from app.exposition.parser import (
    MetricFamily,
    PageParser,
    ParsedPage,
    Sample,
    keep_prefixes,
    parse_page,
)
from tests.support import python_twins

EXPOSITION = Path(__file__).resolve().parents[1] / "fixtures" / "exposition"
VLLM_REAL = EXPOSITION / "vllm-0.32-cpu-real.prom"


# ----------------------------------------------------------------------------- helpers

# The plan is applied in C where the package was built with a compiler, else in Python;
# both must answer exactly like the line-by-line parse.
PLAN_PATHS = ["C", "Python"]


@contextmanager
def plan_applied_in(path: str) -> Iterator[None]:
    built = parser_module._planned
    if path == "C" and built is None:
        pytest.skip("app.exposition._planned was not built (no C compiler at install)")
    parser_module._planned = built if path == "C" else None
    try:
        yield
    finally:
        parser_module._planned = built


def page_forms(text: str) -> list[bytes | str]:
    """The page as a target sends it (UTF-8 bytes), as text, and as bytes that are not UTF-8
    (Latin-1: "é" becomes one byte the decoder replaces)."""
    return [text.encode(), text, text.encode("latin-1", "replace")]


def _v(value: float) -> object:
    """Values compared with NaN == NaN and int == float."""
    value = float(value)
    return "NaN" if math.isnan(value) else value


def canon(page: ParsedPage) -> dict[str, tuple[str, list[tuple[str, dict[str, str], object]]]]:
    return {
        name: (fam.type, [(s.name, s.labels, _v(s.value)) for s in fam.samples])
        for name, fam in page.families.items()
    }


def _canon_oracle(families, keep=None) -> dict:
    """prometheus_client names counters without _total; we always add it."""
    out: dict = {}
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        if keep is not None and not keep(name):
            continue
        type_ = "untyped" if fam.type == "unknown" else fam.type
        _, samples = out.setdefault(name, (type_, []))
        samples.extend((s.name, s.labels, _v(s.value)) for s in fam.samples)
    return out


def oracle(text: str, keep=None) -> dict:
    return _canon_oracle(text_string_to_metric_families(text), keep)


def oracle_rejects(line: str) -> bool:
    try:
        list(text_string_to_metric_families(line))
    except Exception:
        return True
    return False


# ----------------------------------------------------------------------------- fixtures

# Known pages: file -> (1-based numbers of the lines prometheus_client rejects,
# samples_seen, number of families). Other files in the directory
# get the same oracle checks, with the expected numbers taken from the oracle.
KNOWN_FIXTURES = {
    "sglang-v0.4-docs-production_metrics.prom": ([], 91, 12),
    "triton-trtllm-23.11-readme.prom": ([], 33, 17),
    "vllm-0.32-cpu-real.prom": ([], 445, 92),
    "vllm-v1-docs-design-metrics.prom": ([5, 9, 15], 14, 4),
    "vllm-v1-docs-usage-metrics.prom": ([13], 9, 1),
}
ALL_FIXTURES = sorted(p.name for p in EXPOSITION.glob("*.prom"))


def test_known_fixtures_exist() -> None:
    assert set(KNOWN_FIXTURES) <= set(ALL_FIXTURES)
    assert len(ALL_FIXTURES) >= 5


@pytest.mark.parametrize("filename", ALL_FIXTURES)
def test_fixture_matches_oracle(filename: str) -> None:
    text = (EXPOSITION / filename).read_text()
    lines = text.split("\n")
    rejected = [i + 1 for i, line in enumerate(lines) if oracle_rejects(line)]
    clean = "\n".join(line for i, line in enumerate(lines) if i + 1 not in rejected)
    expected = oracle(clean)
    expected_seen = sum(len(samples) for _, samples in expected.values())
    if filename in KNOWN_FIXTURES:
        bad, seen, n_families = KNOWN_FIXTURES[filename]
        assert rejected == bad
        assert expected_seen == seen
        assert len(expected) == n_families

    page = parse_page(text.encode())
    # Exactly the lines prometheus_client rejects are the ones we count as malformed.
    assert page.malformed == len(rejected)
    assert [int(e.split(":")[0].removeprefix("line ")) for e in page.errors] == rejected[:20]
    assert (page.samples_seen, page.samples_kept) == (expected_seen, expected_seen)
    assert canon(page) == expected
    assert canon(parse_page(clean)) == expected
    parser = PageParser()
    first = parser.parse(text)
    second = parser.parse(text)  # the plan path
    assert canon(first) == canon(second) == expected
    assert (second.samples_seen, second.malformed, second.errors) == (expected_seen, len(rejected), page.errors)


def test_doc_excerpt_elisions_are_the_only_malformed_lines() -> None:
    for filename, count in (("vllm-v1-docs-design-metrics.prom", 3), ("vllm-v1-docs-usage-metrics.prom", 1)):
        page = parse_page((EXPOSITION / filename).read_bytes())
        assert page.malformed == count
        assert all(e.endswith(": invalid metric name") for e in page.errors)


def test_vllm_real_page_details() -> None:
    page = parse_page(VLLM_REAL.read_bytes())
    ttft = page.families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert len(ttft.samples) == 25
    assert ttft.samples[0] == Sample(
        "vllm:time_to_first_token_seconds_bucket", {"engine": "0", "le": "0.001", "model_name": "tiny"}, 0.0
    )
    assert ttft.samples[-1].name == "vllm:time_to_first_token_seconds_sum"
    assert ttft.samples[-1].value == 42.11752414703369
    assert page.families["vllm:prompt_tokens_total"] == MetricFamily(
        "vllm:prompt_tokens_total", "counter",
        [Sample("vllm:prompt_tokens_total", {"engine": "0", "model_name": "tiny"}, 15647.0)],
    )
    types = {}
    for fam in page.families.values():
        types[fam.type] = types.get(fam.type, 0) + 1
    assert types == {"counter": 22, "gauge": 50, "histogram": 18, "summary": 2}


def test_counter_without_total_suffix_is_renamed() -> None:
    page = parse_page((EXPOSITION / "triton-trtllm-23.11-readme.prom").read_text())
    fam = page.families["nv_inference_count_total"]
    assert fam.type == "counter"
    assert fam.samples == [Sample("nv_inference_count_total", {"model": "tensorrt_llm", "version": "1"}, 0.0)]
    assert "nv_inference_count" not in page.families
    assert [s.value for s in page.families["nv_trt_llm_request_metrics"].samples] == [1.0, 1.0, 1.0, 512.0, 0.0]


# ----------------------------------------------------------------------------- keep filter


def test_keep_filter_on_real_vllm_page() -> None:
    calls: list[str] = []
    prefixes = keep_prefixes("vllm:")

    def keep(name: str) -> bool:
        calls.append(name)
        return prefixes(name)

    parser = PageParser(keep)
    body = VLLM_REAL.read_bytes()
    first = parser.parse(body)
    assert (first.samples_seen, first.samples_kept, first.malformed) == (445, 374, 0)
    assert len(first.families) == 72
    assert all(name.startswith("vllm:") for name in first.families)
    assert len(calls) == 92  # once per TYPE block
    assert calls[0] == "python_gc_objects_collected_total"
    second = parser.parse(body)
    assert len(calls) == 92  # memoized: not asked again
    assert (second.samples_seen, second.samples_kept, len(second.families)) == (445, 374, 72)
    assert canon(first) == canon(second) == oracle(VLLM_REAL.read_text(), prefixes)
    assert sum(len(f.samples) for f in second.families.values()) == 374


def test_keep_prefixes() -> None:
    keep = keep_prefixes("vllm:", "sglang:")
    assert [keep(n) for n in ("vllm:x", "sglang:y", "nv_z", "vllm")] == [True, True, False, False]
    assert keep_prefixes()("anything") is False


def test_keep_decides_untyped_and_foreign_samples() -> None:
    text = (
        "# TYPE a histogram\n"
        'a_bucket{le="+Inf"} 1\n'
        "a_created 5\n"  # belongs to the histogram
        "a_extra 2\n"  # does not: starts an untyped family
        "a_extra 3\n"
        "stray 4\n"
        "# TYPE b gauge\n"
        "b 6\n"
    )
    page = parse_page(text, keep=lambda name: name != "stray")
    assert canon(page) == {
        "a": ("histogram", [("a_bucket", {"le": "+Inf"}, 1.0), ("a_created", {}, 5.0)]),
        "a_extra": ("untyped", [("a_extra", {}, 2.0), ("a_extra", {}, 3.0)]),
        "b": ("gauge", [("b", {}, 6.0)]),
    }
    assert (page.samples_seen, page.samples_kept) == (6, 5)


def test_stray_sample_inside_a_skipped_block_still_counts() -> None:
    text = "# TYPE drop_me gauge\ndrop_me 1\ndrop_me 2\nwanted 3\n# TYPE other gauge\nother 4\n"
    keep = keep_prefixes("wanted", "other")
    parser = PageParser(keep)
    for _ in range(2):
        page = parser.parse(text)
        assert canon(page) == {"wanted": ("untyped", [("wanted", {}, 3.0)]), "other": ("gauge", [("other", {}, 4.0)])}
        assert (page.samples_seen, page.samples_kept) == (4, 2)


def test_skipped_blocks_are_not_validated() -> None:
    # Lines of a dropped block are counted, not parsed: a bad value there is not noticed.
    text = "# TYPE x gauge\nx{a=\"1\"} not-a-number\nx 2\n# TYPE y gauge\ny 3\n"
    page = parse_page(text, keep=keep_prefixes("y"))
    assert (page.samples_seen, page.samples_kept, page.malformed) == (3, 1, 0)
    assert parse_page(text).malformed == 1


# ----------------------------------------------------------------------------- format details


def test_format_edge_cases() -> None:
    text = (
        "# A free comment\n"
        "\n"
        "# HELP esc Help with \\\\ and \\n escapes\n"
        "# TYPE esc gauge\n"
        'esc{a="back\\\\slash",b="quo\\"te",c="new\\nline",d="odd\\tescape",} 1\n'
        'esc{a="sp ace",b="}",c=",",d="=",e="#",f="# {x=\\"y\\"} 1"} -Inf\n'
        'esc{a="x"} +Inf 1700000000000\n'
        'esc{a="y"} Inf\n'
        'esc{a="z"} NaN\n'
        'esc{a="e"} 1.5e-7\n'
        'esc{a="E"} -2E+3 -5\n'
        "# TYPE ns:with:colons counter\n"
        "ns:with:colons_total 12\n"
        "  ns:with:colons_total{ spaced = \"yes\" , } 13\n"
        "ns:with:colons_total\t14\t1700000000000\n"
        "# TYPE q summary\n"
        'q{quantile="0.5"} 3\n'
        "q_sum 10\n"
        "q_count 4\n"
        "q_created 1.7e9\n"
        'q {quantile="0.9"} 7\n'
    )
    assert oracle_rejects(text) is False
    page = parse_page(text)
    nan = "NaN"
    assert canon(page) == {
        "esc": ("gauge", [
            ("esc", {"a": "back\\slash", "b": 'quo"te', "c": "new\nline", "d": "odd\\tescape"}, 1.0),
            ("esc", {"a": "sp ace", "b": "}", "c": ",", "d": "=", "e": "#", "f": '# {x="y"} 1'}, -math.inf),
            ("esc", {"a": "x"}, math.inf),
            ("esc", {"a": "y"}, math.inf),
            ("esc", {"a": "z"}, nan),
            ("esc", {"a": "e"}, 1.5e-7),
            ("esc", {"a": "E"}, -2000.0),
        ]),
        "ns:with:colons_total": ("counter", [
            ("ns:with:colons_total", {}, 12.0),
            ("ns:with:colons_total", {"spaced": "yes"}, 13.0),
            ("ns:with:colons_total", {}, 14.0),
        ]),
        "q": ("summary", [
            ("q", {"quantile": "0.5"}, 3.0),
            ("q_sum", {}, 10.0),
            ("q_count", {}, 4.0),
            ("q_created", {}, 1.7e9),
            ("q", {"quantile": "0.9"}, 7.0),
        ]),
    }
    # prometheus_client agrees except that it does not attach q_created to the summary.
    expected = oracle(text)
    assert expected.pop("q_created") == ("untyped", [("q_created", {}, 1.7e9)])
    expected["q"][1].insert(3, ("q_created", {}, 1.7e9))
    assert canon(page) == expected
    assert (page.samples_seen, page.samples_kept, page.malformed) == (15, 15, 0)


def test_quoted_utf8_names() -> None:
    text = '# TYPE "my.metric" gauge\n{"my.metric", a="b"} 1\n{__name__="plain", c="d"} 2\n'
    page = parse_page(text)
    assert canon(page) == {
        "my.metric": ("gauge", [("my.metric", {"a": "b"}, 1.0)]),
        "plain": ("untyped", [("plain", {"c": "d"}, 2.0)]),
    }
    assert canon(page) == oracle(text)


def test_crlf_line_endings() -> None:
    text = VLLM_REAL.read_text()
    crlf = text.replace("\n", "\r\n").encode()
    parser = PageParser(keep_prefixes("vllm:"))
    for _ in range(2):
        page = parser.parse(crlf)
        assert (page.samples_seen, page.samples_kept, page.malformed) == (445, 374, 0)
        assert canon(page) == oracle(text, keep_prefixes("vllm:"))


def test_malformed_lines_are_reported_and_skipped() -> None:
    text = (
        "# TYPE g gauge\n"
        'g{a="1"} 1\n'
        "...\n"
        "g\n"
        'g{a="2"} one\n'
        'g{a="3\n'
        'g{a="4",a="5"} 1\n'
        "g 1 ts\n"
        "g 1 2 3\n"
        "g-minus 1\n"
        "g 1_000\n"
        "# TYPE g\n"
        "# TYPE h bogus\n"
        "# HELP\n"
        'g{a="6"} 6\n'
    )
    parser = PageParser()
    for _ in range(2):
        page = parser.parse(text)
        assert canon(page) == {"g": ("gauge", [("g", {"a": "1"}, 1.0), ("g", {"a": "6"}, 6.0)])}
        assert (page.samples_seen, page.samples_kept, page.malformed) == (2, 2, 12)
        assert page.errors == [
            "line 3: invalid metric name",
            "line 4: missing value",
            "line 5: invalid value",
            "line 6: label value is not a terminated quoted string",
            "line 7: duplicate label name",
            "line 8: invalid timestamp",
            "line 9: unexpected text after timestamp",
            "line 10: invalid metric name",
            "line 11: invalid value",
            "line 12: TYPE line without metric type",
            "line 13: unknown metric type",
            "line 14: HELP line without metric name",
        ]


def test_errors_are_capped_at_20() -> None:
    text = "\n".join(f"bad line {i}" for i in range(50))
    page = parse_page(text)
    assert page.malformed == 50
    assert len(page.errors) == 20
    assert page.errors[0] == "line 1: invalid value"
    assert page.errors[-1] == "line 20: invalid value"


def test_errors_name_the_line_but_never_quote_it() -> None:
    """Scrape errors are shown to every reader of the API: a page that is not a metrics
    page (here an environment file) must not have its text copied into them."""
    text = "SECRET_API_KEY=sk-live-123\n# TYPE g bogus-sk-live-456\ng 1\ntoken{a=\"sk-live-789\"} x\n"
    parser = PageParser()
    for _ in range(2):  # the general path, then the plan path
        page = parser.parse(text)
        assert page.errors == ["line 1: invalid metric name", "line 2: unknown metric type", "line 4: invalid value"]
        assert page.malformed == 3 and page.samples_seen == 1


# ----------------------------------------------------------------------------- OpenMetrics

OPENMETRICS = """\
# TYPE acme_http_router_request_seconds summary
# UNIT acme_http_router_request_seconds seconds
# HELP acme_http_router_request_seconds Latency though all of ACME's HTTP request router.
acme_http_router_request_seconds_sum{path="/api/v1",method="GET"} 9036.32
acme_http_router_request_seconds_count{path="/api/v1",method="GET"} 807283.0
acme_http_router_request_seconds_created{path="/api/v1",method="GET"} 1605281325.0
# TYPE go_goroutines gauge
go_goroutines 69
# TYPE process_cpu_seconds counter
# UNIT process_cpu_seconds seconds
# HELP process_cpu_seconds Total user and system CPU time.
process_cpu_seconds_total 4.20072246e+06
process_cpu_seconds_created 1.6e+09
# TYPE foo histogram
foo_bucket{le="0.1"} 8 # {trace_id="KOO5S4vxi0o"} 0.67
foo_bucket{le="+Inf"} 17 # {trace_id="oHg5SJYRHA0"} 9.8 1520879607.789
foo_count 17
foo_sum 324789.3
foo_created 1520430000.123
# TYPE build info
build_info{version="1.2"} 1
# TYPE feature stateset
feature{feature="a"} 1
feature{feature="b"} 0
# TYPE mystery unknown
mystery 3 1520879607.789
# TYPE queue gaugehistogram
queue_bucket{le="1"} 2
queue_bucket{le="+Inf"} 3
queue_gcount 3
queue_gsum 4.5
# EOF
"""


def test_openmetrics_page() -> None:
    parser = PageParser()
    for _ in range(3):
        page = parser.parse(OPENMETRICS.encode())
        assert canon(page) == _canon_oracle(om_families(OPENMETRICS))
        assert (page.samples_seen, page.samples_kept, page.malformed) == (19, 19, 0)
        assert list(page.families) == [
            "acme_http_router_request_seconds", "go_goroutines", "process_cpu_seconds_total", "foo",
            "build", "feature", "mystery", "queue",
        ]
        counter = page.families["process_cpu_seconds_total"]
        assert counter.type == "counter"
        assert [(s.name, s.value) for s in counter.samples] == [
            ("process_cpu_seconds_total", 4200722.46), ("process_cpu_seconds_created", 1.6e9),
        ]
        assert [s.value for s in page.families["foo"].samples] == [8.0, 17.0, 17.0, 324789.3, 1520430000.123]
        assert page.families["mystery"].type == "untyped"
        assert page.families["build"].type == "info"


def test_openmetrics_counter_in_text_format() -> None:
    # "x" typed as counter with x_total samples, as OpenMetrics writes it, and without
    # any TYPE suffix games: both name the family x_total.
    page = parse_page('# TYPE x counter\nx_total{a="1"} 3\nx_created{a="1"} 9\n# TYPE y_total counter\ny_total 4\n')
    assert canon(page) == {
        "x_total": ("counter", [("x_total", {"a": "1"}, 3.0), ("x_created", {"a": "1"}, 9.0)]),
        "y_total": ("counter", [("y_total", {}, 4.0)]),
    }


# ----------------------------------------------------------------------------- garbage


def test_random_bytes() -> None:
    data = random.Random(20240611).randbytes(20_000)
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    expected = sum(1 for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#"))
    assert expected == 78
    parser = PageParser()
    for _ in range(2):
        page = parser.parse(data)
        assert page.families == {}
        assert (page.samples_seen, page.samples_kept, page.malformed) == (0, 0, 78)
        assert len(page.errors) == 20


def test_html_page() -> None:
    html = (
        b"<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n"
        b"<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n</body>\n</html>\n"
    )
    page = PageParser(keep_prefixes("vllm:")).parse(html)
    assert page.families == {}
    assert (page.samples_seen, page.samples_kept, page.malformed) == (0, 0, 8)
    assert page.errors[0] == "line 1: invalid metric name"
    assert page.errors[2] == "line 3: invalid metric name"


def test_empty_and_non_utf8_pages() -> None:
    for body in (b"", "", b"\n\n", b"# EOF\n"):
        page = parse_page(body)
        assert (page.families, page.samples_seen, page.malformed) == ({}, 0, 0)
    page = parse_page(b'x{a="\xff"} 1\n\xfe\xff 2\n')
    assert canon(page) == {"x": ("untyped", [("x", {"a": "\ufffd"}, 1.0)])}
    assert page.malformed == 1


@pytest.mark.parametrize(
    ("cut_after", "kept", "reason"),
    [
        ('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="ti', 154,
         "label value is not a terminated quoted string"),
        ('# TYPE vllm:inter_token_latency_seconds histogram\nvllm:inter_token_lat', 176, "missing value"),
    ],
)
def test_truncated_page(cut_after: str, kept: int, reason: str) -> None:
    body = VLLM_REAL.read_bytes()
    cut = body.index(cut_after.encode()) + len(cut_after)
    truncated = body[:cut]
    complete = truncated[: truncated.rindex(b"\n") + 1].decode()
    keep = keep_prefixes("vllm:")
    parser = PageParser(keep)
    parser.parse(body)  # a full page first: the cache and plan must not mask the damage
    for _ in range(2):
        page = parser.parse(truncated)
        assert page.malformed == 1
        assert page.errors[0] == f"line {complete.count(chr(10)) + 1}: {reason}"
        assert canon(page) == oracle(complete, keep)
        assert page.samples_kept == kept


# ----------------------------------------------------------------------------- cache


def _rewrite_values(text: str, fn) -> str:
    out = []
    for i, line in enumerate(text.split("\n")):
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            line = f"{head} {fn(i, float(value))!r}"
        out.append(line)
    return "\n".join(out)


def test_cache_never_serves_stale_values_or_labels() -> None:
    a = VLLM_REAL.read_text()
    b = _rewrite_values(a, lambda i, v: v + i + 0.5)
    c = b.replace('finished_reason="length",model_name="tiny"', 'finished_reason="length",model_name="tiny-3"')
    assert c != b
    d = "\n".join(line for line in a.split("\n") if "le=\"0.04\"" not in line)
    e = "\n".join(line if line.startswith("#") or not line else line + " 1700000000000" for line in b.split("\n"))
    keep = keep_prefixes("vllm:")
    parser = PageParser(keep)
    plans = []
    for text in (a, b, c, a, d, a, e, e, b):
        page = parser.parse(text)
        assert canon(page) == oracle(text, keep) == canon(parse_page(text, keep))
        plans.append(parser._plan)
    # a and b share one plan (values only); c, d and a again need new ones; e (timestamps)
    # cannot be planned and leaves none, so b starts over.
    assert plans[0] is plans[1]
    assert len({id(p) for p in plans[:6]}) == 5
    assert plans[6] is None and plans[7] is None and plans[8] is not None


def test_the_plan_is_applied_in_c_wherever_the_test_suite_runs_in_ci() -> None:
    """The benchmarks measure the C path; a build that silently fell back to Python must
    not pass CI (a user's install without a compiler still works, in Python)."""
    if os.environ.get("CI") == "true" and not python_twins.forced():
        assert parser_module._planned is not None, "app/exposition/_planned.c was not built"


PLAIN_VALUE_TEXTS = ["0", "17", "-3.25", "1e-9", "6.02E+23", "+Inf", "-Inf", "NaN", "inf", "1e999", "1.5e-400"]
TEXT_ONLY_VALUE_TEXTS = ["\u0661\u0662", "\u00a01", "1_0", "0x10", "1 2", "1 ", "", "1" + "0" * 70]


def _converts(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("path", PLAN_PATHS)
@pytest.mark.parametrize("value", PLAIN_VALUE_TEXTS + TEXT_ONLY_VALUE_TEXTS)
@pytest.mark.parametrize("ending", ["", "\n", "\n\n"])
def test_a_value_the_plan_cannot_take_goes_the_long_way_with_the_same_answer(path: str, value: str,
                                                                              ending: str) -> None:
    """The plan keeps the page's shape and takes every plain ASCII number (float()'s own
    conversion); anything else (text that only float() of a str takes, underscores, hex, a
    timestamp, 71 characters) makes a new parse, which answers the same."""
    head = "# HELP a_total Déjà vu.\n# TYPE a_total counter\n"
    first = f'{head}a_total{{m="x"}} 1\nb 2{ending}'
    second = f'{head}a_total{{m="x"}} {value}\nb 2{ending}'
    with plan_applied_in(path):
        for form in range(2):  # UTF-8 bytes, text
            parser = PageParser()
            parser.parse(page_forms(first)[form])
            plan = parser._plan
            assert plan is not None
            page = page_forms(second)[form]
            got = parser.parse(page)
            assert _everything(got) == _everything(parse_page(page))
            # In Python the plan takes what float() of a str takes (no underscores); C takes
            # plain ASCII numbers.
            if path == "Python":
                plain = "_" not in value and _converts(value)
            else:
                plain = value in PLAIN_VALUE_TEXTS
            assert (parser._plan is plan) == plain, (value, form)
            if value in PLAIN_VALUE_TEXTS:
                assert _v(got.families["a_total"].values[0]) == _v(float(value))


@pytest.mark.parametrize("path", PLAN_PATHS)
def test_a_page_that_is_not_utf8_is_parsed_as_its_decoded_text(path: str) -> None:
    """Both pages decode to the same text (one replacement character), so the Python plan
    keeps its shape; C compares the bytes with the text's UTF-8 and parses such a page the
    long way every time. The answers are the same."""
    first, second = (page_forms(f"# HELP a Déjà vu.\n# TYPE a gauge\na {v}\n")[2] for v in (1, 2))
    with plan_applied_in(path):
        parser = PageParser()
        parser.parse(first)
        plan = parser._plan
        page = parser.parse(second)
        assert (parser._plan is plan) == (path == "Python")
        assert _everything(page) == _everything(parse_page(second))
        assert page.families["a"].values == [2.0]


@pytest.mark.parametrize("path", PLAN_PATHS)
def test_the_plan_sees_every_change_of_shape(path: str) -> None:
    """Line count, an exact line, a skipped line's family and an identity: each change is
    noticed (a new plan), and the answers are the one-shot parse's."""
    text = VLLM_REAL.read_text()
    lines = text.split("\n")
    first_sample = next(i for i, line in enumerate(lines) if line.startswith("vllm:"))
    skipped = next(i for i, line in enumerate(lines) if line.startswith("python_gc_objects_collected_total"))
    changes = {
        "a line more": text + "\nextra 1",
        "a line less": "\n".join(lines[:-2]),
        "a comment changed": text.replace("# HELP", "# HELP  ", 1),
        "another family in a skipped block": "\n".join([*lines[:skipped], "vllm:sneaky 1", *lines[skipped + 1:]]),
        "an identity changed": "\n".join([*lines[:first_sample], lines[first_sample].replace("tiny", "tinz"),
                                          *lines[first_sample + 1:]]),
    }
    keep = keep_prefixes("vllm:")
    with plan_applied_in(path):
        for what, changed in changes.items():
            parser = PageParser(keep)
            parser.parse(text.encode())
            plan = parser._plan
            assert parser.parse(text.encode()) is not None and parser._plan is plan  # the same shape: kept
            crlf = text.replace("\n", "\r\n").encode()
            assert _everything(parser.parse(crlf)) == _everything(parse_page(crlf, keep))
            assert parser._plan is plan  # "\r\n" line ends: the same shape too
            page = parser.parse(changed.encode())
            assert parser._plan is not plan, what
            assert _everything(page) == _everything(parse_page(changed.encode(), keep)), what


def test_cache_is_bounded() -> None:
    text = VLLM_REAL.read_text()
    parser = PageParser(max_cache=50)
    for variant in (text, _rewrite_values(text, lambda i, v: v * 2), text):
        page = parser.parse(variant)
        assert len(parser._series) <= 50
        assert canon(page) == oracle(variant)
        assert page.samples_kept == 445


def test_shared_labels_and_fresh_samples() -> None:
    parser = PageParser()
    text = 'x{a="1"} 1\n'
    first = parser.parse(text)
    second = parser.parse(text)
    s1, s2 = first.families["x"].samples[0], second.families["x"].samples[0]
    assert s1 == s2 == Sample("x", {"a": "1"}, 1.0)
    assert s1 is not s2  # Samples are never shared between pages ...
    assert s1.labels is s2.labels  # ... but label dicts are (documented: do not mutate)


# ----------------------------------------------------------------------------- generated pages

NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:"
LABEL_NAME = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,5}", fullmatch=True).filter(lambda s: s not in ("le", "quantile"))
LABEL_VALUE = st.text(
    alphabet=st.sampled_from(list('ab xyZ09 {}=,#"\\\n\t.:-_') + ["é", "→", "\u00a0", "😀", "\u2028"]),
    max_size=8,
)
VALUE = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["+Inf", "-Inf", "Inf", "NaN", "nan", "1e3", "1.5E-7", "-0", "0.0", "+1.5", ".5", "5."]),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class GenSample:
    name: str
    labels: list[tuple[str, str]]
    value: str
    timestamp: int | None = None
    style: int = 0  # 0 plain, 1 trailing comma, 2 blanks inside braces, 3 tab separator, 4 leading blank


@dataclass
class GenFamily:
    name: str
    type: str | None  # None: no TYPE line
    help: str | None
    samples: list[GenSample] = field(default_factory=list)


def render_sample(s: GenSample) -> str:
    sep = "\t" if s.style == 3 else " "
    if s.labels or s.style == 1:
        if s.style == 2:
            inner = " , ".join(f' {k} = "{_escape(v)}"' for k, v in s.labels) + " "
        else:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels) + ("," if s.style == 1 and s.labels else "")
        ident = f"{s.name}{{{inner}}}"
    else:
        ident = s.name
    line = f"{ident}{sep}{s.value}"
    if s.timestamp is not None:
        line += f"{sep}{s.timestamp}"
    return ("  " + line) if s.style == 4 else line


def render(families: list[GenFamily]) -> str:
    out = []
    for fam in families:
        if fam.help is not None:
            out.append(f"# HELP {fam.name} {fam.help}")
        if fam.type is not None:
            out.append(f"# TYPE {fam.name} {fam.type}")
        out.extend(render_sample(s) for s in fam.samples)
    return "\n".join(out) + "\n"


@st.composite
def label_sets(draw, max_labels: int = 3) -> list[tuple[str, str]]:
    names = draw(st.lists(LABEL_NAME, max_size=max_labels, unique=True))
    return [(n, draw(LABEL_VALUE)) for n in names]


@st.composite
def gen_sample(draw, name: str, labels: list[tuple[str, str]]) -> GenSample:
    return GenSample(
        name, labels, draw(VALUE),
        draw(st.one_of(st.none(), st.integers(0, 2**42))),
        draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4])),
    )


@st.composite
def gen_family(draw, index: int) -> GenFamily:
    stem = draw(st.text(alphabet=NAME_START, min_size=1, max_size=4)) + f"f{index}"
    type_ = draw(st.sampled_from(["counter", "counter_total", "gauge", "histogram", "summary", "untyped", None]))
    help_ = draw(st.one_of(st.none(), st.text(alphabet="abc \\n\\\\#{}\"", max_size=12)))
    samples: list[GenSample] = []
    if type_ in ("histogram", "summary"):
        for labels in draw(st.lists(label_sets(2), max_size=2)):
            if type_ == "histogram":
                for le in draw(st.lists(st.sampled_from(["0.1", "1", "2.5", "1e3"]),
                                        max_size=3, unique=True)) + ["+Inf"]:
                    samples.append(draw(gen_sample(stem + "_bucket", [*labels, ("le", le)])))
            else:
                for q in draw(st.lists(st.sampled_from(["0.5", "0.9", "0.99"]), max_size=3, unique=True)):
                    samples.append(draw(gen_sample(stem, [*labels, ("quantile", q)])))
            samples.append(draw(gen_sample(stem + "_sum", labels)))
            samples.append(draw(gen_sample(stem + "_count", labels)))
        samples = draw(st.permutations(samples))
        return GenFamily(stem, type_, help_, samples)
    name = stem + "_total" if type_ == "counter_total" else stem
    count = draw(st.integers(1 if type_ is None else 0, 4))
    samples = [draw(gen_sample(name, draw(label_sets()))) for _ in range(count)]
    return GenFamily(name, "counter" if type_ == "counter_total" else type_, help_ if type_ else None, samples)


@st.composite
def gen_pages(draw) -> list[GenFamily]:
    count = draw(st.integers(0, 6))
    return [draw(gen_family(i)) for i in range(count)]


def _all_samples(families: list[GenFamily]) -> list[GenSample]:
    return [s for fam in families for s in fam.samples]


GEN_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@GEN_SETTINGS
@given(gen_pages(), st.integers(0, 2**32))
def test_generated_pages_match_oracle(families: list[GenFamily], seed: int) -> None:
    text = render(families)
    expected = oracle(text)
    page = parse_page(text)
    assert canon(page) == expected
    n = len(_all_samples(families))
    assert (page.samples_seen, page.samples_kept, page.malformed) == (n, n, 0)
    # With a random keep filter, on a persistent parser, twice (plan path).
    rng = random.Random(seed)
    wanted = {name for name in expected if rng.random() < 0.5}
    keep = wanted.__contains__
    parser = PageParser(keep)
    for _ in range(2):
        kept_page = parser.parse(text.encode())
        assert canon(kept_page) == {k: v for k, v in expected.items() if k in wanted}
        assert kept_page.samples_seen == n
        assert kept_page.samples_kept == sum(len(v[1]) for k, v in expected.items() if k in wanted)


@pytest.mark.slow
@pytest.mark.parametrize("path", PLAN_PATHS)
@GEN_SETTINGS
@given(gen_pages(), st.data())
def test_generated_page_sequences_never_go_stale(path: str, families: list[GenFamily], data) -> None:
    """One parser sees the same series with new values, then changed labels, names,
    timestamps and removed lines, then the original again: always the oracle's answer."""
    keep = data.draw(st.sampled_from([None, keep_prefixes("a", "B", "_", ":")]))
    variants = [families]
    for _ in range(2):  # same shape, new values
        variants.append([replace(f, samples=[replace(s, value=data.draw(VALUE)) for s in f.samples]) for f in families])
    samples = _all_samples(families)
    if samples:
        target = data.draw(st.sampled_from(samples))
        change = data.draw(st.sampled_from(["label", "drop", "timestamp", "style"]))
        mutated = []
        for f in families:
            new = []
            for s in f.samples:
                if s is target:
                    if change == "label":
                        s = replace(s, labels=[*s.labels[:-1], (s.labels[-1][0], s.labels[-1][1] + "~")] if s.labels
                                    else [("zz", "1")])
                    elif change == "drop":
                        continue
                    elif change == "timestamp":
                        s = replace(s, timestamp=None if s.timestamp is not None else 123)
                    else:
                        s = replace(s, style=(s.style + 1) % 5)
                new.append(s)
            mutated.append(replace(f, samples=new))
        variants.append(mutated)
    variants.append(families)
    as_bytes = data.draw(st.booleans())
    with plan_applied_in(path):
        parser = PageParser(keep, max_cache=data.draw(st.sampled_from([3, 10_000])))
        for variant in variants:
            text = render(variant)
            page = parser.parse(text.encode() if as_bytes else text)
            assert canon(page) == oracle(text, keep)
            assert (page.samples_seen, page.malformed) == (len(_all_samples(variant)), 0)


MUTATION_TEXT = list(' \t#{}",=_.:\\0123456789abcEINFnan+-') + ["\n", "\r\n", "é", "\x1e", " # "]
ODD_VALUES = ["abc", "1_0", "", "1 2", '1 # {a="b"} 2', " 1", "1 ",
              # float() takes these from text: Unicode digits and blanks, a control blank,
              # overflow, underflow, 70 digits, spellings of inf and nan; and not hex
              "\u0661\u0662", "\u00a01", "1\x1c", "1e999", "1.5e-400", "1" + "0" * 69, "+Inf", "-infinity",
              "NaN", "nan", "0x10"]
BASE_PAGES = {
    "vllm": VLLM_REAL.read_text().split("\n"),
    "triton": (EXPOSITION / "triton-trtllm-23.11-readme.prom").read_text().split("\n"),
    "openmetrics": OPENMETRICS.split("\n"),
}


@st.composite
def mutated_pages(draw, base: list[str]) -> str:
    lines = list(base)
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "drop", "value", "swap"]))
        if op == "insert":
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(st.sampled_from(MUTATION_TEXT)) + line[j:]
        elif op == "delete" and line:
            j = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:j] + line[j + 1:]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "value":
            head, _, _ = line.rpartition(" ")
            lines[i] = head + " " + draw(st.one_of(VALUE, st.sampled_from(ODD_VALUES)))
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _everything(page: ParsedPage) -> tuple:
    return canon(page), page.samples_seen, page.samples_kept, page.malformed, page.errors


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("path", PLAN_PATHS)
@given(st.data())
def test_persistent_parser_equals_one_shot_parse_on_mutated_pages(path: str, data) -> None:
    """Whatever the page (valid or not, as bytes or text), the line cache and the page plan
    never change the result: a long-lived parser answers exactly like a fresh one-shot parse."""
    base = BASE_PAGES[data.draw(st.sampled_from(sorted(BASE_PAGES)))]
    keep = data.draw(st.sampled_from([None, keep_prefixes("vllm:", "nv_trt", "foo", "process"),
                                      keep_prefixes("vllm:time", "python_", "nv_inference_count")]))
    form = data.draw(st.integers(0, 2))
    with plan_applied_in(path):
        parser = PageParser(keep, max_cache=data.draw(st.sampled_from([5, 10_000])))
        for _ in range(4):
            page = page_forms(data.draw(mutated_pages(base)))[form]
            assert _everything(parser.parse(page)) == _everything(parse_page(page, keep))
