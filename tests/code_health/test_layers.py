"""The floor plan of ``app``: features read metrics through the window interface only, the root
stays small, modules stay readable, one name means one thing, and the module map in
docs/architecture.md matches the tree."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from tests.code_health.test_import_cycles import ROOT, Import, imports

#: The packages of the features: they read metric windows through ``app.windows`` and never ask
#: which backend holds a target.
FEATURES = ("app.api", "app.diagnosis", "app.attribution", "app.alerts", "app.slo")
#: The backends' own modules: the store's sample reads and a Prometheus source's client and reader.
BACKENDS = ("app.promsource", "app.promql.client", "app.windows.store", "app.windows.prometheus",
            "app.store.reads", "app.store.levels")
MAX_ROOT_MODULES = 12
MAX_LINES = 900
MODULE_MAP = ROOT / "docs" / "architecture.md"


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def backend_imports(found: list[Import]) -> list[Import]:
    return [i for i in found if _within(i.source, FEATURES) and _within(i.target, BACKENDS)]


def test_the_backend_check_names_a_feature_importing_a_backend(tmp_path: Path) -> None:
    (tmp_path / "app/diagnosis").mkdir(parents=True)
    (tmp_path / "app/diagnosis/rounds.py").write_text("from app.windows import default_windows\n"
                                                      "def f():\n    from app.promsource.service import X\n")
    found = backend_imports(imports(tmp_path))
    assert [str(i) for i in found] == ["app/diagnosis/rounds.py:3: app.diagnosis.rounds -> app.promsource.service"]


def test_no_feature_imports_a_backend_module() -> None:
    found = imports(ROOT)
    assert len({i.source for i in found if _within(i.source, FEATURES)}) > 40  # the scan saw the features
    assert [str(i) for i in backend_imports(found)] == []


def test_the_root_of_app_holds_at_most_twelve_modules() -> None:
    root = sorted(p.name for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_module_outside_the_emulator_is_over_900_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "app").rglob("*.py")
            if "emulator" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def public_classes(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((root / "app").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(root)))
    return found


def test_no_two_public_classes_share_a_name() -> None:
    classes = public_classes(ROOT)
    assert len(classes) > 150
    assert {name: where for name, where in classes.items() if len(where) > 1} == {}


def mapped_paths(text: str) -> list[str]:
    """The paths in the first column of the module map's table (``app/...``, one or more per row)."""
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [path for row in rows for path in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def unmapped(root: Path, paths: list[str]) -> list[str]:
    """The ``app`` modules no row names, neither by their file nor by a package above them."""
    covered = [p.rstrip("/") for p in paths]
    out = []
    for path in sorted((root / "app").rglob("*.py")):
        rel = str(path.relative_to(root))
        if path.name == "__init__.py" and str(path.parent.relative_to(root)) in covered:
            continue
        if not any(rel == c or rel.startswith(c + "/") for c in covered):
            out.append(rel)
    return out


def test_the_module_map_check_finds_a_missing_and_a_stale_row(tmp_path: Path) -> None:
    (tmp_path / "app/core").mkdir(parents=True)
    for name in ("app/__init__.py", "app/core/__init__.py", "app/core/a.py", "app/cli.py"):
        (tmp_path / name).write_text("")
    text = "# A\n\n## Module map\n\n| path | concern |\n|---|---|\n| `app/core/` | maths |\n| `app/gone.py` | x |\n"
    paths = mapped_paths(text)
    assert paths == ["app/core/", "app/gone.py"]
    assert unmapped(tmp_path, paths) == ["app/__init__.py", "app/cli.py"]
    assert [p for p in paths if not (tmp_path / p).exists()] == ["app/gone.py"]


def test_the_module_map_matches_the_tree() -> None:
    paths = mapped_paths(MODULE_MAP.read_text())
    assert len(paths) > 25
    assert [p for p in paths if not (ROOT / p).exists()] == [], "rows naming paths that do not exist"
    assert [p for p in unmapped(ROOT, paths) if p != "app/__init__.py"] == [], "modules the map does not list"
