"""A fake Slack for tests: Web API, Socket Mode websocket and file downloads (aiohttp on
127.0.0.1, port 0), plus helpers to sign requests and run the gateway against it.

It checks what Slack checks: the bearer token (bot token, or the app token for
apps.connections.open), required arguments, `no_text`, block limits (≤ 50 blocks, section
text ≤ 3000, ≤ 25 buttons an actions block, button text ≤ 75, value ≤ 2000) as
`invalid_blocks`, and answers 429 with Retry-After when told to. Formatting that Slack would
render wrongly (raw `<`/`&`, unbalanced code fences, blocks without a `text` fallback) is
recorded in `problems` for tests to assert on. Unknown methods fail loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import re
import socket
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import WSMsgType, web

from core.models import SessionKey
from core.store import Store
from gateway.app import build_app
from gateway.keys import RUNTIME
from gateway.settings import load_settings
from tests.loopback import serve

__all__ = [
    "BOT_TOKEN",
    "BOT_USER",
    "TEAM",
    "FakeSlack",
    "SlackGateway",
    "event",
    "gateway_config",
    "message",
    "payload",
    "run_gateway",
    "sign",
]

BOT_TOKEN, APP_TOKEN = "xoxb-fake-bot-token", "xapp-fake-app-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
PAYLOADS = Path(__file__).parent / "payloads" / "slack"
TEAM, BOT_USER, BOT_ID = "T0TEAM0001", "U0BOT00001", "B0BOT00001"
_SLACK_SYNTAX = re.compile(r"<(?:https?://|mailto:|@|#|!)[^<>]*>|&(?:amp|lt|gt);")


def sign(secret: str, body: bytes, ts: int | None = None) -> dict[str, str]:
    """The v0 signature headers Slack sends with a request."""
    stamp = str(int(time.time()) if ts is None else ts)
    base = b"v0:" + stamp.encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def mrkdwn_problems(text: str) -> list[str]:
    """What would not render as intended in Slack: raw `<`/`&`/`>`, an open code block."""
    found = []
    rest = _SLACK_SYNTAX.sub("", text)
    rest = "\n".join(re.sub(r"^(?:> ?|>$)+", "", line) for line in rest.split("\n"))
    for ch in "<&>":
        if ch in rest:
            found.append(f"raw {ch!r} in {text[:80]!r}")
    if len(re.findall(r"^```$", text, re.MULTILINE)) % 2:
        found.append(f"unbalanced code fence in {text[:80]!r}")
    return found


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    at: float


@dataclass
class FakeSlack:
    team: str = TEAM
    calls: list[Call] = field(default_factory=list)
    # channel -> messages the bot posted, in order (dicts: ts, thread_ts, text, blocks, ...)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    reactions: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    statuses: list[tuple[str, str, str]] = field(default_factory=list)
    assistant_threads: set[tuple[str, str]] = field(default_factory=set)
    channel_errors: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # file name -> Location
    acks: list[str] = field(default_factory=list)
    slow: dict[str, float] = field(default_factory=dict)  # method -> seconds before it answers
    url: str = ""
    _faults: dict[str, deque[list[Any]]] = field(default_factory=lambda: defaultdict(deque))
    _sockets: list[web.WebSocketResponse] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _clock: int = 0

    @property
    def api_base(self) -> str:
        return f"{self.url}/api"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        app.router.add_get("/files/{name}", self._file)
        self._runner, self.url = await serve(app, access_log=None, shutdown_timeout=0.2)
        return self.url

    async def aclose(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # test controls

    def fail(
        self,
        method: str,
        status: int = 429,
        *,
        retry_after: float | None = 1,
        times: int = 1,
        after: int = 0,
        body: str | None = None,
    ) -> None:
        """After `after` good calls, the next `times` calls of `method` answer HTTP `status`
        (429 with Retry-After); `body`: this instead of Slack's JSON, said to be JSON (a
        proxy's error page)."""
        for i in range(times):
            self._faults[method].append([after if i == 0 else 0, status, retry_after, body])

    def add_file(self, name: str, data: bytes, mime: str) -> str:
        self.files[name] = (data, mime)
        return f"{self.url}/files/{name}"

    def posted(self, channel: str) -> list[dict[str, Any]]:
        return [m for m in self.messages[channel] if not m.get("deleted")]

    def called(self, method: str) -> list[dict[str, Any]]:
        return [c.args for c in self.calls if c.method == method]

    async def wait_for(self, check: Callable[[], Any], timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while not (result := check()):
                await asyncio.sleep(0.02)
        return result

    async def push(self, envelope: dict[str, Any]) -> None:
        """Send a Socket Mode envelope to every connected client."""
        await self.wait_for(lambda: self._sockets)
        for ws in self._sockets:
            await ws.send_str(json.dumps(envelope))

    # Web API

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args.update(await request.json())
        else:
            args.update(await request.post())
        if isinstance(args.get("blocks"), str):
            args["blocks"] = json.loads(args["blocks"])
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else args.get("token")
        self.calls.append(Call(method, args, time.monotonic()))
        if delay := self.slow.get(method):
            await asyncio.sleep(delay)
        faults = self._faults[method]
        if faults and faults[0][0] > 0:
            faults[0][0] -= 1
        elif faults:
            _, status, retry_after, body = faults.popleft()
            headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else {}
            if body is not None:
                return web.Response(
                    text=body, status=status, headers=headers, content_type="application/json"
                )
            error = "ratelimited" if status == 429 else "internal_error"
            return web.json_response({"ok": False, "error": error}, status=status, headers=headers)
        expected = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if not token:
            return _error("not_authed")
        if token != expected:
            return _error("invalid_auth")
        handler = getattr(self, "_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"}, status=404)
        try:
            result: dict[str, Any] = handler(args)
        except _SlackError as exc:
            return _error(str(exc))
        return web.json_response({"ok": True, **result})

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"team_id": self.team, "user_id": BOT_USER, "bot_id": BOT_ID}

    def _apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"url": self.url.replace("http://", "ws://") + "/socket"}

    def _chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        self._check_content(args)
        message = self._new(channel, args.get("thread_ts"), args.get("text", ""))
        message["blocks"] = args.get("blocks") or []
        return {"channel": channel, "ts": message["ts"], "message": message}

    def _new(self, channel: str, thread: str | None, text: str) -> dict[str, Any]:
        self._clock += 1
        ts = f"{1760000000 + self._clock}.{self._clock:06d}"
        message = {"ts": ts, "thread_ts": thread, "text": text, "blocks": [], "bot_id": BOT_ID}
        self.messages[channel].append(message)
        return message

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        message = self._message(channel, args.get("ts"))
        self._check_content(args)
        message["text"] = args.get("text", "")
        if "blocks" in args:
            message["blocks"] = args["blocks"]
        message["edits"] = message.get("edits", 0) + 1
        return {"channel": channel, "ts": message["ts"]}

    def _chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        self._message(channel, args.get("ts"))["deleted"] = True
        return {"channel": channel, "ts": args["ts"]}

    def _chat_startStream(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        if not args.get("thread_ts"):
            raise _SlackError("invalid_arguments")
        if not channel.startswith("D") and not (
            args.get("recipient_team_id") and args.get("recipient_user_id")
        ):
            raise _SlackError("missing_recipient_team_id_or_user_id")
        message = self._new(channel, args["thread_ts"], args.get("markdown_text", ""))
        message["streaming"] = True
        return {"channel": channel, "ts": message["ts"]}

    def _chat_appendStream(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._message(self._channel(args.get("channel")), args.get("ts"))
        if not message.get("streaming"):
            raise _SlackError("message_not_in_streaming_state")
        message["text"] += args.get("markdown_text", "")
        return {"channel": args["channel"], "ts": message["ts"]}

    def _chat_stopStream(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._message(self._channel(args.get("channel")), args.get("ts"))
        if not message.get("streaming"):
            raise _SlackError("message_not_in_streaming_state")
        message["text"] += args.get("markdown_text", "")
        message["streaming"] = False
        return {"channel": args["channel"], "ts": message["ts"]}

    def _reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        names = self.reactions.setdefault(self._reaction_target(args), set())
        if args["name"] in names:
            raise _SlackError("already_reacted")
        names.add(args["name"])
        return {}

    def _reactions_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        names = self.reactions.get(self._reaction_target(args), set())
        if args["name"] not in names:
            raise _SlackError("no_reaction")
        names.discard(args["name"])
        return {}

    def _assistant_threads_setStatus(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, thread = args.get("channel_id"), args.get("thread_ts")
        if (channel, thread) not in self.assistant_threads:
            raise _SlackError("invalid_thread")  # only assistant threads have a status
        self.statuses.append((channel, thread, args.get("status", "")))
        return {}

    def _reaction_target(self, args: dict[str, Any]) -> tuple[str, str]:
        if not (args.get("channel") and args.get("timestamp") and args.get("name")):
            raise _SlackError("invalid_arguments")
        return self._channel(args["channel"]), str(args["timestamp"])

    def _channel(self, channel: Any) -> str:
        if not isinstance(channel, str) or not channel:
            raise _SlackError("channel_not_found")
        if channel in self.channel_errors:
            raise _SlackError(self.channel_errors[channel])
        return channel

    def _message(self, channel: str, ts: Any) -> dict[str, Any]:
        for m in self.messages[channel]:
            if m["ts"] == ts and not m.get("deleted"):
                return m
        raise _SlackError("message_not_found")

    def _check_content(self, args: dict[str, Any]) -> None:
        text, blocks = args.get("text") or "", args.get("blocks") or []
        if not text and not blocks:
            raise _SlackError("no_text")
        if len(text) > 40_000:
            raise _SlackError("msg_too_long")
        if not isinstance(blocks, list) or len(blocks) > 50:
            raise _SlackError("invalid_blocks")
        for block in blocks:
            _check_block(block)
        if blocks and not text:
            self.problems.append("blocks without a text fallback")
        for mrkdwn in [text, *(b["text"]["text"] for b in blocks if b["type"] == "section")]:
            self.problems.extend(mrkdwn_problems(mrkdwn))

    # Socket Mode and files

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_json({"type": "hello", "num_connections": 1, "connection_info": {}})
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    envelope_id = json.loads(msg.data).get("envelope_id")
                    if envelope_id:
                        self.acks.append(envelope_id)
        finally:
            self._sockets.remove(ws)
        return ws

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {BOT_TOKEN}":
            return web.Response(text="<html>Sign in to Slack</html>", content_type="text/html")
        name = request.match_info["name"]
        if name in self.redirects:
            raise web.HTTPFound(self.redirects[name])
        found = self.files.get(name)
        if found is None:
            raise web.HTTPNotFound()
        return web.Response(body=found[0], content_type=found[1])


class _SlackError(Exception):
    """An `{"ok": false, "error": ...}` answer (HTTP 200, as Slack sends them)."""


def _error(error: str) -> web.Response:
    return web.json_response({"ok": False, "error": error})


def _check_block(block: Any) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "section":
        text = block.get("text") or {}
        if (
            text.get("type") not in ("mrkdwn", "plain_text")
            or not 0 < len(text.get("text", "")) <= 3000
        ):
            raise _SlackError("invalid_blocks")
    elif kind == "actions":
        elements = block.get("elements") or []
        ids = [e.get("action_id") for e in elements]
        if not 0 < len(elements) <= 25 or len(set(ids)) != len(ids):
            raise _SlackError("invalid_blocks")
        for e in elements:
            label = (e.get("text") or {}).get("text", "")
            if e.get("type") != "button" or not 0 < len(label) <= 75:
                raise _SlackError("invalid_blocks")
            if len(e.get("value", "")) > 2000 or len(e.get("action_id") or "") > 255:
                raise _SlackError("invalid_blocks")
    else:
        raise _SlackError("invalid_blocks")


# the gateway under test, configured against the fake


@dataclass
class SlackGateway:
    """The real app on a random port, with its Slack channel pointed at a FakeSlack."""

    url: str
    secret: str
    runner: web.AppRunner

    @property
    def store(self) -> Store:
        return self.runner.app[RUNTIME].store

    async def transcript(self, conversation: str, thread: str | None = None) -> list[Any]:
        """What the session holds: inbound messages and reply parts, in order."""
        key = SessionKey("default", "slack", TEAM, conversation, thread)
        return await self.store.transcript(str(key), 100)

    async def post(
        self,
        body: bytes | dict[str, Any],
        *,
        ts: int | None = None,
        secret: str | None = None,
        headers: dict[str, str] | None = None,
        signed: bool = True,
    ) -> httpx.Response:
        """POST /webhooks/slack as Slack would: JSON (or form bytes), signed v0."""
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        ctype = "application/json" if raw.startswith(b"{") else "application/x-www-form-urlencoded"
        all_headers = {"Content-Type": ctype, **(headers or {})}
        if signed:
            all_headers.update(sign(secret or self.secret, raw, ts))
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            return await client.post("/webhooks/slack", content=raw, headers=all_headers)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gateway_config(tmp_path: Path, slack: FakeSlack, model_url: str, extra: str = "") -> Path:
    path = tmp_path / "switchboard.toml"
    path.write_text(
        f"[server]\nport = {free_port()}\nmax_body_bytes = 65536\nshutdown_grace_s = 0.3\n"
        f'[store]\nurl = "sqlite:///{tmp_path}/sb.db"\n'
        f'[model]\nprovider = "openai"\nbase_url = "{model_url}"\nname = "fake"\n'
        f"max_retries = 1\n"
        # the fakes answer at any length (tests of long replies), as a model asked for more would
        "[agent.limits]\nmax_output_tokens = 4000\ntoken_budget = 30000\n"
        f'[channels]\nmedia_dir = "{tmp_path}/files"\n'
        f"[channels.slack]\nenabled = true\n"
        f'bot_token = "{BOT_TOKEN}"\nsigning_secret = "{SIGNING_SECRET}"\n'
        f'app_token = "{APP_TOKEN}"\napi_base = "{slack.api_base}"\n{extra}'
    )
    return path


@contextlib.asynccontextmanager
async def run_gateway(config: Path) -> AsyncIterator[SlackGateway]:
    settings = load_settings(config)
    runner = web.AppRunner(build_app(settings), shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", settings.server.port)
    await site.start()
    try:
        yield SlackGateway(f"http://127.0.0.1:{settings.server.port}", SIGNING_SECRET, runner)
    finally:
        await runner.cleanup()


def payload(name: str) -> dict[str, Any]:
    """A recorded, real-shaped payload from tests/payloads/slack/."""
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text())
    return data


_ids = itertools.count(1)


def event(inner: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    """An event_callback envelope around `inner`, with a fresh event_id."""
    n = next(_ids)
    return {
        "token": "verification-token-unused",
        "team_id": TEAM,
        "api_app_id": "A0APP00001",
        "type": "event_callback",
        "event_id": f"Ev0TEST{n:05d}",
        "event_time": int(time.time()),
        "authorizations": [
            {"team_id": TEAM, "user_id": BOT_USER, "is_bot": True, "is_enterprise_install": False}
        ],
        "event": inner,
        **envelope,
    }


def message(channel: str, text: str, *, ts: str | None = None, **fields: Any) -> dict[str, Any]:
    """A person's message event (DM when the channel starts with D)."""
    n = next(_ids)
    kind = "im" if channel.startswith("D") else "channel"
    return {
        "type": "message",
        "channel": channel,
        "user": fields.pop("user", "U0USER0001"),
        "text": text,
        "ts": ts or f"{1750000000 + n}.{n:06d}",
        "event_ts": ts or f"{1750000000 + n}.{n:06d}",
        "channel_type": kind,
        "client_msg_id": f"00000000-0000-0000-0000-{n:012d}",
        **fields,
    }
