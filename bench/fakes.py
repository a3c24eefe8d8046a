"""Lean fakes the gateway talks to during a benchmark, served from the load generator's process:
an OpenAI-compatible model with a fixed latency (zero by default) that echoes the newest user
message, and one platform server answering the WhatsApp Graph API, the Telegram Bot API and the
Slack Web API. They record only what a benchmark needs (who was answered, with what), so their
own cost stays small next to the gateway's."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["FakeModel", "FakePlatform", "Server"]

_USER = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)


class Server:
    """An aiohttp app on 127.0.0.1 with a free port."""

    def __init__(self) -> None:
        self.app = web.Application(client_max_size=8 * 1024 * 1024)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            content = m.get("content") or ""
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            found = _USER.findall(content)
            return "\n".join(found) if found else content
    return ""


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


_USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10}}\n\n'


class FakeModel(Server):
    """Chat Completions (streamed or not) answering "echo: <newest user text>" after delay_s."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.app.router.add_post("/v1/chat/completions", self._handle)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.active -= 1
        text = "echo: " + last_user_text(body)
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
            return web.json_response(
                {
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        sse = b"".join(
            (
                _chunk({"role": "assistant", "content": ""}),
                _chunk({"content": text}),
                _chunk({}, "stop"),
                _USAGE,
                b"data: [DONE]\n\n",
            )
        )
        return web.Response(body=sse, headers={"Content-Type": "text/event-stream"})


class FakePlatform(Server):
    """WhatsApp Graph (`/{version}/...`), Telegram (`/bot{token}/{method}`) and Slack
    (`/api/{method}`) in one server. Replies are recorded per recipient, in order, and
    `on_reply(recipient, text)` is called for each."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: dict[str, list[str]] = defaultdict(list)
        self.answered = 0
        self.other_calls = 0
        self.on_reply: Callable[[str, str], None] | None = None
        self._ids = itertools.count(1)
        r = self.app.router
        r.add_post("/bot{token}/{method}", self._telegram)
        r.add_post("/api/{method}", self._slack)
        r.add_post("/{version}/{number}/messages", self._graph_messages)
        r.add_get("/{version}/{object_id}", self._graph_object)

    def _record(self, who: str, text: str) -> None:
        self.replies[who].append(text)
        self.answered += 1
        if self.on_reply is not None:
            self.on_reply(who, text)

    def reset(self) -> None:
        self.replies.clear()
        self.answered = self.other_calls = 0

    async def _graph_messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("status") == "read":
            self.other_calls += 1
            return web.json_response({"success": True})
        to = str(body.get("to") or body.get("recipient") or "")
        kind = body.get("type")
        text = body["text"]["body"] if kind == "text" else json.dumps(body.get(kind))
        wamid = f"wamid.OUT{next(self._ids)}"
        self._record(to, text)
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": wamid}],
            }
        )

    async def _graph_object(self, request: web.Request) -> web.Response:
        oid = request.match_info["object_id"]
        return web.json_response(
            {"display_phone_number": f"+1 555 {oid}", "verified_name": "Bench", "id": oid}
        )

    async def _telegram(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.content_type == "application/json":
            p: dict[str, Any] = await request.json()
        else:
            p = dict(await request.post())
        if method == "getMe":
            bot = {"id": 123456789, "is_bot": True, "first_name": "Bench", "username": "bench_bot"}
            return web.json_response({"ok": True, "result": bot})
        if method in ("sendMessage", "editMessageText"):
            chat = str(p.get("chat_id"))
            if method == "sendMessage":
                self._record(chat, str(p.get("text", "")))
            else:
                self.other_calls += 1
            msg = {
                "message_id": next(self._ids),
                "date": 1750000000,
                "chat": {"id": int(chat), "type": "private"},
                "text": p.get("text", ""),
            }
            return web.json_response({"ok": True, "result": msg})
        self.other_calls += 1
        return web.json_response({"ok": True, "result": True})

    async def _slack(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.content_type == "application/json":
            args: dict[str, Any] = await request.json()
        else:
            args = dict(await request.post())
        if method == "auth.test":
            return web.json_response(
                {"ok": True, "team_id": "T0TEAM0001", "user_id": "U0BOT00001", "bot_id": "B0BOT0"}
            )
        ts = f"1760000000.{next(self._ids):06d}"
        if method == "chat.postMessage":
            self._record(str(args.get("channel")), str(args.get("text", "")))
        else:
            self.other_calls += 1
        return web.json_response({"ok": True, "ts": ts, "channel": args.get("channel")})
