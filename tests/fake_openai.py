"""A fake OpenAI-compatible Chat Completions server for tests (aiohttp on 127.0.0.1, port 0).

A test gives it a `responder(body) -> Step` (or a list of Steps served in order); the default
echoes the last user message. It records every request, counts concurrent calls per session
(`session_of(body)`), and can stream, call tools, fail, hang, cut a stream, or send garbage.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.loopback import serve

__all__ = [
    "Cut",
    "Error",
    "FakeOpenAI",
    "Garbage",
    "Step",
    "Text",
    "ToolCalls",
    "last_user_text",
]


@dataclass
class Text:
    text: str
    delay_s: float = 0.0  # before answering
    chunk_delay_s: float = 0.0
    finish_reason: str = "stop"


@dataclass
class ToolCalls:
    calls: list[tuple[str, str]]  # (name, arguments JSON text)
    text: str = ""
    delay_s: float = 0.0


@dataclass
class Error:
    status: int
    message: str = "fake error"
    retry_after: float | None = None


@dataclass
class Cut:
    """Stream some text, then drop the connection without finishing."""

    text: str = "partial"


@dataclass
class Garbage:
    """Answer 200 with a body that is not a valid completion: `data` as the whole body, or as
    the one event of a stream (the default is not JSON; JSON in the wrong shape works too)."""

    data: str = "{not json"


Step = Text | ToolCalls | Error | Cut | Garbage
Responder = Callable[[dict[str, Any]], Step | Awaitable[Step]]

_USER = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)


_FROM = re.compile(r"^\[from: [^\n]*\]$")


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the newest user message, without the <user_message> wrapping."""
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            found = _USER.findall(m.get("content") or "")
            return "\n".join(found) if found else (m.get("content") or "")
    return ""


def _echo(body: dict[str, Any]) -> Step:
    """What the people wrote; not who wrote it in a group (the "[from: …]" lines: tests of
    that read the requests), so tests of where answers go compare the texts alone."""
    said = [line for line in last_user_text(body).split("\n") if not _FROM.match(line)]
    return Text("echo: " + "\n".join(said))


@dataclass
class FakeOpenAI:
    responder: Responder | None = None
    session_of: Callable[[dict[str, Any]], str | None] = lambda body: None
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # per request, keys lowercased
    overlaps: int = 0
    max_concurrent: int = 0
    _script: deque[Step] = field(default_factory=deque)
    _active: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    _concurrent: int = 0
    _runner: web.AppRunner | None = None
    url: str = ""
    api_key: str | None = None  # when set, /v1/models refuses other keys

    def script(self, *steps: Step) -> None:
        """Serve these steps in order before falling back to the responder."""
        self._script.extend(steps)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        self._runner, base = await serve(app, access_log=None, shutdown_timeout=0.2)
        self.url = base + "/v1"
        return self.url

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        """GET /v1/models, checking the key when `api_key` is set (for `switchboard check`)."""
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _next(self, body: dict[str, Any]) -> Step:
        if self._script:
            return self._script.popleft()
        result = (self.responder or _echo)(body)
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            return await result
        return result

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        key = self.session_of(body)
        self._active[key] += 1
        self._concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self._concurrent)
        if key is not None and self._active[key] > 1:
            self.overlaps += 1
        try:
            step = await self._next(body)
            return await self._serve(request, body, step)
        except ConnectionResetError:  # the client went away mid-answer (a killed replica)
            return web.Response(status=499)
        finally:
            self._active[key] -= 1
            self._concurrent -= 1

    async def _serve(
        self, request: web.Request, body: dict[str, Any], step: Step
    ) -> web.StreamResponse:
        if isinstance(step, Error):
            headers = {"Retry-After": str(step.retry_after)} if step.retry_after else {}
            return web.json_response(
                {"error": {"message": step.message, "type": "fake"}},
                status=step.status,
                headers=headers,
            )
        if isinstance(step, Garbage):
            ctype = "text/event-stream" if body.get("stream") else "application/json"
            text = f"data: {step.data}\n\n" if body.get("stream") else step.data
            return web.Response(text=text, content_type=ctype)
        delay = getattr(step, "delay_s", 0.0)
        if delay:
            await asyncio.sleep(delay)
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        if not body.get("stream"):
            return web.json_response(_completion(step, usage))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        if isinstance(step, Cut):
            await send(chunk({"role": "assistant", "content": step.text}))
            assert request.transport is not None
            request.transport.close()
            return resp
        if isinstance(step, Text):
            await send(chunk({"role": "assistant", "content": ""}))
            for piece in re.findall(r"\S+\s*|\s+", step.text):
                await send(chunk({"content": piece}))
                if step.chunk_delay_s:
                    await asyncio.sleep(step.chunk_delay_s)
            await send(chunk({}, step.finish_reason))
        else:
            if step.text:
                await send(chunk({"role": "assistant", "content": step.text}))
            for i, (name, args) in enumerate(step.calls):
                first = {
                    "index": i,
                    "id": f"call_{len(self.requests)}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                await send(chunk({"tool_calls": [first]}))
                for j in range(0, len(args), 7):  # arguments arrive in pieces
                    piece = {"index": i, "function": {"arguments": args[j : j + 7]}}
                    await send(chunk({"tool_calls": [piece]}))
            await send(chunk({}, "tool_calls"))
        await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _completion(step: Step, usage: dict[str, int]) -> dict[str, Any]:
    if isinstance(step, Text):
        message: dict[str, Any] = {"role": "assistant", "content": step.text}
        finish = step.finish_reason
    elif isinstance(step, ToolCalls):
        message = {
            "role": "assistant",
            "content": step.text or None,
            "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(step.calls)
            ],
        }
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": "partial"}, "stop"
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
