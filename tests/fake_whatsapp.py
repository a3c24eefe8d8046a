"""A fake WhatsApp Cloud API (Graph API) for tests: aiohttp on 127.0.0.1, port 0.

It checks what the real API checks and answers in its shapes (reference/channels.md §1.4–1.6):
the bearer token (190 / HTTP 401), `messaging_product`, known phone number ids, text ≤ 4096,
interactive limits (≤ 3 reply buttons with unique titles ≤ 20, body ≤ 1024; list ≤ 10 rows with
titles ≤ 24), template shape and parameters. It serves the two-step media API (the download needs
the bearer token too) and phone number lookups. Tests script failures with `fail(...)`.
Lengths are counted in UTF-16 code units, the strictest reading of "characters".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.loopback import serve

__all__ = [
    "APP_SECRET",
    "VERIFY_TOKEN",
    "Failure",
    "FakeGraph",
    "Gateway",
    "payload",
    "running_gateway",
    "sign",
    "text_message",
    "until",
]


@dataclass
class Failure:
    code: int
    status: int = 400
    message: str = "scripted failure"


class _Invalid(Exception):
    def __init__(self, message: str, code: int = 100) -> None:
        super().__init__(message)
        self.code = code


def _len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _error(code: int, message: str, status: int = 400) -> web.Response:
    body = {
        "error": {
            "message": f"(#{code}) {message}",
            "type": "OAuthException",
            "code": code,
            "error_data": {"messaging_product": "whatsapp", "details": message},
            "fbtrace_id": "AbCdEfGh",
        }
    }
    return web.json_response(body, status=status)


@dataclass
class FakeGraph:
    token: str = "wa-token"
    version: str = "v21.0"
    numbers: dict[str, str] = field(
        default_factory=lambda: {"1001": "+1 555 000 1001", "1002": "+1 555 000 1002"}
    )
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # id → (bytes, mime)
    media_delay_s: float = 0.0
    lookup_delay_s: float = 0.0  # before answering a business number's lookup
    announced_size: int | None = None  # lie about file_size in the media lookup
    sent: list[dict[str, Any]] = field(default_factory=list)  # accepted messages, with "_number"
    reads: list[dict[str, Any]] = field(default_factory=list)  # mark-as-read calls
    attempts: list[dict[str, Any]] = field(default_factory=list)  # every message POST
    failures: deque[Failure | None] = field(default_factory=deque)
    url: str = ""
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def fail(self, *failures: Failure | None) -> None:
        """The next message sends fail with these, in order (None: that one succeeds)."""
        self.failures.extend(failures)

    def texts(self, to: str | None = None) -> list[str]:
        return [m["text"]["body"] for m in self.to(to) if m["type"] == "text"]

    def to(self, user: str | None) -> list[dict[str, Any]]:
        return [m for m in self.sent if user is None or user in (m.get("to"), m.get("recipient"))]

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/{version}/{number}/messages", self._messages)
        app.router.add_get("/lookaside/{media_id}", self._download)
        app.router.add_get("/{version}/{object_id}", self._object)
        self._runner, self.url = await serve(app, access_log=None, shutdown_timeout=0.2)
        return self.url

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _messages(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(190, "Invalid OAuth access token.", 401)
        number = request.match_info["number"]
        if request.match_info["version"] != self.version or number not in self.numbers:
            return _error(100, f"Unsupported post request. Object with ID '{number}'")
        try:
            body = await request.json()
        except ValueError:
            return _error(100, "The parameter messaging_product is required.")
        if not isinstance(body, dict) or body.get("messaging_product") != "whatsapp":
            return _error(100, "The parameter messaging_product is required.")
        if body.get("status") == "read":
            if not str(body.get("message_id", "")).startswith("wamid."):
                return _error(100, "Invalid parameter message_id")
            self.reads.append(body)
            return web.json_response({"success": True})
        self.attempts.append(body)
        f = self.failures.popleft() if self.failures else None
        if f is not None:
            return _error(f.code, f.message, f.status)
        try:
            _validate(body)
        except _Invalid as exc:
            return _error(exc.code, str(exc))
        wamid = f"wamid.OUT{next(self._ids)}"
        self.sent.append({**body, "_number": number, "_id": wamid})
        user = body.get("to") or body.get("recipient")
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": user, "wa_id": user}],
                "messages": [{"id": wamid}],
            }
        )

    async def _object(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(190, "Invalid OAuth access token.", 401)
        oid = request.match_info["object_id"]
        if oid in self.numbers:
            await asyncio.sleep(self.lookup_delay_s)
            return web.json_response(
                {"display_phone_number": self.numbers[oid], "verified_name": "Test", "id": oid}
            )
        if oid in self.media:
            data, mime = self.media[oid]
            size = self.announced_size if self.announced_size is not None else len(data)
            return web.json_response(
                {
                    "messaging_product": "whatsapp",
                    "url": f"{self.url}/lookaside/{oid}?ext=1",
                    "mime_type": mime,
                    "sha256": "0" * 64,
                    "file_size": size,
                    "id": oid,
                }
            )
        return _error(100, f"Unsupported get request. Object with ID '{oid}' does not exist")

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):  # a plain GET gets no media
            return web.Response(status=401, text="unauthorized")
        media = self.media.get(request.match_info["media_id"])
        if media is None:
            return web.Response(status=404)
        if self.media_delay_s:
            await asyncio.sleep(self.media_delay_s)
        return web.Response(body=media[0], content_type=media[1].split(";")[0])


def _validate(body: dict[str, Any]) -> None:
    """The checks the Cloud API makes on a message body (the ones our adapter can trip)."""
    if not (body.get("to") or body.get("recipient")):
        raise _Invalid("The parameter to is required.")
    kind = body.get("type", "text")
    content = body.get(kind)
    if not isinstance(content, dict):
        raise _Invalid(f"Param {kind} is required")
    if kind == "text":
        text = content.get("body")
        if not isinstance(text, str) or not text.strip():
            raise _Invalid("Param text['body'] is required")
        if _len(text) > 4096:
            raise _Invalid("Param text['body'] must be at most 4096 characters long")
    elif kind == "interactive":
        _interactive(content)
    elif kind == "template":
        _template(content)
    elif kind in ("image", "audio", "video", "document", "sticker"):
        if not (content.get("link") or content.get("id")):
            raise _Invalid(f"Param {kind} must have a link or an id")
    else:
        raise _Invalid(f"Unsupported message type {kind}")


def _interactive(content: dict[str, Any]) -> None:
    body = (content.get("body") or {}).get("text")
    action = content.get("action") or {}
    if not isinstance(body, str) or not body.strip():
        raise _Invalid("Param interactive['body']['text'] is required")
    if content.get("type") == "button":
        if _len(body) > 1024:
            raise _Invalid("Param interactive['body']['text'] must be at most 1024 characters")
        buttons = action.get("buttons") or []
        titles = [b["reply"]["title"] for b in buttons]
        ids = [b["reply"]["id"] for b in buttons]
        if not 1 <= len(buttons) <= 3:
            raise _Invalid("Param interactive['action']['buttons'] must have 1 to 3 buttons")
        if any(not t or _len(t) > 20 for t in titles) or len(set(titles)) != len(titles):
            raise _Invalid("Button titles must be unique and at most 20 characters")
        if any(not i or _len(i) > 256 for i in ids) or len(set(ids)) != len(ids):
            raise _Invalid("Button ids must be unique and at most 256 characters")
    elif content.get("type") == "list":
        if _len(body) > 4096:
            raise _Invalid("Param interactive['body']['text'] must be at most 4096 characters")
        label = action.get("button")
        if not isinstance(label, str) or not 1 <= _len(label) <= 20:
            raise _Invalid("Param interactive['action']['button'] must be 1 to 20 characters")
        sections = action.get("sections") or []
        rows = [r for s in sections for r in s.get("rows", [])]
        if not 1 <= len(sections) <= 10 or not 1 <= len(rows) <= 10:
            raise _Invalid("A list has 1 to 10 sections and 1 to 10 rows in total")
        if any(not r.get("title") or _len(r["title"]) > 24 for r in rows):
            raise _Invalid("Row titles must be at most 24 characters")
        ids = [r.get("id") for r in rows]
        if any(not i or _len(i) > 200 for i in ids) or len(set(ids)) != len(ids):
            raise _Invalid("Row ids must be unique and at most 200 characters")
    else:
        raise _Invalid("Unsupported interactive type")


def _template(content: dict[str, Any]) -> None:
    if not content.get("name") or not (content.get("language") or {}).get("code"):
        raise _Invalid("Template name and language code are required")
    for comp in content.get("components", []):
        for p in comp.get("parameters", []):
            text = p.get("text")
            if p.get("type") != "text" or not isinstance(text, str) or not text.strip():
                raise _Invalid("Template parameters need a non-empty text", 132000)
            if "\n" in text or "\t" in text or "     " in text or _len(text) > 1024:
                raise _Invalid("Param text cannot have new-line/tab or more than 4 spaces", 132018)


# the platform's side of the webhook: signed notifications, as Meta sends them

APP_SECRET = "wa-app-secret"
VERIFY_TOKEN = "wa-verify-token"
PAYLOADS = Path(__file__).parent / "payloads" / "whatsapp"


def sign(raw: bytes, secret: str = APP_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def payload(name: str, user: str | None = None, number: str | None = None) -> dict[str, Any]:
    """A recorded notification, sent now, optionally from another customer or to another
    number (the recorded timestamps are long past: outside the 24-hour window)."""
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text())
    for entry in data["entry"]:
        for change in entry["changes"]:
            value = change["value"]
            if number is not None and "metadata" in value:
                value["metadata"]["phone_number_id"] = number
            for contact in value.get("contacts", []) if user else []:
                contact["wa_id"] = user
            for msg in value.get("messages", []):
                msg["timestamp"] = str(int(time.time()))
                if user:
                    msg["from"] = user
                    msg["id"] = f"{msg['id']}.{user}"
    return data


def text_message(
    body: str, user: str = "15551234567", mid: str = "wamid.IN1", ts: float | None = None
) -> dict[str, Any]:
    data = payload("text")
    value = data["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["wa_id"] = user
    value["messages"][0].update(
        {"from": user, "id": mid, "text": {"body": body}, "timestamp": str(int(ts or time.time()))}
    )
    return data


# the gateway under test, with WhatsApp enabled against this fake

TOKEN = "wa-token"


@dataclass
class Gateway:
    """The real app on a random port, WhatsApp pointed at `graph`, the model at `model_url`."""

    graph: FakeGraph
    store: Any
    client: httpx.AsyncClient
    files: Path

    async def notify(
        self, data: Any, *, raw: bytes | None = None, signature: str | None = ""
    ) -> httpx.Response:
        """POST a notification; signed correctly unless `signature` is given (None: absent)."""
        body = raw if raw is not None else json.dumps(data).encode()
        headers = {"Content-Type": "application/json"}
        if signature is not None:
            headers["X-Hub-Signature-256"] = signature or sign(body)
        return await self.client.post("/webhooks/whatsapp", content=body, headers=headers)


async def until(cond: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait until `cond()` (sync or async) is truthy."""
    async with asyncio.timeout(timeout):
        while True:
            result = cond()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_gateway(
    tmp_path: Path, graph: FakeGraph, model_url: str, extra: str = ""
) -> AsyncIterator[Gateway]:
    from gateway.app import build_app
    from gateway.keys import RUNTIME
    from gateway.settings import load_settings

    config = tmp_path / "switchboard.toml"
    config.write_text(
        "[server]\nport = 0\nmax_body_bytes = 262144\nshutdown_grace_s = 0.3\n"
        f'[store]\nurl = "sqlite:///{tmp_path}/sb.db"\n'
        f'[model]\nprovider = "openai"\nbase_url = "{model_url}"\nname = "fake"\n'
        "max_retries = 1\n"
        # the fakes answer at any length (tests of long replies), as a model asked for more would
        "[agent.limits]\nmax_output_tokens = 4000\ntoken_budget = 30000\n"
        f'[channels]\nmedia_dir = "{tmp_path}/files"\nmax_media_bytes = 4096\n'
        "[channels.web]\nenabled = false\n"
        "[channels.whatsapp]\nenabled = true\n"
        f'access_token = "{TOKEN}"\napp_secret = "{APP_SECRET}"\n'
        f'verify_token = "{VERIFY_TOKEN}"\nphone_number_id = "1001"\n'
        f'phone_number_ids = ["1002"]\napi_base = "{graph.url}"\n'
        "throughput_backoff_s = 0.3\npair_backoff_s = 0.3\nmedia_timeout_s = 1.0\n" + extra
    )
    settings = load_settings(config)
    app = build_app(settings)
    runner, url = await serve(app, shutdown_timeout=1)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield Gateway(graph, app[RUNTIME].store, client, tmp_path / "files")
    finally:
        await runner.cleanup()
