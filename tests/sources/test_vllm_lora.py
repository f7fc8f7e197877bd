"""vLLM's ``vllm:lora_requests_info`` read as the LoRA slot gauges: the newest series is the engine's
state, the two adapter lists counted together against ``max_lora`` (0.10's separate lists and 0.34's
identical ones alike), and the label values - user content - only ever counted, bounded, never kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.exposition.parser import parse_page
from app.scrape.jobs import PageProcessor
from app.sources import ADAPTERS
from app.sources.base import Canonical
from app.sources.vllm import MAX_COUNTED_ADAPTERS

EXPOSITION = Path(__file__).parents[1] / "fixtures" / "exposition"
REAL_PAGE = (EXPOSITION / "vllm-0.32-cpu-real.prom").read_text()  # model "tiny", engine "0"
HEADER = "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"


def lora_series(max_lora: str, waiting: str, running: str, value: float) -> str:
    return (f'vllm:lora_requests_info{{max_lora="{max_lora}",waiting_lora_adapters="{waiting}",'
            f'running_lora_adapters="{running}"}} {value}\n')


def slots(page: str) -> tuple[dict[str, tuple[str, str, float]], Canonical]:
    _, canonical, error = PageProcessor("vllm").process(page)
    assert canonical is not None, error
    return {s.signal: (s.model, s.rank, s.value) for s in canonical.scalars if s.signal.startswith("lora_")}, canonical


def test_the_newest_series_is_the_state_and_the_lists_count_together() -> None:
    # 0.10-0.11: running and waiting apart; the newest (1.7000002e9) has a, b running and c waiting
    page = REAL_PAGE + HEADER + lora_series("2", "", "a,b", 1.7e9) + lora_series("2", "c,a", "a,b", 1.7000002e9) \
        + lora_series("2", "", "a", 1.7000001e9)
    found, canonical = slots(page)
    assert found == {"lora_max_adapters": ("tiny", "0", 2.0), "lora_adapters_in_demand": ("tiny", "0", 3.0),
                     "lora_slot_wait": ("tiny", "0", 1.0)}
    assert canonical.problems == []
    # 0.34: both lists every adapter in flight; two adapters in two slots wait for nothing
    found, _ = slots(REAL_PAGE + HEADER + lora_series("2", "a,b", "a,b", 1.8e9) + lora_series("4", "", "", 1.7e9))
    assert [found[k][2] for k in ("lora_max_adapters", "lora_adapters_in_demand", "lora_slot_wait")] == [2.0, 2.0, 0.0]


def test_adapter_names_are_counted_bounded_and_never_break_the_page_or_leave_it() -> None:
    nasty = r'a\"b,c\\d,e\nf,  ,\"},x=\"1' + ",g" * 3  # escaped quote, backslash, newline, label-like text
    page = REAL_PAGE + HEADER + lora_series("1", nasty, "", 1.8e9)
    found, canonical = slots(page)
    # a"b, c\d, e<newline>f, "}, x="1, g: six names (the blank dropped, g counted once)
    assert found["lora_adapters_in_demand"][2] == 6.0 and found["lora_slot_wait"][2] == 1.0
    assert canonical.problems == []
    kept = repr(canonical)
    assert "c\\\\d" not in kept and '"},x=' not in kept and "a\\\"b" not in kept  # no name is kept
    many = ",".join(f"adapter-{i}" for i in range(MAX_COUNTED_ADAPTERS + 500))
    found, _ = slots(REAL_PAGE + HEADER + lora_series("8", many, many, 1.8e9))
    assert found["lora_adapters_in_demand"][2] == MAX_COUNTED_ADAPTERS


@pytest.mark.parametrize("max_lora", ["", "x", "0", "-1", "2.5"])
def test_a_series_without_a_positive_integer_max_lora_is_not_read_and_says_so(max_lora: str) -> None:
    found, canonical = slots(REAL_PAGE + HEADER + lora_series(max_lora, "a,b,c", "a", 1.9e9)
                             + lora_series("4", "a", "a", 1.8e9))
    assert found["lora_max_adapters"][2] == 4.0 and found["lora_adapters_in_demand"][2] == 1.0  # the valid one
    assert canonical.problems == ["vllm:lora_requests_info: 1 series with a max_lora that is no positive integer "
                                  "(not read)"]


def test_without_a_model_on_the_page_nothing_is_attached() -> None:
    page = parse_page(HEADER + lora_series("2", "a,b,c", "a", 1.8e9), keep=ADAPTERS["vllm"].families.__contains__)
    canonical = ADAPTERS["vllm"].to_canonical(page)
    assert [s for s in canonical.scalars if s.signal.startswith("lora_")] == []
    assert "lora_" not in repr(slots(REAL_PAGE)[0])  # no LoRA: no gauges
