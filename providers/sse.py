"""A server-sent events decoder for the streamed model answers: bytes in, events out.

It follows the HTML spec's parsing rules for what model APIs send: lines end in CRLF, LF or
CR; `event:` and `data:` fields (several data lines joined with LF); a value's one leading
space dropped; `:` comments and unknown fields ignored; a blank line dispatches, an event
without data is dropped, and an unfinished event at the end of the stream is never seen.
`id:` and `retry:` are ignored: they only matter for reconnecting, which the clients never do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_EVENT_BYTES", "SSEDecoder", "SSEError", "ServerSentEvent"]

MAX_EVENT_BYTES = 16 * 1024 * 1024  # far above any model chunk; a bound on a broken server
_EOL = re.compile(rb"\r\n|\r|\n")


class SSEError(ValueError):
    """The stream cannot be read as server-sent events."""


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    event: str = "message"
    data: str = ""


class SSEDecoder:
    """Push parser: `feed` each chunk as it arrives, get back the events it completed."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()  # the start of a line whose end has not arrived
        self._after_cr = False  # the last chunk ended in CR: a leading LF completes that CRLF
        self._first = True  # the stream's first line, which may start with a BOM
        self._event = ""
        self._data: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        if not chunk:
            return []
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        self._after_cr = False
        events: list[ServerSentEvent] = []
        for match in _EOL.finditer(chunk, start):
            line = chunk[start : match.start()]
            if self._buf:
                line = bytes(self._buf) + line
                self._buf.clear()
            start = match.end()
            if self._line(line):
                events.append(self._dispatch())
        if start == len(chunk) and chunk[-1:] == b"\r":
            self._after_cr = True
        self._buf += chunk[start:]
        if len(self._buf) + self._size > self._max:
            raise SSEError(f"an event longer than {self._max} bytes")
        return events

    def _line(self, raw: bytes) -> bool:
        """Take one line; True when it completes an event to dispatch."""
        if self._first:
            self._first = False
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a BOM opening the stream
        if not raw:
            if self._data:
                return True
            self._event = ""  # an event without data is dropped, its type with it
            return False
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return False
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(raw)
        elif name == "event":
            self._event = value
        return False

    def _dispatch(self) -> ServerSentEvent:
        event = ServerSentEvent(self._event or "message", "\n".join(self._data))
        self._event, self._data, self._size = "", [], 0
        return event
