"""An alert storm does not hold the round: when the alerts of many targets start firing in one
round, at most ``EXPLAINED_PER_ROUND`` targets' attributions are computed (each reads eight
windows of its target inside the round's transaction); the others' alerts say where theirs is."""

from __future__ import annotations

from pathlib import Path

from app.alerts.engine import EXPLAINED_PER_ROUND, Condition, explain_fired
from app.store.models import AlertRow
from tests.alerts.harness import alerting

TARGETS = ("a", "b", "c", "d", "e")


def test_a_storm_of_firing_alerts_explains_the_first_targets_and_points_the_rest_to_the_api(
        migrated_url: str, tmp_path: Path) -> None:
    with alerting(migrated_url, tmp_path, {name: {} for name in TARGETS}, {"oncall": {}}) as h:
        monitor = h.svc.monitor
        explained: list[str] = []
        real = monitor.what_changed

        def counted(session, target, now, since, real=real, explained=explained):  # type: ignore[no-untyped-def]
            explained.append(target)
            return real(session, target, now, since) or f"{target}: what changed"

        monitor.what_changed = counted
        h.down(*TARGETS)
        h.evaluate(0)
        assert EXPLAINED_PER_ROUND == 3 and explained == ["a", "b", "c"]  # same severity: by name
        alerts = h.alerts()
        assert [alerts[t]["state"] for t in TARGETS] == ["firing"] * 5
        for target in ("a", "b", "c"):
            assert alerts[target]["annotations"]["what_changed"] == f"{target}: what changed"
        for target in ("d", "e"):
            assert alerts[target]["annotations"]["what_changed"] == (
                "not computed: alerts of 5 targets started firing in the same round and 3 are explained at firing; "
                f"GET /api/v1/targets/{target}/changes explains this one")
        # kept while they fire: the next round computes none again
        h.evaluate(15)
        assert explained == ["a", "b", "c"]
        assert h.alerts()["d"]["annotations"]["what_changed"].startswith("not computed: alerts of 5 targets")


def test_the_most_severe_alerts_are_explained_first() -> None:
    """Critical before warning before info, then by target name; a target's alerts share one
    attribution, from the earliest time one of them began."""
    fired = []
    for target, severity, since in (("a", "info", 10.0), ("b", "warning", 20.0), ("z", "critical", 30.0),
                                    ("y", "critical", 40.0), ("z", "warning", 5.0)):
        row = AlertRow(fingerprint=f"{target}{severity}", alertname="x", labels={}, annotations={}, state="firing",
                       group_key="", active_since=since, last_evaluated=100.0)
        fired.append((row, Condition({"target": target, "severity": severity}, {"summary": target}, 0.0)))
    asked: list[tuple[str, float]] = []

    def what_changed(session, target, now, since):  # type: ignore[no-untyped-def]
        asked.append((target, since))
        return f"{target} changed"

    explain_fired(None, fired, 100.0, what_changed)  # type: ignore[arg-type]
    assert asked == [("y", 40.0), ("z", 5.0), ("b", 20.0)]
    said = [(cond.labels["target"], row.annotations["what_changed"].split(":")[0]) for row, cond in fired]
    assert said == [("a", "not computed"), ("b", "b changed"), ("z", "z changed"), ("y", "y changed"),
                    ("z", "z changed")]
