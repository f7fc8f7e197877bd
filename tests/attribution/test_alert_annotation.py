"""A firing alert carries what changed: an emulated engine's load doubles, the diagnosis finds
queueing, and the alert that fires has the attribution's sentence as its ``what_changed``
annotation, computed once at firing and kept while it fires."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.emulator.scenarios import ScenarioPlan
from tests.api.conftest import make_quiet_service
from tests.attribution.harness import CASES
from tests.diagnosis.harness import T0, OfflineTarget

pytestmark = pytest.mark.slow

CHANGE_AT = 900.0


def test_a_firing_alert_says_what_changed(migrated_url: str, tmp_path: Path) -> None:
    (_, first), (_, second) = CASES["load step"][0].phases
    plan = ScenarioPlan("load step", ((0.0, first), (CHANGE_AT, second)))
    target = OfflineTarget(tmp_path, plan, seed=1)  # type: ignore[arg-type]
    try:
        target.run(CHANGE_AT)
        for svc in make_quiet_service(target.url, tmp_path):
            fired: dict | None = None
            while target.sim.clock < CHANGE_AT + 600 and fired is None:
                target.run(30)
                now = round(T0 + target.sim.clock, 3)
                svc.monitor.evaluate_diagnoses(now=now)
                svc.monitor.evaluate_alerts(now=now)
                fired = next((a for a in svc.client.get("/api/v1/alerts").json()
                              if a["labels"].get("regime") == "queueing" and a["state"] == "firing"), None)
            assert fired is not None, "no queueing alert fired"
            said = fired["annotations"]["what_changed"]
            assert said.startswith("TTFT p99 ") and "request rate +" in said and "with the same prompts" in said
            # the time since the condition began and the diagnosis window (at least 2 minutes) against the
            # same time before: no change event is stored here (the events round does not run)
            assert "over the last 2m vs the 2m before" in said
            target.run(30)
            later = round(T0 + target.sim.clock, 3)
            svc.monitor.evaluate_diagnoses(now=later)
            svc.monitor.evaluate_alerts(now=later)
            again = next(a for a in svc.client.get("/api/v1/alerts").json() if a["fingerprint"] == fired["fingerprint"])
            assert again["annotations"]["what_changed"] == said  # computed once, at firing
    finally:
        target.close()
