"""The WhatsApp channel on the official Cloud API: webhook routes, delivery, typing.

`GET /webhooks/whatsapp` answers Meta's verification handshake; `POST /webhooks/whatsapp` checks
`X-Hub-Signature-256` over the raw body before anything is parsed (fail closed: missing 401,
wrong 403, nothing stored), stores every message of the notification, records delivery reports,
and answers 200 once stored. Reactions are passed to the agent as messages (a 👎 on an answer
is feedback worth reading); a removed reaction, a deleted message or a system notice is not.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Coroutine
from typing import Any

from aiohttp import web
from cachetools import LRUCache
from pydantic import SecretStr

from channels.base import BadInput, ChannelContext, Refusals, read_body, webhook_ok
from channels.mend import mend_json
from channels.order import Turns
from channels.whatsapp.client import GraphClient
from channels.whatsapp.media import fetch_all
from channels.whatsapp.menus import Menus
from channels.whatsapp.outbound import match_menu
from channels.whatsapp.parse import (
    CHANNEL,
    Incoming,
    MediaRef,
    StatusReport,
    Unsupported,
    parse_json,
)
from channels.whatsapp.sender import NS_SEEN, Sender
from channels.whatsapp.settings import WhatsAppSettings
from core.errors import ChannelError
from core.models import InboundMessage, MessageKind, OutboundPart, SessionKey

__all__ = ["OUTPUT_RULES", "WhatsAppAdapter"]

log = logging.getLogger(__name__)

PATH = "/webhooks/whatsapp"
OUTPUT_RULES = (
    "This is WhatsApp on a phone. Keep answers short: a few sentences or a short list. "
    "Write Markdown; WhatsApp shows **bold**, *italic*, ~~strikethrough~~ and `code`, but no "
    "headings, tables or link labels, so write plain URLs. Offer at most 3 short choices "
    "(20 characters each) with send_buttons when the person has to pick one."
)
NS_NOTIFIED = "whatsapp.notified"  # wamids of unsupported messages already answered
MENU_TEXT_MAX = 100  # longer texts are never read as a menu choice
TYPING_REFRESH_S = 20.0  # the indicator disappears after 25 s
TYPING_MAX_S = 600.0  # shown again for at most this long
RECENT_MAX = 4096
_CHALLENGE = re.compile(r"[0-9A-Za-z_-]{1,256}")  # documented as an int; echoed, so kept tame


class WhatsAppAdapter:
    """ChannelAdapter, HttpRoutes, Lifecycle and LiveOutlet of the WhatsApp Cloud API."""

    name = CHANNEL
    output_rules = OUTPUT_RULES

    def __init__(self, settings: WhatsAppSettings, ctx: ChannelContext) -> None:
        self._s, self._ctx = settings, ctx
        self._numbers = frozenset(settings.numbers())
        self._secret = _secret(settings.app_secret).encode()
        self._verify = _secret(settings.verify_token).encode()
        self._refusals = Refusals(log)
        self._graph = GraphClient(
            settings.api_base,
            settings.api_version,
            _secret(settings.access_token),
            settings.timeout_s,
            tuple(settings.media_hosts),
        )
        self._menus = Menus(ctx.store)
        self._sender = Sender(settings, ctx, self._graph, self._menus)
        self._tasks: set[asyncio.Task[None]] = set()
        self._notifying: set[str] = set()  # unsupported messages being answered now
        self._turns = Turns()
        self._typing: dict[str, asyncio.Task[None]] = {}  # session → its indicator, kept up
        self._recent: LRUCache[str, None] = LRUCache(RECENT_MAX)  # stored wamids: no refetch

    # HttpRoutes and Lifecycle

    def routes(self) -> list[web.RouteDef]:
        return [web.get(PATH, self.handshake), web.post(PATH, self.webhook)]

    async def start(self) -> None:
        """Hear about menus other replicas show; look up each business number once, in the
        background (a slow Graph API must not keep webhooks and /healthz waiting), so a bad
        token or number id shows in the log at start."""
        await self._menus.start()
        self._spawn(self._look_up_numbers())

    async def _look_up_numbers(self) -> None:
        for number in sorted(self._numbers):
            try:
                info = await self._graph.lookup(number)
            except ChannelError as exc:
                log.error("WhatsApp number %s lookup failed: %s", number, exc)
                continue
            log.info("WhatsApp number %s ready: %s", number, info.get("display_phone_number", "?"))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._graph.aclose()

    # inbound

    async def handshake(self, request: web.Request) -> web.Response:
        q = request.query
        token = q.get("hub.verify_token", "").encode()
        if q.get("hub.mode") == "subscribe" and hmac.compare_digest(token, self._verify):
            challenge = q.get("hub.challenge", "")
            if not _CHALLENGE.fullmatch(challenge):  # Meta sends an integer to echo back
                raise web.HTTPBadRequest(text="hub.challenge: missing or not a number-like token")
            return web.Response(text=challenge, content_type="text/plain")
        self._refusals.warning("WhatsApp verification refused", channel=CHANNEL)
        raise web.HTTPForbidden(text="verification failed")

    async def webhook(self, request: web.Request) -> web.Response:
        raw = await read_body(request)
        signature = request.headers.get("X-Hub-Signature-256")
        if signature is None:
            raise web.HTTPUnauthorized(text="missing X-Hub-Signature-256")
        expected = "sha256=" + hmac.new(self._secret, raw, hashlib.sha256).hexdigest()
        given = signature.strip()
        if not given.isascii() or not hmac.compare_digest(given.encode(), expected.encode()):
            self._refusals.warning("WhatsApp notification with a bad signature", channel=CHANNEL)
            raise web.HTTPForbidden(text="bad signature")
        try:
            events = parse_json(mend_json(raw), self._numbers, time.time())
        except (ValueError, RecursionError, BadInput) as exc:
            reason = str(exc) if isinstance(exc, BadInput) else "body is not valid JSON"
            raise web.HTTPBadRequest(text=reason) from None
        fresh = [
            (e.message, e.media)
            for e in events
            if isinstance(e, Incoming) and _rid(e.message) not in self._recent
        ]
        if fresh:
            # a text sent just after a photo must not be stored (and answered) before it
            async with self._turns.of(f"{m.account}/{m.conversation}" for m, _ in fresh):
                await self._store(fresh)
        for event in events:
            if isinstance(event, Unsupported):
                await self._unsupported(event)
            elif isinstance(event, StatusReport):
                await self._status(event)
        return webhook_ok()

    async def _store(self, fresh: list[tuple[InboundMessage, MediaRef | None]]) -> None:
        for msg in await fetch_all(self._graph, self._ctx, fresh, self._s.media_timeout_s):
            key = self._key(msg)
            session = str(key)
            # before it is stored: a notice submit queues (to a stranger the allowlist
            # refuses, who is not stored) may go out at once, inside the window they opened
            self._sender.heard(session, msg.received_at)
            await self._ctx.submit(await self._menu_choice(msg, session), key)
            self._recent[_rid(msg)] = None

    async def _menu_choice(self, msg: InboundMessage, session: str) -> InboundMessage:
        """A typed number or title answering the text menu we last sent becomes that button."""
        if msg.kind is not MessageKind.MESSAGE or msg.attachments or len(msg.text) > MENU_TEXT_MAX:
            return msg
        menu = await self._menus.get(session)
        chosen = match_menu(msg.text, menu) if menu else None
        if chosen is None:
            return msg
        label, value = chosen
        return msg.model_copy(
            update={"kind": MessageKind.BUTTON, "button_value": value, "text": label}
        )

    async def _unsupported(self, event: Unsupported) -> None:
        msg, store = event.message, self._ctx.store
        key, rid = self._key(msg), _rid(msg)
        # copies delivered at once (a redelivery while a slow acknowledgement is on its way)
        # would each find the flag unset: the first one in tells the customer
        if rid in self._notifying:
            return
        self._notifying.add(rid)
        try:
            if await store.kv_get(NS_NOTIFIED, rid):
                return
            log.info("unsupported %s message", event.what, extra=_extra(key))
            await store.kv_set(NS_SEEN, str(key), str(msg.received_at))
            await self._ctx.notify(key, self._s.unsupported_reply, about=msg)
            await store.kv_set(NS_NOTIFIED, rid, "1")
        finally:
            self._notifying.discard(rid)

    async def _status(self, report: StatusReport) -> None:
        known = await self._ctx.store.update_delivery(
            CHANNEL, report.id, report.status, report.error
        )
        if known and report.status == "failed":
            log.warning(
                "WhatsApp could not deliver %s: %s",
                report.id,
                report.error,
                extra={"channel": CHANNEL},
            )

    def _key(self, msg: InboundMessage) -> SessionKey:
        return self._ctx.session_key(msg)

    # outbound: Outlet and LiveOutlet

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        return await self._sender.send(key, part)

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        """Mark the message answered read (and all before it) and show the typing indicator,
        shown again before it lapses for as long as the run goes on (tool calls, a slow
        model: the person sees nothing else)."""
        self._stop_typing(key)
        self._typing[str(key)] = self._spawn(self._keep_typing(key, newest.platform_id))

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        """WhatsApp cannot edit a message, so nothing streams (the indicator goes on)."""
        return None

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        """The reply (or its absence) ends the indicator; stop showing it again."""
        self._stop_typing(key)

    async def _keep_typing(self, key: SessionKey, wamid: str) -> None:
        payload = {"status": "read", "message_id": wamid, "typing_indicator": {"type": "text"}}
        until = time.monotonic() + TYPING_MAX_S  # a run that never said it ended
        while time.monotonic() < until:
            await self._quietly(key, self._sender.call(key.account, payload))
            await asyncio.sleep(TYPING_REFRESH_S)

    def _stop_typing(self, key: SessionKey) -> None:
        if (task := self._typing.pop(str(key), None)) is not None:
            task.cancel()

    async def _quietly(self, key: SessionKey, call: Coroutine[Any, Any, Any]) -> None:
        try:
            await call
        except ChannelError as exc:
            log.warning("typing indicator failed: %s", exc, extra=_extra(key))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _rid(msg: InboundMessage) -> str:
    return f"{msg.account}/{msg.platform_id}"


def _extra(key: SessionKey) -> dict[str, str]:
    return {"session": str(key), "channel": CHANNEL}


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""
