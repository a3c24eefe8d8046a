"""Reply parts → Telegram messages: HTML chunks sent strictly in order, buttons on the last one,
the run's streamed preview edited into the reply (never both left), and each chunk sent once
even when a later one fails and the outbox retries the part."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

from cachetools import LRUCache
from telegram import InlineKeyboardButton, InlineKeyboardMarkup

from channels.telegram.client import BLOCKED, ChatMigrated, TelegramClient
from channels.telegram.live import Live, digest
from channels.telegram.markdown import render
from channels.telegram.parse import quoted
from channels.text import link
from core.errors import ChannelError, StoreError
from core.models import Button, OutboundPart, Reply, SessionKey
from core.store import Store

__all__ = ["CALLBACK_NS", "CALLBACK_PREFIX", "Delivery"]

log = logging.getLogger(__name__)
CALLBACK_NS = "telegram_cb"  # long button values, by the short id sent as callback_data
CALLBACK_PREFIX = "sb:"
BLOCKED_NS = "telegram_blocked"  # chat id → when Telegram said the bot was blocked
BLOCKED_KEEP = 10_000  # chats whose blocked state is remembered here (the store has them all)
PROGRESS_NS = "telegram_progress"  # part id → chunks already delivered
MIGRATED_NS = "telegram_migrated"  # group chat id → its supergroup's chat id
PROGRESS_KEEP = 1000  # parts whose progress is also kept in memory
BUTTONS_ONLY = "⬇️"  # Telegram needs text under a keyboard


@dataclass
class _Progress:
    done: list[int] = field(default_factory=list)  # message ids of the chunks delivered
    targets: list[int] = field(default_factory=list)  # preview messages to edit into chunks
    shown: list[str] = field(default_factory=list)  # digests of what the previews show
    reply_to: int | None = None
    # the run whose previews this part edits into the reply: while it does, its progress is
    # in the store, so a stop before the edits still finds the previews (else a second copy)
    preview_run: str | None = None
    handed: bool = False  # the run's own record of its previews is gone (they are in ours)


class Delivery:
    """The Outlet half of the adapter: `send` one stored reply part."""

    def __init__(self, client: TelegramClient, store: Store, live: Live) -> None:
        self._client, self._store, self._live = client, store, live
        self._progress: LRUCache[int, _Progress] = LRUCache(PROGRESS_KEEP)
        # chat → (since, by part), or None: not blocked; the chats sent to lately (it grew
        # with every chat ever answered)
        self._blocked: LRUCache[int, tuple[float, int] | None] = LRUCache(BLOCKED_KEEP)

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        chat = await self._chat(int(key.conversation))
        thread = int(key.thread) if key.thread else None
        await self._check_blocked(key, chat, part.id)
        chunks = _chunks(part.reply, str(key))
        progress = await self._start(key, part, chat)
        # in the store while under way, so a stop midway finds it: which chunks went out,
        # which previews they go into
        kept = len(chunks) > 1 or progress.preview_run is not None
        markup = await self._keyboard(part.reply.buttons) if part.reply.buttons else None
        try:
            for i in range(len(progress.done), len(chunks)):
                last = markup if i == len(chunks) - 1 else None
                mid = await self._chunk(chat, thread, i, chunks[i], last, progress, str(key))
                progress.done.append(mid)
                if kept:
                    await self._save(part.id, progress)
        except ChatMigrated as exc:  # the retry goes to the supergroup (new messages come from
            # there too, as another session: this one only finishes what it was answering)
            await self._store.kv_set(MIGRATED_NS, str(chat), str(exc.new_chat_id))
            progress.targets.clear()  # the previews stay behind in the old group
            progress.reply_to = None
            raise
        except ChannelError as exc:
            if exc.code == BLOCKED:
                await self._mark_blocked(chat, part.id)
            raise
        await self._live.delete(chat, progress.targets[len(chunks) :])  # previews left over
        self._progress.pop(part.id, None)
        if progress.preview_run is not None and not progress.handed:
            await self._live.handed(key, progress.preview_run)
        if kept:
            with contextlib.suppress(StoreError):
                await self._store.kv_delete(PROGRESS_NS, str(part.id))
        return str(progress.done[0]) if progress.done else None

    async def _chunk(
        self,
        chat: int,
        thread: int | None,
        i: int,
        chunk: tuple[str, str],
        markup: InlineKeyboardMarkup | None,
        progress: _Progress,
        session: str,
    ) -> int:
        """Deliver chunk i: into the preview message at the same place, else as a new message
        (the first one replying to the message it answers, in groups)."""
        html, plain = chunk
        if i >= len(progress.targets):
            reply_to = progress.reply_to if i == 0 else None
            return await self._client.send_text(
                chat, html, plain, thread=thread, reply_to=reply_to, markup=markup
            )
        mid = progress.targets[i]
        if markup is None and i < len(progress.shown) and progress.shown[i] == digest(html):
            return mid  # the preview already shows exactly this
        try:
            await self._client.edit_text(chat, mid, html, plain, markup=markup)
        except ChannelError as exc:
            if exc.code != "bad_request":
                raise
            log.info(
                "preview %d not editable (%s); sending anew",
                mid,
                exc,
                extra={"session": session, "channel": "telegram"},
            )
            return await self._client.send_text(chat, html, plain, thread=thread, markup=markup)
        return mid

    async def _chat(self, chat: int) -> int:
        """Where the session's chat lives now: a group upgraded to a supergroup moved."""
        if chat >= 0:  # private chats never move
            return chat
        moved = await self._store.kv_get(MIGRATED_NS, str(chat))
        return int(moved) if moved else chat

    async def _start(self, key: SessionKey, part: OutboundPart, chat: int) -> _Progress:
        """Where this part stands: fresh, or resumed after a failed attempt (from memory, or
        from the store after a restart)."""
        known = self._progress.get(part.id)
        if known is not None:
            return known
        raw = None  # asked even when no attempt was counted: a send cut short by a stop is not
        with contextlib.suppress(StoreError):
            raw = await self._store.kv_get(PROGRESS_NS, str(part.id))
        if raw:
            data = json.loads(raw)
            progress = _Progress(
                data["done"],
                data["targets"],
                data["shown"],
                data["reply_to"],
                data.get("preview_run"),
            )
        else:
            progress = _Progress()
            if chat < 0 and part.run_id:
                progress.reply_to = await self._trigger(part.run_id)
            if part.run_id:
                preview = await self._live.take(key, part.run_id)
                if preview.ids and chat < 0 and preview.reply_to != progress.reply_to:
                    await self._live.delete(chat, preview.ids)  # it answers another message
                    await self._live.handed(key, part.run_id)
                elif preview.ids:
                    progress.targets, progress.shown = preview.ids, preview.shown
                    progress.preview_run = part.run_id
                    # before the first edit: a stop while it waits (a 429) must still find
                    # the previews; then they are this part's alone (a next run must not take
                    # them over, should this part fail for good)
                    if await self._save(part.id, progress):
                        await self._live.handed(key, part.run_id)
                        progress.handed = True
        self._progress[part.id] = progress
        return progress

    async def _save(self, part_id: int, progress: _Progress) -> bool:
        """Whether the part's progress is in the store now."""
        data = {
            "done": progress.done,
            "targets": progress.targets,
            "shown": progress.shown,
            "reply_to": progress.reply_to,
            "preview_run": progress.preview_run,
        }
        try:
            await self._store.kv_set(PROGRESS_NS, str(part_id), json.dumps(data))
        except StoreError:
            return False
        return True

    async def _trigger(self, run_id: str) -> int | None:
        """What the reply quotes in a group: the newest message the run answers (`quoted`)."""
        messages = await self._store.run_messages(run_id)
        return quoted(messages[-1]) if messages else None

    async def _keyboard(self, buttons: tuple[Button, ...]) -> InlineKeyboardMarkup:
        """Short labels side by side, long ones a row each; values over 64 bytes travel as a
        short id that the store maps back."""
        keys = []
        for b in buttons:
            data = b.value
            if len(data.encode()) > 64 or data.startswith(CALLBACK_PREFIX):
                data = CALLBACK_PREFIX + hashlib.sha256(b.value.encode()).hexdigest()[:24]
                await self._store.kv_set(CALLBACK_NS, data, b.value)
            keys.append(InlineKeyboardButton(b.label, callback_data=data))
        if len(keys) <= 3 and all(len(b.label) <= 12 for b in buttons):
            return InlineKeyboardMarkup([keys])
        return InlineKeyboardMarkup([[k] for k in keys])

    async def _check_blocked(self, key: SessionKey, chat: int, part_id: int) -> None:
        """Fail fast for a chat that blocked the bot, until the person writes again. The part
        that found it out, or one before it, is tried for real: an operator sends a dead
        letter again once the person unblocked the bot."""
        if chat not in self._blocked:
            raw = (await self._store.kv_get(BLOCKED_NS, str(chat)) or "").split()
            by = int(raw[1]) if len(raw) > 1 and raw[1].isdigit() else 0  # older: every part
            self._blocked[chat] = (float(raw[0]), by) if raw else None
        blocked = self._blocked[chat]
        if blocked is None or part_id <= blocked[1]:
            return
        since = blocked[0]
        last = await self._store.last_inbound_at(str(key))
        if last is not None and last > since:
            self._blocked[chat] = None
            await self._store.kv_set(BLOCKED_NS, str(chat), "")
            return
        raise ChannelError("the bot was blocked by the user", retryable=False, code=BLOCKED)

    async def _mark_blocked(self, chat: int, part_id: int) -> None:
        now = time.time()
        self._blocked[chat] = (now, part_id)
        await self._store.kv_set(BLOCKED_NS, str(chat), f"{now!r} {part_id}")


def _chunks(reply: Reply, session: str) -> list[tuple[str, str]]:
    """The reply's messages: its text (attachments with a URL linked at the end), or a marker
    when only buttons need somewhere to live."""
    text = reply.text
    links = [link(a.name or a.kind, a.url) for a in reply.attachments if a.url]
    if links:
        text = "\n\n".join([text, *links]) if text else "\n".join(links)
    if any(a.url is None for a in reply.attachments):
        log.warning(
            "reply attachments without a URL are not sent on Telegram",
            extra={"session": session, "channel": "telegram"},
        )
    chunks = render(text).chunks()
    if not chunks and reply.buttons:
        chunks = [(BUTTONS_ONLY, BUTTONS_ONLY)]
    return chunks
