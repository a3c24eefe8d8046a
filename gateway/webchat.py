"""Routes of the web chat: the page, posting messages, history, and the live event stream."""

from __future__ import annotations

import asyncio
import contextlib
from importlib import resources

from aiohttp import web

from channels.base import BadInput
from channels.web import WebChat, new_session_id, valid_session_id
from core.store import InboxStatus
from gateway.http import json_error, read_json
from gateway.keys import RUNTIME, WEBCHAT

__all__ = ["add_routes"]

COOKIE = "switchboard_chat"
HISTORY_LIMIT = 200
KEEPALIVE_S = 15.0


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", page)
    app.router.add_post("/chat/messages", post_message)
    app.router.add_get("/chat/history", history)
    app.router.add_get("/chat/events", events)


def _session(request: web.Request) -> tuple[str, bool]:
    """The browser's chat session id from its cookie, or a new one (True when new)."""
    value = request.cookies.get(COOKIE)
    if valid_session_id(value):
        assert value is not None
        return value, False
    return new_session_id(), True


def _set_cookie(response: web.StreamResponse, session_id: str, request: web.Request) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=60 * 60 * 24 * 365,
        httponly=True,
        samesite="Lax",
        secure=request.secure,
        path="/",
    )


async def page(request: web.Request) -> web.StreamResponse:
    html = resources.files("channels.web").joinpath("static/index.html").read_text("utf-8")
    response = web.Response(text=html, content_type="text/html")
    session_id, new = _session(request)
    if new:
        _set_cookie(response, session_id, request)
    return response


async def post_message(request: web.Request) -> web.StreamResponse:
    chat: WebChat = request.app[WEBCHAT]
    session_id, new = _session(request)
    body = await read_json(request)
    try:
        msg = chat.parse(session_id, body)
    except BadInput as exc:
        return json_error(400, str(exc))
    result = await request.app[RUNTIME].manager.submit(msg)
    response = web.json_response(
        {
            "accepted": True,
            "duplicate": result.status is InboxStatus.DUPLICATE,
            "queued": result.status is InboxStatus.PENDING,
            "id": f"in-{result.id}",
        },
        status=202,
    )
    if new:
        _set_cookie(response, session_id, request)
    return response


async def history(request: web.Request) -> web.StreamResponse:
    session_id, new = _session(request)
    messages = []
    if not new:
        key = request.app[RUNTIME].manager.session_key(WebChat.name, "default", session_id)
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
    response = web.json_response({"messages": messages})
    if new:
        _set_cookie(response, session_id, request)
    return response


async def events(request: web.Request) -> web.StreamResponse:
    chat: WebChat = request.app[WEBCHAT]
    session_id, new = _session(request)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    if new:
        _set_cookie(response, session_id, request)
    await response.prepare(request)
    queue = chat.subscribe(session_id)
    try:
        await response.write(b": connected\n\n")
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
        chat.unsubscribe(session_id, queue)
        with contextlib.suppress(Exception):
            await response.write_eof()
    return response
