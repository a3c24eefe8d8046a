"""The Telegram channel: webhook route or long polling in, Delivery and Live out.

Media and the webhook: Telegram redelivers an update until it gets a 2xx, and the agent needs
the files, so a message with media is stored only once its files are fetched. On the webhook
path that fetch is bounded (`media_timeout_s`, 5 s by default, well inside Telegram's patience);
whatever is not downloaded by then is stored described as "not downloaded (reason)" rather than
holding the request or losing the message. Long polling has no deadline to meet, so it fetches
inline (bounded at a minute) before storing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Coroutine
from typing import Any

import httpx
from aiohttp import web
from cachetools import LRUCache
from pydantic import ValidationError

from channels.base import ChannelContext, read_body, webhook_ok
from channels.mend import mend_json, mend_strings
from channels.order import Turns
from channels.telegram.client import TelegramClient
from channels.telegram.live import Live
from channels.telegram.media import fetch_all
from channels.telegram.outbound import CALLBACK_NS, CALLBACK_PREFIX, Delivery
from channels.telegram.parse import (
    Identity,
    Incoming,
    ParseOptions,
    Update,
    message_id_of,
    normalize,
)
from channels.telegram.settings import TelegramSettings
from core.errors import ChannelError
from core.models import InboundMessage, MessageKind, OutboundPart, SessionKey
from core.store import InboxStatus

__all__ = ["OUTPUT_RULES", "TelegramAdapter"]

log = logging.getLogger(__name__)
CHANNEL = "telegram"
ROUTE = "/webhooks/telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
IDENTITY_NS = "telegram_identity"  # bot id → @username learnt from getMe
POLL_MEDIA_TIMEOUT_S = 60.0
IDENTIFY_WITHIN_S = 2.0  # getMe, asked again when a group message comes before it succeeded
NO_IDENTITY = "no_identity"
EDITS_NS = "telegram_versions"  # chat:message id → digest of its last text and files
_TYPED = (MessageKind.MESSAGE, MessageKind.EDIT)
ALBUMS_NS = "telegram_albums"  # media_group_id → "1": an album addressed to the bot
STALE_BUTTON = "a button whose choice is no longer known"  # its stored value is gone
ALBUMS_MAX = 10_000
ANSWERED_MAX = 10_000  # button presses answered lately: a redelivered one is not answered again
OUTPUT_RULES = (
    "Telegram shows Markdown: **bold**, *italic*, ~~strikethrough~~, `code`, fenced code "
    "blocks, > quotes, [links](https://example.com) and lists. Tables show as plain rows, so "
    "prefer lists. Keep answers short, like a chat message."
)


class TelegramAdapter:
    """Channel adapter, LiveOutlet, HttpRoutes (webhook mode) and Lifecycle."""

    name = CHANNEL
    output_rules = OUTPUT_RULES

    def __init__(
        self, section: TelegramSettings, ctx: ChannelContext, client: TelegramClient | None = None
    ) -> None:
        self._section, self._ctx = section, ctx
        self._client = client or TelegramClient(section)
        self._webhook = section.effective_mode(ctx.public_url) == "webhook"
        secret = section.webhook_secret
        self._secret = secret.get_secret_value().encode() if secret else b""
        self._me = Identity(self._client.bot_id, section.bot_username)
        self._opts = ParseOptions(section.group_mode, section.edited_messages)
        self._live = Live(self._client, ctx.store, streaming=section.streaming)
        self._delivery = Delivery(self._client, ctx.store, self._live)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))
        self._tasks: set[asyncio.Task[None]] = set()
        self._answered: LRUCache[str, None] = LRUCache(ANSWERED_MAX)
        self._albums: LRUCache[str, None] = LRUCache(ALBUMS_MAX)  # media groups known for us
        self._turns = Turns()
        self._closed = False

    # HttpRoutes

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ROUTE, self._handle_webhook)] if self._webhook else []

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        header = request.headers.get(SECRET_HEADER, "")
        given = header.encode() if header.isascii() else b""  # a real secret is ASCII
        if not self._secret or not given or not hmac.compare_digest(given, self._secret):
            return web.json_response({"error": "forbidden"}, status=403)
        raw = await read_body(request)
        try:
            update = Update.model_validate_json(mend_json(raw))
        except ValidationError as exc:
            return web.json_response({"error": _reason(exc)}, status=400)
        try:
            await self._accept(update, self._section.media_timeout_s)
        except ChannelError as exc:
            if exc.code != NO_IDENTITY:
                raise
            return web.json_response({"error": str(exc)}, status=503)  # Telegram retries
        return webhook_ok()

    # Lifecycle

    async def start(self) -> None:
        await self._learn_identity(wait_s=5.0)
        if not self._webhook:
            self._spawn(self._poll(), "telegram polling")

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._live.aclose()
        await self._http.aclose()
        await self._client.aclose()

    # Outlet and LiveOutlet

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        if self._closed:  # the part stays stored (the outbox waits, then is cancelled) and
            # goes out after the restart
            raise ChannelError("the Telegram channel is closed", retryable=True, retry_after=60)
        return await self._delivery.send(key, part)

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        if not self._closed:
            await self._live.run_started(key, run_id, newest)

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        if not self._closed:
            await self._live.run_delta(key, run_id, text)

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        if not self._closed:
            await self._live.run_ended(key, run_id, discarded=discarded)

    # inbound, shared by both modes

    async def _accept(self, update: Update, media_timeout_s: float) -> None:
        """Normalize, fetch media, store (deduped), then acknowledge a button press."""
        if self._me.username is None and update.in_a_group:
            await self._identify()  # whether it mentions us, or its /command@bot is for us
        msg = update.message
        album = msg.media_group_id if msg is not None and update.in_a_group else None
        known = album is not None and await self._album_for_us(album)
        incoming = normalize(update, self._me, self._opts, addressed=known)
        if album is not None and incoming is not None and not known:
            await self._ctx.store.kv_set(ALBUMS_NS, album, "1")  # its other photos are too
            self._albums[album] = None
        if incoming is not None and not await self._same_as_before(incoming):
            # a text sent just after a photo must not be stored (and answered) before it
            async with self._turns.of([incoming.message.conversation]):
                await self._store(incoming, media_timeout_s)
        if update.callback_query is not None and update.callback_query.id not in self._answered:
            # Telegram takes one answer per press; a redelivery (the first acknowledgement was
            # lost) is stored once by the inbox and answered once here. After a restart it is
            # answered again: Telegram refuses that harmlessly, and it may be the first answer
            query_id = update.callback_query.id
            self._answered[query_id] = None
            self._spawn(self._answer(query_id), "telegram callback answer")

    async def _same_as_before(self, incoming: Incoming) -> bool:
        """With edits read as new messages: whether this edit leaves what the agent reads as
        it was (Telegram sends an edit for a change of formatting or of a link's preview too).
        Each message's last version is remembered for that, only while edits are read."""
        if self._opts.edited_messages != "new" or incoming.message.kind not in _TYPED:
            return False
        msg = incoming.message
        shown = "\0".join([msg.text, *(m.file_id or m.description for m in incoming.media)])
        digest = hashlib.sha256(shown.encode()).hexdigest()[:16]
        where = f"{msg.conversation}:{message_id_of(msg.platform_id)}"
        if msg.kind is MessageKind.EDIT and await self._ctx.store.kv_get(EDITS_NS, where) == digest:
            log.info("edit %s changes nothing the agent reads", msg.platform_id)
            return True
        await self._ctx.store.kv_set(EDITS_NS, where, digest)
        return False

    async def _album_for_us(self, album: str) -> bool:
        """Whether an earlier photo of this album was addressed to the bot (in a group only
        the first one carries the caption that mentions it)."""
        if album in self._albums:
            return True
        if await self._ctx.store.kv_get(ALBUMS_NS, album) is None:
            return False
        self._albums[album] = None
        return True

    async def _store(self, incoming: Incoming, media_timeout_s: float) -> None:
        msg = incoming.message
        key = self._ctx.session_key(msg)
        if msg.button_value and msg.button_value.startswith(CALLBACK_PREFIX):
            value = await self._ctx.store.kv_get(CALLBACK_NS, msg.button_value)
            if value is not None:
                text = value if msg.text == msg.button_value else msg.text
            else:  # a button of ours whose value is gone: never show the model our token
                text = STALE_BUTTON if msg.text == msg.button_value else msg.text
            msg = msg.model_copy(update={"button_value": value, "text": text})
        if incoming.media:
            attachments = await fetch_all(
                incoming.media,
                client=self._client,
                http=self._http,
                ctx=self._ctx,
                key=key,
                timeout_s=media_timeout_s,
            )
            msg = msg.model_copy(update={"attachments": attachments})
        result = await self._ctx.submit(msg, key)
        if result.status is InboxStatus.DUPLICATE:
            # its files are kept: they are named by their content, so the copy that was stored
            # first points at the very same ones
            extra = {"session": str(key), "channel": CHANNEL}
            log.info("update %s was already stored", msg.platform_id, extra=extra)

    async def _answer(self, query_id: str) -> None:
        bot = self._client.bot
        try:
            await self._client.call(lambda: bot.answer_callback_query(query_id))
        except ChannelError as exc:
            log.info("callback query %s not answered: %s", query_id, exc)

    # long polling

    async def _poll(self) -> None:
        """getUpdates forever; an update is confirmed (by asking past it) only once stored, so a
        crash redelivers it and the inbox's dedupe makes that harmless."""
        bot, s = self._client.bot, self._section
        with contextlib.suppress(ChannelError):
            await self._client.call(lambda: bot.delete_webhook(drop_pending_updates=False))
        offset: int | None = None
        failures = 0
        while True:
            try:
                batch = await self._client.get_updates(offset, s.poll_timeout_s, s.allowed_updates)
                await self._poll_batch(batch)
                ids = [u.get("update_id") for u in batch if isinstance(u, dict)]
                if numbered := [i for i in ids if isinstance(i, int)]:  # Telegram numbers all
                    offset = max(numbered) + 1
                failures = 0
            except Exception as exc:  # the loop must outlive any one failure
                failures += 1
                delay = min(0.5 * 2 ** min(failures - 1, 6), 30.0)
                if isinstance(exc, ChannelError) and exc.retry_after:
                    delay = max(delay, exc.retry_after)
                log.warning("telegram polling failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)

    async def _poll_batch(self, batch: list[Any]) -> None:
        """Each chat's updates in order, the chats side by side: one person's slow download
        must not hold up everyone else (each webhook is its own request, so there it cannot).
        Raises when any failed, so the batch is asked for again; what was stored is deduped."""
        chats: dict[int | None, list[Update]] = {}
        for item in batch:
            try:
                update = Update.model_validate(mend_strings(item))
            except ValidationError as exc:
                log.warning(
                    "skipping an update Telegram sent that we cannot read: %s", _reason(exc)
                )
                continue
            chats.setdefault(update.chat_id, []).append(update)

        async def in_order(updates: list[Update]) -> None:
            for update in updates:
                await self._accept(update, POLL_MEDIA_TIMEOUT_S)

        results = await asyncio.gather(*map(in_order, chats.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # identity

    async def _learn_identity(self, wait_s: float) -> None:
        """Know our @username for mentions: configured, cached in the store, or from getMe
        (waited for briefly at start, then retried in the background)."""
        if self._me.username:
            return
        cached = await self._ctx.store.kv_get(IDENTITY_NS, self._me.bot_id)
        if cached:
            self._me = Identity(self._me.bot_id, cached)
            return
        try:
            await asyncio.wait_for(self._get_me(), wait_s)
        except (ChannelError, TimeoutError) as exc:
            log.warning("getMe failed (%s); mentions are recognised once it succeeds", exc)
            self._spawn(self._get_me_retrying(), "telegram getMe")

    async def _identify(self) -> None:
        """Learn our @username now, or raise: a group message cannot be judged without it (it
        used to be dropped as not addressed to us, and other bots' commands taken for ours)."""
        try:
            await asyncio.wait_for(self._get_me(), IDENTIFY_WITHIN_S)
        except (ChannelError, TimeoutError) as exc:
            raise ChannelError(
                f"the bot's @username is not known yet (getMe: {exc or 'timed out'})",
                code=NO_IDENTITY,
            ) from None
        if self._me.username is None:
            raise ChannelError("getMe gave the bot no @username", code=NO_IDENTITY)

    async def _get_me(self) -> None:
        bot = self._client.bot
        user = await self._client.call(bot.get_me)
        if user.username:
            self._me = Identity(self._me.bot_id, user.username)
            await self._ctx.store.kv_set(IDENTITY_NS, self._me.bot_id, user.username)

    async def _get_me_retrying(self) -> None:
        delay = 2.0
        while True:
            await asyncio.sleep(delay)
            try:
                await self._get_me()
                return
            except ChannelError as exc:
                log.info("getMe failed again: %s", exc)
                delay = min(delay * 2, 300.0)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _reason(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"
