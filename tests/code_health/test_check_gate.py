"""The static gate (`scripts/check`) fails on a new type error, a new lint error and a
baseline entry that is no longer needed, and passes on the repository as committed.

Each case runs the real script on a copy of the repository (its mypy cache copied too,
so a run takes seconds, not the full cold check).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _copy_repo(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file() and not name.startswith("tests/deploy/operator_models/"):
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", dest / ".mypy_cache")
    return dest


def _check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/check"], cwd=repo, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return _check(_copy_repo(tmp_path_factory.mktemp("clean")))


def test_the_committed_tree_passes(clean_run: subprocess.CompletedProcess[str]) -> None:
    assert clean_run.returncode == 0, clean_run.stdout + clean_run.stderr
    assert "all within the baseline" in clean_run.stdout


def test_a_planted_type_error_in_a_strict_module_fails(tmp_path: Path, clean_run) -> None:
    repo = _copy_repo(tmp_path)
    quantiles = repo / "app" / "core" / "quantiles.py"
    quantiles.write_text(quantiles.read_text() + "\n\ndef _planted() -> int:\n    return 'not an int'\n")
    done = _check(repo)
    assert done.returncode == 1
    assert "app/core/quantiles.py" in done.stdout and "Incompatible return value type" in done.stdout
    assert "app/core/quantiles.py: 1 mypy error(s), baseline allows 0" in done.stdout


def test_a_planted_lint_error_fails(tmp_path: Path, clean_run) -> None:
    repo = _copy_repo(tmp_path)
    latency = repo / "app" / "latency.py"
    latency.write_text(latency.read_text() + "\n\ndef _planted(items):\n    return [lambda: i for i in items]\n")
    done = _check(repo)
    assert done.returncode == 1
    assert "B023" in done.stdout and "app/latency.py" in done.stdout


def test_a_fixed_error_must_lower_the_baseline(tmp_path: Path, clean_run) -> None:
    repo = _copy_repo(tmp_path)
    baseline_file = repo / "scripts" / "mypy-baseline.json"
    baseline = json.loads(baseline_file.read_text())
    path, allowed = next(iter(sorted(baseline.items())))
    baseline[path] = allowed + 1  # as if one of its errors had just been fixed
    baseline_file.write_text(json.dumps(baseline))
    done = _check(repo)
    assert done.returncode == 1
    assert f"{path}: {allowed} mypy error(s), below its baseline {allowed + 1}" in done.stdout
    lowered = subprocess.run([sys.executable, "scripts/check", "--update-baseline"], cwd=repo,
                             capture_output=True, text=True, timeout=600)
    assert lowered.returncode == 0, lowered.stdout
    assert json.loads(baseline_file.read_text())[path] == allowed
