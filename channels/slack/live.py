"""Live feedback while a run lasts: a thinking status and a preview of the reply.

Thinking: `assistant.threads.setStatus` in a thread (Slack accepts it in assistant threads
only); elsewhere, or when refused, a reaction on the person's message, removed at the end.
Both are best effort, sent in the background: a slow Slack never holds a run or its reply.
Preview: streaming = "update" posts the text so far and edits it at most once a second;
"stream" uses chat.startStream / appendStream / stopStream, which Slack allows only as a
thread reply (a DM without a thread falls back to "update"). A run shorter than one interval
shows no preview at all. The final reply replaces the preview (the adapter edits it), and a
discarded run deletes it. The preview's ts is kept in the store per session: after a restart,
the final send of a committed run still replaces it, and the session's next run takes over the
one a run cut short left (editing it into its own), or deletes it when it streams instead.
The message a thinking reaction is on is kept likewise, so the next run takes off the one a
run cut short left, whichever message it answers itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from cachetools import LRUCache

from channels.limiter import KeyedLimiter
from channels.slack.chunk import sections
from channels.slack.client import SlackApi
from channels.slack.format import to_mrkdwn
from channels.slack.settings import SlackSettings
from core.errors import ChannelError, StoreError
from core.models import SessionKey
from core.store import Store

__all__ = ["Live", "Preview"]

log = logging.getLogger(__name__)
UPDATE_INTERVAL = 1.0
STREAM_INTERVAL = 0.5
# chat.update is Tier 3 (50+ a minute per workspace): previews edit within 40, leaving room for
# the final replies that replace them (counted per replica; a 429 pushes the next edit back)
PREVIEW_EDITS_PER_MINUTE = 40
PREVIEWS_MAX = 1000
PREVIEWS_NS = "slack_preview"  # session -> its newest run's preview message, until replaced
REACTIONS_NS = "slack_thinking"  # session -> the message its run's thinking reaction is on
THINKING = "is thinking…"
_TS = re.compile(r"^\d+\.\d+$")


@dataclass(frozen=True, slots=True)
class Preview:
    """A message showing a run's text so far, to be replaced by its final reply."""

    channel: str
    ts: str


@dataclass(frozen=True, slots=True)
class _Saved:
    """A run's preview message as recorded in the store."""

    run: str
    channel: str
    ts: str
    stream: bool


@dataclass(eq=False)
class _Run:
    run_id: str
    key: SessionKey
    stream: bool
    trigger_ts: str | None
    user: str | None
    last_flush: float
    status: str | None = None  # "assistant" | "reaction"
    text: str = ""
    flushed: int = 0
    shown: str = ""  # the preview's text as last sent
    broken: bool = False  # the preview failed for good; the final reply still goes out
    preview_ts: str | None = None
    pump: asyncio.Task[None] | None = None
    inflight: asyncio.Future[None] | None = None
    status_on: asyncio.Task[None] | None = None


class Live:
    def __init__(self, api: SlackApi, store: Store, settings: SlackSettings) -> None:
        self._api, self._store = api, store
        self._mode = settings.streaming
        self._status = settings.status_messages
        self._reaction = settings.status_reaction
        self._runs: dict[str, _Run] = {}
        self._previews: LRUCache[str, Preview | None] = LRUCache(PREVIEWS_MAX)  # None: none
        self._no_assistant: set[str] = set()  # channels where setStatus was refused
        self._background: set[asyncio.Task[None]] = set()  # thinking status calls
        self._edits = KeyedLimiter(PREVIEW_EDITS_PER_MINUTE, 60.0)  # per workspace
        # workspace -> when (time.monotonic) Slack's last 429 on an edit lets edits go again
        self._edits_after: dict[str, float] = {}

    async def preview(self, key: SessionKey, run_id: str | None) -> Preview | None:
        """The finished run's preview, for its final reply to replace; from the store when
        this process did not stream it (it restarted between the commit and the send)."""
        if run_id is None:
            return None
        if run_id in self._previews:
            return self._previews[run_id]
        saved = await self._saved(key)
        if saved is None or saved.run != run_id:
            return None
        if saved.stream:  # left streaming by the process that died
            await _quiet(self._api.stop_stream(saved.channel, saved.ts), key)
        preview = self._previews[run_id] = Preview(saved.channel, saved.ts)
        return preview

    async def forget(self, key: SessionKey, run_id: str | None) -> None:
        """The final reply went out: its preview is no longer needed, here or in the store."""
        if run_id is None:
            return
        if run_id in self._previews and self._previews.pop(run_id) is None:
            return  # it had no preview: nothing stored
        await self._forget(key, run_id)

    async def started(self, key: SessionKey, run_id: str) -> None:
        stream = self._mode == "stream" and key.thread is not None
        trigger_ts, user = await self._trigger(key) if self._status or stream else (None, None)
        run = _Run(run_id, key, stream, trigger_ts, user, last_flush=time.monotonic())
        self._runs[run_id] = run
        # best effort: a slow Slack must not hold the run or its reply back
        run.status_on = self._spawn(self._status_on(run))
        # even with previews off: a process that showed them may have died (and been
        # restarted with them switched off) leaving one in the thread
        await self._left_behind(run)

    async def delta(self, key: SessionKey, run_id: str, text: str) -> None:
        run = self._runs.get(run_id)
        if run is None or self._mode == "off" or run.broken:
            return
        run.text += text
        if run.pump is None or run.pump.done():
            run.pump = asyncio.create_task(self._pump(run))

    async def ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        await self._stop_pump(run)
        self._spawn(self._status_done(run))
        if run.preview_ts is None:
            if not discarded:
                self._previews[run_id] = None
            return
        if run.stream:
            await _quiet(self._api.stop_stream(key.conversation, run.preview_ts), key)
        if discarded:
            await _quiet(self._api.delete(key.conversation, run.preview_ts), key)
            await self._forget(key, run_id)
            return
        self._previews[run_id] = Preview(key.conversation, run.preview_ts)

    async def aclose(self) -> None:
        for run in list(self._runs.values()):
            await self._stop_pump(run)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # thinking status

    async def _trigger(self, key: SessionKey) -> tuple[str | None, str | None]:
        """The ts and author of the newest message this run answers (still pending now)."""
        try:
            items = await self._store.pending(str(key))
        except StoreError:
            return None, None
        for item in reversed(items):
            channel, _, ts = item.message.platform_id.partition(":")
            if channel == key.conversation and _TS.match(ts):
                return ts, item.message.sender.id
        return None, items[-1].message.sender.id if items else None

    async def _status_on(self, run: _Run) -> None:
        await self._reaction_left_behind(run)
        if not self._status:
            return
        key = run.key
        if key.thread is not None and key.conversation not in self._no_assistant:
            try:
                await self._api.set_status(key.conversation, key.thread, THINKING)
            except ChannelError as exc:
                if not exc.retryable:
                    self._no_assistant.add(key.conversation)
            else:
                run.status = "assistant"
                return
        if run.trigger_ts is None:
            return
        try:
            await self._api.react(key.conversation, run.trigger_ts, self._reaction, add=True)
        except ChannelError as exc:
            if exc.code != "already_reacted":  # there already: left by a run cut short
                log.info("slack live feedback failed: %s", exc, extra={"session": str(key)})
                return
        run.status = "reaction"
        if run.run_id in self._runs:  # else ended meanwhile: its _status_done takes it off
            # (and the next run may have recorded its own); kept for whoever runs next,
            await self._record(REACTIONS_NS, run, run.trigger_ts)  # should this process die

    async def _status_done(self, run: _Run) -> None:
        """The status off, once it is surely on (its call may still be on its way)."""
        if run.status_on is not None:
            await asyncio.gather(run.status_on, return_exceptions=True)
        await self._status_off(run)

    async def _status_off(self, run: _Run) -> None:
        key = run.key
        if run.status == "assistant" and key.thread is not None:
            await _quiet(self._api.set_status(key.conversation, key.thread, ""), key)
        elif run.status == "reaction" and run.trigger_ts is not None:
            react = self._api.react(key.conversation, run.trigger_ts, self._reaction, add=False)
            await _quiet(react, key)
            await self._forget(key, run.run_id, REACTIONS_NS)

    async def _reaction_left_behind(self, run: _Run) -> None:
        """The thinking reaction of a run that no longer runs (the process died before it
        removed it): off, unless this run's own goes on that very message."""
        key = run.key
        saved = await self._saved(key, REACTIONS_NS)
        if saved is None or saved.run == run.run_id or saved.run in self._runs:
            return
        mine = self._status and saved.channel == key.conversation and saved.ts == run.trigger_ts
        if not mine:
            await _quiet(self._api.react(saved.channel, saved.ts, self._reaction, add=False), key)
        await self._forget(key, saved.run, REACTIONS_NS)

    # preview

    async def _left_behind(self, run: _Run) -> None:
        """The preview of a run that no longer runs (the process died before its final send
        or before it deleted it): this run edits it into its own, or (streaming) deletes it.
        Only the session's lease holder starts a run, and it sends every committed reply
        first, so no other run can still need it."""
        key = run.key
        saved = await self._saved(key)
        if saved is None or saved.run == run.run_id or saved.run in self._runs:
            return
        self._previews.pop(saved.run, None)
        log.info(
            "taking over the preview of run %s",
            saved.run,
            extra={"session": str(key), "channel": key.channel},
        )
        if saved.stream:
            await _quiet(self._api.stop_stream(saved.channel, saved.ts), key)
        if not run.stream and saved.channel == key.conversation:
            run.preview_ts = saved.ts
            await self._remember(run)  # now this run's, never lost
            return
        await _quiet(self._api.delete(saved.channel, saved.ts), key)
        await self._forget(key, saved.run)

    async def _saved(self, key: SessionKey, namespace: str = PREVIEWS_NS) -> _Saved | None:
        """The preview message (or, in REACTIONS_NS, the message a thinking reaction is on)
        the store holds for the session (from any process)."""
        try:
            raw = await self._store.kv_get(namespace, str(key))
            data = json.loads(raw) if raw else None
            if not isinstance(data, dict):
                return None
            return _Saved(
                str(data["run"]), str(data["channel"]), str(data["ts"]), bool(data.get("stream"))
            )
        except StoreError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            log.warning(
                "unreadable %s record dropped: %s", namespace, exc, extra={"session": str(key)}
            )
            return None

    async def _remember(self, run: _Run) -> None:
        """Keep the preview's ts in the store, so a restart still replaces or deletes it."""
        await self._record(PREVIEWS_NS, run, run.preview_ts)

    async def _record(self, namespace: str, run: _Run, ts: str | None) -> None:
        value = {"run": run.run_id, "channel": run.key.conversation, "ts": ts, "stream": run.stream}
        with contextlib.suppress(StoreError):
            await self._store.kv_set(namespace, str(run.key), json.dumps(value))

    async def _forget(self, key: SessionKey, run_id: str, namespace: str = PREVIEWS_NS) -> None:
        """Drop the stored record once done with, unless a newer run's is there."""
        saved = await self._saved(key, namespace)
        if saved is not None and saved.run != run_id:
            return
        with contextlib.suppress(StoreError):
            await self._store.kv_delete(namespace, str(key))

    async def _pump(self, run: _Run) -> None:
        while len(run.text) > run.flushed and not run.broken:
            interval = STREAM_INTERVAL if run.stream else UPDATE_INTERVAL
            wait = run.last_flush + interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            run.inflight = asyncio.ensure_future(self._flush(run))
            await asyncio.shield(run.inflight)  # a cancelled pump still learns the preview's ts
            run.last_flush = max(run.last_flush, time.monotonic())

    async def edits_allowed(self, account: str) -> None:
        """Wait out the Retry-After Slack gave the workspace's last edit (a final reply
        replacing its preview is an edit too: sent at once, it was refused again)."""
        if (wait := self._edits_after.get(account, 0.0) - time.monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _flush(self, run: _Run) -> None:
        key, text, new = run.key, run.text, run.preview_ts is None
        try:
            if run.stream and run.preview_ts is None and key.thread is not None:
                run.preview_ts = await self._api.start_stream(
                    key.conversation, key.thread, _inert(text), key.account, run.user
                )
            elif run.stream and run.preview_ts is not None:
                sent = len(_inert(text[: run.flushed]))  # what was sent is a prefix of it
                await self._api.append_stream(key.conversation, run.preview_ts, _inert(text)[sent:])
            elif run.preview_ts is None:
                run.shown = _preview(text)
                run.preview_ts = await self._api.post(key.conversation, run.shown, [], key.thread)
            elif (preview := _preview(text)) == run.shown:
                pass  # only the first section is shown, and it is there already: no edit
            elif (wait := await self._edits.take(key.account)) is not None:
                run.last_flush = time.monotonic() + wait  # the workspace's edits are spent
                return
            else:
                await self._api.update(key.conversation, run.preview_ts, preview, [])
                run.shown = preview
        except ChannelError as exc:
            extra = {"session": str(key), "channel": key.channel}
            if run.stream and run.preview_ts is None:
                log.info("slack stream refused (%s); editing a message instead", exc, extra=extra)
                run.stream = False
            elif exc.retryable:
                run.last_flush = time.monotonic() + (exc.retry_after or 0.0)
                if exc.retry_after and not run.stream:
                    self._edits_after[key.account] = run.last_flush
            else:
                log.warning("slack preview stopped: %s", exc, extra=extra)
                run.broken = True
            return
        run.flushed = len(text)
        if new:
            await self._remember(run)

    async def _stop_pump(self, run: _Run) -> None:
        if run.pump is not None:
            run.pump.cancel()
            await asyncio.gather(run.pump, return_exceptions=True)
        if run.inflight is not None:
            await asyncio.gather(run.inflight, return_exceptions=True)


def _inert(markdown: str) -> str:
    """Streamed text (Markdown, which Slack's streams take as it is) that names no one: a
    zero-width space after each "<" that would open <!here>, <!channel>, <@U…> or <#C…>,
    as a person may have typed it and the agent repeated it."""
    return re.sub(r"<(?=[!@#])", "<\u200b", markdown)


def _preview(markdown: str) -> str:
    """The text so far as mrkdwn, at most one section long, marked as unfinished."""
    first = sections(to_mrkdwn(markdown))[:1]
    return f"{first[0]} …" if first else "…"


async def _quiet(call: Awaitable[None], key: SessionKey) -> bool:
    """Best-effort feedback: a failure is logged, never raised."""
    try:
        await call
    except ChannelError as exc:
        log.info("slack live feedback failed: %s", exc, extra={"session": str(key)})
        return False
    return True
