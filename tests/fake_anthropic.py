"""A fake Anthropic Messages API for tests (aiohttp on 127.0.0.1, port 0).

It checks what the real API checks and answers 401/400 like it: the headers, and the request
shape (user first, roles alternating, non-empty text, every tool_result answering a tool_use of
the assistant turn just before, tool blocks only with tools, max_tokens present). Each refusal is
also kept in `problems`, so a test can assert there were none. A test scripts the answers with
the step types of tests/fake_openai.py (plus StreamError), or gives a `responder(body) -> Step`;
the default echoes the last user text.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fake_openai import Cut, Error, Garbage, Text, ToolCalls
from tests.loopback import serve

__all__ = [
    "Cut",
    "Error",
    "FakeAnthropic",
    "Garbage",
    "Step",
    "StreamError",
    "Text",
    "ToolCalls",
    "last_user_text",
]

VERSION = "2023-06-01"
TOP_LEVEL = {
    "model",
    "max_tokens",
    "messages",
    "system",
    "temperature",
    "tools",
    "tool_choice",
    "stream",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
}
_USER = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass
class StreamError:
    """Stream some text (maybe none), then an `error` event, as the API does when overloaded."""

    error_type: str = "overloaded_error"
    text: str = ""


Step = Text | ToolCalls | Error | Cut | Garbage | StreamError
Responder = Callable[[dict[str, Any]], Step]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the newest user turn that has text, without the <user_message> wrapping."""
    for m in reversed(body.get("messages", [])):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [b["text"] for b in blocks if b.get("type") == "text"]
        if texts:
            joined = "\n".join(texts)
            found = _USER.findall(joined)
            return "\n".join(found) if found else joined
    return ""


def _echo(body: dict[str, Any]) -> Step:
    return Text(f"echo: {last_user_text(body)}")


@dataclass
class FakeAnthropic:
    api_key: str = "test-key"
    responder: Responder | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"input_tokens": 100, "output_tokens": 10}
    )
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # per request, keys lowercased
    problems: list[str] = field(default_factory=list)
    url: str = ""
    _script: deque[Step] = field(default_factory=deque)
    _runner: web.AppRunner | None = None

    def script(self, *steps: Step) -> None:
        """Serve these steps in order before falling back to the responder."""
        self._script.extend(steps)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        self._runner, self.url = await serve(app, access_log=None, shutdown_timeout=0.2)
        return self.url

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.headers.append(headers)
        if headers.get("x-api-key") != self.api_key:
            self.problems.append("x-api-key missing or wrong")
            return _error(401, "invalid x-api-key")
        try:
            body = await request.json()
        except ValueError:
            self.problems.append("body is not JSON")
            return _error(400, "body is not JSON")
        self.requests.append(body)
        problems = _check_headers(headers) + _check_body(body)
        if problems:
            self.problems.extend(problems)
            return _error(400, "; ".join(problems))
        step = self._script.popleft() if self._script else (self.responder or _echo)(body)
        try:
            return await self._serve(request, body, step)
        except ConnectionResetError:
            return web.Response(status=499)

    async def _serve(
        self, request: web.Request, body: dict[str, Any], step: Step
    ) -> web.StreamResponse:
        if isinstance(step, Error):
            headers = {"retry-after": str(step.retry_after)} if step.retry_after else {}
            headers["request-id"] = f"req_{len(self.requests)}"
            return _error(step.status, step.message, headers)
        if isinstance(step, Garbage):
            ctype = "text/event-stream" if body.get("stream") else "application/json"
            text = "event: message_start\ndata: {not json\n\n" if body.get("stream") else "{not"
            return web.Response(text=text, content_type=ctype)
        if isinstance(step, Text | ToolCalls) and step.delay_s:
            await asyncio.sleep(step.delay_s)
        if not body.get("stream"):
            return web.json_response(self._message(body, step))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(kind: str, data: dict[str, Any]) -> None:
            await resp.write(
                f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            )

        start = dict(self._message(body, Text("")), content=[], stop_reason=None)
        start["usage"] = {**self.usage, "output_tokens": 1}
        await send("message_start", {"message": start})
        await send("ping", {})
        index = 0
        text = step.text if isinstance(step, Text | ToolCalls | Cut | StreamError) else ""
        if text:
            await send("content_block_start", {"index": 0, "content_block": _text_block("")})
            for piece in re.findall(r"\S+\s*|\s+", text):
                await send("content_block_delta", {"index": 0, "delta": _text_delta(piece)})
                if isinstance(step, Text) and step.chunk_delay_s:
                    await asyncio.sleep(step.chunk_delay_s)
            if isinstance(step, Cut):
                assert request.transport is not None
                request.transport.close()
                return resp
            await send("content_block_stop", {"index": 0})
            index = 1
        if isinstance(step, Cut):  # cut before any text
            assert request.transport is not None
            request.transport.close()
            return resp
        if isinstance(step, StreamError):
            error = {"type": step.error_type, "message": "Overloaded"}
            await send("error", {"error": error})
            await resp.write_eof()
            return resp
        if isinstance(step, ToolCalls):
            for i, (name, args) in enumerate(step.calls, start=index):
                call_id = f"toolu_{len(self.requests)}_{i}"
                block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                await send("content_block_start", {"index": i, "content_block": block})
                for j in range(0, len(args), 7):  # the input arrives in pieces
                    piece = {"type": "input_json_delta", "partial_json": args[j : j + 7]}
                    await send("content_block_delta", {"index": i, "delta": piece})
                await send("content_block_stop", {"index": i})
        stop = self._message(body, step)["stop_reason"]
        end = {"stop_reason": stop, "stop_sequence": None}
        usage = {"output_tokens": self.usage.get("output_tokens", 0)}
        await send("message_delta", {"delta": end, "usage": usage})
        await send("message_stop", {})
        await resp.write_eof()
        return resp

    def _message(self, body: dict[str, Any], step: Step) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        stop = "end_turn"
        if isinstance(step, Text):
            content = [_text_block(step.text)] if step.text else []
            stop = STOP_REASONS.get(step.finish_reason, step.finish_reason)
        elif isinstance(step, ToolCalls):
            content = [_text_block(step.text)] if step.text else []
            content += [
                {
                    "type": "tool_use",
                    "id": f"toolu_{len(self.requests)}_{i}",
                    "name": n,
                    "input": json.loads(a),
                }
                for i, (n, a) in enumerate(step.calls)
            ]
            stop = "tool_use"
        return {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": dict(self.usage),
        }


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _text_delta(text: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": text}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = _ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _check_headers(headers: dict[str, str]) -> list[str]:
    problems = []
    if headers.get("anthropic-version") != VERSION:
        problems.append(f"anthropic-version must be {VERSION}")
    if not headers.get("content-type", "").startswith("application/json"):
        problems.append("content-type must be application/json")
    return problems


def _check_body(body: dict[str, Any]) -> list[str]:
    p = [f"{key}: Extra inputs are not permitted" for key in set(body) - TOP_LEVEL]
    if not isinstance(body.get("model"), str) or not body["model"]:
        p.append("model: Field required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        p.append("max_tokens: Field required")
    temperature = body.get("temperature", 0)
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 1:
        p.append("temperature: must be between 0 and 1")
    if "system" in body and not isinstance(body["system"], str):
        p.append("system: must be a string")
    tools = body.get("tools")
    if tools is not None:
        for t in tools:
            if set(t) - {"name", "description", "input_schema"} or not t.get("name"):
                p.append(f"tools: bad tool {t}")
            elif _dict(t.get("input_schema")).get("type") != "object":
                p.append(f"tools.{t['name']}.input_schema: type must be object")
    if "tool_choice" in body:
        if not tools:
            p.append("tool_choice: may only be specified while providing tools")
        if _dict(body["tool_choice"]).get("type") not in ("auto", "any", "tool", "none"):
            p.append("tool_choice: bad type")
    p.extend(_check_messages(body.get("messages"), bool(tools)))
    return p


def _check_messages(messages: Any, has_tools: bool) -> list[str]:
    if not isinstance(messages, list) or not messages:
        return ["messages: at least one message is required"]
    p: list[str] = []
    if messages[0].get("role") != "user":
        p.append("messages: first message must use the user role")
    open_ids: set[str] = set()
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            p.append(f"messages.{i}.role: must be user or assistant")
        if i and role == messages[i - 1].get("role"):
            p.append(f"messages.{i}: roles must alternate")
        blocks = [_text_block(content)] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            p.append(f"messages.{i}.content: must not be empty")
            continue
        kinds = [b.get("type") for b in blocks]
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if open_ids and answered != open_ids:
            p.append(f"messages.{i}: tool_use ids {sorted(open_ids)} lack tool_result blocks")
        if answered - open_ids:
            p.append(f"messages.{i}: tool_result for unknown tool_use ids {answered - open_ids}")
        if "tool_result" in kinds and kinds != sorted(kinds, key=lambda k: k != "tool_result"):
            p.append(f"messages.{i}: tool_result blocks must come first")
        if ("tool_use" in kinds or "tool_result" in kinds) and not has_tools:
            p.append("messages: tool_use or tool_result blocks need tools to be defined")
        open_ids = set()
        for j, b in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            if b.get("type") == "text" and not str(b.get("text", "")).strip():
                p.append(f"{where}: text content blocks must contain non-whitespace text")
            elif b.get("type") == "tool_use":
                if role != "assistant" or not isinstance(b.get("input"), dict):
                    p.append(f"{where}: bad tool_use block")
                if not re.fullmatch(r"[a-zA-Z0-9_-]+", str(b.get("id"))):
                    p.append(f"{where}.id: does not match the id pattern")
                open_ids.add(str(b.get("id")))
            elif b.get("type") == "tool_result" and role != "user":
                p.append(f"{where}: tool_result blocks belong in user messages")
            elif b.get("type") not in ("text", "tool_use", "tool_result"):
                p.append(f"{where}: unknown block type")
    if open_ids:
        p.append("messages: the last assistant turn's tool_use blocks have no tool_result")
    return p


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
