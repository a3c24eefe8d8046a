"""Routes of the web chat: the page, posting messages, history, and the live event stream."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import math
import resource
from collections import Counter
from importlib import resources
from typing import NamedTuple

from aiohttp import web
from aiolimiter import AsyncLimiter
from cachetools import LRUCache

from channels.base import BadInput
from channels.web import WebChat, conversation_of, new_secret, valid_secret
from core.backoff import JITTER
from core.store import InboxStatus
from gateway.http import client_key, json_error, page_csp, read_json, same_origin
from gateway.keys import RUNTIME, SETTINGS, WEBCHAT

__all__ = ["PostGate", "add_routes"]

COOKIE = "switchboard_chat"
HOST_COOKIE = "__Host-" + COOKIE  # over HTTPS
LEGACY_LEN = 32  # a cookie from before they were secrets: the conversation id itself
COOKIE_AGE_S = 60 * 60 * 24 * 365
HISTORY_LIMIT = 200
KEEPALIVE_S = 15.0
GATE_WINDOW_S = 60.0
ADDRESSES_MAX = 100_000  # client addresses whose recent posts are counted
PRIVATE = {"Cache-Control": "no-store", "Vary": "Cookie"}  # one browser's own conversation


class PostGate:
    """At most `limit` posts a minute from one client address (a bucket of `limit` that
    empties over a minute): one client cannot queue model runs without end and keep every
    channel's people waiting. Loopback is not limited (the machine itself, or a proxy on it
    whose clients' addresses are not forwarded). A bucket, not the platforms' sliding window
    (channels.limiter): it keeps one number per address, not the times of its last posts, for
    up to ADDRESSES_MAX addresses."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buckets: LRUCache[str, AsyncLimiter] = LRUCache(ADDRESSES_MAX)

    async def retry_after(self, address: str) -> float | None:
        """None, counting the post, when the address may post now; else seconds to wait."""
        if not self._limit or _loopback(address):
            return None
        key = client_key(address)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = AsyncLimiter(self._limit, GATE_WINDOW_S)
        if not bucket.has_capacity():
            return GATE_WINDOW_S / self._limit  # a full bucket leaks one post at a time
        await bucket.acquire()  # there is room: it does not wait
        return None


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


GATE = web.AppKey("webchat_gate", PostGate)


class Streams:
    """How many event streams are open, at most `limit`: each holds a connection (a file
    descriptor) for as long as the page is open, and streams must not take the descriptors
    the webhooks need. One client address (an IPv6 /64) holds at most an eighth of them: one
    client opening streams until the cap cut every other visitor's live replies off. An
    eighth, not a handful: many people may share an address (an office, a carrier's NAT).
    Loopback is not counted apart, as for posts."""

    def __init__(self, limit: int) -> None:
        self.limit, self.open = limit, 0
        self.per_client = max(4, limit // 8)
        self._by_client: Counter[str] = Counter()

    def take(self, address: str | None) -> str | None:
        """Count a stream in, or say why not (None: taken)."""
        key = _counted_as(address)
        if self.open >= self.limit:
            return "too many live chats open; the page tries again shortly"
        if key and self._by_client[key] >= self.per_client:
            return "too many live chats open from your address; the page tries again shortly"
        self.open += 1
        if key:
            self._by_client[key] += 1
        return None

    def give_back(self, address: str | None) -> None:
        self.open -= 1
        if key := _counted_as(address):
            self._by_client[key] -= 1
            if not self._by_client[key]:
                del self._by_client[key]


def _counted_as(address: str | None) -> str:
    """Whom a stream counts against: the client's address (its /64), or "" on loopback."""
    return "" if address is None or _loopback(address) else client_key(address)


def _streams_max() -> int:
    """A quarter of the process's file descriptors (20,000 under the shipped unit: 5,000)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) // 4)


STREAMS = web.AppKey("webchat_streams", Streams)


def add_routes(app: web.Application) -> None:
    app[GATE] = PostGate(app[SETTINGS].channels.web.posts_per_minute)
    app[STREAMS] = Streams(_streams_max())
    app.router.add_get("/", page)
    app.router.add_post("/chat/messages", post_message)
    app.router.add_get("/chat/history", history)
    app.router.add_get("/chat/events", events)


class _Browser(NamedTuple):
    conversation: str
    cookie: str | None  # a new secret to set, when the browser brought none


async def _browser(request: web.Request) -> _Browser:
    """The conversation the browser's cookie opens, or a new one (with its cookie).

    Over HTTPS the cookie is `__Host-` prefixed: only this host can set it, so a page on a
    sibling subdomain cannot plant a cookie it knows (and read the chat the person then has);
    no other cookie is read there (a planted one from before the upgrade would open a chat
    its planter can read). Over plain HTTP nothing can stop that."""
    if request.secure:
        secret = request.cookies.get(HOST_COOKIE)
        if valid_secret(secret):
            assert secret is not None
            return _Browser(conversation_of(secret), None)
    else:
        secret = request.cookies.get(COOKIE)
        if valid_secret(secret):
            assert secret is not None
            if await _before_upgrade(request, secret):
                return _Browser(secret, None)
            return _Browser(conversation_of(secret), None)
    secret = new_secret()
    return _Browser(conversation_of(secret), secret)


async def _before_upgrade(request: web.Request, value: str | None) -> bool:
    """Whether `value` is a cookie set before cookies were secrets (the conversation id itself,
    32 characters), whose conversation exists: that browser keeps its conversation. No such
    conversation starts any more, so a planted one can only name one from before."""
    if value is None or len(value) != LEGACY_LEN or not valid_secret(value):
        return False
    runtime = request.app[RUNTIME]
    key = str(runtime.manager.session_key(WebChat.name, "default", value))
    if (await runtime.store.get_session(key)).epoch:
        return True
    return bool(await runtime.store.transcript(key, 1))


def _set_cookie(response: web.StreamResponse, secret: str | None, request: web.Request) -> None:
    """Over HTTPS the cookie also works where the chat is framed by a page of another site
    (a shop on its own domain): SameSite=None, so the browser sends it from the frame, and
    Partitioned, so it is kept per embedding site (browsers refuse unpartitioned third-party
    cookies). Posts from another origin are refused anyway (`post_message`), and only the
    chat's own origin can read its answers. Over plain HTTP (a Secure cookie would never come
    back) it stays SameSite=Lax: first-party only."""
    if secret is None:
        return
    if not request.secure:
        response.set_cookie(
            COOKIE, secret, max_age=COOKIE_AGE_S, httponly=True, samesite="Lax", path="/"
        )
        return
    # written out: Python's cookie module before 3.14 refuses the Partitioned attribute (the
    # secret is letters, digits, - and _: nothing to quote)
    response.headers.add(
        "Set-Cookie",
        f"{HOST_COOKIE}={secret}; Max-Age={COOKIE_AGE_S}; Path=/; HttpOnly; Secure; "
        "SameSite=None; Partitioned",
    )


@functools.cache
def _page() -> tuple[str, str]:
    """The page and its Content-Security-Policy (only its own inline script and style run;
    any site may frame it, so it can be embedded in the business's own pages)."""
    html = resources.files("channels.web").joinpath("static/index.html").read_text("utf-8")
    return html, page_csp(html, framing="*")


async def page(request: web.Request) -> web.StreamResponse:
    html, csp = _page()
    response = web.Response(text=html, content_type="text/html")
    response.headers.update(
        {
            "Content-Security-Policy": csp,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        }
    )
    _set_cookie(response, (await _browser(request)).cookie, request)
    return response


async def post_message(request: web.Request) -> web.StreamResponse:
    # a page elsewhere may post here with the person's cookie (a form or a no-cors fetch);
    # browsers name its Origin, so it is refused (any content type is read as JSON, as
    # scripts and other clients send it)
    if not same_origin(request, request.app[SETTINGS].server.public_url):
        return json_error(403, "cross-origin request refused")
    chat: WebChat = request.app[WEBCHAT]
    browser = await _browser(request)
    body = await read_json(request)
    try:
        msg = chat.parse(browser.conversation, body)
    except BadInput as exc:
        return json_error(400, str(exc))
    wait = await request.app[GATE].retry_after(request.remote or "unknown")
    if wait is not None:
        response = json_error(429, "too many messages; please wait a moment and send it again")
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response
    result = await request.app[RUNTIME].manager.submit(msg)
    if result.status not in (InboxStatus.DUPLICATE, InboxStatus.REFUSED):
        chat.posted(msg, result.id)
    response = web.json_response(
        {
            "accepted": True,
            "duplicate": result.status is InboxStatus.DUPLICATE,
            "queued": result.status is InboxStatus.PENDING,
            "id": f"in-{result.id}",
        },
        status=202,
        headers=PRIVATE,
    )
    _set_cookie(response, browser.cookie, request)
    return response


async def history(request: web.Request) -> web.StreamResponse:
    browser = await _browser(request)
    messages = []
    if browser.cookie is None:
        key = request.app[RUNTIME].manager.session_key(
            WebChat.name, "default", browser.conversation
        )
        entries = await request.app[RUNTIME].store.transcript(str(key), HISTORY_LIMIT)
        messages = [
            {
                "id": e.id,
                "role": e.role,
                "text": e.text,
                "buttons": [b.model_dump() for b in e.reply.buttons] if e.reply else [],
                "ts": e.ts,
            }
            for e in entries
        ]
    response = web.json_response({"messages": messages}, headers=PRIVATE)
    _set_cookie(response, browser.cookie, request)
    return response


async def events(request: web.Request) -> web.StreamResponse:
    chat: WebChat = request.app[WEBCHAT]
    streams = request.app[STREAMS]
    # counted before any wait: requests coming together are counted together
    if (refused := streams.take(request.remote)) is not None:
        busy = json_error(503, refused)
        busy.headers["Retry-After"] = "30"
        return busy
    try:
        browser = await _browser(request)
        response = web.StreamResponse(
            headers={  # no-store: it may set the cookie that opens the conversation
                **PRIVATE,
                "Content-Type": "text/event-stream",
                "X-Accel-Buffering": "no",
            }
        )
        _set_cookie(response, browser.cookie, request)
        return await _stream(request, response, chat, browser.conversation)
    finally:
        streams.give_back(request.remote)


async def _stream(
    request: web.Request, response: web.StreamResponse, chat: WebChat, conversation: str
) -> web.StreamResponse:
    await response.prepare(request)
    queue = chat.subscribe(conversation)
    try:
        # when the stream ends (a restart, news missed on a replica), pages come back spread
        # over a few seconds, not all at once
        await response.write(f": connected\nretry: {JITTER.randint(1000, 4000)}\n\n".encode())
        while True:
            try:
                frame = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                frame = ": keepalive\n\n"
            if frame is None:
                break
            await response.write(frame.encode())
    except ConnectionResetError:
        pass
    finally:
        chat.unsubscribe(conversation, queue)
        with contextlib.suppress(Exception):
            await response.write_eof()
    return response
