"""Hand-over between two replicas on PostgreSQL, in one process on a simulated clock: the old
owner's event loop is too busy to drop the target's scrape job, yet it neither starts a scrape
nor writes one after the hand-over (its heartbeat thread's view fences it), so no stretch of
the target's history is scraped and written twice."""

from __future__ import annotations

import asyncio

import pytest

from app.replicas.membership import Membership, Ownership, owner
from app.runtime import scheduling
from app.scrape.jobs import ScrapeSpec
from app.scrape.scheduler import ScrapeService
from app.store import db, repository
from app.targets import repository as target_repository
from app.telemetry import Telemetry
from tests.conftest import scratch_postgres_database
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer

HEARTBEAT, EXPIRY = 5.0, 15.0
A, B = "r-a", "r-b"
NAME = next(f"t{i}" for i in range(100) if owner(f"t{i}", [A, B]) == B)  # moves from A to B when B joins


@pytest.mark.parametrize("a_heartbeat_on_time", [True, False], ids=["heartbeat-on-time", "heartbeat-stalled"])
def test_the_old_owner_neither_scrapes_nor_writes_a_target_handed_over(a_heartbeat_on_time: bool) -> None:
    clock = {"now": 0.0}

    def now() -> float:
        return clock["now"]

    with scratch_postgres_database() as database, StaticPageServer(VllmPage().render()) as page:
        db.upgrade(database.url)
        engine = db.make_engine(database.url)
        sessions = db.make_sessionmaker(engine)
        with sessions.begin() as session:
            target_id = target_repository.create_target(session, name=NAME, url=page.url, engine="vllm", labels={}).id
        spec = ScrapeSpec(target_id, NAME, page.url, "vllm", 15.0, 2.0)
        members = {r: Membership(sessions, r, EXPIRY, clock=now, shared_clock=lambda _: now()) for r in (A, B)}
        ownerships = {r: Ownership(r, 1.5 * HEARTBEAT) for r in (A, B)}
        telemetry = {r: Telemetry() for r in (A, B)}

        def owns(replica: str):  # what the Monitor wires: the heartbeat's view, on this clock
            return lambda target: ownerships[replica].holds(target, members[replica].view, now())

        services = {r: ScrapeService(engine, telemetry[r], scheduling.make_scheduler(), owns=owns(r)) for r in (A, B)}

        async def scrape(replica: str, at: float, finishes_at: float | None = None, meanwhile=None) -> None:
            clock["now"] = at
            service = services[replica]
            fetch = service.fetcher.fetch
            if finishes_at is not None:  # a slow page: the hand-over happens while it is fetched
                async def slow(url: str, timeout: float):
                    fetched = await fetch(url, timeout)
                    if meanwhile is not None:
                        meanwhile()
                    clock["now"] = finishes_at
                    return fetched
                service.fetcher.fetch = slow  # type: ignore[method-assign]
            try:
                await service._run_job(service.scrapers[NAME])
            finally:
                service.fetcher.fetch = fetch  # type: ignore[method-assign]
            await service.flush()
            await asyncio.sleep(0.002)  # distinct millisecond timestamps for the next scrape

        def beat(replica: str, at: float) -> None:
            clock["now"] = at
            members[replica].beat()

        async def run() -> None:
            for service in services.values():
                await service.fetcher.start()
            beat(A, 0.0)
            owned, _ = ownerships[A].update([NAME], members[A].live, 0.0)
            assert owned == {NAME}
            services[A].sync_targets([spec])
            await scrape(A, 1.0)                      # written: A alone
            beat(B, 2.0)                              # B joins and waits 7.5 s for A to drop the target
            owned, _ = ownerships[B].update([NAME], members[B].live, 2.0)
            assert owned == set() and ownerships[B].next_change_at() == 9.5
            await scrape(A, 3.0)                      # written: A has not seen B yet, and B waits
            # From here A's event loop is "busy": it never re-reads ownership, its job stays scheduled.
            if a_heartbeat_on_time:
                # started owned; while the page is fetched the heartbeat thread sees B: not written
                await scrape(A, 4.0, finishes_at=6.0, meanwhile=lambda: beat(A, 5.0))
                await scrape(A, 7.0)                  # not started
            else:                                     # no heartbeat since 0: the view expires at 7.5
                await scrape(A, 4.0, finishes_at=8.0)  # finished past the view's age: not written
                await scrape(A, 7.0)                  # written: still before B may take over
                await scrape(A, 8.0)                  # not started
            beat(B, 7.0)
            clock["now"] = 9.5
            owned, taken = ownerships[B].update([NAME], members[B].live, 9.5)
            assert owned == taken == {NAME}
            services[B].sync_targets([spec], immediate=taken)
            await scrape(B, 9.5)                      # written: B scrapes at once
            await scrape(A, 10.0)                     # not started
            await scrape(B, 11.0)                     # written
            assert NAME in services[A].scrapers       # A's job is still there: the fence stopped it
            for service in services.values():
                await service.fetcher.close()

        try:
            asyncio.run(run())
            with sessions() as session:
                times = repository.scrape_times(session, target_id, 0.0, 2e10)
                series = repository.find_series(session, [target_id], ("ttft",))
                snapshots = repository.histogram_snapshots(session, [s.id for s in series], 0.0, 2e10)
        finally:
            engine.dispose()
    by_a = 3 if not a_heartbeat_on_time else 2
    assert len(times) == by_a + 2 == len(set(times))
    assert [s.ts for s in snapshots[series[0].id]] == times  # one snapshot per scrape, each written once
    stopped = telemetry[A].not_owned
    assert stopped.labels("write")._value.get() == 1.0 and stopped.labels("scrape")._value.get() == 2.0
    assert telemetry[B].not_owned.labels("scrape")._value.get() == 0.0
