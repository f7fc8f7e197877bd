"""Packaging that pyproject.toml cannot express: files kept outside ``app/`` that the
service reads at run time travel inside the wheel.

The database migrations (``alembic/``, where the ``alembic`` command and alembic.ini look)
and the runbooks (``docs/runbooks/``, where readers of the repository look) stay at the top
of the source tree and are installed as ``app/migrations`` and ``app/runbooks``;
``app.resources`` finds them in either place. Everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["app", "app.*"]),
              "app.migrations", "app.migrations.versions", "app.runbooks"],
    package_dir={"app.migrations": "alembic", "app.runbooks": "docs/runbooks"},
)
