"""While a run lasts: "typing…" refreshed every 4 s, and a preview of the reply as it is written.

Private chats get sendMessageDraft (an ephemeral preview the final sendMessage replaces); if the
server does not know the method, that is remembered and previews fall back to edit-in-place, as
in groups: one message edited at most once a second per chat, a new one started before 4096
units. The preview messages are handed to the final send, which edits them into the reply (or
deletes them), so a reply never shows twice; a discarded run deletes its preview. Their ids are
kept in the store per session: after a restart, the final send of a committed run still finds
them, and the session's next run takes over those a run cut short left (editing them into its
own preview and reply), or deletes them when it answers another message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from functools import partial

from cachetools import LRUCache
from telegram.constants import ChatAction, ParseMode

from channels.telegram.client import BLOCKED, TelegramClient, is_parse_error
from channels.telegram.markdown import render
from channels.telegram.parse import quoted
from core.errors import ChannelError, StoreError
from core.models import InboundMessage, SessionKey
from core.store import Store

__all__ = ["Handover", "Live", "Preview", "digest"]

log = logging.getLogger(__name__)
TYPING_EVERY_S = 4.0
EDIT_EVERY_S = 1.0
PREVIEWS_NS = "telegram_preview"
_KEEP = 1000  # finished previews waiting for their final send


def digest(html: str) -> str:
    """A short fingerprint of what a message shows (to skip edits that change nothing)."""
    return hashlib.sha256(html.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Handover:
    """A finished run's preview messages, for the final send to edit into the reply."""

    ids: list[int] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)  # digest of each one's current HTML
    reply_to: int | None = None


@dataclass(frozen=True, slots=True)
class _Saved:
    """The preview messages a run recorded in the store."""

    run: str
    ids: list[int]
    shown: list[str]
    reply_to: int | None


@dataclass
class Preview:
    """A run's live state, and the preview messages the final send must take over."""

    run_id: str
    chat_id: int
    thread: int | None
    reply_to: int | None
    draft: bool
    text: str = ""
    ids: list[int] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)  # digests
    last: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    typing: asyncio.Task[None] | None = None


class Live:
    """LiveOutlet behaviour for one bot."""

    def __init__(self, client: TelegramClient, store: Store, *, streaming: bool) -> None:
        self._client, self._store, self._streaming = client, store, streaming
        self._drafts = True  # until the server says it has no sendMessageDraft
        self._no_drafts: LRUCache[int, None] = LRUCache(_KEEP)  # chats that refused one
        self._running: dict[str, Preview] = {}
        self._finished: LRUCache[str, Preview] = LRUCache(_KEEP)

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        """In a group the answer quotes the newest message it answers (`quoted`)."""
        chat = int(key.conversation)
        state = Preview(
            run_id=run_id,
            chat_id=chat,
            thread=int(key.thread) if key.thread else None,
            reply_to=quoted(newest) if chat < 0 else None,
            draft=chat > 0 and self._drafts and chat not in self._no_drafts,
        )
        old = self._running.pop(str(key), None)
        if old is not None:
            await self._stop(old)
        self._running[str(key)] = state
        state.typing = asyncio.create_task(self._type(state), name=f"typing {key}")
        # even with previews off: a process that streamed them may have died (and been
        # restarted with them switched off) leaving one in the chat
        await self._left_behind(key, state)

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        state = self._running.get(str(key))
        if not self._streaming or state is None or state.run_id != run_id:
            return
        state.text += text
        if state.pump is None:
            state.pump = asyncio.create_task(self._pump(key, state), name=f"preview {key}")

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        state = self._running.get(str(key))
        if state is None or state.run_id != run_id:
            return
        del self._running[str(key)]
        await self._stop(state)
        if discarded:
            await self.delete(state.chat_id, state.ids)
            if state.ids:
                await self._forget(key, run_id)
            return
        self._finished[run_id] = state

    async def take(self, key: SessionKey, run_id: str) -> Handover:
        """The preview messages of a finished run, handed over once; from the store when this
        process did not stream it (it restarted in between). The store keeps them until the
        taker says `handed`: a stop before it has recorded them must not lose them."""
        state = self._finished.pop(run_id, None)
        if state is not None:
            return Handover(state.ids, state.shown, state.reply_to)
        saved = await self._saved(key)
        if saved is None or saved.run != run_id:
            return Handover()
        return Handover(saved.ids, saved.shown, saved.reply_to)

    async def handed(self, key: SessionKey, run_id: str) -> None:
        """The run's previews taken are in the taker's own record now (or gone)."""
        await self._forget(key, run_id)

    async def aclose(self) -> None:
        for state in list(self._running.values()):
            await self._stop(state)
        self._running.clear()

    async def delete(self, chat_id: int, ids: list[int]) -> None:
        for mid in ids:
            with contextlib.suppress(ChannelError):
                await self._client.call(partial(self._client.bot.delete_message, chat_id, mid))

    async def _stop(self, state: Preview) -> None:
        state.stop.set()
        tasks = [t for t in (state.pump, state.typing) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _type(self, state: Preview) -> None:
        bot = self._client.bot
        while not state.stop.is_set():
            pause = TYPING_EVERY_S
            try:
                await self._client.call(
                    lambda: bot.send_chat_action(
                        state.chat_id, ChatAction.TYPING, message_thread_id=state.thread
                    )
                )
            except ChannelError as exc:
                log.debug("typing action failed: %s", exc)
                if exc.code == BLOCKED:
                    return
                pause = max(pause, exc.retry_after or 0.0)  # a 429 says when to ask again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.stop.wait(), pause)

    async def _pump(self, key: SessionKey, state: Preview) -> None:
        """Show the text so far, at most once a second, until nothing new is left."""
        while not state.stop.is_set():
            wait = state.last + EDIT_EVERY_S - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.stop.wait(), wait)
                if state.stop.is_set():
                    break
            seen, pause = len(state.text), 0.0
            try:
                await self._show(key, state)
            except ChannelError as exc:
                log.info("preview not shown: %s", exc, extra={"session": str(key)})
                pause = exc.retry_after or 0.0  # a 429: no edit before it has passed
            state.last = time.monotonic() + pause
            if len(state.text) == seen:
                break
        state.pump = None

    async def _show(self, key: SessionKey, state: Preview) -> None:
        chunks = render(state.text).chunks()
        if not chunks:
            return
        bot, chat = self._client.bot, state.chat_id
        if state.draft:
            html = chunks[-1][0]
            draft_id = _draft_id(state.run_id) + len(chunks) - 1
            try:
                await self._client.call(  # ephemeral: not a message the chat's budget counts
                    lambda: bot.send_message_draft(
                        chat, draft_id, html, state.thread, parse_mode=ParseMode.HTML
                    )
                )
                return
            except ChannelError as exc:
                if exc.code not in ("not_found", "bad_request") or is_parse_error(exc):
                    raise
                log.info("sendMessageDraft unavailable (%s); previews edit messages instead", exc)
                state.draft = False
                if exc.code == "not_found":  # the server has no such method
                    self._drafts = False
                else:  # refused for this chat: the others keep their drafts
                    self._no_drafts[chat] = None
        await self._roll(key, state, chunks)

    async def _roll(self, key: SessionKey, state: Preview, pages: list[tuple[str, str]]) -> None:
        """Edit the preview messages whose text changed; start the next one when the text
        outgrows the last."""
        for i, (html, plain) in enumerate(pages):
            if i < len(state.ids):
                if state.shown[i] != digest(html):
                    await self._client.edit_text(state.chat_id, state.ids[i], html, plain)
                    state.shown[i] = digest(html)
                continue
            mid = await self._client.send_text(
                state.chat_id,
                html,
                plain,
                thread=state.thread,
                reply_to=state.reply_to if not state.ids else None,
            )
            state.ids.append(mid)
            state.shown.append(digest(html))
            await self._remember(key, state)

    async def _left_behind(self, key: SessionKey, state: Preview) -> None:
        """Previews of a run that no longer runs (the process died before its final send, or
        before it deleted them): this run edits them into its own, or they go. Only the
        session's lease holder starts a run, and it sends every committed reply first, so
        no other run can still need them."""
        saved = await self._saved(key)
        if saved is None or saved.run == state.run_id:
            return
        self._finished.pop(saved.run, None)
        log.info(
            "taking over %d preview(s) of run %s",
            len(saved.ids),
            saved.run,
            extra={"session": str(key), "channel": "telegram"},
        )
        if not state.draft and saved.reply_to == state.reply_to:
            state.ids, state.shown = list(saved.ids), list(saved.shown)
            await self._remember(key, state)  # now this run's, never lost
            return
        await self.delete(state.chat_id, saved.ids)  # a draft or another quote: out of place
        await self._forget(key, saved.run)

    async def _saved(self, key: SessionKey) -> _Saved | None:
        """The preview messages the store holds for the session (from any process)."""
        try:
            raw = await self._store.kv_get(PREVIEWS_NS, str(key))
            data = json.loads(raw) if raw else None
            if not isinstance(data, dict) or not data.get("ids"):
                return None
            ids, shown = [int(i) for i in data["ids"]], [str(d) for d in data.get("shown", [])]
            shown = (shown + [""] * len(ids))[: len(ids)]  # one digest per message, to edit it
            reply_to = data.get("reply_to")
            return _Saved(str(data["run"]), ids, shown, int(reply_to) if reply_to else None)
        except StoreError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("unreadable preview record dropped: %s", exc, extra={"session": str(key)})
            return None

    async def _remember(self, key: SessionKey, state: Preview) -> None:
        """Keep the preview ids in the store, so a restart before the final send still
        replaces them instead of leaving a second copy."""
        value = {
            "run": state.run_id,
            "ids": state.ids,
            "shown": state.shown,
            "reply_to": state.reply_to,
        }
        with contextlib.suppress(StoreError):
            await self._store.kv_set(PREVIEWS_NS, str(key), json.dumps(value))

    async def _forget(self, key: SessionKey, run_id: str) -> None:
        """Drop the stored ids once handed over or deleted, unless a newer run's are there."""
        saved = await self._saved(key)
        if saved is not None and saved.run != run_id:
            return
        with contextlib.suppress(StoreError):
            await self._store.kv_delete(PREVIEWS_NS, str(key))


def _draft_id(run_id: str) -> int:
    """A non-zero id per run (within 31 bits), with room for 63 more previews after it."""
    seed = int(hashlib.sha256(run_id.encode()).hexdigest()[:6], 16)
    return (seed << 6) + 1
