"""The terminal channel behind `switchboard chat`: stdin in, streamed text out."""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from typing import TextIO

from channels.mend import mend_strings
from core.errors import ChannelError
from core.models import InboundMessage, MessageKind, OutboundPart, Sender, SessionKey

__all__ = ["Console"]

CHANNEL = "console"
CLOSED = "the terminal's output is closed"


class Console:
    name = CHANNEL
    output_rules = "The terminal shows plain text; light Markdown is fine."

    def __init__(self, user: str, out: TextIO | None = None) -> None:
        self.user = user
        self._out = out or sys.stdout
        self._streamed: dict[str, str] = {}  # run id -> text already shown
        self._open = False  # the last write left its line open (an answer streaming)
        self.gone = False  # the output was closed (`switchboard chat | head`)
        self.delivered = 0

    def parse(self, line: str) -> InboundMessage | None:
        # bytes that are not UTF-8 reach us as lone surrogates (surrogateescape): U+FFFD,
        # as on every HTTP route, since no store can keep them
        text = mend_strings(line).strip()
        if not text:
            return None
        kind, command = MessageKind.MESSAGE, None
        if text.startswith("/") and text[1:].isidentifier():
            kind, command = MessageKind.COMMAND, text[1:].lower()
        return InboundMessage(
            channel=CHANNEL,
            conversation=self.user,
            sender=Sender(id=self.user, name=self.user),
            text=text,
            platform_id=uuid.uuid4().hex,
            kind=kind,
            command=command,
            received_at=time.time(),
        )

    def _write(self, text: str) -> None:
        if self.gone:
            raise ChannelError(CLOSED)
        try:
            self._out.write(text)
            self._out.flush()
        except BrokenPipeError:  # every later reply would be retried for a day, and the
            # chat waited for them: it never ended
            self.gone = True
            raise ChannelError(CLOSED) from None
        self._open = not text.endswith("\n")

    def end_line(self) -> None:
        """End the line an answer is streaming on, so a log line written to the same terminal
        starts on its own line (the run's "ok" came stuck to the answer's last word)."""
        if self._open:
            with contextlib.suppress(ChannelError):  # closed: nothing to end
                self._write("\n")

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        shown = self._streamed.pop(part.run_id, None) if part.run_id else None
        if self.gone:  # streamed into a closed output: not shown
            raise ChannelError(CLOSED)
        self.end_line()
        if shown is None or shown.strip() != part.reply.text.strip():
            self._write(f"agent> {part.reply.text}\n")
        for button in part.reply.buttons:
            self._write(f"  [{button.label}]\n")
        self.delivered += 1
        return None

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        self._streamed[run_id] = ""

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        shown = self._streamed.get(run_id, "")
        self._streamed[run_id] = shown + text
        with contextlib.suppress(ChannelError):  # output closed: the reply's send says so, once
            self._write(text if shown else f"agent> {text}")

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        if discarded and self._streamed.pop(run_id, "") and not self.gone:
            self.end_line()
            self._write("(discarded: a newer message interrupted this answer)\n")
