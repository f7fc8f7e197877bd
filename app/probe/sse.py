"""A lenient incremental Server-Sent-Events parser for OpenAI-style streams.

Fed raw bytes as they arrive; returns the complete events (the ``data`` payloads) found so
far. Nothing a server sends can make it raise: lines it cannot use are *counted* as
malformed so the probe reports them, and parsing goes on.

Leniency beyond the SSE spec, because real servers and proxies bend it:

* ``\\n``, ``\\r\\n`` and ``\\r`` all end a line;
* a ``data:`` line arriving while the previous event's data is already a complete JSON
  value (or ``[DONE]``) dispatches the previous event first, so a server that forgets the
  blank line between events loses nothing;
* pending data at the end of the stream is dispatched (the spec would drop it);
* a line longer than ``max_line_bytes`` is dropped and counted, bounding memory.

Malformed: a line that is not ``field: value`` with a known field (``data``, ``event``,
``id``, ``retry``) or a ``:`` comment, a line that is not UTF-8, an over-long line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KNOWN_FIELDS = frozenset({"data", "event", "id", "retry"})
DONE = "[DONE]"


@dataclass
class SSEParser:
    max_line_bytes: int = 1 << 20
    malformed: int = 0
    malformed_samples: list[str] = field(default_factory=list)  # first few, for the error detail
    _buf: bytearray = field(default_factory=bytearray)
    _data: list[str] = field(default_factory=list)
    _skip_cr_lf: bool = False
    _dropping: bool = False

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the data payloads of the events completed by them."""
        out: list[str] = []
        buf = self._buf
        i = 0
        n = len(chunk)
        while i < n:
            b = chunk[i]
            if self._skip_cr_lf:
                self._skip_cr_lf = False
                if b == 0x0A:  # the \n of a \r\n pair
                    i += 1
                    continue
            j = i
            while j < n and chunk[j] not in (0x0A, 0x0D):
                j += 1
            if not self._dropping:
                buf += chunk[i:j]
                if len(buf) > self.max_line_bytes:
                    self.note(f"line longer than {self.max_line_bytes} bytes")
                    buf.clear()
                    self._dropping = True
            if j == n:
                break
            if chunk[j] == 0x0D:
                self._skip_cr_lf = True
            if self._dropping:
                self._dropping = False
            else:
                self._line(bytes(buf), out)
            buf.clear()
            i = j + 1
        return out

    def close(self) -> list[str]:
        """End of stream: the last unterminated line and any pending event."""
        out: list[str] = []
        if self._buf and not self._dropping:
            self._line(bytes(self._buf), out)
        self._buf.clear()
        self._dispatch(out)
        return out

    def note(self, what: str) -> None:
        """Count one malformed line (callers above the parser count bad event payloads here too)."""
        self.malformed += 1
        if len(self.malformed_samples) < 3:
            self.malformed_samples.append(what[:120])

    # ------------------------------------------------------------------ internals

    def _dispatch(self, out: list[str]) -> None:
        if self._data:
            out.append("\n".join(self._data))
            self._data = []

    def _line(self, raw: bytes, out: list[str]) -> None:
        if not raw:
            self._dispatch(out)
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.note(f"not UTF-8: {raw[:60]!r}")
            return
        if line.startswith(":"):
            return  # comment / keep-alive
        name, sep, value = line.partition(":")
        if not sep or name not in KNOWN_FIELDS:
            self.note(line)
            return
        if value.startswith(" "):
            value = value[1:]
        if name != "data":
            return
        if self._data and _complete("\n".join(self._data)):
            self._dispatch(out)
        self._data.append(value)


def _complete(payload: str) -> bool:
    if payload.strip() == DONE:
        return True
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True
