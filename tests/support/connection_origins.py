"""Where a psycopg connection left open for the garbage collector was opened.

psycopg warns (``ResourceWarning``) when a connection that was never closed is collected, which
under ``filterwarnings = error`` fails whichever test happens to be running then -- usually not
the one that leaked it. :func:`record_connection_origins` makes that warning say which thread
opened the connection, from where, and during which test, so the failure names its owner.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any
from warnings import warn

#: the test running now (its node id), set by the conftest around each test
current_test: list[str] = [""]

_ORIGIN = "_llm_latency_test_origin"


def _origin(connection: Any) -> str:
    return getattr(connection, _ORIGIN, "") or " (opened before the origins were recorded)"


def record_connection_origins() -> None:
    """Keep, on every psycopg connection, the stack, thread and test that opened it, and add
    them to psycopg's "deleted while still open" warning. Idempotent."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - PostgreSQL's driver is a dependency
        return
    base = psycopg.Connection.__mro__[1]  # BaseConnection: where __del__ and the warning live
    if getattr(base.__del__, "_records_origins", False):
        return
    connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    original_del = base.__del__

    def connect_recording(cls: Any, *args: Any, **kwargs: Any) -> Any:
        connection = connect(cls, *args, **kwargs)
        # the project's frames: the library frames between them and the driver say nothing
        frames = [f for f in traceback.extract_stack()[:-1] if "site-packages" not in f.filename
                  and "/lib/python3" not in f.filename][-15:]
        stack = "".join(traceback.format_list(frames))
        setattr(connection, _ORIGIN, f"\nopened in thread {threading.current_thread().name!r} during test "
                                     f"{current_test[0] or '(none)'}, at:\n{stack}")
        return connection

    def del_naming_the_origin(self: Any, *args: Any) -> None:
        def warn_with_origin(message: str, category: type[Warning]) -> None:
            warn(message + _origin(self), category, stacklevel=2)

        original_del(self, warn_with_origin)

    del_naming_the_origin._records_origins = True  # type: ignore[attr-defined]
    psycopg.Connection.connect = classmethod(connect_recording)  # type: ignore[method-assign,assignment]
    psycopg.connect = psycopg.Connection.connect  # what SQLAlchemy's dialect calls
    base.__del__ = del_naming_the_origin  # type: ignore[method-assign]
