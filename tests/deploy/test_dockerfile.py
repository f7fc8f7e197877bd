"""deploy/Dockerfile, checked without a Docker engine: the base image, a non-root user,
the health check, and that everything the service reads at run time is copied in."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def copies() -> list[tuple[list[str], str]]:
    return [(parts[:-1], parts[-1]) for keyword, args in instructions() if keyword == "COPY"
            for parts in [shlex.split(args)]]


def test_python_311_slim_non_root_with_health_check_and_serve_by_default() -> None:
    steps = instructions()
    assert [a for k, a in steps if k == "FROM"] == ["python:3.11-slim"]
    user = [a for k, a in steps if k == "USER"]
    assert user == ["10001:10001"]
    health = next(a for k, a in steps if k == "HEALTHCHECK")
    command = json.loads(health.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"] and "/healthz" in command[2] and "LLM_LATENCY_PORT" in command[2]
    compile(command[2], "healthcheck", "exec")
    assert json.loads(next(a for k, a in steps if k == "ENTRYPOINT")) == ["llm-latency"]
    assert json.loads(next(a for k, a in steps if k == "CMD")) == ["serve"]
    env = next(a for k, a in steps if k == "ENV")
    assert "LLM_LATENCY_HOST=0.0.0.0" in env
    assert any(k == "RUN" and "pip install . " in a for k, a in steps)  # a wheel, not an editable install


def test_the_image_contains_what_the_service_reads_from_the_source_tree() -> None:
    """The wheel is built from the copied tree, which keeps the repository's layout under
    WORKDIR: setup.py maps alembic/ and docs/runbooks/ into the package, so both must be there."""
    copied = set()
    for sources, dest in copies():
        for source in sources:
            assert (ROOT / source).exists(), source
            assert dest in ("./", ".") or Path(dest).as_posix().removeprefix("./") == source, (source, dest)
            copied.add(source)
    needed = {"alembic", "docs/runbooks", "app", "pyproject.toml", "setup.py", "README.md"}
    assert needed <= copied, needed - copied


def test_the_dockerignore_keeps_every_copied_path_and_nothing_else() -> None:
    patterns = [line for line in (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
                if line and not line.startswith("#")]
    assert patterns[0] == "*"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for sources, _ in copies():
        for source in sources:
            assert any(source == k or fnmatch.fnmatch(source, k) for k in kept), source
