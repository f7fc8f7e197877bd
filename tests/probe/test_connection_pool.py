"""A concurrency level reaches the engine concurrently, also after the preflight.

On a pool that already holds an idle connection, httpx handed that one connection to
several requests starting together, so a "concurrency 32" level reached the engine one
request after another. Judged on the emulator's own records (simulated time): every
request of the level must have arrived before the first of them finished.
"""

from __future__ import annotations

import pytest

from app.emulator.server import EmulatorFleet, TargetSpec
from app.probe.runner import LevelPlan, ProbeSpec, run_probe_sync

CONCURRENCY = 32


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet([TargetSpec("solo", "healthy", synthetic=False, time_scale=1.0, model_name="m")]) as f:
        yield f


@pytest.mark.parametrize("levels", [1, 2])
def test_every_request_of_a_level_arrives_before_the_first_finishes(fleet, levels: int) -> None:
    seen = {r.rid for r in fleet.call("solo", lambda t: list(t.sim.records))}
    # 32 output tokens: each request lasts about 0.5 simulated seconds (at time scale 1),
    # longer than opening 32 loopback connections takes on a loaded machine.
    spec = ProbeSpec(fleet.urls["solo"], prompt_tokens=64, max_tokens=32, concurrency=CONCURRENCY,
                     requests=CONCURRENCY, preflight=True)
    plans = [LevelPlan(prompt_tokens=64, max_tokens=32, concurrency=CONCURRENCY, requests=CONCURRENCY)] * levels
    result = run_probe_sync(spec, plans)
    assert [sum(r.ok for r in lv.requests) for lv in result.levels] == [CONCURRENCY] * levels
    assert result.preflight_requests >= 1
    records = sorted((r for r in fleet.call("solo", lambda t: list(t.sim.records)) if r.rid not in seen),
                     key=lambda r: r.arrival)
    probe_records = [r for r in records if r.output_tokens == 32]
    assert len(probe_records) == CONCURRENCY * levels
    for level in range(levels):
        batch = probe_records[level * CONCURRENCY:(level + 1) * CONCURRENCY]
        first_finish = min(r.finish for r in batch)
        late = [r.arrival - first_finish for r in batch if r.arrival >= first_finish]
        assert late == [], f"level {level + 1}: {len(late)} of {CONCURRENCY} requests arrived after the first finished"
