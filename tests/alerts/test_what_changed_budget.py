"""An alert storm does not hold the round: when the alerts of many targets start firing in one
round, at most ``EXPLAINED_PER_ROUND`` targets' attributions are computed (each reads eight
windows of its target inside the round's transaction); the others' alerts say where theirs is."""

from __future__ import annotations

from pathlib import Path

from app.alerts.engine import EXPLAINED_PER_ROUND
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
