"""A target whose page renames its models every scrape: series and memory with the stored
series limit against the same target without one, measured in the same run.

Not a test. Each mode runs in a process of its own (so its RSS is its own): a scraper and a
writer as the service has them (``TargetScraper`` -> ``SampleWriter.write``, SQLite in a temp
file), one target serving the real vLLM page (tests/fixtures/exposition) under a new
``model_name`` each scrape, another serving it unchanged, both written in one batch a scrape.
``limited`` is the default ``stored_series_limit`` (10,000 series and info rows); ``unlimited``
sets it out of reach, as the service was before the limit. RSS is read from
``/proc/self/status`` after a garbage collection and ``malloc_trim`` (``app/runtime/malloc.py``)
after 10 scrapes, after 500 (the limited target stops at its 477th) and at the end.

Run from the repository root::

    python -m bench.rotating_labels                 # 4,400 scrapes a mode (≈ 92,000 rows unlimited)
    python -m bench.rotating_labels --scrapes 600   # a quick run
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("unlimited", "limited")


def rss_mb() -> float:
    from app.runtime import malloc

    gc.collect()
    malloc.trim()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(mode: str, scrapes: int) -> dict:
    """One mode, in this process: what it stored and what it held."""
    from dataclasses import replace

    from sqlalchemy import func, select

    from app.core.limits import DEFAULT_STORED_SERIES_LIMIT, MAX_SCRAPE_LIMIT
    from app.runtime import malloc
    from app.scrape.jobs import ScrapeSpec, TargetScraper
    from app.store import db
    from app.store.models import Series, TargetInfo
    from app.store.writer import SampleWriter
    from app.targets import repository as target_repository
    from tests.scrape.test_limits import page_of

    malloc.configure()
    limit = DEFAULT_STORED_SERIES_LIMIT if mode == "limited" else MAX_SCRAPE_LIMIT
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        db.upgrade(url)
        engine = db.make_engine(url)
        sessions = db.make_sessionmaker(engine)
        scrapers, refused = {}, []
        with sessions.begin() as session:
            for name in ("rotating", "steady"):
                target = target_repository.create_target(session, name=name, url=f"http://127.0.0.1:1/{name}",
                                                         engine="vllm", labels={})
                spec = replace(ScrapeSpec(target.id, name, target.url, "vllm"), stored_series_limit=limit)
                scrapers[name] = TargetScraper(spec, None, lambda record: None)  # type: ignore[arg-type]
        writer = SampleWriter(engine, refused.append)
        steady = page_of(["tiny"])
        t0, started = 1_700_006_400.0, time.perf_counter()
        rss = {}
        for i in range(scrapes):
            ts = t0 + 15 * i
            writer.write([scrapers["rotating"]._build_record(page_of([f"m{i}"]), ts, time.perf_counter()),
                          scrapers["steady"]._build_record(steady, ts, time.perf_counter())])
            if i + 1 in (10, 500):
                rss[i + 1] = rss_mb()
        seconds = time.perf_counter() - started
        after = rss_mb()
        with engine.connect() as conn:
            rows = {table.__tablename__: conn.scalar(select(func.count()).select_from(table))
                    for table in (Series, TargetInfo)}
        parser = scrapers["rotating"].processor._parser
        engine.dispose()
    return {"mode": mode, "scrapes": scrapes, "refused": len(refused), "series": rows["series"],
            "infos": rows["target_info"], "rss_10": rss.get(10, 0.0), "rss_500": rss.get(500, 0.0),
            "rss_end": after, "seconds": seconds,
            "writer_series": len(writer._series), "writer_open": len(writer._open), "writer_infos": len(writer._infos),
            "parser_lines": len(parser._series)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=4_400)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child process's
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run(args.mode, args.scrapes)))
        return
    results = {}
    for mode in MODES:
        out = subprocess.run([sys.executable, "-m", "bench.rotating_labels", "--mode", mode,
                              "--scrapes", str(args.scrapes)], cwd=ROOT, check=True, capture_output=True, text=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    base, ours = results["unlimited"], results["limited"]
    print(f"{args.scrapes:,} scrapes of a target renaming its models every scrape (+ one steady target)\n")
    print("| | unlimited (baseline) | limited (default) | ratio |")
    print("|---|---|---|---|")
    rows = [("series rows", "series"), ("info rows", "infos"), ("scrapes refused", "refused"),
            ("writer: series ids cached", "writer_series"), ("writer: open intervals", "writer_open"),
            ("writer: infos cached", "writer_infos"), ("parser: line cache", "parser_lines")]
    for label, key in rows:
        ratio = f"{ours[key] / base[key]:.3f}" if base[key] else "-"
        print(f"| {label} | {base[key]:,} | {ours[key]:,} | {ratio} |")
    for label, key in (("RSS after 10 scrapes", "rss_10"), ("RSS after 500 scrapes", "rss_500"),
                       ("RSS at the end", "rss_end")):
        print(f"| {label} | {base[key]:.0f} MB | {ours[key]:.0f} MB | {ours[key] / max(base[key], 1e-9):.2f} |")
    for label, start in (("RSS growth from 10 scrapes on", "rss_10"), ("RSS growth from 500 scrapes on", "rss_500")):
        grew = {m: r["rss_end"] - r[start] for m, r in results.items()}
        print(f"| {label} | {grew['unlimited']:+.0f} MB | {grew['limited']:+.0f} MB | |")
    print(f"| wall time | {base['seconds']:.0f} s | {ours['seconds']:.0f} s | "
          f"{ours['seconds'] / base['seconds']:.2f} |")


if __name__ == "__main__":
    main()
