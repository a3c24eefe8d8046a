"""A fake Telegram Bot API server for tests (aiohttp on 127.0.0.1, port 0).

It checks what the real one checks: the token in the path, form-encoded or JSON parameters,
Telegram HTML (supported tags only, proper nesting, known entities; errors worded like the
server's "Bad Request: can't parse entities: ..."; links it refuses, rewrites or reads as
mentions; only the first 100 entities kept), text length after entity parsing in UTF-16
code units, callback_data size, 429 with parameters.retry_after (and whether the client waited),
403 for chats that blocked the bot, getUpdates offsets and the webhook/polling conflict.
It also builds real-shaped updates (messages, button presses, photos) for tests to deliver.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import re
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from channels.telegram.client import RATES
from gateway.app import build_app
from gateway.keys import RUNTIME
from gateway.settings import load_settings
from tests.loopback import serve

__all__ = [
    "ANA",
    "BOB",
    "FORUM",
    "GROUP",
    "MAX_ENTITIES",
    "SECRET",
    "FakeTelegram",
    "Gateway",
    "HtmlError",
    "Sent",
    "User",
    "parse_html",
    "running_fake",
    "running_gateway",
    "sent_entities",
    "until",
    "utf16",
    "write_config",
]

TOKEN = "123456789:AAHfakefakefakefakefakefakefakefake"
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
_TAGS = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_ENTITY = re.compile(r"&(?:(lt|gt|amp|quot)|#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6}));")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_ATTR = re.compile(r"\s*([a-zA-Z-]+)(?:\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s>\"']+))?")
MAX_ENTITIES = 100  # TDLib MessageEntity.cpp: MAX_USER_ENTITY_COUNT = 100, "server-side limit"
_SPLITTABLE = ("bold", "italic", "underline", "strikethrough", "spoiler")
_HOST_CHARS = re.compile(r"(?:[a-z0-9._~!$&'()*+,;=-]|%[0-9a-f]{2}|[^\x00-\x7f])+")


class HtmlError(ValueError):
    """What Telegram says after "Bad Request: can't parse entities: "."""


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _decode(raw: str, at: int, html: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return _NAMED[m.group(1)]
        code = int(m.group(2)) if m.group(2) else int(m.group(3), 16)
        if not 0 < code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise HtmlError(f"Invalid HTML entity at byte offset {_byte(html, at)}")
        return chr(code)

    out, pos = [], 0
    for m in _ENTITY.finditer(raw):
        if "&" in raw[pos : m.start()]:
            raise HtmlError(f"Unsupported HTML entity at byte offset {_byte(html, at + pos)}")
        out += [raw[pos : m.start()], one(m)]
        pos = m.end()
    if "&" in raw[pos:]:
        raise HtmlError(f"Unsupported HTML entity at byte offset {_byte(html, at + pos)}")
    return "".join([*out, raw[pos:]])


def _byte(html: str, i: int) -> int:
    return len(html[:i].encode())


def parse_html(html: str) -> tuple[str, list[dict[str, Any]]]:
    """Telegram HTML → (text, entities with UTF-16 offsets), or HtmlError."""
    text: list[str] = []
    units = 0
    stack: list[dict[str, Any]] = []
    entities: list[dict[str, Any]] = []
    i, n = 0, len(html)
    while i < n:
        ch = html[i]
        if ch == "<":
            close = html.find(">", i)
            if close < 0:
                raise HtmlError(f"Unclosed start tag at byte offset {_byte(html, i)}")
            if html.startswith("</", i):
                name = html[i + 2 : close].strip().lower()
                if not stack:
                    raise HtmlError(f'Unexpected end tag "{name}" at byte offset {_byte(html, i)}')
                top = stack.pop()
                if top["tag"] != name:
                    raise HtmlError(
                        f"Unmatched end tag at byte offset {_byte(html, i)}, "
                        f'expected "</{top["tag"]}>", found "</{name}>"'
                    )
                _finish(top, units, stack, entities, "".join(text[top["at"] :]))
            else:
                stack.append({**_open(html, i, close, units, stack), "at": len(text)})
            i = close + 1
        elif ch == "&":
            m = _ENTITY.match(html, i)
            if m is None:
                raise HtmlError(f"Unsupported HTML entity at byte offset {_byte(html, i)}")
            piece = _decode(m.group(0), i, html)
            text.append(piece)
            units += utf16(piece)
            i = m.end()
        elif ch == ">":
            raise HtmlError(f"Character '>' must be escaped at byte offset {_byte(html, i)}")
        else:
            text.append(ch)
            units += 2 if ord(ch) > 0xFFFF else 1
            i += 1
    if stack:
        raise HtmlError(f'Can\'t find end tag corresponding to start tag "{stack[-1]["tag"]}"')
    return "".join(text), sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def _open(html: str, i: int, close: int, units: int, stack: list[dict[str, Any]]) -> dict[str, Any]:
    body = html[i + 1 : close]
    m = re.match(r"[a-zA-Z][a-zA-Z0-9-]*", body)
    name = m.group(0).lower() if m else ""
    if name not in _TAGS:
        raise HtmlError(f'Unsupported start tag "{name}" at byte offset {_byte(html, i)}')
    attrs: dict[str, str] = {}
    rest = body[len(name) :]
    pos = 0
    while rest[pos:].strip():
        a = _ATTR.match(rest, pos)
        if a is None or a.end() == pos:
            raise HtmlError(f"Empty attribute name in the tag at byte offset {_byte(html, i)}")
        value = (a.group(2) or "").strip("\"'")
        attrs[a.group(1).lower()] = _decode(value, i, html)
        pos = a.end()
    if name == "span" and attrs.get("class") != "tg-spoiler":
        raise HtmlError(f'Tag "span" must have class "tg-spoiler" at byte offset {_byte(html, i)}')
    if name == "tg-emoji" and not attrs.get("emoji-id", "").isdigit():
        raise HtmlError(f'Custom emoji entity must have "emoji-id" at byte offset {_byte(html, i)}')
    return {"tag": name, "type": _TAGS[name], "offset": units, "attrs": attrs}


def _finish(
    top: dict[str, Any],
    units: int,
    stack: list[dict[str, Any]],
    entities: list[dict[str, Any]],
    inner: str,
) -> None:
    length = units - top["offset"]
    attrs = top["attrs"]
    if top["tag"] == "code" and stack and stack[-1]["tag"] == "pre":
        lang = attrs.get("class", "")
        if lang.startswith("language-"):
            stack[-1]["language"] = lang[9:]
            return
    if length <= 0:
        return
    entity: dict[str, Any] = {"type": top["type"], "offset": top["offset"], "length": length}
    if top["tag"] == "a":  # TDLib parse_html: a tg://user link is a mention, a link that
        # fails LinkManager::get_checked_link no entity at all (no error either)
        url = attrs.get("href") or inner
        user = _link_user_id(url)
        if user is not None:
            entity.update(type="text_mention", user={"id": user, "is_bot": False})
        elif url := _checked_link(url):
            entity["url"] = url
        else:
            return
    if top["tag"] == "pre" and top.get("language"):
        entity["language"] = top["language"]
    if top["tag"] == "blockquote" and "expandable" in attrs:
        entity["type"] = "expandable_blockquote"
    entities.append(entity)


def _link_user_id(url: str) -> int | None:
    """The user a tg:user?id=N link mentions (TDLib LinkManager::get_link_user_id)."""
    rest = url.lower()
    if not rest.startswith("tg:"):
        return None
    rest = rest[3:].removeprefix("//")
    if not rest.startswith("user"):
        return None
    rest = rest[4:].removeprefix("/")
    if not rest.startswith("?"):
        return None
    for param in rest[1:].split("#")[0].split("&"):
        key, _, value = param.partition("=")
        if key == "id":
            valid = re.fullmatch(r"-?[0-9]{1,18}", value) and 0 < int(value) < 1 << 40
            return int(value) if valid else None
    return None


def _checked_link(link: str) -> str:
    """The link Telegram keeps for an <a href>, or "" when it keeps none (TDLib
    LinkManager::check_link_impl, td/telegram/LinkManager.cpp): http(s) needs a dot in the
    host (or an IPv6 one), anything without "http(s)://" is read as a web address (mailto:a@b.c
    becomes http://mailto:a@b.c/), and tg:, ton:, tonsite: links keep a plain host."""
    kind = next((k for k in ("tg", "ton", "tonsite") if link.lower().startswith(k + ":")), "")
    rest = link[len(kind) + 1 :].removeprefix("//") if kind else link
    url = _parse_url(rest)
    if url is None:
        return ""
    scheme, userinfo, host, port, query, ipv6 = url
    if kind:
        if rest.lower().startswith("http://") or scheme == "https" or userinfo or port or ipv6:
            return ""
        if not re.fullmatch(r"[a-z0-9_-]+" if kind != "tonsite" else r"[a-z0-9_.-]+", host):
            return ""
        return f"{kind}://{host}{query[1:] if query.startswith('/?') else query}"
    if "." not in host and not ipv6:
        return ""  # "Wrong HTTP URL"
    credentials, at_port = f"{userinfo}@" if userinfo else "", f":{port}" if port else ""
    return f"{scheme}://{credentials}{host}{at_port}{query}"


def _parse_url(url: str) -> tuple[str, str, str, int, str, bool] | None:
    """(scheme, userinfo, host, port given, path, IPv6) as TDLib reads a URL, or None
    (parse_url, tdutils/td/utils/HttpUrl.cpp)."""
    head = re.split(r"[:/?#@\[\]]", url, maxsplit=1)[0]
    scheme = "http"  # without "://" the whole link is host and path
    if url.startswith("://", len(head)):
        scheme = head.lower()
        if scheme not in ("http", "https"):
            return None  # "Unsupported URL protocol"
        url = url[len(head) + 3 :]
    hostport = re.split(r"[/?#]", url, maxsplit=1)[0]
    query = url[len(hostport) :].rstrip(" \t\r\n") or "/"
    port = 0
    sep = max(hostport.rfind(":"), hostport.rfind("]"), hostport.rfind("@"))
    if sep > 0 and hostport[sep] == ":":
        digits = hostport[sep + 1 :].lstrip("0")
        if not re.fullmatch(r"[0-9]{1,5}", digits) or not 0 < int(digits) <= 65535:
            return None
        hostport, port = hostport[:sep], int(digits)
    userinfo, _, host = hostport.rpartition("@")
    host = "".join(c.lower() if c.isascii() else c for c in host)
    ipv6 = len(host) > 1 and host[0] == "[" and host[-1] == "]"
    if ipv6:
        try:
            ipaddress.IPv6Address(host[1:-1] if "%" not in host else "")
        except ValueError:
            return None
    elif host in ("", ".") or not _HOST_CHARS.fullmatch(host):
        return None
    path = "".join(f"%{ord(c):02X}" if ord(c) <= 0x20 else c for c in query)
    return scheme, userinfo, host, port, path if path.startswith("/") else "/" + path, ipv6


def sent_entities(entities: list[dict[str, Any]], most: int = MAX_ENTITIES) -> list[dict[str, Any]]:
    """What Telegram keeps of a message's entities (TDLib get_input_message_entities,
    td/telegram/MessageEntity.cpp): bold, italic, underline, strikethrough and spoiler are
    cut into pieces (split_entities), then the first `most` others are sent in order, then
    pieces while fewer than `most` were sent; the rest are dropped, without an error."""
    whole = [e for e in entities if e["type"] not in _SPLITTABLE]
    emoji = [e for e in whole if e["type"] == "custom_emoji"]  # not counted
    others = [e for e in whole if e["type"] != "custom_emoji"][:most]
    pieces = _split([e for e in entities if e["type"] in _SPLITTABLE])
    kept = emoji + others + pieces[: most - len(others)]
    return sorted(kept, key=lambda e: (e["offset"], -e["length"]))


def _split(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TDLib split_entities (with no other entities): entities of one type that touch or
    overlap make one run, and every run is cut where a run of another type starts."""
    runs: dict[str, list[int]] = {}  # type → [start, end] of its open run
    out: list[dict[str, Any]] = []

    def flush(at: int) -> None:
        for kind in _SPLITTABLE:
            run = runs.get(kind)
            if run is not None and run[0] < at:
                out.append({"type": kind, "offset": run[0], "length": min(run[1], at) - run[0]})
                if run[1] <= at:
                    del runs[kind]
                else:
                    run[0] = at

    for e in sorted(entities, key=lambda e: (e["offset"], -e["length"])):
        start, end = e["offset"], e["offset"] + e["length"]
        run = runs.get(e["type"])
        if run is not None and start <= run[1]:
            run[1] = max(run[1], end)
        else:
            flush(start)
            runs[e["type"]] = [start, end]
    flush(1 << 62)
    return sorted(out, key=lambda e: (e["offset"], -e["length"], _SPLITTABLE.index(e["type"])))


@dataclass(frozen=True)
class User:
    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username:
            out["username"] = self.username
        return out


@dataclass
class Sent:
    """A message the bot sent, as the fake keeps it (edits change it in place)."""

    chat_id: int
    message_id: int
    text: str
    entities: list[dict[str, Any]]
    html: str | None
    thread: int | None = None
    reply_to: int | None = None
    reply_markup: dict[str, Any] | None = None
    deleted: bool = False
    edits: int = 0

    def buttons(self) -> list[dict[str, Any]]:
        if not self.reply_markup:
            return []
        return [b for row in self.reply_markup.get("inline_keyboard", []) for b in row]


@dataclass
class FakeTelegram:
    token: str = TOKEN
    username: str = "switchboard_test_bot"
    drafts_supported: bool = True
    drafts_refused: set[int] = field(default_factory=set)  # chats answering 400 to a draft
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)  # time.monotonic() of each call
    sent: list[Sent] = field(default_factory=list)  # every message created, in order
    drafts: list[tuple[int, int, str]] = field(default_factory=list)
    actions: list[tuple[int, str, int | None]] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    webhook: dict[str, Any] | None = None
    offsets: list[int] = field(default_factory=list)
    files: dict[str, tuple[str, bytes, int]] = field(default_factory=dict)  # path, data, size
    blocked: set[int] = field(default_factory=set)
    forums: dict[int, set[int]] = field(default_factory=dict)
    refuse_html: bool = False  # answer every HTML text with "can't parse entities"
    file_delay_s: float = 0.0  # before serving a file download
    early_retries: int = 0  # write calls made before a 429's retry_after had passed
    rejected: list[str] = field(default_factory=list)  # descriptions of every 4xx answered
    url: str = ""
    _pending: list[dict[str, Any]] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _polling: bool = False
    _storm: list[float] = field(default_factory=list)
    _flood_until: dict[int, float] = field(default_factory=dict)
    _queries: set[str] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(900_000_001))
    _mids: dict[int, itertools.count[int]] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    _failures: dict[str, list[tuple[int, str, dict[str, Any] | None] | None]] = field(
        default_factory=dict
    )
    _stalls: dict[str, int] = field(default_factory=dict)  # method: successful calls before
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def bot(self) -> User:
        return User(int(self.token.split(":")[0]), "Switchboard", self.username, is_bot=True)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        self._runner, self.url = await serve(app, access_log=None, shutdown_timeout=0.1)
        return self.url

    async def aclose(self) -> None:
        self._arrived.set()
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    # scripting

    def flood(self, count: int, retry_after: float) -> None:
        """The next `count` write calls answer 429 (and the chat stays flooded retry_after s)."""
        self._storm.extend([retry_after] * count)

    def fail_next(
        self,
        method: str,
        code: int,
        description: str,
        *,
        times: int = 1,
        after: int = 0,
        retry_after: float | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """After `after` more calls of `method` succeed, the next `times` answer this error
        (with these response parameters, retry_after among them when given)."""
        if retry_after is not None:
            parameters = {**(parameters or {}), "retry_after": retry_after}
        queue = self._failures.setdefault(method, [])
        queue.extend([None] * after + [(code, description, parameters)] * times)

    def stall_next(self, method: str, *, after: int = 0) -> None:
        """After `after` more calls of `method` succeed, the next one never answers (the
        gateway is stopped while it waits, say)."""
        self._stalls[method] = after

    def push(self, update: dict[str, Any]) -> None:
        """Queue an update for getUpdates."""
        self._pending.append(update)
        self._arrived.set()

    def add_file(self, data: bytes, path: str, *, size: int | None = None) -> dict[str, Any]:
        """A downloadable file; `size` is what the update and getFile claim (default: true)."""
        file_id = f"AgAC{len(self.files):04d}file"
        self.files[file_id] = (path, data, len(data) if size is None else size)
        return {
            "file_id": file_id,
            "file_unique_id": f"AQAD{len(self.files):04d}",
            "file_size": self.files[file_id][2],
        }

    def in_chat(self, chat_id: int, *, include_deleted: bool = False) -> list[Sent]:
        return [s for s in self.sent if s.chat_id == chat_id and (include_deleted or not s.deleted)]

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    def writes_to(self, chat_id: int) -> list[tuple[float, str]]:
        """(time, method) of each sendMessage / editMessageText call for the chat."""
        return [
            (t, m)
            for t, (m, p) in zip(self.stamps, self.calls, strict=True)
            if m in ("sendMessage", "editMessageText") and str(p.get("chat_id")) == str(chat_id)
        ]

    # updates

    def _mid(self, chat_id: int) -> int:
        return next(self._mids.setdefault(chat_id, itertools.count(1)))

    def message(
        self,
        user: User,
        text: str | None = None,
        *,
        chat: dict[str, Any] | None = None,
        thread: int | None = None,
        reply_to: Sent | dict[str, Any] | None = None,
        entities: list[dict[str, Any]] | None = None,
        edited: bool = False,
        **extra: Any,
    ) -> dict[str, Any]:
        """A real-shaped `message` update from `user` (in a private chat unless `chat`)."""
        chat = chat or {"id": user.id, "first_name": user.first_name, "type": "private"}
        msg: dict[str, Any] = {
            "message_id": self._mid(chat["id"]),
            "from": user.json(),
            "chat": chat,
            "date": int(time.time()),
        }
        if thread is not None:
            msg["message_thread_id"] = thread
            msg["is_topic_message"] = True
        if text is not None:
            msg["text"] = text
            ents = list(entities or [])
            if text.startswith("/"):
                ents.append({"type": "bot_command", "offset": 0, "length": len(text.split()[0])})
            for m in re.finditer(r"@\w+", text):
                ents.append({"type": "mention", "offset": m.start(), "length": len(m.group(0))})
            if ents:
                msg["entities"] = ents
        if isinstance(reply_to, Sent):
            msg["reply_to_message"] = {
                "message_id": reply_to.message_id,
                "from": self.bot.json(),
                "chat": chat,
                "date": int(time.time()),
                "text": reply_to.text,
            }
        elif reply_to is not None:
            msg["reply_to_message"] = reply_to
        msg.update(extra)
        if edited:
            msg["edit_date"] = int(time.time())
        return {"update_id": next(self._ids), "edited_message" if edited else "message": msg}

    def press(self, user: User, sent: Sent, data: str) -> dict[str, Any]:
        """A `callback_query` update: `user` pressed the button with `data` under `sent`."""
        assert any(b.get("callback_data") == data for b in sent.buttons()), data
        chat_type = "private" if sent.chat_id > 0 else "supergroup"
        message: dict[str, Any] = {
            "message_id": sent.message_id,
            "from": self.bot.json(),
            "chat": {"id": sent.chat_id, "type": chat_type},
            "date": int(time.time()),
            "text": sent.text,
            "reply_markup": sent.reply_markup,
        }
        if sent.thread is not None:
            message.update(message_thread_id=sent.thread, is_topic_message=True)
        return self.callback(user, message=message, data=data)

    def callback(
        self, user: User, *, message: dict[str, Any] | None = None, data: str | None = None
    ) -> dict[str, Any]:
        """A `callback_query` update with a query id the fake will accept an answer for."""
        query_id = f"{len(self._queries) + 4382}bfdwdsb323b2d9"
        self._queries.add(query_id)
        query: dict[str, Any] = {"id": query_id, "from": user.json(), "chat_instance": "-8421"}
        if message is not None:
            query["message"] = message
        if data is not None:
            query["data"] = data
        return {"update_id": next(self._ids), "callback_query": query}

    # the API

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(_error(401, "Unauthorized"), status=401)
        await asyncio.sleep(self.file_delay_s)
        for path, data, _ in self.files.values():
            if path == request.match_info["path"]:
                return web.Response(body=data)
        return web.json_response(_error(404, "Not Found"), status=404)

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.match_info["token"] != self.token:
            return self._fail(401, "Unauthorized")
        # the Bot API takes parameters in the query string, a form or a JSON body
        params: dict[str, Any] = {k: _maybe_json(k, v) for k, v in request.query.items()}
        if request.content_type == "application/json":
            params.update(await request.json())
        else:
            form = await request.post()
            params.update({k: _maybe_json(k, v) for k, v in form.items() if isinstance(v, str)})
        self.calls.append((method, params))
        self.stamps.append(time.monotonic())
        if self._failures.get(method) and (failure := self._failures[method].pop(0)):
            return self._fail(*failure)
        if method in self._stalls:
            self._stalls[method] -= 1
            if self._stalls[method] < 0:
                del self._stalls[method]
                await self._released.wait()
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return self._fail(404, "Not Found")
        try:
            result = await handler(params)
        except _ApiError as exc:
            return self._fail(exc.code, exc.description, exc.parameters)
        return web.json_response({"ok": True, "result": result})

    def _fail(self, code: int, desc: str, parameters: dict[str, Any] | None = None) -> web.Response:
        self.rejected.append(desc)
        return web.json_response(_error(code, desc, parameters), status=code)

    async def _m_getMe(self, p: dict[str, Any]) -> Any:
        return {**self.bot.json(), "can_join_groups": True, "supports_inline_queries": False}

    def _write_checks(self, chat_id: int) -> None:
        if chat_id in self.blocked:
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        now = time.monotonic()
        until = self._flood_until.get(chat_id, 0.0)
        if now < until:
            self.early_retries += 1
            raise _flood(until - now)
        if self._storm:
            delay = self._storm.pop(0)
            self._flood_until[chat_id] = now + delay
            raise _flood(delay)

    def _text(self, p: dict[str, Any], *, empty_ok: bool = False) -> tuple[str, list[Any]]:
        raw = str(p.get("text", ""))
        if p.get("parse_mode") == "HTML" and self.refuse_html:
            raise _ApiError(400, "Bad Request: can't parse entities: unsupported start tag")
        if p.get("parse_mode") == "HTML":
            try:
                text, entities = parse_html(raw)
            except HtmlError as exc:
                raise _ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
            entities = sent_entities(entities)  # the rest are lost without an error
        elif p.get("parse_mode"):
            raise _ApiError(400, f"Bad Request: unsupported parse_mode {p['parse_mode']}")
        else:
            text, entities = raw, []
        stripped = text.strip()
        lead = utf16(text[: len(text) - len(text.lstrip())])
        for e in entities:
            e["offset"] = max(e["offset"] - lead, 0)
        if not stripped and not empty_ok:
            raise _ApiError(400, "Bad Request: message text is empty")
        if utf16(stripped) > 4096:
            raise _ApiError(400, "Bad Request: message is too long")
        return stripped, entities

    def _markup(self, p: dict[str, Any]) -> dict[str, Any] | None:
        markup = p.get("reply_markup")
        if markup is None:
            return None
        for row in markup.get("inline_keyboard", []):
            for button in row:
                data = button.get("callback_data")
                if not button.get("text"):
                    raise _ApiError(400, "Bad Request: text buttons are unallowed in the keyboard")
                if data is not None and not 1 <= len(data.encode()) <= 64:
                    raise _ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return dict(markup)

    def _chat(self, p: dict[str, Any]) -> int:
        try:
            return int(p["chat_id"])
        except (KeyError, ValueError):
            raise _ApiError(400, "Bad Request: chat not found") from None

    def _thread(self, chat_id: int, p: dict[str, Any]) -> int | None:
        thread = int(p["message_thread_id"]) if p.get("message_thread_id") else None
        if thread is not None and chat_id in self.forums and thread not in self.forums[chat_id]:
            raise _ApiError(400, "Bad Request: message thread not found")
        return thread

    async def _m_sendMessage(self, p: dict[str, Any]) -> Any:
        chat_id = self._chat(p)
        thread = self._thread(chat_id, p)
        text, entities = self._text(p)
        markup = self._markup(p)
        self._write_checks(chat_id)
        reply = p.get("reply_parameters") or {}
        sent = Sent(
            chat_id=chat_id,
            message_id=self._mid(chat_id),
            text=text,
            entities=entities,
            html=p["text"] if p.get("parse_mode") == "HTML" else None,
            thread=thread,
            reply_to=reply.get("message_id"),
            reply_markup=markup,
        )
        self.sent.append(sent)
        return self._message_json(sent)

    def _find(self, p: dict[str, Any], action: str) -> Sent:
        chat_id, mid = self._chat(p), int(p.get("message_id", 0))
        for s in self.sent:
            if s.chat_id == chat_id and s.message_id == mid and not s.deleted:
                return s
        raise _ApiError(400, f"Bad Request: message to {action} not found")

    async def _m_editMessageText(self, p: dict[str, Any]) -> Any:
        sent = self._find(p, "edit")
        text, entities = self._text(p)
        markup = self._markup(p)
        if text == sent.text and entities == sent.entities and markup == sent.reply_markup:
            raise _ApiError(400, NOT_MODIFIED)
        self._write_checks(sent.chat_id)
        sent.text, sent.entities, sent.reply_markup = text, entities, markup
        sent.html = p["text"] if p.get("parse_mode") == "HTML" else None
        sent.edits += 1
        return self._message_json(sent)

    async def _m_deleteMessage(self, p: dict[str, Any]) -> Any:
        self._find(p, "delete").deleted = True
        return True

    async def _m_sendChatAction(self, p: dict[str, Any]) -> Any:
        chat_id = self._chat(p)
        if chat_id in self.blocked:
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        if p.get("action") not in {"typing", "upload_photo", "upload_document", "record_voice"}:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        self.actions.append((chat_id, p["action"], self._thread(chat_id, p)))
        return True

    async def _m_sendMessageDraft(self, p: dict[str, Any]) -> Any:
        if not self.drafts_supported:
            raise _ApiError(404, "Not Found")
        chat_id = self._chat(p)
        if chat_id < 0 or chat_id in self.drafts_refused:
            raise _ApiError(400, "Bad Request: TEXTDRAFT_PEER_INVALID")
        if not int(p.get("draft_id", 0)):
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text, _ = self._text(p, empty_ok=True)
        self.drafts.append((chat_id, int(p["draft_id"]), text))
        return True

    async def _m_answerCallbackQuery(self, p: dict[str, Any]) -> Any:
        query = str(p.get("callback_query_id", ""))
        if query not in self._queries or query in self.answered:  # one answer per press
            raise _ApiError(
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        self.answered.append(query)
        return True

    async def _m_getFile(self, p: dict[str, Any]) -> Any:
        file_id = str(p.get("file_id", ""))
        if file_id not in self.files:
            raise _ApiError(400, "Bad Request: invalid file_id")
        path, _, size = self.files[file_id]
        return {
            "file_id": file_id,
            "file_unique_id": "AQAD" + file_id[-8:],
            "file_size": size,
            "file_path": path,
        }

    async def _m_setWebhook(self, p: dict[str, Any]) -> Any:
        url = str(p.get("url", ""))
        if not url.startswith("https://"):
            raise _ApiError(
                400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook"
            )
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
        self.webhook = {
            "url": url,
            "secret_token": secret,
            "allowed_updates": p.get("allowed_updates"),
        }
        return True

    async def _m_deleteWebhook(self, p: dict[str, Any]) -> Any:
        self.webhook = None
        return True

    async def _m_getUpdates(self, p: dict[str, Any]) -> Any:
        if self.webhook is not None:
            raise _ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        if self._polling:
            raise _ApiError(
                409,
                "Conflict: terminated by other getUpdates request; "
                "make sure that only one bot instance is running",
            )
        offset = int(p.get("offset", 0) or 0)
        if offset:
            self.offsets.append(offset)
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
        self._polling = True
        try:
            if not self._pending:
                self._arrived.clear()
                timeout = float(p.get("timeout", 0) or 0)
                if timeout:
                    try:
                        await asyncio.wait_for(self._arrived.wait(), timeout)
                    except TimeoutError:
                        return []
        finally:
            self._polling = False
        return self._pending[: int(p.get("limit", 100) or 100)]

    def _message_json(self, sent: Sent) -> dict[str, Any]:
        out: dict[str, Any] = {
            "message_id": sent.message_id,
            "from": self.bot.json(),
            "chat": {"id": sent.chat_id, "type": "private" if sent.chat_id > 0 else "supergroup"},
            "date": int(time.time()),
            "text": sent.text,
        }
        if sent.entities:
            out["entities"] = sent.entities
        if sent.thread is not None:
            out["message_thread_id"] = sent.thread
        if sent.reply_markup:
            out["reply_markup"] = sent.reply_markup
        return out


class _ApiError(Exception):
    def __init__(self, code: int, description: str, parameters: dict[str, Any] | None = None):
        super().__init__(description)
        self.code, self.description, self.parameters = code, description, parameters


def _flood(delay: float) -> _ApiError:
    delay = max(round(delay, 3), 0.001)
    return _ApiError(429, f"Too Many Requests: retry after {delay}", {"retry_after": delay})


def _error(code: int, desc: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": desc}
    if parameters:
        body["parameters"] = parameters
    return body


def _maybe_json(key: str, value: str) -> Any:
    if key in {"reply_markup", "reply_parameters", "allowed_updates", "entities"}:
        return json.loads(value)
    return value


# helpers for end-to-end tests: the real gateway, configured for this fake

SECRET = "test_webhook-secret_0123"
ANA = User(111111, "Ana")
BOB = User(222222, "Bob")
GROUP = {"id": -1001234567890, "title": "Team", "type": "supergroup"}
FORUM = {"id": -1009876543210, "title": "Support", "type": "supergroup", "is_forum": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(
    tmp_path: Path,
    fake: FakeTelegram,
    model_url: str,
    *,
    mode: str = "webhook",
    extra: str = "",
    channels: str = "",
    poll_timeout_s: int = 1,
) -> Path:
    """A gateway config: the fake model, this fake Bot API, Telegram in `mode`, web chat off.
    `extra` lines go into [channels.telegram] (other sections may follow), `channels` lines
    into [channels]."""
    public = 'public_url = "https://bot.example.com"\n' if mode == "webhook" else ""
    path = tmp_path / "switchboard.toml"
    path.write_text(
        f"[server]\nport = {free_port()}\nshutdown_grace_s = 0.3\n{public}"
        f'[store]\nurl = "sqlite:///{tmp_path}/sb.db"\n'
        f'[model]\nprovider = "openai"\nbase_url = "{model_url}"\nname = "fake"\n'
        "max_retries = 1\n"
        # the fakes answer at any length (tests of long replies), as a model asked for more would
        "[agent.limits]\nmax_output_tokens = 4000\ntoken_budget = 30000\n"
        f'[channels]\nmedia_dir = "{tmp_path}/files"\n{channels}'
        "[channels.web]\nenabled = false\n"
        f'[channels.telegram]\nenabled = true\ntoken = "{fake.token}"\nmode = "{mode}"\n'
        f'webhook_secret = "{SECRET}"\napi_base = "{fake.url}"\n'
        f"poll_timeout_s = {poll_timeout_s}\n{extra}",
        encoding="utf-8",
    )
    return path


@dataclass
class Gateway:
    """The real app on a real port, plus ways to hand it Telegram updates."""

    url: str
    app: web.Application
    fake: FakeTelegram
    mode: str
    db: Path

    async def post(
        self, body: bytes | dict[str, Any], secret: str | None = SECRET
    ) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            return await client.post("/webhooks/telegram", content=data, headers=headers)

    async def deliver(self, update: dict[str, Any]) -> None:
        """Hand the update over the way this mode receives it, and wait until it is taken."""
        if self.mode == "webhook":
            resp = await self.post(update)
            assert resp.status_code == 200, resp.text
            return
        self.fake.push(update)
        await until(lambda: any(o > update["update_id"] for o in self.fake.offsets))

    def inbox(self) -> list[tuple[str, dict[str, Any]]]:
        """(session, message) of every stored inbound message, oldest first."""
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            rows = db.execute("SELECT session, payload FROM inbox ORDER BY id").fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]

    def outbox(self) -> list[dict[str, Any]]:
        """Every reply part with its delivery outcome, oldest first."""
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "SELECT session, status, attempts, platform_id, error FROM outbox ORDER BY id"
            ).fetchall()
        return [dict(r) for r in rows]

    async def kv(self, namespace: str, key: str) -> str | None:
        return await self.app[RUNTIME].store.kv_get(namespace, key)


@contextlib.asynccontextmanager
async def running_gateway(config: Path, fake: FakeTelegram) -> AsyncIterator[Gateway]:
    settings = load_settings(config)
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", settings.server.port)
    await site.start()
    mode = settings.channels.telegram.effective_mode(settings.server.public_url)
    try:
        yield Gateway(
            f"http://127.0.0.1:{settings.server.port}",
            app,
            fake,
            mode,
            Path(settings.sqlite_path()),
        )
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_fake(
    monkeypatch: Any, *, real_limits: bool = False, **kw: Any
) -> AsyncIterator[FakeTelegram]:
    """Start the fake. Unless `real_limits`, the adapter's send limits are made 50x faster so
    tests that send several messages to one chat do not wait a second for each.

    PTB 22 warns (an error, in tests) whenever a RetryAfter is built unless its timedelta mode
    is on; the adapter handles both forms."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    if not real_limits:
        for name, (count, period) in RATES.items():
            monkeypatch.setitem(RATES, name, (count, period / 50))
    fake = FakeTelegram(**kw)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.aclose()


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)
