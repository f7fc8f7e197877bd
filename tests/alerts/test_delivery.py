"""The outbox worker against a real webhook server: exponential backoff with jitter, expiry
after ``max_delivery_age``, the attempt log's truncated responses, and per-group order
when the receiver fails in the middle of a sequence."""

from __future__ import annotations

from pathlib import Path

from app.alerts.delivery import RESPONSE_LOG_BYTES
from app.store.models import NotificationRow
from tests.alerts.harness import alerting, summary


def test_retries_back_off_exponentially_with_jitter_then_expire_and_the_group_moves_on(migrated_url: str,
                                                                                        tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}}, {"oncall": {}}, group_by=["alertname"],
                  max_delivery_age="1h") as h:
        hook = h.hooks["oncall"]
        hook.status = 503
        h.down("a")
        assert h.evaluate(0) == 1
        h.down("b")
        assert h.evaluate(40) == 1  # queued behind the first one, same group
        first, second = (n["id"] for n in h.notifications())
        ratios = []
        for attempt in range(11):
            due_at = h.notifications()[0]["nextAttemptAt"]
            if attempt:
                assert h.deliver(due_at - h.t0 - 0.01) == 0 and len(hook.rejected) == attempt  # not before its time
            h.deliver(due_at - h.t0)
            assert len(hook.rejected) == attempt + 1
            head = h.notifications()[0]
            backoff = min(h.svc.monitor.delivery.max_backoff, 2 ** attempt)
            ratios.append((head["nextAttemptAt"] - head["attemptLog"][-1]["ts"]) / backoff)
        assert all(0.5 <= r < 1.5 for r in ratios), ratios  # backoff 1, 2, 4 ... 256, 300, 300 s x [0.5, 1.5)
        assert len({round(r, 9) for r in ratios}) > 1  # jittered, not a fixed factor
        assert {item.headers["Idempotency-Key"] for item in hook.rejected} == {first}  # the second waits its turn
        assert h.deliver(3599.9) == 0 and len(hook.rejected) == 12  # still retried up to its maximum age
        hook.status = 200
        assert h.deliver(3600.5) == 1  # too old now: expired, and the group moves on to the second at once
        log = {n["id"]: n for n in h.notifications()}
    expired, delivered = log[first], log[second]
    assert (expired["state"], expired["attempts"], len(expired["attemptLog"])) == ("expired", 12, 12)
    assert [a["statusCode"] for a in expired["attemptLog"]] == [503] * 12
    assert [a["attempt"] for a in expired["attemptLog"]] == list(range(1, 13))
    assert expired["lastError"] == "not delivered within 3600s after 12 attempts: HTTP 503"
    assert (delivered["state"], delivered["attempts"]) == ("delivered", 1)
    assert summary(hook.received[0].json) == ("firing", [("a", "firing"), ("b", "firing")])


def test_the_attempt_log_keeps_the_first_kilobyte_of_a_response(migrated_url: str, tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}}, {"oncall": {}}) as h:
        hook = h.hooks["oncall"]
        hook.status, hook.response_body = 503, b"x" * 5000
        h.down("a")
        h.at(0)
        hook.status, hook.response_body = 200, "é".encode() * 3000  # 6000 bytes, 2 per character
        h.deliver(60)
        attempts = h.notifications()[0]["attemptLog"]
    assert RESPONSE_LOG_BYTES == 1024
    assert [(a["statusCode"], len(a["response"])) for a in attempts] == [(503, 1024), (200, 512)]
    assert attempts[0]["response"] == "x" * 1024
    assert attempts[1]["response"] == "é" * 512 and len(attempts[1]["response"].encode()) == 1024


def test_a_group_is_delivered_in_order_when_the_receiver_fails_mid_sequence(migrated_url: str,
                                                                            tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}, "c": {}}, {"oncall": {}}, group_by=["alertname"],
                  group_interval="30s") as h:
        hook = h.hooks["oncall"]
        h.down("a")
        assert h.at(0) == {"oncall": [("firing", [("a", "firing")])]}
        hook.status = 503  # the receiver goes down after the first notification
        h.down("b")
        h.at(30)
        h.up("a")
        h.at(60)
        h.up("b")
        h.at(90)
        h.down("c")
        h.at(120)
        log = h.notifications()
        assert [(n["seq"], n["state"], n["attempts"]) for n in log] == [
            (1, "delivered", 1), (2, "pending", 4), (3, "pending", 0), (4, "pending", 0), (5, "pending", 0)]
        hook.status = 200
        assert h.deliver(121) == 4
        log = h.notifications()
    assert [summary(m.json) for m in hook.received] == [
        ("firing", [("a", "firing")]),
        ("firing", [("a", "firing"), ("b", "firing")]),
        ("firing", [("a", "resolved"), ("b", "firing")]),
        ("resolved", [("b", "resolved")]),
        ("firing", [("c", "firing")]),
    ]
    assert [m.headers["Idempotency-Key"] for m in hook.received] == [n["id"] for n in log]
    assert [n["state"] for n in log] == ["delivered"] * 5
    assert [a["statusCode"] for a in log[1]["attemptLog"]] == [503, 503, 503, 503, 200]
    assert [len(n["attemptLog"]) for n in log] == [1, 5, 1, 1, 1]
    assert {item.json["groupKey"] for item in hook.received} == {'{}:{alertname="LLMLatencyTargetDown"}'}


def test_an_expired_notification_tells_how_often_it_was_attempted(migrated_url: str, tmp_path: Path) -> None:
    """The expiry reason follows the attempt count: "(never attempted)" only with no
    attempt, else the number of attempts and the last error (if one was recorded)."""
    with alerting(migrated_url, tmp_path, {"a": {}, "b": {}, "c": {}}, {"oncall": {}}, max_delivery_age="1h") as h:
        hook = h.hooks["oncall"]
        hook.status = 503
        h.down("a", "b")
        assert h.evaluate(0) == 2
        h.deliver(0)
        h.deliver(30)  # a and b: attempted twice (the first backoff is at most 1.5 s)
        h.down("c")
        assert h.evaluate(10) == 1  # c: queued, never attempted
        ids = {n["groupKey"].rsplit('target="', 1)[1][0]: n["id"] for n in h.notifications()}
        with h.svc.monitor.sessions.begin() as session:  # b: attempted, but no error text stored
            session.get(NotificationRow, ids["b"]).last_error = None
        assert h.deliver(3611) == 0
        log = {n["id"]: n for n in h.notifications()}
    assert len(hook.rejected) == 4
    assert [(log[ids[x]]["state"], log[ids[x]]["attempts"]) for x in "abc"] == [
        ("expired", 2), ("expired", 2), ("expired", 0)]
    assert [log[ids[x]]["lastError"] for x in "abc"] == [
        "not delivered within 3600s after 2 attempts: HTTP 503",
        "not delivered within 3600s after 2 attempts: no error recorded",
        "not delivered within 3600s (never attempted)"]
