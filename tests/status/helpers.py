"""Helpers of the status-page tests: emulated pages, synthetic history, HTML slicing."""

from __future__ import annotations

import html
import re

from app.emulator.simulation import Simulation
from app.scrape.jobs import PageProcessor
from app.store.record import ScrapeRecord


def stepping_page(scenario: str, engine: str = "vllm", seconds_per_scrape: float = 5.0, warmup: float = 30.0):
    """A page callable: every request advances the emulated engine, like real time passing."""
    sim = Simulation(scenario, engine=engine, seed=4)
    sim.run_for(warmup)

    def page() -> bytes:
        sim.run_for(seconds_per_scrape)
        return sim.render_metrics()
    return page


def history_records(target_ids: list[int], end: float, snapshots: int, every: float = 60.0,
                    scenario: str = "healthy", simulated: float = 5.0) -> list[ScrapeRecord]:
    """``snapshots`` scrapes ``every`` seconds up to ``end`` for each target, from one emulated engine
    (parsed once per step; ``simulated`` engine seconds per step): an hour of data without waiting an hour."""
    sim = Simulation(scenario, seed=1)
    sim.run_for(30)
    processor = PageProcessor("vllm")
    records = []
    for k in range(snapshots):
        sim.run_for(simulated)
        body = sim.render_metrics()
        page, canonical, error_class = processor.process(body)
        ts = round(end - (snapshots - 1 - k) * every, 3)
        for target_id in target_ids:
            records.append(ScrapeRecord(target_id, ts, True, 0.01, len(body), page.samples_seen, page.samples_kept,
                                        0, "vllm", error_class, None, canonical))
    return records


def rows(page: str) -> dict[str, str]:
    """The index's fleet table in page order: target name -> the row's HTML."""
    found = re.findall(r'<tr class="level-\w+" data-target="([^"]+)"[^>]*>(.*?)</tr>', page, re.S)
    return {html.unescape(name): body for name, body in found}


def levels(page: str) -> dict[str, str]:
    """The index's fleet table in page order: target name -> its level (the row's colour class)."""
    found = re.findall(r'<tr class="level-(\w+)" data-target="([^"]+)" data-level="(\w+)"', page)
    assert all(css == level for css, _, level in found)
    return {html.unescape(name): level for _, name, level in found}


def stat(row: str, name: str) -> tuple[str, str]:
    """(data-value, text) of a fleet-table number such as ``ttft-p50``."""
    match = re.search(rf'<td class="num" data-stat="{name}" data-value="([^"]*)"[^>]*>([^<]*)', row)
    assert match, f"no stat {name!r} in row"
    return match.group(1), html.unescape(match.group(2)).strip()


def text_of(fragment: str) -> str:
    """Visible text of an HTML fragment, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())
