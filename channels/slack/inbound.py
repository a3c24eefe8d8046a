"""What comes in: the webhook route, and the work left after each acknowledgement.

Design. Measured on this codebase (slack-bolt 1.30): a bare Bolt `AsyncApp` with a no-op
listener costs its server about 440 µs of CPU per event, most of it in Bolt's middleware
chain, context building and listener runner; checking the v0 signature and reading the JSON
cost about 12 µs. Events are nearly all of the traffic, so `event_callback` takes a short path
(about 170 µs of server CPU per request, aiohttp included): the signature (SignatureVerifier;
401 when wrong, missing or more than 5 minutes off; 400 for a signed body that is not UTF-8),
`url_verification`, then retries, repeated `event_id`s and the same post arriving as
`app_mention` and `message` are answered from a memory of recent ids, ignorable events are
dropped by `parse_event`, and the rest is acknowledged once stored. Bolt keeps what it does
well and what is rare: interactivity (form-encoded `payload=`, block_actions) and slash
commands, run before the response (process_before_response), and an `authorize` that never
calls Slack.

Stored, then acknowledged: an event is answered 200 only once its message is in the store
(durable, deduped on channel:ts), because Slack never redelivers an acknowledged event. File
downloads are bounded (`download_timeout_s`, inside Slack's 3 s) and a file that is not in by
then reaches the agent described as not downloaded. The work for each message runs in a task
chained behind the session's earlier messages, so a message with a file is not overtaken by
the next. If the store fails or is too slow, the route answers 503 and forgets the ids, so
Slack's retry is processed again (the store's dedupe makes that safe); a retry that comes
while the first delivery is still being stored waits for it, and shares its answer. A click
or a command that is not stored gets a 503, which Slack shows the person as failed (it
retries neither); if it is stored after all, late, the same press made again (the person trying
again) is acknowledged as that one, not acted on twice.
Socket Mode envelopes follow the same path, acknowledged once stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from typing import Any

from aiohttp import web
from cachetools import LRUCache, TTLCache
from pydantic_core import from_json
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_sdk.signature import SignatureVerifier

from channels.base import ChannelContext, read_body
from channels.mend import mend_json, mend_strings
from channels.slack.bolt import build_bolt
from channels.slack.files import Downloader
from channels.slack.identity import BotIdentity
from channels.slack.parse import Incoming, parse_action, parse_command, parse_event
from channels.slack.settings import SlackSettings
from core.errors import StoreError
from core.models import Attachment, InboundMessage, MessageKind

__all__ = ["Inbound"]

log = logging.getLogger(__name__)
SEEN_MAX = 20_000  # recent event ids and message ids remembered for duplicates
MAX_IN_FLIGHT = 5_000  # accepted messages not yet stored; past it events get 503
ACK_WITHIN_S = 2.5  # Slack wants 2xx within 3 s: past this, 503 and Slack retries
THREADS_MAX = 50_000  # joined threads remembered in memory (all are in the store)
RETRY_WINDOW_S = 300.0  # a press not acknowledged in time, repeated within this, is the same
THREADS_NS = "slack.threads"
_EMPTY = b""
_Order = tuple[str, str, str | None]  # account, conversation, thread: one session
IN_A_THREAD = (
    "In a channel, each thread with me is its own conversation, and Slack does not tell me "
    "which thread a command was typed in. Write it in the thread instead, mentioning me: "
    "{bot} {command}"
)


class Inbound:
    def __init__(
        self,
        settings: SlackSettings,
        ctx: ChannelContext,
        identity: BotIdentity,
        downloader: Downloader,
    ) -> None:
        secret = settings.signing_secret.get_secret_value() if settings.signing_secret else ""
        self._verifier = SignatureVerifier(secret)
        self._threads = settings.reply_in_threads
        self._ctx, self._identity, self._downloader = ctx, identity, downloader
        # event ids and message ids taken, with the task storing each: a copy that arrives
        # while it is still being stored waits for that task rather than being acknowledged
        self._seen: LRUCache[str, asyncio.Task[bool] | None] = LRUCache(SEEN_MAX)
        self._joined: LRUCache[str, None] = LRUCache(THREADS_MAX)
        self._tails: dict[_Order, asyncio.Task[bool]] = {}
        # clicks and commands not acknowledged in time (Slack showed them as failed), by what
        # was pressed, and the press each acknowledgement waits for
        self._unacked: TTLCache[str, asyncio.Task[bool]] = TTLCache(SEEN_MAX, RETRY_WINDOW_S)
        self._press_of: TTLCache[asyncio.Task[bool], str] = TTLCache(SEEN_MAX, RETRY_WINDOW_S)
        self._tasks: set[asyncio.Task[bool]] = set()
        self._bolt_app = build_bolt(secret, settings.api_base, identity, self)

    # the route

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """POST /webhooks/slack: Events API and interactivity, signed v0."""
        raw = await read_body(request)
        headers = request.headers
        verdict = self._verdict(
            raw, headers.get("X-Slack-Request-Timestamp"), headers.get("X-Slack-Signature")
        )
        if verdict is not None:
            return verdict
        if not raw.lstrip().startswith((b"{", b"[")):
            return await self._bolt(request)
        try:
            body = _json(mend_json(raw))
        except (ValueError, RecursionError):
            return web.json_response({"error": "body is not valid JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        kind = body.get("type")
        if not isinstance(kind, str):
            return web.json_response({"error": "type: a string is required"}, status=400)
        if kind == "event_callback" and (reason := _malformed_event(body)):
            return web.json_response({"error": reason}, status=400)
        if kind == "url_verification":
            challenge = body.get("challenge")
            if not isinstance(challenge, str):
                return web.json_response({"error": "challenge: must be a string"}, status=400)
            return web.json_response({"challenge": challenge})
        if kind == "event_callback":
            if len(self._tasks) >= MAX_IN_FLIGHT:  # the store is not keeping up: Slack retries
                return web.json_response({"error": "busy, retry later"}, status=503)
            if not await self.stored(self.on_event(body)):
                self.forget(body)
                return web.json_response({"error": "not stored, retry later"}, status=503)
        return web.Response(body=_EMPTY)  # app_rate_limited and the rest: nothing to do

    async def stored(self, task: asyncio.Task[bool] | None) -> bool:
        """Wait (a bounded time) until the accepted message is durably stored, or deliberately
        dropped; nothing accepted (None) is done at once."""
        if task is None:
            return True
        if not task.done():
            # `asyncio.wait((task,), timeout=…)` without its sets and loops: one future and one
            # timer. Per event (callgrind): 43k instructions, against 67k for asyncio.wait and
            # 87k for wait_for(shield(task)). The task itself is never cancelled from here
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_: object) -> None:
                if not waiter.done():
                    waiter.set_result(None)

            timer = loop.call_later(ACK_WITHIN_S, wake, None)
            task.add_done_callback(wake)
            try:
                await waiter
            finally:
                timer.cancel()
                task.remove_done_callback(wake)
            if not task.done():
                log.warning("slack message not stored in %.1f s; not acknowledged", ACK_WITHIN_S)
                return False
        done = not task.cancelled() and task.result()
        if done and task in self._press_of:  # a click or a command (events never are)
            self._unacked.pop(self._press_of.pop(task), None)
        return done

    def forget(self, body: dict[str, Any]) -> None:
        """Drop the ids of an event we did not store, so its retry is not taken for a copy."""
        event = body.get("event")
        event = event if isinstance(event, dict) else {}
        for key in (f"ev:{body.get('event_id')}", f"{event.get('channel')}:{event.get('ts')}"):
            self._seen.pop(key, None)

    def _verdict(
        self, raw: bytes, timestamp: str | None, signature: str | None
    ) -> web.Response | None:
        """None for a signed request; else the refusal: 401 for a signature that is wrong,
        missing or stale, 400 for a signed body that is not UTF-8 (the SDK's verifier decodes
        the body first, so such a body is checked here, on its bytes)."""
        if timestamp and signature and timestamp.isascii() and signature.isascii():
            try:
                if self._verifier.is_valid(raw, timestamp, signature):
                    return None
            except UnicodeDecodeError:
                if self._signed_bytes(raw, timestamp, signature):
                    return web.json_response({"error": "body is not UTF-8"}, status=400)
            except ValueError:  # a timestamp that is not a number
                pass
        return web.json_response({"error": "invalid request"}, status=401)

    def _signed_bytes(self, raw: bytes, timestamp: str, signature: str) -> bool:
        """The v0 check on the raw bytes, for a body the SDK cannot decode (timestamp already
        known to be a number within five minutes: the SDK checked it before decoding)."""
        base = b"v0:" + timestamp.encode() + b":" + raw
        key = self._verifier.signing_secret.encode()
        digest = "v0=" + hmac.new(key, base, hashlib.sha256).hexdigest()
        return hmac.compare_digest(digest, signature)

    async def _bolt(self, request: web.Request) -> web.StreamResponse:
        # Bolt assumes well-formed payloads: a signed body that is not (a null, a list, a
        # payload= nested thousands deep, actions that are not a list) must be a 400, not a 500
        try:
            bolt_request = await to_bolt_request(request)
            if reason := _malformed_actions(bolt_request.body):  # Bolt's matcher would fail
                return web.json_response({"error": reason}, status=400)
            response = await self._bolt_app.async_dispatch(bolt_request)
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
            return web.json_response({"error": "malformed form body"}, status=400)
        return await to_aiohttp_response(response)

    # normalized input, from the route or Socket Mode

    def on_event(self, body: dict[str, Any]) -> asyncio.Task[bool] | None:
        """An event_callback: dropped when seen or ignorable, else accepted (the task ends
        True once the message is stored, or deliberately dropped)."""
        event_id = body.get("event_id")
        seen = f"ev:{event_id}" if isinstance(event_id, str) else None
        if seen is not None and seen in self._seen:
            return self._seen[seen]
        self._identity.learn(body)
        incoming = parse_event(body, self._identity.user_id, self._threads)
        task = None if incoming is None else self.accept(incoming)
        if seen is not None:
            self._seen_as(seen, task)
        return task

    def on_action(self, payload: dict[str, Any]) -> asyncio.Task[bool] | None:
        return self._press(parse_action(mend_strings(payload)))

    def not_here(self, form: dict[str, Any]) -> str | None:
        """What to tell, privately, whoever typed a slash command in a channel: there every
        thread with the bot is its own conversation and Slack does not say which thread the
        command was typed in, so it would act on none of them. None in a DM."""
        if str(form.get("channel_id", "")).startswith("D"):
            return None
        bot = f"<@{self._identity.user_id}>" if self._identity.user_id else "@me"
        return IN_A_THREAD.format(bot=bot, command=form.get("command") or "/reset")

    def on_command(self, form: dict[str, Any]) -> asyncio.Task[bool] | None:
        return self._press(parse_command(mend_strings(form)))

    def _press(self, incoming: Incoming | None) -> asyncio.Task[bool] | None:
        """A click or a command. Slack sends each once and gives a new id to the same press
        made again; so when an earlier one of the same, not acknowledged in time, is still
        being stored or was stored late, this is the person trying again: it is acknowledged
        once that one is stored, and not acted on a second time."""
        if incoming is None:
            return None
        press = _press_key(incoming.message)
        earlier = self._unacked.get(press)
        if earlier is not None and not (
            earlier.done() and (earlier.cancelled() or not earlier.result())
        ):
            log.info("slack: a repeated press of one not acknowledged in time, taken as it")
            return earlier
        task = self.accept(incoming)
        if task is not None:
            self._unacked[press] = task
            self._press_of[task] = press
        return task

    def accept(self, incoming: Incoming) -> asyncio.Task[bool] | None:
        """Queue the message's remaining work behind the session's earlier messages."""
        msg = incoming.message
        # e.g. the same post as app_mention and as message (a thread reply that may yet be
        # dropped is not remembered: its mention must still get through; the store dedupes)
        remembered = not incoming.needs_joined_thread
        if remembered and msg.platform_id in self._seen:
            return self._seen[msg.platform_id]
        order = (msg.account, msg.conversation, msg.thread)  # a session, without building its key
        task = asyncio.create_task(self._complete(incoming, self._tails.get(order)))
        if remembered:
            self._seen_as(msg.platform_id, task)
        self._tails[order] = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(order, t))
        return task

    def _seen_as(self, seen: str, task: asyncio.Task[bool] | None) -> None:
        """A copy of `seen` waits for `task`; once it has stored the message, the copy is done
        at once (None), and the finished task is not kept (20,000 of them were)."""
        self._seen[seen] = task
        if task is not None:
            task.add_done_callback(lambda t: self._stored_as(seen, t))

    def _stored_as(self, seen: str, task: asyncio.Task[bool]) -> None:
        stored = not task.cancelled() and task.exception() is None and task.result()
        if stored and self._seen.get(seen) is task:
            self._seen[seen] = None

    def _done(self, order: _Order, task: asyncio.Task[bool]) -> None:
        self._tasks.discard(task)
        if self._tails.get(order) is task:
            del self._tails[order]

    async def _complete(self, incoming: Incoming, before: asyncio.Task[bool] | None) -> bool:
        """Download, then store; False when the message could not be stored."""
        msg = incoming.message
        key = self._ctx.session_key(msg)
        extra = {"session": str(key), "channel": key.channel}
        try:
            attachments: tuple[Attachment, ...] = ()
            if incoming.files:
                files = [self._downloader.fetch(key, ref) for ref in incoming.files]
                attachments = tuple(await asyncio.gather(*files))
            if before is not None:
                await asyncio.wait([before])
            if incoming.needs_joined_thread and not await self._in_thread(msg):
                return True
            if incoming.joins_thread and self._threads == "all":
                await self._join_thread(msg)
            if attachments:
                msg = msg.model_copy(update={"attachments": attachments})
            await self._ctx.submit(msg, key)
        except StoreError as exc:
            log.error("slack message not stored: %s", exc, extra=extra)
            return False
        except Exception:
            log.exception("slack message not stored", extra=extra)
            return False
        return True

    async def _in_thread(self, msg: InboundMessage) -> bool:
        tkey = _thread_key(msg)
        if tkey in self._joined:
            return True
        if await self._ctx.store.kv_get(THREADS_NS, tkey) is None:
            return False
        self._remember(self._joined, tkey)
        return True

    async def _join_thread(self, msg: InboundMessage) -> None:
        tkey = _thread_key(msg)
        if not self._remember(self._joined, tkey):
            await self._ctx.store.kv_set(THREADS_NS, tkey, "1")

    @staticmethod
    def _remember(memory: LRUCache[str, None], key: str) -> bool:
        """Add `key` (or make it recent again); True when it was already there."""
        seen = key in memory
        memory[key] = None
        return seen

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Let accepted messages reach the store; cancel what is still running after grace."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def _json(raw: bytes) -> Any:
    """The body, read by pydantic-core's parser (the fast one we already have); anything it
    refuses is read again by `json` (deeper nesting, other encodings), whose verdict stands."""
    try:
        return from_json(raw)
    except ValueError:
        return json.loads(raw)


def _thread_key(msg: InboundMessage) -> str:
    return f"{msg.account}:{msg.conversation}:{msg.thread}"


def _press_key(msg: InboundMessage) -> str:
    """Who pressed what, where: the same for a click or command made again."""
    what = msg.button_value if msg.kind is MessageKind.BUTTON else f"{msg.command} {msg.text}"
    return "\0".join([msg.account, msg.conversation, msg.thread or "", msg.sender.id, str(what)])


def _malformed_event(body: dict[str, Any]) -> str | None:
    """Why a signed event_callback cannot be read, or None: it was acknowledged and dropped
    without a word (a message whose channel was a list, files that were strings)."""
    event = body.get("event")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return "event: an object with a type"
    auths = body.get("authorizations")
    if auths is not None and not _objects(auths):
        return "authorizations: a list of objects"
    if event["type"] not in ("message", "app_mention"):
        return None  # other events are acknowledged as they come
    if not isinstance(event.get("channel"), str):
        return "event.channel: a string is required"
    for name in ("ts", "user", "text", "thread_ts", "subtype", "bot_id"):
        if event.get(name) is not None and not isinstance(event[name], str):
            return f"event.{name}: must be a string"
    if event.get("files") is not None and not _objects(event["files"]):
        return "event.files: a list of objects"
    return None


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _malformed_actions(body: Any) -> str | None:
    """Why a form body (interactivity, a slash command) cannot be read, or None: Bolt matches
    listeners on the first action's action_id, and on a view's type, and answers 500 when one
    is missing, and 404 to a form that is neither."""
    if not isinstance(body, dict):
        return None
    if not any(k in body for k in ("type", "command", "ssl_check")):  # Bolt's 404
        return "a form body needs payload= (interactivity) or command= (a slash command)"
    kind = body.get("type")
    if kind == "block_actions":
        actions = body.get("actions")
        if (
            not isinstance(actions, list)
            or not actions
            or not all(isinstance(a, dict) and isinstance(a.get("action_id"), str) for a in actions)
        ):
            return "actions: a list of objects, each with an action_id"
    elif kind in ("view_submission", "view_closed"):
        view = body.get("view")
        if not isinstance(view, dict) or not isinstance(view.get("type"), str):
            return "view: an object with a type"
    return None
