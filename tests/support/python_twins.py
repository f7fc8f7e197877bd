"""Run the tests as an install without a C compiler does: on the Python twins of the C extensions.

``LLM_LATENCY_TEST_PYTHON_TWINS=1`` makes the C extensions (``setup.py``'s optional ones)
impossible to import in the test process, exactly as where they were never built: their
importers fall back to the Python twins (``app/exposition/parser.py``: the plan applied in
Python; ``app/vectors.py`` and ``app/store/encoding.py``: the checks and the count encoding).
``scripts/test.sh`` runs the parser, vectors and ingest tests once more this way.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

ENV = "LLM_LATENCY_TEST_PYTHON_TWINS"
#: the optional C extensions of setup.py
C_EXTENSIONS = ("app.exposition._planned", "app._vectors")


def forced() -> bool:
    """True when this test run is on the Python twins by choice (the C extensions may be built)."""
    return os.environ.get(ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class _NotBuilt(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname in C_EXTENSIONS:
            raise ModuleNotFoundError(f"No module named {fullname!r} ({ENV} is set)", name=fullname)
        return None


def hide_c_extensions() -> None:
    """Make the C extensions unimportable from now on; refuse if one is imported already
    (its importer has chosen it, and would go on using it)."""
    loaded = [name for name in C_EXTENSIONS if name in sys.modules]
    if loaded:
        raise RuntimeError(f"{ENV}: {', '.join(loaded)} imported before the tests could hide it")
    if not any(isinstance(finder, _NotBuilt) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NotBuilt())


def check_hidden() -> None:
    """Fail unless every importer took its Python twin."""
    from app import vectors
    from app.exposition import parser

    if parser._planned is not None or vectors._vectors is not None:
        raise RuntimeError(f"{ENV} is set but a C extension is in use")
