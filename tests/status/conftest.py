"""Fixtures of the status-page tests: the in-process service of the API suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.runtime import scheduling
from tests.api.conftest import Service, make_service

DIAGNOSIS_INTERVAL = 84.0  # the first round 98 s after the start (its phase adds a sixth): under
                           # 100 s the countdown is spelled in seconds; long enough that no
                           # scheduled round runs while a test builds its fleet
FIRST_DIAGNOSIS = DIAGNOSIS_INTERVAL * (1 + scheduling.PHASES[scheduling.DIAGNOSIS_JOB])


@pytest.fixture
def service(migrated_url: str, tmp_path: Path) -> Iterator[Service]:
    config = tmp_path / "config.yaml"
    config.write_text(f"diagnosis:\n  interval: {DIAGNOSIS_INTERVAL:g}s\n")
    yield from make_service(migrated_url, tmp_path, config_file=config)
