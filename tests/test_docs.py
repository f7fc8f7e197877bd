"""The README is a front door and the manual a docs site that builds.

* ``mkdocs build --strict`` succeeds: no broken link or anchor, no page under ``docs/`` left
  out of ``nav`` (``validation`` in ``mkdocs.yml`` makes those warnings, ``--strict`` errors);
* the README stays short, keeps the Quick start's two commands byte for byte (``.ci/run``
  runs the second) and links the manual's index;
* the configuration reference is what ``scripts/gen_config_reference.py`` generates now, and
  lists every setting and every key of the targets YAML, found here independently of the
  generator by walking the models.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from app.config import FileConfig
from app.settings import Settings
from tests.support.components import missing_component

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference" / "configuration.md"
MAX_README_LINES = 250
QUICK_START = ("    python3 -m venv .venv && . .venv/bin/activate && pip install -e . && llm-latency demo  "
               "# in a virtual environment, Python ≥ 3.11", "    ./scripts/test.sh")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    try:
        import material  # noqa: F401 (the theme mkdocs.yml names)
        import mkdocs  # noqa: F401
    except ImportError:
        missing_component("mkdocs-material is not installed (python3 -m pip install -e '.[test]')")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_every_page_is_in_nav() -> None:
    """mkdocs --strict says so too (validation.omitted_files); this names the page at once."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", nav, re.M))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav names pages that do not exist"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the manual is docs/"
    for command in QUICK_START:
        assert command in lines, f"the Quick start's command changed: {command!r}"
    assert "./scripts/test.sh --fast" in text
    assert "](docs/index.md)" in text, "the README links the manual's index"
    picture = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", text)
    assert picture and (ROOT / picture[1]).is_file(), "the README shows the status page"
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), f"README links a missing file: {target}"


def test_the_configuration_reference_is_current() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == generator().render(), (
        "docs/reference/configuration.md is stale: run python3 scripts/gen_config_reference.py")


def _models(tp: object) -> list[type[BaseModel]]:
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models(arg)]


def _file_models() -> dict[str, type[BaseModel]]:
    """Every model of the targets YAML by its path (``alerts.receivers[]``)."""
    found: dict[str, type[BaseModel]] = {}

    def walk(model: type[BaseModel], path: str) -> None:
        if model in found.values():
            return
        found[path] = model
        for name, field in model.model_fields.items():
            key = (field.alias or name) + ("[]" if typing.get_origin(field.annotation) is list else "")
            for sub in _models(field.annotation):
                walk(sub, f"{path}.{key}" if path else key)

    walk(FileConfig, "")
    return found


def test_the_configuration_reference_lists_every_setting_and_field() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"| `LLM_LATENCY_{name.upper()}` |" in page, f"setting {name} is not in the reference"
    sections = dict(re.findall(r"^### (.+?) \{#[^}]+\}\n(.*?)(?=^##|\Z)", page, re.M | re.S))
    models = _file_models()
    assert len(models) >= 15, models  # targets, hardware, canary, diagnosis, thresholds, alerts, sources, slos, ...
    for path, model in models.items():
        heading = f"`{path}`" if path else "Top level"
        assert heading in sections, f"no section for {path or 'the top level'} ({model.__name__})"
        for name, field in model.model_fields.items():
            key = field.alias or name
            assert f"| `{key}` |" in sections[heading], f"{path}.{key} is not in the reference"


@pytest.mark.parametrize("stale", ["Settings.no_such_setting"])
def test_a_note_for_a_field_that_is_gone_stops_the_generator(stale: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = generator()
    monkeypatch.setitem(module.NOTES, stale, "a note")
    with pytest.raises(SystemExit, match="no longer exist"):
        module.render()
