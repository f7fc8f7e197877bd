"""Packaging that pyproject.toml cannot express: files kept outside ``app/`` that the
service reads at run time travel inside the wheel.

The database migrations (``alembic/``, where the ``alembic`` command and alembic.ini look)
and the runbooks (``docs/runbooks/``, where readers of the repository look) stay at the top
of the source tree and are installed as ``app/migrations`` and ``app/runbooks``;
``app.runtime.resources`` finds them in either place. And the two C extensions of the ingest path,
the parser's plan applied to a page's bytes (``app/exposition/_planned.c``) and the checks
and encoding of a histogram's numbers (``app/_vectors.c``; each file's header says why):
optional, so an install without a C compiler still works, with the same code in Python.
Everything else is in pyproject.toml.
"""

from setuptools import Extension, find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["app", "app.*"]),
              "app.migrations", "app.migrations.versions", "app.runbooks"],
    package_dir={"app.migrations": "alembic", "app.runbooks": "docs/runbooks"},
    # The parser's plan applied in C (app/exposition/_planned.c); optional: where no C
    # compiler is at hand the install goes on and the parser applies its plan in Python.
    ext_modules=[Extension("app.exposition._planned", ["app/exposition/_planned.c"], optional=True),
                 Extension("app._vectors", ["app/_vectors.c"], optional=True)],
)
