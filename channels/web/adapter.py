"""The web chat: browser sessions by cookie, live events over Server-Sent Events.

On several replicas (PostgreSQL), a browser's event stream may be open on another replica than
the one that runs its turn. The replica that sends a reply announces it to every replica
(`kv_set(..., announce=True)`: a NOTIFY, which the sender ignores), and each other replica
with a stream open for that browser reads the replies it has not shown from the transcript and
sends them on. Typing and streamed
previews stay with the replica that runs the turn, and a message one tab posts is shown live
only by the replica that took it; every reply reaches every open page.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import secrets
import time
import uuid
from collections import defaultdict
from typing import Any

from cachetools import LRUCache
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from channels.base import BadInput
from core.agent.builtin import BUTTON_VALUE_MAX
from core.errors import StoreError
from core.models import InboundMessage, MessageKind, OutboundPart, Sender, SessionKey
from core.policies import KvWatchingStore, NotifyingStore
from core.store import Store

__all__ = ["WebChat", "conversation_of", "new_secret", "valid_secret"]

CHANNEL = "web"
OUTPUT_RULES = (
    "The web chat renders Markdown: **bold**, *italic*, `code`, fenced code blocks, lists and "
    "links. Keep answers short; use a list when there are several items."
)
_SECRET = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
_COMMAND = re.compile(r"^/([a-z][a-z0-9_]{0,31})(?:\s|$)", re.IGNORECASE)  # phones: /Reset
QUEUE_SIZE = 1000
NS_REPLIES = "web.replies"  # "<replica> <session key>": a reply was sent (announced only)
SHOWN_MAX = 20_000  # reply ids this replica has put on its streams
CATCH_UP = 20  # transcript entries read for a reply sent by another replica

log = logging.getLogger(__name__)


def new_secret() -> str:
    """A browser's cookie: 43 characters (those set before it was a secret had 32)."""
    return secrets.token_urlsafe(32)


def valid_secret(value: str | None) -> bool:
    return value is not None and bool(_SECRET.match(value))


def conversation_of(secret: str) -> str:
    """The conversation a browser's cookie opens: a digest of it, so the id that the store, the
    logs and the console show is no credential (and, holding a ".", which no cookie may,
    cannot be sent back as one)."""
    digest = hashlib.sha256(secret.encode()).digest()[:24]
    return "c." + base64.urlsafe_b64encode(digest).decode()


class _PostBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=4000)
    client_id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")
    button: str | None = Field(default=None, max_length=BUTTON_VALUE_MAX)


class WebChat:
    """Adapter and event hub. One browser session = one conversation; a browser may have
    several tabs open, and each gets every event of its session."""

    name = CHANNEL
    output_rules = OUTPUT_RULES

    def __init__(self, store: Store | None = None) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[str | None]]] = defaultdict(set)
        # other replicas run turns too (PostgreSQL): replies are announced between them
        shared = isinstance(store, NotifyingStore) and isinstance(store, KvWatchingStore)
        self._relay: Store | None = store if shared else None
        self._origin = uuid.uuid4().hex[:12]  # this replica, which needs no news of its sends
        self._shown: LRUCache[str, None] = LRUCache(SHOWN_MAX)
        self._tasks: set[asyncio.Task[None]] = set()
        # streamed text not yet on the pages: (run id, pieces) by conversation
        self._deltas: dict[str, tuple[str, list[str]]] = {}
        # the run going on now, by conversation, with the text its pages were sent: a page
        # opened (or reopened) mid-run is told, or it showed no sign of it, or a fragment
        self._running: dict[str, tuple[str, list[str]]] = {}

    async def start(self) -> None:
        if isinstance(self._relay, KvWatchingStore):
            await self._relay.watch_kv(NS_REPLIES, self._sent_elsewhere)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def parse(self, session_id: str, body: Any) -> InboundMessage:
        """Turn a POST /chat/messages body into a normalized message, or raise BadInput."""
        try:
            post = _PostBody.model_validate(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "body"
            raise BadInput(f"{where}: {err['msg']}") from None
        text = post.text.strip()
        if not text:
            raise BadInput("text: must not be blank")
        kind, command = MessageKind.MESSAGE, None
        if post.button is not None:
            kind = MessageKind.BUTTON
        elif m := _COMMAND.match(text):
            kind, command = MessageKind.COMMAND, m.group(1).lower()
        return InboundMessage(
            channel=CHANNEL,
            conversation=session_id,
            sender=Sender(id=session_id),
            text=text,
            platform_id=f"{session_id}:{post.client_id}",  # ids are only unique per browser
            kind=kind,
            command=command,
            button_value=post.button,
            received_at=time.time(),
        )

    # event hub

    def subscribe(self, session_id: str) -> asyncio.Queue[str | None]:
        """Frames of Server-Sent Events for one open page; None means the stream is over."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE_SIZE)
        self._subscribers[session_id].add(queue)
        if (running := self._running.get(session_id)) is not None:
            run_id, pieces = running
            queue.put_nowait(_frame("typing", {"run_id": run_id}))
            if pieces:  # the whole text so far, in place of what the page may have
                queue.put_nowait(_frame("preview", {"run_id": run_id, "text": "".join(pieces)}))
        return queue

    def close(self) -> None:
        """End every open stream: at shutdown, so no connection holds the server open, and
        when replies may have been missed (each page then reloads what it has not shown)."""
        for subs in self._subscribers.values():
            for queue in subs:
                _end(queue)

    def unsubscribe(self, session_id: str, queue: asyncio.Queue[str | None]) -> None:
        subs = self._subscribers.get(session_id)
        if subs is not None:
            subs.discard(queue)
            if not subs:
                del self._subscribers[session_id]

    def _publish(self, session_id: str, event: str, data: dict[str, Any]) -> None:
        if event != "delta":
            self._flush(session_id)  # the text streamed before it goes first
        frame = _frame(event, data)
        for queue in list(self._subscribers.get(session_id, ())):
            try:
                queue.put_nowait(frame)
            except asyncio.QueueFull:  # a stalled tab: its stream ends, the page reconnects
                self.unsubscribe(session_id, queue)  # and reads the history again
                _end(queue)

    def posted(self, msg: InboundMessage, inbox_id: int) -> None:
        """A message from one tab, shown in the session's other tabs too (the tab that sent
        it knows it by its client_id)."""
        client_id = msg.platform_id.partition(":")[2]
        data = {"id": f"in-{inbox_id}", "text": msg.text, "client_id": client_id}
        self._publish(msg.conversation, "user", data)

    # Outlet and LiveOutlet

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        shown = f"out-{part.id}"
        if shown not in self._shown:  # else caught up already, from another replica's news
            self._shown[shown] = None
            self._publish(
                key.conversation,
                "message",
                {
                    "id": shown,
                    "run_id": part.run_id,
                    "text": part.reply.text,
                    "buttons": [b.model_dump() for b in part.reply.buttons],
                },
            )
        if self._relay is not None:
            try:
                # the announcement is all that is wanted: announced as a delete, nothing is
                # kept (a row per web conversation and replica start grew for good)
                where = f"{self._origin} {key}"
                await self._relay.kv_delete(NS_REPLIES, where, announce=True)
            except StoreError as exc:  # the reply is stored; a page elsewhere sees it on reload
                log.warning("web reply not announced to other replicas: %s", exc)
        return shown

    def _sent_elsewhere(self, where: str | None) -> None:
        """Another replica sent a reply for a session: show it on this replica's open pages.
        None: announcements may have been missed (the connection that hears them was lost,
        or is back): every open stream ends, and its page reconnects and reads the history.
        Left open, a page stayed on without the replies sent meanwhile, for good."""
        if where is None:
            self.close()
            return
        origin, _, skey = where.partition(" ")
        if origin == self._origin:
            return
        try:
            key = SessionKey.parse(skey)
        except ValueError:
            return
        if key.channel != CHANNEL or key.conversation not in self._subscribers:
            return
        task = asyncio.create_task(self._catch_up(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _catch_up(self, key: SessionKey) -> None:
        if self._relay is None:
            return
        try:
            entries = await self._relay.transcript(str(key), CATCH_UP)
        except StoreError as exc:
            log.warning("web replies from another replica not shown: %s", exc)
            return
        for e in entries:
            if e.role != "assistant" or e.id in self._shown:
                continue
            self._shown[e.id] = None
            buttons = [b.model_dump() for b in e.reply.buttons] if e.reply else []
            self._publish(
                key.conversation, "message", {"id": e.id, "text": e.text, "buttons": buttons}
            )

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        self._running[key.conversation] = (run_id, [])
        self._publish(key.conversation, "typing", {"run_id": run_id})

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        """Pieces that come faster than the event loop turns are sent as one event: a fast
        model's burst (thousands of pieces) filled a page's queue, which then counted as a
        stalled tab and lost its live stream."""
        conversation = key.conversation
        held = self._deltas.get(conversation)
        if held is not None and held[0] == run_id:
            held[1].append(text)
            return
        self._flush(conversation)
        self._deltas[conversation] = (run_id, [text])
        asyncio.get_running_loop().call_soon(self._flush, conversation)

    def _flush(self, conversation: str) -> None:
        held = self._deltas.pop(conversation, None)
        if held is None:
            return
        text = "".join(held[1])
        running = self._running.get(conversation)
        if running is not None and running[0] == held[0]:
            running[1].append(text)
        self._publish(conversation, "delta", {"run_id": held[0], "text": text})

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        self._publish(key.conversation, "discard" if discarded else "done", {"run_id": run_id})
        if (running := self._running.get(key.conversation)) is not None and running[0] == run_id:
            del self._running[key.conversation]


def _frame(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _end(queue: asyncio.Queue[str | None]) -> None:
    """End a stream now: what it had not sent yet is dropped (the page reloads the history
    when it reconnects), and None tells its writer to stop."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(None)
