"""Benchmark app.exposition.parser against prometheus_client's text parser.

    python3 bench/parse_bench.py [--repeat N]

Runs on the real vLLM 0.32 page and on a synthetic 8-model page (every ``vllm:`` sample
line repeated with 8 different ``model_name`` labels), keeping ``vllm:`` families, and
prints per-parse times. Timing: ``time.perf_counter`` around ``repeat`` calls, garbage
collector off during the loop (as ``timeit`` does), best of 3 rounds -- the machine is
shared, and the minimum is the least noisy estimate of the code's own cost.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from app.exposition.parser import PageParser, ParsedPage, keep_prefixes  # noqa: E402

VLLM_PAGE = ROOT / "tests" / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom"
ROUNDS = 3


def _mean_seconds(call: Callable[[], object], repeat: int, rounds: int = ROUNDS) -> float:
    """Per-call mean over ``repeat`` calls, best of ``rounds`` rounds."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for _ in range(repeat):
                call()
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed / repeat)
    return best


def _with_new_values(page: bytes, variant: int) -> bytes:
    """The same page with every sample value changed (same series, same shape)."""
    out = []
    for line in page.decode().split("\n"):
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            line = f"{head} {float(value) + variant + 0.25!r}"
        out.append(line)
    return "\n".join(out).encode()


class _LineCacheOnly(PageParser):
    """A PageParser that never uses its page plan: the per-line cache path alone."""

    def parse(self, page: bytes | str) -> ParsedPage:
        from app.exposition.parser import _prepare

        return self._parse_text(_prepare(page), build_plan=False)[0]


def bench_parse(page: bytes, keep: Callable[[str], bool] | None, repeat: int) -> dict:
    """Per-parse mean seconds of (a) prometheus_client's parser, (b) PageParser cold (a
    new parser per call), (c) PageParser warm (one parser, same page again and again),
    plus (d) warm with all values changing between calls and (e) warm without the page
    plan (line cache only), and speedups relative to (a).

    prometheus_client runs ``max(3, repeat // 10)`` times (it is ~40x slower).
    """
    text_calls = max(3, repeat // 10)
    oracle = _mean_seconds(lambda: list(text_string_to_metric_families(page.decode("utf-8", "replace"))), text_calls)
    cold = _mean_seconds(lambda: PageParser(keep).parse(page), max(3, repeat // 5))

    warm_parser = PageParser(keep)
    first = warm_parser.parse(page)
    warm = _mean_seconds(lambda: warm_parser.parse(page), repeat)

    variants = [_with_new_values(page, i) for i in range(4)]
    changing_parser = PageParser(keep)
    changing_parser.parse(variants[-1])
    state = {"i": 0}

    def next_variant() -> ParsedPage:
        state["i"] = (state["i"] + 1) % len(variants)
        return changing_parser.parse(variants[state["i"]])

    warm_changing = _mean_seconds(next_variant, repeat)

    line_cache_parser = _LineCacheOnly(keep)
    line_cache_parser.parse(page)
    line_cache = _mean_seconds(lambda: line_cache_parser.parse(page), repeat)

    return {
        "bytes": len(page),
        "samples_seen": first.samples_seen,
        "samples_kept": first.samples_kept,
        "prometheus_client_s": oracle,
        "cold_s": cold,
        "warm_s": warm,
        "warm_new_values_s": warm_changing,
        "warm_line_cache_only_s": line_cache,
        "cold_speedup": oracle / cold,
        "warm_speedup": oracle / warm,
        "warm_new_values_speedup": oracle / warm_changing,
        "warm_line_cache_only_speedup": oracle / line_cache,
    }


def eight_model_page(page: bytes, models: int = 8) -> bytes:
    """Every ``vllm:`` sample line repeated with ``models`` different model_name labels."""
    out = []
    for line in page.decode().split("\n"):
        if line.startswith("vllm:") and 'model_name="' in line:
            out.extend(re.sub(r'model_name="[^"]*"', f'model_name="model-{i}"', line) for i in range(models))
        else:
            out.append(line)
    return "\n".join(out).encode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=300, help="parses per timing round (default 300)")
    args = parser.parse_args(argv)
    real = VLLM_PAGE.read_bytes()
    pages = [(VLLM_PAGE.name, real, args.repeat),
             ("synthetic 8-model vLLM page", eight_model_page(real), max(10, args.repeat // 8))]
    keep = keep_prefixes("vllm:")
    print(f"keep=keep_prefixes('vllm:'), Python {sys.version.split()[0]}; "
          "times per parse, speedup vs prometheus_client\n")
    header = (f"{'page':30s} {'kept/seen':>11s} {'prom_client':>11s} {'cold':>16s} {'warm':>16s} "
              f"{'warm,new vals':>16s} {'line cache only':>16s}")
    print(header)
    print("-" * len(header))
    for name, page, repeat in pages:
        r = bench_parse(page, keep, repeat)

        def cell(key: str, r: dict = r) -> str:
            return f"{r[key + '_s'] * 1e3:8.3f} ms {r[key + '_speedup']:4.0f}x"

        print(
            f"{name:30s} {r['samples_kept']:>5d}/{r['samples_seen']:<5d} {r['prometheus_client_s'] * 1e3:8.3f} ms"
            f" {cell('cold'):>16s} {cell('warm'):>16s} {cell('warm_new_values'):>16s}"
            f" {cell('warm_line_cache_only'):>16s}"
        )


if __name__ == "__main__":
    main()
