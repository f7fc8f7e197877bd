"""One policy for tests that need a real external component (binary, server).

Locally a missing component may skip the test, so a developer without e.g.
Prometheus can still run the suite. In CI (``CI=true``, which ``.ci/run`` runs
under) a missing component is a broken environment, and skipping would hide
that the oracle tests never ran, so the test FAILS instead.
"""

from __future__ import annotations

import os
import shutil

import pytest

_TRUTHY = {"1", "true", "yes", "on"}


def in_ci() -> bool:
    """True when the CI environment variable says so (``CI=true``; ``1``/``yes`` accepted)."""
    return os.environ.get("CI", "").strip().lower() in _TRUTHY


def missing_component(message: str) -> None:
    """Fail (under CI) or skip (elsewhere) with ``message``; never returns."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: required components must be installed, not skipped)", pytrace=False)
    pytest.skip(message)


def require_binary(path_or_name: str, purpose: str) -> str:
    """Return the absolute path of an executable, or fail/skip the calling test.

    ``path_or_name`` is either a path (``/usr/bin/prometheus``) or a command name
    looked up on PATH (``promtool``). ``purpose`` says why the test needs it and
    ends up in the skip/fail message, e.g. "real Prometheus as PromQL oracle".
    """
    if os.sep in path_or_name:
        found = path_or_name if os.path.isfile(path_or_name) and os.access(path_or_name, os.X_OK) else None
    else:
        found = shutil.which(path_or_name)
    if found is None:
        missing_component(
            f"{path_or_name} not found (needed for: {purpose}); install it, e.g. Debian's package"
        )
    return found  # type: ignore[return-value]
