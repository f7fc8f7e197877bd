"""Per-target scrape limits: a page past ``sample_limit`` or ``series_limit`` is refused by the
scraper, one whose new series would take its target past ``stored_series_limit`` by the writer;
the target is down for that scrape with the limit and the count named, nothing of the page is
stored, and the other targets of the batch are. A target that renames its models every scrape
stops at its limit: its series, and what the writer and the parser keep of it, stay as they
are. A histogram of 20,000 buckets goes through the whole path exactly, on both databases."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.core.limits import DEFAULT_SAMPLE_LIMIT, DEFAULT_SERIES_LIMIT
from app.exposition.parser import PageParser
from app.scrape.client import DEFAULT_MAX_PAGE_BYTES
from app.scrape.jobs import PageProcessor, ScrapeSpec, TargetScraper
from app.store import repository
from app.store.models import ScrapeSample, Series, TargetInfo
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository

REAL = (Path(__file__).parent.parent / "fixtures" / "exposition" / "vllm-0.32-cpu-real.prom").read_text()
T0 = 1_700_006_400.0
#: the real page's stored series (11 histograms, 9 gauges and counters) and infos (cache_config,
#: which has no model label, and sleep_state, which has), and its kept samples
HISTOGRAMS, SCALARS, INFOS, KEPT = 11, 9, 2, 250


def page_of(models: list[str], text: str = REAL) -> bytes:
    """The real vLLM page serving ``models``: each family's TYPE block once, its model lines once
    per model (``model_name`` replaced), its other lines once."""
    lines: list[str] = []
    block: list[str] = []
    comments = True

    def flush() -> None:
        samples = [line for line in block if not line.startswith("#")]
        lines.extend(line for line in block if line.startswith("#"))
        for model in models:
            lines.extend(s.replace('model_name="tiny"', f'model_name="{model}"') for s in samples
                         if 'model_name="tiny"' in s)
        lines.extend(s for s in samples if 'model_name="tiny"' not in s)

    for line in text.splitlines():
        if line.startswith("#") and not comments:
            flush()
            block = []
        comments = line.startswith("#")
        block.append(line)
    flush()
    return ("\n".join(lines) + "\n").encode()


class Scrapes:
    """Targets scraped through their :class:`TargetScraper` at simulated times, written in
    batches by one writer that tells which scrapes it refused."""

    def __init__(self, engine, sessions) -> None:
        self.engine, self.sessions = engine, sessions
        self.refused: list[ScrapeRecord] = []
        self.writer = SampleWriter(engine, self.refused.append)
        self.scrapers: dict[str, TargetScraper] = {}

    def add(self, name: str, **limits: int) -> TargetScraper:
        with self.sessions.begin() as session:
            target = target_repository.get_target(session, name) or target_repository.create_target(
                session, name=name, url=f"http://127.0.0.1:1/{name}", engine="vllm", labels={})
            spec = replace(ScrapeSpec(target.id, name, target.url, "vllm"), **limits)
        self.scrapers[name] = scraper = TargetScraper(spec, None, lambda record: None)  # type: ignore[arg-type]
        return scraper

    def batch(self, ts: float, pages: dict[str, bytes]) -> dict[str, ScrapeRecord]:
        """Each named target's page scraped at ``ts``, all written in one batch; the records as
        stored (the scraper's, or the writer's refusal)."""
        records = [self.scrapers[name]._build_record(body, ts, 0.0) for name, body in pages.items()]
        before = len(self.refused)
        assert self.writer.write(records) == len(records)
        refused = {r.target_id: r for r in self.refused[before:]}
        return {name: refused.get(r.target_id, r) for name, r in zip(pages, records)}

    def rows(self, name: str) -> tuple[int, int, int]:
        """(series, info rows, sample rows) the target has stored."""
        target_id = self.scrapers[name].spec.id
        with self.engine.connect() as conn:
            return tuple(conn.scalar(select(func.count()).select_from(table).where(table.target_id == target_id))
                         for table in (Series, TargetInfo, ScrapeSample))  # type: ignore[return-value]


def test_the_largest_real_page_the_byte_cap_lets_through_is_within_the_default_limits() -> None:
    """The defaults' argument (app/core/limits.py): the real vLLM page repeated per model up to the
    4 MiB page cap is 123 models, 30,628 kept samples and 2,584 series."""
    def size(models: int) -> int:
        return len(page_of([f"model-{i:03d}" for i in range(models)]))

    one, each = size(1), size(2) - size(1)  # the page grows by the same bytes per model
    models = 1 + (DEFAULT_MAX_PAGE_BYTES - one) // each
    assert size(models) <= DEFAULT_MAX_PAGE_BYTES < size(models + 1)
    page, canonical, error = PageProcessor("vllm").process(page_of([f"model-{i:03d}" for i in range(models)]))
    assert error is None and canonical is not None and not canonical.problems
    series = len(canonical.histograms) + len(canonical.scalars) + len(canonical.infos)
    assert (models, page.samples_kept, series) == (123, 30_628, 2_584)
    assert series == models * (HISTOGRAMS + SCALARS + 1) + 1
    assert (round(DEFAULT_SAMPLE_LIMIT / page.samples_kept, 2), round(DEFAULT_SERIES_LIMIT / series, 2)) == (1.63, 1.93)


@pytest.mark.parametrize(("limits", "refusal"), [
    ({"sample_limit": KEPT, "series_limit": HISTOGRAMS + SCALARS + INFOS}, None),  # at each limit: taken
    ({"sample_limit": KEPT - 1}, ("too_many_samples", "the page has 250 samples of the engine's families, over the "
                                                      "target's sample_limit of 249; nothing of it was stored")),
    ({"series_limit": 21}, ("too_many_series", "the page has 22 series (histograms, gauges, counters and infos per "
                                               "model and rank), over the target's series_limit of 21; nothing of it "
                                               "was stored")),
])
def test_a_page_past_a_limit_is_refused_and_the_rest_of_the_batch_is_stored(store, limits, refusal) -> None:
    engine, sessions, _ = store
    scrapes = Scrapes(engine, sessions)
    scrapes.add("odd", **limits)
    scrapes.add("steady")
    body = page_of(["tiny"])
    stored = scrapes.batch(T0, {"odd": body, "steady": body})
    assert (stored["steady"].up, stored["steady"].error_class) == (True, None)
    assert scrapes.rows("steady") == (HISTOGRAMS + SCALARS, INFOS, 1)
    odd = stored["odd"]
    if refusal is None:
        assert (odd.up, odd.error_class, odd.samples_kept) == (True, None, KEPT)
        assert scrapes.rows("odd") == (HISTOGRAMS + SCALARS, INFOS, 1)
        return
    assert (odd.up, odd.error_class, odd.error, odd.samples_kept, odd.canonical) == (False, *refusal, 0, None)
    assert odd.samples_seen == 445 and odd.bytes == len(body)
    assert scrapes.rows("odd") == (0, 0, 0)
    with sessions() as session:
        (log,) = repository.scrape_log(session, scrapes.scrapers["odd"].spec.id)
    assert (log.up, log.error_class, log.error, log.samples_kept) == (False, *refusal, 0)
    assert scrapes.refused == []  # refused by the scraper: the writer only stored it


def test_a_target_renaming_its_models_every_scrape_stops_at_its_stored_series_limit(store) -> None:
    """Each rename brings 21 new rows (20 series and the model's sleep_state info; cache_config
    has no model label): with a limit of 200 the first 9 scrapes are stored (22 + 8 x 21 = 190
    rows), every later one is refused. What the target has stored and what the writer and the
    parser keep of it stay as they are, a restarted writer refuses as well, and a page of the
    models it has stored is still taken."""
    engine, sessions, _ = store
    scrapes = Scrapes(engine, sessions)
    rotating = scrapes.add("rotating", stored_series_limit=200)
    scrapes.add("steady")
    steady = page_of(["tiny"])
    writer = scrapes.writer

    def sizes() -> tuple[int, ...]:
        parser: PageParser = rotating.processor._parser
        return (len(writer._series), len(writer._open), len(writer._infos), len(writer._bounds_keys),
                len(parser._comments), len(parser._untyped), *scrapes.rows("rotating"))

    seen = []
    for i in range(40):
        stored = scrapes.batch(T0 + 15 * i, {"rotating": page_of([f"m{i}"]), "steady": steady})
        assert (stored["steady"].up, stored["steady"].error_class) == (True, None)
        seen.append((stored["rotating"].up, stored["rotating"].error_class))
        if i == 9:
            at_limit = sizes()
        if i >= 9:
            assert sizes() == at_limit
            assert stored["rotating"].error == (
                "the page has 21 new series and the target 190 stored, over its stored_series_limit of 200; "
                "nothing of it was stored: raise the limit, or delete the target to drop its series")
    assert seen == [(True, None)] * 9 + [(False, "too_many_series")] * 31
    assert [r.target_id for r in scrapes.refused] == [rotating.spec.id] * 31
    assert scrapes.rows("rotating") == (9 * 20, 1 + 9, 9)
    # series ids and open intervals of both targets' series, infos of both (2 + 10), the rows
    assert at_limit[:3] + at_limit[6:] == (180 + 20, 180 + 20, 2 + 10, 180, 10, 9)
    assert scrapes.rows("steady") == (20, 2, 40)
    assert len(rotating.processor._parser._series) <= 10_000  # the line cache: bounded, cleared when full

    restarted = Scrapes(engine, sessions)  # a new writer: the count is the database's
    restarted.add("rotating", stored_series_limit=200)
    again = restarted.batch(T0 + 15 * 40, {"rotating": page_of(["m40"])})["rotating"]
    assert (again.up, again.error_class) == (False, "too_many_series") and "190 stored" in again.error
    known = restarted.batch(T0 + 15 * 41, {"rotating": page_of(["m3"])})["rotating"]
    assert (known.up, known.error_class, known.samples_kept) == (True, None, KEPT)
    assert restarted.rows("rotating") == (180, 10, 10)


def test_a_label_wider_than_the_store_keeps_is_refused_by_name(store) -> None:
    """PostgreSQL refuses a 257-character model (its column's width) and SQLite would store it:
    both refuse the scrape, before the insert could fail the batch."""
    engine, sessions, _ = store
    scrapes = Scrapes(engine, sessions)
    scrapes.add("wide")
    scrapes.add("steady")
    stored = scrapes.batch(T0, {"wide": page_of(["x" * 257]), "steady": page_of(["tiny"])})
    wide = stored["wide"]
    assert (wide.up, wide.error_class, wide.error) == (
        False, "label_too_long", "a new series' model label has 257 characters; the store keeps at most 256")
    assert scrapes.rows("wide") == (0, 0, 0) and scrapes.rows("steady") == (20, 2, 1)
    assert scrapes.batch(T0 + 15, {"wide": page_of(["x" * 256])})["wide"].up


def big_histogram_page(counts: list[float], total: float) -> bytes:
    """A vLLM page with one TTFT histogram of ``len(counts)`` buckets (the last one +Inf)."""
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for i, count in enumerate(counts):
        le = "+Inf" if i == len(counts) - 1 else repr(0.001 * (i + 1))
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {count!r}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total!r}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {counts[-1]!r}')
    return ("\n".join(lines) + "\n").encode()


def test_a_20000_bucket_histogram_is_stored_and_read_back_exactly(store) -> None:
    """20,002 samples (under the default sample_limit), 80 kB of uint32 counts in the first
    scrape and 160 kB of float64 ones in the second (a count of 2**32 and more): both past the
    uint16 length of a short entry, both exact."""
    engine, sessions, _ = store
    scrapes = Scrapes(engine, sessions)
    scrapes.add("wide")
    first = [float(3 * i) for i in range(20_000)]
    second = [float(2**32 + 7 * i) for i in range(20_000)]
    for ts, counts in ((T0, first), (T0 + 15, second)):
        stored = scrapes.batch(ts, {"wide": big_histogram_page(counts, 12.5)})["wide"]
        assert (stored.up, stored.error_class, stored.samples_kept) == (True, None, 20_002)
    with sessions() as session:
        (series,) = repository.find_series(session, [scrapes.scrapers["wide"].spec.id], ["ttft"])
        snapshots = repository.histogram_snapshots(session, [series.id], T0, T0 + 15)[series.id]
    assert len(series.bounds) == 20_000 and series.bounds[-1] == math.inf
    assert series.bounds[:-1] == tuple(0.001 * (i + 1) for i in range(19_999))
    assert [(s.ts, s.counts, s.sum, s.count) for s in snapshots] == [
        (T0, tuple(first), 12.5, first[-1]), (T0 + 15, tuple(second), 12.5, second[-1])]
    with engine.connect() as conn:
        sizes = sorted(len(blob) for blob in conn.scalars(select(ScrapeSample.samples)))
    # a long entry's head is 11 bytes: the 7 of a short one and its uint32 length
    assert sizes == [11 + 1 + 4 * 20_000 + 16, 11 + 1 + 8 * 20_000 + 16]

