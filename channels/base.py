"""The channel boundary: what every adapter provides, and what the gateway gives it.

An adapter is a ChannelAdapter (name, output rules, send). Optional capabilities are their own
small Protocols, checked with isinstance: LiveOutlet (typing and streamed text while a run
lasts), Lifecycle (background work such as long polling or Socket Mode), HttpRoutes (webhook
routes mounted on the gateway's aiohttp app).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from aiohttp import web

from core.models import InboundMessage, OutboundPart, SessionKey
from core.outbox import Outlet
from core.sessions import LiveOutlet
from core.store import PutResult, Store

__all__ = [
    "LINGER_S",
    "BadInput",
    "ChannelAdapter",
    "ChannelContext",
    "HttpRoutes",
    "Lifecycle",
    "LiveOutlet",
    "Outlet",
    "Refusals",
    "read_body",
    "webhook_ok",
]

_OK_BODY = b'{"ok":true}'  # a webhook's 200 answer, encoded once


def webhook_ok() -> web.Response:
    """200 with {"ok": true}: a webhook stored (or deliberately ignored)."""
    return web.Response(body=_OK_BODY, content_type="application/json")


class Submit(Protocol):
    def __call__(
        self, msg: InboundMessage, key: SessionKey | None = None
    ) -> Awaitable[PutResult]: ...


class Notify(Protocol):
    def __call__(
        self, key: SessionKey, text: str, *, about: InboundMessage | None = None
    ) -> Awaitable[None]: ...


KeyFor = Callable[[str, str, str, str | None], SessionKey]
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class BadInput(ValueError):
    """A request the adapter cannot accept; the message is safe to show the client (HTTP 400)."""


class ChannelAdapter(Protocol):
    """A channel: its name, the output rules the agent follows there, and delivery."""

    name: str
    output_rules: str

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """Background work the adapter runs while the gateway is up (polling, sockets)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class HttpRoutes(Protocol):
    """Routes the adapter serves (its webhooks), mounted on the gateway's app."""

    def routes(self) -> list[web.RouteDef]: ...


@dataclass
class ChannelContext:
    """What the gateway hands every adapter: where to put messages, state and files."""

    store: Store
    files_dir: Path
    max_media_bytes: int = 20 * 1024 * 1024
    public_url: str | None = None
    _submit: Submit | None = field(default=None, repr=False)
    _notify: Notify | None = field(default=None, repr=False)
    _key_for: KeyFor | None = field(default=None, repr=False)

    def bind(self, submit: Submit, notify: Notify, key_for: KeyFor) -> None:
        """Connect to the session manager (it is built after the adapters)."""
        self._submit, self._notify, self._key_for = submit, notify, key_for

    async def submit(self, msg: InboundMessage, key: SessionKey | None = None) -> PutResult:
        """Store the message durably (deduped) and wake its session; returns once stored.
        `key`: the message's `session_key`, when the adapter has it already."""
        if self._submit is None:
            raise RuntimeError("channel context used before the session manager was bound")
        return await self._submit(msg, key)

    async def notify(self, key: SessionKey, text: str, *, about: InboundMessage) -> None:
        """Tell the sender of `about` something outside any run (stored, then delivered in
        order), unless access control refuses them (blocked, not allowed or not approved)."""
        if self._notify is None:
            raise RuntimeError("channel context used before the session manager was bound")
        await self._notify(key, text, about=about)

    def session_key(self, msg: InboundMessage) -> SessionKey:
        """The session this message belongs to (bindings decide the agent)."""
        if self._key_for is None:
            raise RuntimeError("channel context used before the session manager was bound")
        return self._key_for(msg.channel, msg.account, msg.conversation, msg.thread)

    def save_file(self, key: SessionKey, name: str, data: bytes) -> Path:
        """Keep a received file in the session's own folder; returns its path. The name starts
        with a digest of the bytes, so a redelivered or concurrently repeated message (each
        downloads before the store dedupes it) keeps one copy, written whole or not at all."""
        folder = self.files_dir / _UNSAFE.sub("_", str(key))[:200]
        folder.mkdir(parents=True, exist_ok=True)
        stem, dot, ext = name.rpartition(".")
        safe = _UNSAFE.sub("_", stem if dot else ext).strip("_")[:80] or "file"
        if dot and ext:
            safe += "." + _UNSAFE.sub("", ext)[:10]
        path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}-{safe}"
        if not path.exists():
            partial = path.with_name(f".{uuid.uuid4().hex}.part")
            partial.write_bytes(data)
            partial.replace(path)
        return path


class Refusals:
    """A warning about requests anyone can send (a bad signature, a wrong verify token),
    logged at most once per `every_s`; the next line says how many more there were, so a
    flood of forged requests cannot flood the log too (the 4xx are counted in the metrics)."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self._log, self._every = logger, every_s
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(self, msg: str, **extra: str) -> None:
        now = time.monotonic()
        last = self._last.get(msg)
        if last is not None and now - last < self._every:
            self._skipped[msg] = self._skipped.get(msg, 0) + 1
            return
        skipped = self._skipped.pop(msg, 0)
        self._last[msg] = now
        more = f" (and {skipped} more since the last such line)" if skipped else ""
        self._log.warning("%s%s", msg, more, extra=extra)


BODY_WITHIN_S = 10.0  # a request's body must have arrived by then
LINGER_S = 1.0  # after answering a request whose body did not all come, how long aiohttp reads on


async def read_body(request: web.Request) -> bytes:
    """The request body, which must arrive within BODY_WITHIN_S (else 408): a client that
    sends its headers and then the body a byte at a time held its connection, and a file
    descriptor, forever, and some thousands of them took the whole gateway down."""
    if request.content.is_eof():  # all here already (a small body comes with its headers):
        return await request.read()  # no timer to arm, on the path every webhook takes
    try:
        async with asyncio.timeout(BODY_WITHIN_S):
            return await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"body not received within {BODY_WITHIN_S:g} s", headers={"Connection": "close"}
        ) from None
