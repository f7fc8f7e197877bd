"""pydantic's validation errors as people read them: ``targets[0].url: reason``."""

from __future__ import annotations

from pydantic import ValidationError


def error_path(loc: tuple) -> str:
    """pydantic's ``('targets', 0, 'url')`` as ``targets[0].url``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def validation_messages(exc: ValidationError) -> list[tuple[tuple, str]]:
    """Every error of ``exc`` as (location, ``field.path: reason``)."""
    messages = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        path = error_path(error["loc"])
        messages.append((error["loc"], f"{path}: {message}" if path else message))
    return messages


def format_validation_error(exc: ValidationError) -> str:
    """All errors on one line, ``; ``-separated (settings, command-line options)."""
    return "; ".join(message for _, message in validation_messages(exc))
