"""The terminal channel behind `switchboard chat`: stdin in, streamed text out."""

from __future__ import annotations

import sys
import time
import uuid
from typing import TextIO

from channels.mend import mend_strings
from core.models import InboundMessage, MessageKind, OutboundPart, Sender, SessionKey

__all__ = ["Console"]

CHANNEL = "console"


class Console:
    name = CHANNEL
    output_rules = "The terminal shows plain text; light Markdown is fine."

    def __init__(self, user: str, out: TextIO | None = None) -> None:
        self.user = user
        self._out = out or sys.stdout
        self._streamed: dict[str, str] = {}  # run id -> text already shown
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
        self._out.write(text)
        self._out.flush()

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        shown = self._streamed.pop(part.run_id, None) if part.run_id else None
        if shown is None or shown.strip() != part.reply.text.strip():
            if shown is not None:
                self._write("\n")
            self._write(f"agent> {part.reply.text}\n")
        else:
            self._write("\n")
        for button in part.reply.buttons:
            self._write(f"  [{button.label}]\n")
        self.delivered += 1
        return None

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        self._streamed[run_id] = ""

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        if not self._streamed.get(run_id):
            self._write("agent> ")
        self._streamed[run_id] = self._streamed.get(run_id, "") + text
        self._write(text)

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        if discarded and self._streamed.pop(run_id, ""):
            self._write("\n(discarded: a newer message interrupted this answer)\n")
