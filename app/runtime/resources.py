"""Where the service's non-code files are, in a source checkout and in an installed wheel.

The database migrations and the runbooks live at the top of the source tree (``alembic/``,
``docs/runbooks/``) and are installed inside the package (``app/migrations``,
``app/runbooks``: setup.py maps them into the wheel). Both places are checked, the
installed one first, so ``pip install .``, a pipx install and an editable checkout all work.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # app/runtime/resources.py -> the checkout


def _find(packaged: str, checkout: str) -> Path:
    """``app/<packaged>`` when installed, else ``<checkout>`` in the source tree; an error
    naming both places when neither exists."""
    candidates = (Path(str(files("app"))) / packaged, CHECKOUT / checkout)
    for directory in candidates:
        if directory.is_dir():
            return directory
    raise FileNotFoundError(f"neither {candidates[0]} nor {candidates[1]} exists: this installation of "
                            f"LLM Latency Monitor is incomplete (build it from the source tree, which has {checkout}/)")


def migrations_dir() -> Path:
    """The Alembic script directory (env.py, versions/)."""
    return _find("migrations", "alembic")


def runbooks_dir() -> Path:
    """The runbooks, one ``<name>.md`` each."""
    return _find("runbooks", "docs/runbooks")
