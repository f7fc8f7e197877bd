"""The alert lifecycle and notification timing, in simulated time with realistic intervals:
``group_interval`` per receiver and group, ``for``, ``repeat_interval``, ``group_by``,
receiver routing, and the Alertmanager sink's re-posts with ``endsAt``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import event

from app.alerts import repository as alert_repository
from app.alerts.delivery import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from app.alerts.schemas import unix
from tests.alerts.harness import alerting, summary

NOTHING = {"oncall": []}


def test_a_resolution_inside_group_interval_is_sent_when_the_group_is_due(migrated_url: str, tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}}, {"oncall": {}}, group_interval="30s") as h:
        h.down("a")
        assert h.at(0) == {"oncall": [("firing", [("a", "firing")])]}
        h.up("a")
        assert h.at(15) == NOTHING  # resolved 15 s after the last notification: not due yet
        assert h.at(29.9) == NOTHING
        assert h.at(30) == {"oncall": [("resolved", [("a", "resolved")])]}  # first round >= t=30
        assert h.at(60) == NOTHING and h.at(4 * 3600) == NOTHING  # a resolution is sent once
        log = h.notifications()
        resolved = h.hooks["oncall"].received[1].json["alerts"][0]
    assert [(n["status"], n["createdAt"] - h.t0) for n in log] == [("firing", 0), ("resolved", 30)]
    assert (resolved["startsAt"], resolved["endsAt"]) == (h.ts(0), h.ts(15))  # the real times, not the send time


def test_an_alert_joining_a_group_inside_group_interval_is_sent_when_the_group_is_due(migrated_url: str,
                                                                                      tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}}, {"oncall": {}}, group_by=["alertname"],
                  group_interval="30s") as h:
        h.down("a")
        assert h.at(0) == {"oncall": [("firing", [("a", "firing")])]}
        h.down("b")
        assert h.at(10) == NOTHING and h.at(20) == NOTHING
        assert h.at(30) == {"oncall": [("firing", [("a", "firing"), ("b", "firing")])]}
        assert h.at(45) == NOTHING
        assert [a["notifiedFiring"] for a in h.alerts().values()] == [["oncall"], ["oncall"]]


def test_two_receivers_with_different_due_times_each_get_every_change(migrated_url: str, tmp_path: Path) -> None:
    """``all`` takes every alert of the group, ``b-team`` only target b's: they are notified
    at different times, and one being notified must not mark the change sent for the other."""
    with alerting(migrated_url, tmp_path, {"a": {"team": "a"}, "b": {"team": "b"}},
                  {"all": {}, "b-team": {"match": {"team": "b"}}}, group_by=["alertname"],
                  group_interval="30s") as h:
        h.down("a")
        assert h.at(0) == {"all": [("firing", [("a", "firing")])], "b-team": []}
        h.down("b")
        assert h.at(20) == {"all": [], "b-team": [("firing", [("b", "firing")])]}  # never notified: at once
        assert h.at(30) == {"all": [("firing", [("a", "firing"), ("b", "firing")])], "b-team": []}
        h.up("b")
        assert h.at(40) == {"all": [], "b-team": []}
        assert h.at(50) == {"all": [], "b-team": [("resolved", [("b", "resolved")])]}  # 30 s after its t=20
        assert h.at(59) == {"all": [], "b-team": []}
        assert h.at(60) == {"all": [("firing", [("a", "firing"), ("b", "resolved")])], "b-team": []}
        assert h.at(90) == {"all": [], "b-team": []}
        created = [(n["receiver"], n["createdAt"] - h.t0) for n in h.notifications()]
    assert created == [("all", 0), ("b-team", 20), ("all", 30), ("b-team", 50), ("all", 60)]


def test_for_holds_an_alert_pending_for_exactly_its_duration(migrated_url: str, tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}}, {"oncall": {}}, target_down_for="1m") as h:
        h.down("a", "b")
        for t in (0, 30, 59.9):
            assert h.at(t) == NOTHING
            assert {name: a["state"] for name, a in h.alerts().items()} == {"a": "pending", "b": "pending"}
        h.up("b")  # b clears while pending: it never was an alert
        assert h.at(60) == {"oncall": [("firing", [("a", "firing")])]}
        alert = h.alerts()["a"]
        assert "b" not in h.alerts()
        message = h.hooks["oncall"].received[0].json["alerts"][0]
    assert alert["state"] == "firing"
    assert (alert["activeSince"], alert["startsAt"], alert["endsAt"]) == (h.ts(0), h.ts(60), None)
    assert message["startsAt"] == h.ts(60)


def test_a_resolution_is_not_lost_when_the_condition_returns_before_it_was_sent(migrated_url: str,
                                                                                tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}}, {"oncall": {}}, target_down_for="20s",
                  group_interval="30s") as h:
        h.down("a")
        assert h.at(0) == NOTHING
        assert h.at(20) == {"oncall": [("firing", [("a", "firing")])]}
        h.up("a")
        assert h.at(30) == NOTHING  # resolved at t=30, the group is due at t=50
        h.down("a")
        assert h.at(40) == NOTHING
        assert (h.alerts()["a"]["state"], h.alerts()["a"]["startsAt"]) == ("pending", None)
        assert h.at(50) == {"oncall": [("resolved", [("a", "resolved")])]}
        assert h.at(60) == NOTHING  # firing again (held 20 s since t=40), due at t=80
        assert h.at(80) == {"oncall": [("firing", [("a", "firing")])]}
        sent = [m.json["alerts"][0] for m in h.hooks["oncall"].received]
    assert [(m["status"], m["startsAt"], m["endsAt"]) for m in sent] == [
        ("firing", h.ts(20), "0001-01-01T00:00:00Z"), ("resolved", h.ts(20), h.ts(30)),
        ("firing", h.ts(60), "0001-01-01T00:00:00Z")]


def test_repeat_interval_renotifies_a_still_firing_group(migrated_url: str, tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}}, {"oncall": {}}, group_interval="30s",
                  repeat_interval="1h") as h:
        h.down("a")
        for t in (0, 30, 1800, 3599, 3600, 3630, 7199, 7200):
            h.at(t)
        created = [(n["status"], n["createdAt"] - h.t0) for n in h.notifications()]
    assert created == [("firing", 0), ("firing", 3600), ("firing", 7200)]


@pytest.mark.parametrize(("group_by", "groups"), [
    (["cluster"], {'{}:{cluster="east"}': ["a", "b"], '{}:{cluster="west"}': ["c"]}),
    (None, {'{}:{alertname="LLMLatencyTargetDown", target="a"}': ["a"],
            '{}:{alertname="LLMLatencyTargetDown", target="b"}': ["b"],
            '{}:{alertname="LLMLatencyTargetDown", target="c"}': ["c"]}),
])
def test_group_by_puts_alerts_in_one_notification_or_apart(migrated_url: str, tmp_path: Path,
                                                           group_by: list[str] | None,
                                                           groups: dict[str, list[str]]) -> None:
    settings = {"group_by": group_by} if group_by else {}  # None: the default [alertname, target]
    targets = {"a": {"cluster": "east"}, "b": {"cluster": "east"}, "c": {"cluster": "west"}}
    with alerting(migrated_url, tmp_path, targets, {"oncall": {}}, **settings) as h:
        h.down("a", "b", "c")
        assert h.evaluate(0) == len(groups)
        h.deliver(0)
        messages = [m.json for m in h.hooks["oncall"].received]
    assert {m["groupKey"]: sorted(a["labels"]["target"] for a in m["alerts"]) for m in messages} == groups
    if group_by:
        assert sorted(m["groupLabels"]["cluster"] for m in messages) == ["east", "west"]
        assert all(list(m["groupLabels"]) == ["cluster"] for m in messages)
        east = next(m for m in messages if m["groupLabels"] == {"cluster": "east"})
        assert east["commonLabels"] == {"alertname": "LLMLatencyTargetDown", "cluster": "east",
                                        "severity": "critical"}


def test_a_receiver_gets_only_the_alerts_its_match_selects(migrated_url: str, tmp_path: Path) -> None:
    targets = {"a": {"cluster": "east"}, "b": {"cluster": "east"}, "c": {"cluster": "west"}}
    receivers = {"east": {"match": {"cluster": "east"}}, "west": {"match": {"cluster": "west"}},
                 "critical-east": {"match": {"cluster": "east", "severity": "critical"}},
                 "warnings": {"match": {"severity": "warning"}}, "all": {}}
    with alerting(migrated_url, tmp_path, targets, receivers, group_by=["alertname"]) as h:
        h.down("a", "b", "c")
        got = h.at(0)
        h.up("c")
        resolved = h.at(60)
    assert got == {"east": [("firing", [("a", "firing"), ("b", "firing")])],
                   "west": [("firing", [("c", "firing")])],
                   "critical-east": [("firing", [("a", "firing"), ("b", "firing")])],
                   "warnings": [],  # target-down alerts are critical
                   "all": [("firing", [("a", "firing"), ("b", "firing"), ("c", "firing")])]}
    # c's resolution goes to those that were told about c, and only to them
    assert resolved == {"east": [], "west": [("resolved", [("c", "resolved")])], "critical-east": [],
                        "warnings": [], "all": [("firing", [("a", "firing"), ("b", "firing"), ("c", "resolved")])]}


def test_alertmanager_sinks_get_reposts_with_ends_at_independent_of_repeat_interval(migrated_url: str,
                                                                                    tmp_path: Path) -> None:
    """Still-firing alerts are re-posted every resend_interval with endsAt = now + 4 x
    max(evaluation interval, resend_interval); the webhook's repeat_interval is not involved,
    and while the Alertmanager is down re-posts do not pile up in the outbox."""
    with alerting(migrated_url, tmp_path, {"a": {}}, {"am": {"kind": "alertmanager"}, "hook": {}},
                  service={"alert_interval": "15s"}, group_interval="30s", repeat_interval="4h",
                  resend_interval="1m") as h:
        h.svc.monitor.scheduler.pause_job("alerts")  # the test drives the rounds itself
        h.down("a")
        valid = 4 * 60.0  # 4 x max(15 s, 60 s)
        assert h.at(0) == {"am": [("alertmanager", [("a", h.ts(valid))])], "hook": [("firing", [("a", "firing")])]}
        assert h.at(30) == {"am": [], "hook": []} and h.at(59) == {"am": [], "hook": []}
        assert h.at(60) == {"am": [("alertmanager", [("a", h.ts(60 + valid))])], "hook": []}
        assert h.at(120) == {"am": [("alertmanager", [("a", h.ts(120 + valid))])], "hook": []}
        h.hooks["am"].status = 503  # the Alertmanager is down
        for t in (180, 240, 300, 360):
            assert h.at(t) == {"am": [], "hook": []}
        pending = [n for n in h.notifications("am") if n["state"] == "pending"]
        assert [n["createdAt"] - h.t0 for n in pending] == [180]  # one re-post waits, no stale copies pile up
        h.hooks["am"].status = 200
        assert h.deliver(361) == 1
        # enqueued at t=180, delivered at t=361: valid for 4 min from its delivery
        assert [summary(m.json) for m in h.new_messages("am")] == [("alertmanager", [("a", h.ts(361 + valid))])]
        # the copy delivered late was enqueued at t=180: a fresh one is due at the next round
        assert h.at(370) == {"am": [("alertmanager", [("a", h.ts(370 + valid))])], "hook": []}
        h.up("a")
        assert h.at(390) == {"am": [], "hook": [("resolved", [("a", "resolved")])]}  # am: due at t=400
        assert h.at(400) == {"am": [("alertmanager", [("a", h.ts(390))])], "hook": []}  # endsAt = resolution
        assert h.at(3 * 3600) == {"am": [], "hook": []}
        with h.svc.monitor.sessions() as session:
            body = json.loads(next(n.body for n in alert_repository.list_notifications(session, "am")
                                   if n.created_at == h.t0))
    assert body == [{"labels": {"alertname": "LLMLatencyTargetDown", "severity": "critical", "target": "a"},
                     "annotations": body[0]["annotations"], "startsAt": h.ts(0), "endsAt": h.ts(valid),
                     "generatorURL": "http://127.0.0.1:8000/api/v1/alerts"}]


def test_an_alertmanager_post_delivered_after_an_outage_is_valid_from_its_delivery(
        migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Alertmanager is down for 10 min, longer than a post's 4 min validity. The posts
    that waited are delivered with each firing alert's endsAt = delivery + 4 min (sent as
    queued they would arrive ended, and Alertmanager would resolve the still-firing alert
    and fire it again at the next re-post); a resolved alert keeps its resolution time;
    the signature covers the body as sent."""
    monkeypatch.setenv("TEST_AM_SECRET", "am secret")
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}},
                  {"am": {"kind": "alertmanager", "secret_env": "TEST_AM_SECRET"}}, group_by=["alertname"],
                  service={"alert_interval": "15s"}, group_interval="30s", resend_interval="1m") as h:
        h.svc.monitor.scheduler.pause_job("alerts")  # the test drives the rounds itself
        valid = 4 * 60.0  # 4 x max(15 s, 60 s)
        am = h.hooks["am"]
        am.status = 503  # down from t=0 to t=600
        h.down("a", "b")
        h.at(0)  # queued: a, b firing
        h.up("b")
        h.at(15)  # b resolves at t=15
        for t in range(30, 600, 15):
            h.at(t)  # t=30: queued: a firing, b resolved; later re-posts wait behind them
        assert not am.received and len(am.rejected) >= 5
        queued = {n["id"]: n["createdAt"] - h.t0 for n in h.notifications("am")}
        am.status = 200
        assert h.deliver(600) == 2
        with h.svc.monitor.sessions() as session:
            stored = [json.loads(n.body) for n in sorted(alert_repository.list_notifications(session, "am"),
                                                         key=lambda n: n.seq)]
    assert sorted(queued.values()) == [0, 30]
    delivered = [{a["labels"]["target"]: round(unix(a["endsAt"]) - h.t0, 2) for a in m.json} for m in am.received]
    assert delivered == [{"a": 600 + valid, "b": 600 + valid}, {"a": 600 + valid, "b": 15.0}]
    assert [queued[m.headers["Idempotency-Key"]] for m in am.received] == [0, 30]
    assert [{a["labels"]["target"]: round(unix(a["endsAt"]) - h.t0, 2) for a in body} for body in stored] == [
        {"a": valid, "b": valid}, {"a": 30 + valid, "b": 15.0}]  # the outbox keeps them as queued
    for m in am.received:
        assert verify("am secret", m.headers[TIMESTAMP_HEADER], m.body, m.headers[SIGNATURE_HEADER])


def test_the_notification_log_forgets_groups_with_nothing_firing_once_group_interval_passed(
        migrated_url: str, tmp_path: Path) -> None:
    """A (receiver, group) last told "nothing fires" is dropped group_interval after that
    notification (it then plans like a group never notified); one still listing a firing
    alert stays however old it is: here b's resolution, muted by a 3 h silence, is still
    sent when the silence ends."""
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}}, {"oncall": {}}, group_interval="30s",
                  repeat_interval="1h") as h:
        def logs() -> dict[str, tuple[int, float]]:
            with h.svc.monitor.sessions() as session:
                return {gk.rsplit('target="', 1)[1][0]: (len(log.firing), log.sent_at - h.t0)
                        for (_, gk), log in alert_repository.notification_logs(session).items()}

        h.down("a", "b")
        assert sorted(h.at(0)["oncall"]) == [("firing", [("a", "firing")]), ("firing", [("b", "firing")])]
        made = h.svc.client.post("/api/v1/silences", json={
            "matchers": ['target="b"'], "startsAt": h.t0 + 10, "endsAt": h.t0 + 3 * 3600, "createdBy": "ops",
            "comment": "maintenance"})
        assert made.status_code == 201, made.text
        h.up("a", "b")
        assert h.at(30) == {"oncall": [("resolved", [("a", "resolved")])]}  # b's resolution is muted
        assert logs() == {"a": (0, 30), "b": (1, 0)}
        assert h.at(59) == NOTHING and logs() == {"a": (0, 30), "b": (1, 0)}  # a: told 29 s ago
        assert h.at(60) == NOTHING and logs() == {"b": (1, 0)}
        assert h.at(3 * 3600 - 1) == NOTHING and logs() == {"b": (1, 0)}  # still to tell: b resolved
        assert h.at(3 * 3600) == {"oncall": [("resolved", [("b", "resolved")])]}
        assert logs() == {"b": (0, 3 * 3600)}
        assert h.at(3 * 3600 + 30) == NOTHING and logs() == {}
        h.down("a")
        assert h.at(3 * 3600 + 40) == {"oncall": [("firing", [("a", "firing")])]}  # a group never told: at once
        assert logs() == {"a": (1, 3 * 3600 + 40)}


def test_alerts_that_start_together_are_read_together_and_a_resolved_one_starts_a_new_episode(
        migrated_url: str, tmp_path: Path) -> None:
    """25 targets go down in one round: their alerts are looked up in one query, not one each
    (a fleet-wide incident is when the round must stay quick); resolved and down again, each
    alert starts a new episode in its own row (same fingerprint, new ``startsAt``)."""
    names = [f"t{i:02d}" for i in range(25)]
    with alerting(migrated_url, tmp_path, {name: {} for name in names}, {"oncall": {}}, group_by=["alertname"]) as h:
        engine = h.svc.monitor.sessions.kw["bind"]
        statements: list[str] = []

        def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
            statements.append(" ".join(statement.split()))

        h.down(*names)
        event.listen(engine, "before_cursor_execute", seen)
        try:
            h.evaluate(0)
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        by_fingerprint = [s for s in statements
                          if s.startswith("SELECT") and "FROM alerts WHERE alerts.fingerprint" in s]
        assert len(by_fingerprint) == 1, by_fingerprint  # one IN (...) for the 25, not 25 lookups
        h.deliver(0)
        first = h.alerts()
        assert sorted(first) == names and {a["state"] for a in first.values()} == {"firing"}
        h.up(*names)
        h.at(30)
        assert {a["state"] for a in h.alerts().values()} == {"resolved"}
        h.down(*names)
        assert h.at(60)["oncall"] == [("firing", [(name, "firing") for name in names])]
        again = h.alerts()
    assert {name: a["fingerprint"] for name, a in again.items()} == \
        {name: a["fingerprint"] for name, a in first.items()}
    assert {a["startsAt"] for a in again.values()} == {h.ts(60)}
    assert {a["startsAt"] for a in first.values()} == {h.ts(0)}
