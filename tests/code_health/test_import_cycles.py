"""The ``app`` packages form layers: no two of them import each other, directly or through
others, and every module imports on its own.

A package is the first two dotted components of a module (``app.scrape.jobs`` -> ``app.scrape``);
a top-level module (``app.config``) is its own package. Every import counts: inside functions
(they still tie the packages together) and under ``if TYPE_CHECKING:`` (a type named from a
package above is a dependency on it all the same; a package below declares a ``Protocol`` for
what it needs instead).
"""

from __future__ import annotations

import ast
import graphlib
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, top: str = "app") -> list[Import]:
    """The imports of ``top``'s modules (under ``root``) that name another ``top`` module."""
    found = []
    for path in sorted((root / top).rglob("*.py")):
        module = module_name(path, root)
        is_package = path.name == "__init__.py"
        nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
        for node in sorted(nodes, key=lambda node: getattr(node, "lineno", 0)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolved against the importing package
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from app import config` imports the module app.config, not the package app
                targets = [f"{base}.{alias.name}" if base == top else base for alias in node.names]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            found += [Import(module, target, where) for target in targets
                      if target == top or target.startswith(top + ".")]
    return found


def package_cycle(found: list[Import]) -> list[str]:
    """One cycle among the packages as ``[a, b, ..., a]``, or ``[]`` when they form layers."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        if package(imp.source) != package(imp.target):
            graph[package(imp.source)].add(package(imp.target))
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        # CycleError lists the cycle against the graph's direction (each node is a dependency of the previous one)
        return list(reversed(error.args[1]))
    return []


def describe(cycle: list[str], found: list[Import]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines += [f"    {imp}" for imp in found if package(imp.source) == a and package(imp.target) == b]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the checker itself


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "app/__init__.py": "",
        "app/low/__init__.py": "",
        "app/low/a.py": "def f():\n    from app.high.b import g\n",
        "app/high/b.py": "from ..low import a\n",
        "app/config.py": "from app import low\n",
    })
    found = imports(root)
    assert {(i.source, i.target, i.where) for i in found} == {
        ("app.low.a", "app.high.b", "app/low/a.py:2"),
        ("app.high.b", "app.low", "app/high/b.py:1"),
        ("app.config", "app.low", "app/config.py:1"),
    }
    cycle = package_cycle(found)
    assert cycle in (["app.low", "app.high", "app.low"], ["app.high", "app.low", "app.high"])
    message = describe(["app.low", "app.high", "app.low"], found)
    assert message == ("app.low -> app.high -> app.low\n"
                       "    app/low/a.py:2: app.low.a -> app.high.b\n"
                       "    app/high/b.py:1: app.high.b -> app.low")


def test_the_checker_counts_type_checking_imports(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "app/low/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from app.high import b\n",
        "app/high/b.py": "from app.low import a\n",
    })
    assert package_cycle(imports(root)) in (["app.low", "app.high", "app.low"], ["app.high", "app.low", "app.high"])
    (root / "app/low/a.py").write_text("from typing import Protocol\nclass B(Protocol):\n    name: str\n")
    assert package_cycle(imports(root)) == []


# ----------------------------------------------------------------------------- the repository


def test_no_two_app_packages_import_each_other() -> None:
    found = imports(ROOT)
    assert len({package(i.source) for i in found}) > 15  # the scan saw the whole tree
    cycle = package_cycle(found)
    assert cycle == [], "import cycle among app packages:\n" + describe(cycle, found)


# Run in one fresh interpreter: it imports the third-party libraries that ``app`` imports at module
# level once, then forks a child per module, so each child starts with no ``app`` module loaded.
_IMPORT_EACH = """
import importlib, os, sys
modules, libraries = sys.argv[1].split(","), sys.argv[2].split(",")
for library in libraries:
    try:
        importlib.import_module(library)
    except Exception:
        pass  # the child that needs it reports the failure
for module in modules:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException as error:
            print(f"{module}: {type(error).__name__}: {error}", flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: the child has reported its exception
        print(f"{module}: exit status {os.waitstatus_to_exitcode(status)}", flush=True)
"""


def _third_party_libraries(root: Path) -> list[str]:
    names = set()
    for path in (root / "app").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
    return sorted(name for name in names if name.split(".")[0] not in ("app", "__future__"))


def _import_each(root: Path, modules: list[str]) -> list[str]:
    libraries = _third_party_libraries(root)
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, ",".join(modules), ",".join(libraries)], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_import_runner_names_a_module_that_fails_to_import(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "app/__init__.py": "",
        "app/good.py": "import json\n",
        "app/bad.py": "from app.good import missing_name\n",
    })
    failures = _import_each(root, ["app.good", "app.bad"])
    assert failures == ["app.bad: ImportError: cannot import name 'missing_name' from 'app.good' "
                        f"({root / 'app' / 'good.py'})"]


@pytest.mark.slow  # about 40 s: each of the ~90 modules in a fresh process
def test_every_app_module_imports_on_its_own() -> None:
    modules = sorted(module_name(path, ROOT) for path in (ROOT / "app").rglob("*.py"))
    assert len(modules) > 80
    assert _import_each(ROOT, modules) == []
