"""Same-run baselines, served like the gateway (`web.run_app`, no access log, pinned to the
gateway's core):

- `aiohttp`: a bare handler that reads the body and returns 200: the ceiling of the HTTP stack.
- `bolt`: a bare slack-bolt AsyncApp (signature checked, no-op `message` listener, an `authorize`
  that makes no network call), on Bolt's own aiohttp server: what the Slack route is compared to.
- `minimal`: the issue's reference handler for the WhatsApp route: the HMAC-SHA256 signature
  checked (403 when wrong), the JSON parsed, one INSERT committed per request into a SQLite file
  (WAL, `--synchronous` FULL as the gateway's commits, or NORMAL: no fsync), then 200.
- `relay`: per WhatsApp webhook, answer 200, then make the same HTTP exchanges the gateway makes
  for one message (a streamed model call, a read receipt, a send) and nothing else: the HTTP
  floor of an end-to-end answer.

    python -m bench.bare aiohttp --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import logging
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.payloads import (
    APP_SECRET,
    SLACK_BOT_TOKEN,
    SLACK_BOT_USER,
    SLACK_SECRET,
    WA_NUMBER,
    WA_TOKEN,
)

__all__ = ["main"]


def bare_app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/{tail:.*}", ok)
    return app


def bolt_app() -> web.Application:
    from slack_bolt.async_app import AsyncApp
    from slack_bolt.authorization import AuthorizeResult

    async def authorize(
        enterprise_id: str | None, team_id: str | None, user_id: str | None
    ) -> AuthorizeResult:
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id,
            bot_token=SLACK_BOT_TOKEN,
            bot_user_id=SLACK_BOT_USER,
            bot_id="B0BOT0",
        )

    bolt = AsyncApp(signing_secret=SLACK_SECRET, authorize=authorize)

    @bolt.event("message")
    async def noop(body: dict[str, Any]) -> None:
        return None

    app = bolt.web_app(path="/webhooks/slack")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", health)
    return app


def minimal_app(db: Path, synchronous: str) -> web.Application:
    conn = sqlite3.connect(db, isolation_level=None)  # autocommit: one commit per INSERT
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS inbox (id INTEGER PRIMARY KEY, platform_id TEXT UNIQUE,"
        " payload TEXT NOT NULL)"
    )
    secret = APP_SECRET.encode()

    async def webhook(request: web.Request) -> web.Response:
        raw = await request.read()
        expected = "sha256=" + hmac.new(secret, raw, hashlib.sha256).hexdigest()
        given = request.headers.get("X-Hub-Signature-256", "")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return web.Response(status=403, text="bad signature")
        data = json.loads(raw)
        wamid = data["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        conn.execute(
            "INSERT INTO inbox (platform_id, payload) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (wamid, raw.decode()),
        )
        return web.Response(text="ok")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def close(app: web.Application) -> None:
        conn.close()

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/webhooks/whatsapp", webhook)
    app.on_cleanup.append(close)
    return app


def relay_app(model_url: str, graph_url: str) -> web.Application:
    tasks: set[asyncio.Task[None]] = set()

    async def answer(http: aiohttp.ClientSession, user: str, wamid: str, text: str) -> None:
        body = {
            "model": "fake",
            "stream": True,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"<user_message>\n{text}\n</user_message>"},
            ],
        }
        reply = []
        async with http.post(f"{model_url}/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        reply.append(choice.get("delta", {}).get("content") or "")
        messages = f"{graph_url}/v21.0/{WA_NUMBER}/messages"
        headers = {"Authorization": f"Bearer {WA_TOKEN}"}
        read = {"messaging_product": "whatsapp", "status": "read", "message_id": wamid}
        async with http.post(messages, json=read, headers=headers) as resp:
            await resp.read()
        send = {
            "messaging_product": "whatsapp",
            "to": user,
            "type": "text",
            "text": {"body": "".join(reply)},
        }
        async with http.post(messages, json=send, headers=headers) as resp:
            await resp.read()

    async def webhook(request: web.Request) -> web.Response:
        data = json.loads(await request.read())
        http: aiohttp.ClientSession = request.app[HTTP]
        for entry in data["entry"]:
            for change in entry["changes"]:
                for msg in change["value"].get("messages", []):
                    task = asyncio.create_task(
                        answer(http, msg["from"], msg["id"], msg["text"]["body"])
                    )
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        return web.json_response({"ok": True})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[HTTP] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await app[HTTP].close()

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/webhooks/whatsapp", webhook)
    app.cleanup_ctx.append(session)
    return app


HTTP = web.AppKey("http", aiohttp.ClientSession)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bare", description=__doc__)
    p.add_argument("kind", choices=("aiohttp", "bolt", "minimal", "relay"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-url", default="")
    p.add_argument("--graph-url", default="")
    p.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.kind == "minimal":
        with tempfile.TemporaryDirectory(prefix="bench-minimal-") as tmp:
            _serve(minimal_app(Path(tmp) / "inbox.db", args.synchronous), args.port)
        return 0
    if args.kind == "aiohttp":
        app = bare_app()
    elif args.kind == "bolt":
        app = bolt_app()
    else:
        app = relay_app(args.model_url, args.graph_url)
    _serve(app, args.port)
    return 0


def _serve(app: web.Application, port: int) -> None:
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, shutdown_timeout=2.0)


if __name__ == "__main__":
    raise SystemExit(main())
