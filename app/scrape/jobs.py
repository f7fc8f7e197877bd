"""One scrape of one target: fetch -> parse (only the wanted families) -> canonical signals.

Nothing here raises on bad targets: a down, slow, oversized or garbage-serving target
produces a :class:`ScrapeRecord` with ``up=False`` and a classified error, and the
other targets never notice. A record's message names the position and kind of a problem,
never the page's text (see :mod:`app.exposition.parser`): every API reader sees it. An
unexpected exception is logged in full and recorded by its type only, since its message
may quote the page.

A page with more samples of the engine's families than the target's ``sample_limit`` is
refused before it is adapted (``too_many_samples``), one with more stored series than its
``series_limit`` after (``too_many_series``): the target is down for that scrape and nothing
of the page is stored, as Prometheus does past ``sample_limit``. The record carries the
target's ``stored_series_limit`` to the writer, which alone knows what the target has stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.core.limits import DEFAULT_SAMPLE_LIMIT, DEFAULT_SERIES_LIMIT, DEFAULT_STORED_SERIES_LIMIT
from app.exposition.parser import PageParser, ParsedPage
from app.scrape.client import PageFetcher, ScrapeError
from app.scrape.load_balancing import MESSAGE as LOAD_BALANCED
from app.scrape.load_balancing import ReplicaDetector, counter_values, process_start_time
from app.sources import ADAPTERS, DETECTION_PREFIXES, detect_engine, trtllm
from app.sources.base import Canonical
from app.store.record import ScrapeRecord

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ScrapeSpec:
    """What the scheduler needs to know about a target (a detached copy of the DB row)."""

    id: int
    name: str
    url: str
    engine: str = "auto"
    interval: float = 15.0
    timeout: float = 10.0
    labels: dict[str, str] = field(default_factory=dict)
    sample_limit: int = DEFAULT_SAMPLE_LIMIT
    series_limit: int = DEFAULT_SERIES_LIMIT
    stored_series_limit: int = DEFAULT_STORED_SERIES_LIMIT


def _internal_error(exc: Exception, doing: str) -> str:
    return f"{type(exc).__name__} while {doing}; the service log has the details"


def _detect_keep(name: str) -> bool:
    return name.startswith(DETECTION_PREFIXES)


#: What a page without any engine's families is told; trtllm-serve's own words when it was recognised.
NO_ENGINE_METRICS = ("page has no vLLM, TGI, SGLang or TensorRT-LLM metrics; this target cannot be diagnosed "
                     "from metrics")


class PageProcessor:
    """Parse + adapt for one target. Keeps the parser (and its line cache) across scrapes.

    With ``engine="auto"`` the first page is parsed with every adapter's prefixes to
    detect the engine; afterwards only the detected adapter's families are kept.
    """

    def __init__(self, engine: str = "auto") -> None:
        self.configured = engine
        self.engine: str | None = None if engine == "auto" else engine
        self._parser = self._make_parser()

    def _make_parser(self) -> PageParser:
        if self.engine is None:
            return PageParser(keep=_detect_keep)
        families = ADAPTERS[self.engine].families
        return PageParser(keep=families.__contains__)

    def process(self, body: bytes | str, sample_limit: int | None = None
                ) -> tuple[ParsedPage, Canonical | None, str | None]:
        """Returns (parsed page, canonical signals or None, error class or None).

        ``wrong_endpoint``: the answer is trtllm-serve's JSON iteration statistics (its
        ``/metrics``), recognised from the first bytes without parsing the rest; a page with
        more kept samples than ``sample_limit`` is not adapted (``too_many_samples``)."""
        if trtllm.is_iteration_stats(body):
            return ParsedPage({}, 0, 0, 0, []), None, "wrong_endpoint"
        page = self._parser.parse(body)
        if self.engine is None:
            detected = detect_engine(page)
            if detected is not None:
                self.engine = detected
                self._parser = self._make_parser()
                page = self._parser.parse(body)
        if self.engine is None or not page.families:
            if page.samples_seen == 0 and page.malformed:
                return page, None, "parse_error"
            return page, None, "no_engine_metrics"
        if sample_limit is not None and page.samples_kept > sample_limit:
            return page, None, "too_many_samples"
        canonical = ADAPTERS[self.engine].to_canonical(page)
        return page, canonical, None


class TargetScraper:
    """The scheduled job for one target."""

    def __init__(self, spec: ScrapeSpec, fetcher: PageFetcher, sink: Callable[[ScrapeRecord], None],
                 on_result: Callable[[ScrapeSpec, ScrapeRecord], None] | None = None) -> None:
        self.spec = spec
        self.fetcher = fetcher
        self.sink = sink
        self.on_result = on_result
        self.processor = PageProcessor(spec.engine)
        self.replicas = ReplicaDetector()
        self.last: ScrapeRecord | None = None

    async def run(self) -> ScrapeRecord:
        spec = self.spec
        started = round(time.time(), 3)  # Prometheus' millisecond resolution
        t0 = time.perf_counter()
        try:
            fetched = await self.fetcher.fetch(spec.url, spec.timeout)
        except ScrapeError as exc:
            record = ScrapeRecord(spec.id, started, False, time.perf_counter() - t0,
                                  error_class=exc.error_class, error=str(exc)[:500])
        except Exception as exc:  # never let one target's surprise stop the scheduler
            log.exception("unexpected error scraping %s", spec.name)
            record = ScrapeRecord(spec.id, started, False, time.perf_counter() - t0,
                                  error_class="internal", error=_internal_error(exc, "fetching the page"))
        else:
            record = self._build_record(fetched.body, started, t0)
        self.last = record
        self.sink(record)
        if self.on_result is not None:
            self.on_result(spec, record)
        return record

    def _over_limit(self, page: ParsedPage, canonical: Canonical | None, error_class: str | None
                    ) -> tuple[str, str] | None:
        """(error class, message) of a page past the target's ``sample_limit`` or ``series_limit``."""
        spec = self.spec
        if error_class == "too_many_samples":
            return error_class, (f"the page has {page.samples_kept:,} samples of the engine's families, over the "
                                 f"target's sample_limit of {spec.sample_limit:,}; nothing of it was stored")
        series = 0 if canonical is None else len(canonical.histograms) + len(canonical.scalars) + len(canonical.infos)
        if series > spec.series_limit:
            return "too_many_series", (f"the page has {series:,} series (histograms, gauges, counters and infos per "
                                       f"model and rank), over the target's series_limit of {spec.series_limit:,}; "
                                       "nothing of it was stored")
        return None

    def _build_record(self, body: bytes, started: float, t0: float) -> ScrapeRecord:
        spec = self.spec
        try:
            page, canonical, error_class = self.processor.process(body, spec.sample_limit)
        except Exception as exc:
            log.exception("processing the page of %s failed", spec.name)
            return ScrapeRecord(spec.id, started, False, time.perf_counter() - t0, len(body),
                                error_class="internal", error=_internal_error(exc, "processing the page"))
        refused = self._over_limit(page, canonical, error_class)
        if refused is not None:
            return ScrapeRecord(spec.id, started, False, time.perf_counter() - t0, len(body), page.samples_seen, 0,
                                page.malformed, self.processor.engine, *refused)
        errors = list(page.errors[:3])
        if canonical is not None:
            errors = canonical.problems[:3] + errors
        up = error_class not in ("parse_error", "wrong_endpoint")
        engine = self.processor.engine
        if error_class == "no_engine_metrics":
            errors.insert(0, trtllm.NOTHING_YET if engine == "trtllm" else NO_ENGINE_METRICS)
        elif error_class == "wrong_endpoint":
            engine = "trtllm"  # recognised by its answer, whatever the target was configured as
            errors.insert(0, trtllm.WRONG_ENDPOINT)
        elif error_class is None and (page.malformed or (canonical and canonical.problems)):
            error_class = "partial"
        if canonical is not None:
            evidence = self.replicas.observe(process_start_time(body), counter_values(canonical))
            if evidence is not None:  # mixed replicas: no sample of this page may be used
                return ScrapeRecord(spec.id, started, True, time.perf_counter() - t0, len(body), page.samples_seen,
                                    0, page.malformed, self.processor.engine, "load_balanced",
                                    LOAD_BALANCED.format(evidence=evidence)[:1000])
        return ScrapeRecord(
            spec.id, started, up, time.perf_counter() - t0, len(body), page.samples_seen, page.samples_kept,
            page.malformed, engine, error_class, "; ".join(errors)[:1000] or None, canonical,
            spec.stored_series_limit,
        )
