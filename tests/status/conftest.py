"""Fixtures of the status-page tests: the in-process service of the API suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import Service, make_service


@pytest.fixture
def service(migrated_url: str, tmp_path: Path) -> Iterator[Service]:
    yield from make_service(migrated_url, tmp_path)
