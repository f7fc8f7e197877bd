"""``GET /api/v1/targets/{name}/changes`` and the events endpoints over the built-in store, on an
emulated engine whose load doubles at a known simulated time."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.attribution import repository as events_repository
from app.attribution.events import ChangeEvent
from app.emulator.scenarios import ScenarioPlan
from app.store.models import ChangeEventRow
from tests.api.conftest import Service, make_quiet_service
from tests.api.test_openapi_schemas import validator
from tests.attribution.harness import CASES
from tests.diagnosis.harness import T0, OfflineTarget

CHANGE_AT, WINDOW = 300.0, 300.0
END = T0 + CHANGE_AT + WINDOW


@pytest.fixture(scope="module")
def load_step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineTarget]:
    """The load step of the scenario table, switched at 5 minutes (a shorter run)."""
    (_, first), (_, second) = CASES["load step"][0].phases
    plan = ScenarioPlan("load step", ((0.0, first), (CHANGE_AT, second)))
    target = OfflineTarget(tmp_path_factory.mktemp("load-step"), plan, seed=1)  # type: ignore[arg-type]
    target.run(CHANGE_AT + WINDOW)
    yield target
    target.close()


@pytest.fixture
def service(load_step: OfflineTarget, tmp_path: Path) -> Iterator[Service]:
    """The service on the recording; the events a test adds are gone before the next one."""
    for running in make_quiet_service(load_step.url, tmp_path):
        yield running
        with running.monitor.sessions.begin() as session:
            session.query(ChangeEventRow).delete()


def test_the_changes_of_a_load_step(service: Service) -> None:
    answer = service.client.get("/api/v1/targets/t/changes", params={"window": "5m", "end": END})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["target"] == "t" and body["changed"] and body["lead"] == "ttft"
    assert body["window"] == {"start": END - 300, "end": END}
    assert body["baseline"] == {"kind": "previous", "start": END - 600, "end": END - 300}
    assert body["summary"].startswith("TTFT p99 ") and "request rate +101% (2.86 → 5.75 req/s) with the same " \
        "prompts; no restart or config change." in body["summary"]
    top = body["drivers"][0]
    assert top["name"] == "load" and top["significant"] and top["before"] == pytest.approx(2.86, abs=0.01)
    ttft = body["signals"]["ttft"]
    # the components add up to the change of the mean, and the queue is nearly all of it
    total = ttft["change"]["mean"]
    assert math.isclose(math.fsum(c["change"] for c in ttft["components"]), total, abs_tol=1e-9)
    queue = next(c for c in ttft["components"] if c["name"] == "queue")
    assert queue["share"] > 0.95 and ttft["before"]["mean"] < 0.5 < 10 < ttft["after"]["mean"]
    assert top["share"]["ttft"] > 0.95 and ttft["explained"]["load"] == pytest.approx(top["explains"]["ttft"])
    assert ttft["not_explained"] == pytest.approx(total - math.fsum(ttft["explained"].values()))
    assert ttft["before"]["intervals"]["p99"][0] <= ttft["before"]["p99"]  # quantiles keep their bucket
    assert set(body["signals"]) == {"ttft", "itl", "e2e"} and body["gaps"] == []
    # the answer is what its OpenAPI schema says, and the check is not vacuous
    check = validator(service.client.get("/openapi.json").json(), "GET", "/api/v1/targets/{name}/changes")
    assert [e.message for e in check.iter_errors(body)] == []
    assert not check.is_valid({**body, "drivers": [{**top, "significant": "yes"}]})


def test_a_day_earlier_has_no_data_and_says_so(service: Service) -> None:
    body = service.client.get("/api/v1/targets/t/changes", params={"window": "5m", "baseline": "1d",
                                                                  "end": END}).json()
    assert body["baseline"] == {"kind": "offset:1d", "start": END - 86400 - 300, "end": END - 86400}
    assert body["signals"] == {} and not body["changed"]
    assert body["gaps"] == ["the baseline has no scrape in 6 of its 6 parts (08:05-08:10 UTC)"]
    assert body["summary"] == ("No latency to compare over the last 5m vs the same 5m 1d earlier: one of the "
                               "windows has none; data missing: the baseline has no scrape in 6 of its 6 parts "
                               "(08:05-08:10 UTC).")


def test_the_baseline_before_an_event(service: Service) -> None:
    with service.monitor.sessions.begin() as session:
        events_repository.add_events(session, 1, [ChangeEvent("step", END - 300, "request_rate", "3.1 req/s",
                                                              "6 req/s", "request rate stepped up")], END - 200)
    (event,) = service.client.get("/api/v1/targets/t/events", params={"since": T0}).json()
    assert event["kind"] == "step" and event["target"] == "t" and event["detected_at"] == END - 200
    body = service.client.get("/api/v1/targets/t/changes", params={"baseline": f"event:{event['id']}",
                                                                  "end": END}).json()
    # the window after the event, as long as the one asked (10m) up to the end: 5m; the baseline as long
    assert body["baseline"] == {"kind": f"event:{event['id']}", "start": END - 600, "end": END - 300}
    assert body["window"] == {"start": END - 300, "end": END}
    assert body["summary"].startswith("TTFT p99") and " since 08:05 UTC: " in body["summary"]
    assert [e["id"] for e in body["events"]] == [event["id"]]
    fleet = service.client.get("/api/v1/events", params={"since": T0, "kind": "step"}).json()
    assert fleet == [event]
    check = validator(service.client.get("/openapi.json").json(), "GET", "/api/v1/events")
    assert [e.message for e in check.iter_errors(fleet)] == [] and not check.is_valid([{**event, "ts": "then"}])
    assert service.client.get("/api/v1/events", params={"since": T0, "kind": "restart"}).json() == []


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"baseline": "yesterday"}, "baseline", "baseline must be 'previous', a duration such as 1d or 7d"),
    ({"baseline": "event:999"}, "baseline", "no change event 999 on this target"),
    ({"baseline": "5m"}, "baseline", "a baseline offset (5m) must be at least the window (10m)"),
    ({"baseline": "60d"}, "baseline", "a baseline offset must be between 1s and 31d"),
    ({"window": "10s"}, "window", "must be between 60s and 604800s"),
])
def test_a_bad_parameter_is_named(service: Service, params: dict, field: str, message: str) -> None:
    answer = service.client.get("/api/v1/targets/t/changes", params={"end": END, **params})
    assert answer.status_code == 422
    (detail,) = answer.json()["detail"]
    assert detail["loc"] == ["query", field] and detail["msg"].startswith(message), detail


def test_unknown_targets_and_kinds(service: Service) -> None:
    assert service.client.get("/api/v1/targets/nope/changes").status_code == 404
    assert service.client.get("/api/v1/targets/nope/events").status_code == 404
    answer = service.client.get("/api/v1/events", params={"kind": "reboot"})
    assert answer.status_code == 422 and "unknown kind 'reboot'" in answer.text


def test_the_status_page_says_what_changed(service: Service) -> None:
    """The target page's What changed section: the attribution over the page's window (10m by default:
    longer than the 10 minutes of data here) with the page's default baseline (no event: a day
    earlier, which has no data here, then the window before), its parts and drivers; a change event
    is listed and marked on the charts."""
    assert "No latency to compare yet." in service.client.get("/targets/t", params={"end": END}).text
    page = service.client.get("/targets/t", params={"end": END, "window": "5m"})
    assert page.status_code == 200
    body = page.text
    section = body.split('<section class="card what-changed"', 1)[1].split("</section>", 1)[0]
    assert 'data-changed="true" data-lead="ttft" data-baseline="previous"' in section
    api = service.client.get("/api/v1/targets/t/changes", params={"window": "5m", "end": END}).json()
    assert f'<p class="summary">{api["summary"]}</p>' in section.replace("&#39;", "'")
    assert '<tr data-part="queue">' in section and '<tr data-driver="load"' in section
    with service.monitor.sessions.begin() as session:
        events_repository.add_events(session, 1, [ChangeEvent("restart", END - 120, "engine", None, None,
                                                              "the engine restarted")], END - 100)
    marked = service.client.get("/targets/t", params={"end": END, "window": "5m"}).text
    assert marked.count('<line class="mark restart" data-kind="restart"') >= 2  # on each chart
    assert '<li data-kind="restart"' in marked and "the engine restarted" in marked
    # with an event in the day, the page's baseline is the window before it
    assert 'data-baseline="event:' in marked
