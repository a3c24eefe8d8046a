"""Anthropic Messages API over aiohttp: tools, streaming and not, retries like the OpenAI client.

No SDK: the wire format is small, and sharing HttpModelClient (session, SSE reader, RetryPolicy)
with the OpenAI-compatible client keeps both providers' retry and error rules identical.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from core.agent.model import (
    ChatMessage,
    DeltaSink,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
)
from core.agent.retry import RetryPolicy
from core.errors import ModelError
from providers.http import HttpModelClient

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_BASE_URL", "AnthropicClient", "to_anthropic_messages"]

log = logging.getLogger(__name__)

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_BASE_URL = "https://api.anthropic.com"  # the root, before /v1/messages

# stop_reason -> the OpenAI-style finish_reason the loop reads
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# error types of a streamed `error` event that a new attempt may fix
_RETRYABLE_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
OMITTED = "[earlier conversation omitted]"
NO_RESULT = '{"error": "no_result", "detail": "This tool call got no result."}'


class AnthropicClient(HttpModelClient):
    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 60.0,
        stream: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        headers = {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if api_key:
            headers["x-api-key"] = api_key
        super().__init__(
            base_url=base_url.rstrip("/").removesuffix("/v1"),  # tolerate an OpenAI-style /v1
            path="v1/messages",
            headers=headers,
            model=model,
            timeout_s=timeout_s,
            stream=stream,
            retry=retry,
        )

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic_messages(request.messages)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": request.max_tokens,
            "messages": messages,
            "temperature": min(max(request.temperature, 0.0), 1.0),  # the API's range is 0..1
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tool_choice"] = {"type": request.tool_choice}
        if self._stream:
            body["stream"] = True
        return body

    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    def _check_status(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        _raise_for_status(status, headers, body)

    def _read_once(self, body: bytes) -> ModelResponse:
        try:
            data = json.loads(body)
            content = data["content"]
            if not isinstance(content, list):
                raise TypeError("content is not a list")
            text = "".join(b["text"] for b in content if b.get("type") == "text")
            calls = tuple(
                ToolCall(b["id"], b["name"], json.dumps(b.get("input") or {}, ensure_ascii=False))
                for b in content
                if b.get("type") == "tool_use"
            )
            usage = data.get("usage") or {}
            return ModelResponse(
                text=text,
                tool_calls=calls,
                input_tokens=_input_tokens(usage),
                output_tokens=usage.get("output_tokens"),
                finish_reason=_finish(data.get("stop_reason")),
                model=self._model,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError("model returned a malformed response", retryable=True) from exc

    async def _complete_stream(self, payload: bytes, sink: DeltaSink) -> ModelResponse:
        text: list[str] = []
        tools = _ToolUseBlocks()
        usage: dict[str, Any] = {}
        stop_reason: str | None = None
        stopped = False
        async with self._events(payload) as events:
            async for sse in events:
                event = _event(sse.data)
                kind = event.get("type") or sse.event
                if kind == "message_start":
                    usage.update(_dict(_dict(event.get("message")).get("usage")))
                elif kind == "content_block_start":
                    block = _dict(event.get("content_block"))
                    if block.get("type") == "tool_use":
                        tools.start(event.get("index"), block)
                    elif block.get("type") == "text" and block.get("text"):
                        text.append(str(block["text"]))
                        await sink(str(block["text"]))
                elif kind == "content_block_delta":
                    delta = _dict(event.get("delta"))
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        text.append(str(delta["text"]))
                        await sink(str(delta["text"]))
                    elif delta.get("type") == "input_json_delta":
                        tools.feed(event.get("index"), str(delta.get("partial_json") or ""))
                elif kind == "message_delta":
                    stop_reason = _dict(event.get("delta")).get("stop_reason") or stop_reason
                    usage.update(_dict(event.get("usage")))
                elif kind == "message_stop":
                    stopped = True
                    break
                elif kind == "error":
                    err = _dict(event.get("error"))
                    raise ModelError(
                        f"model stream error: {err.get('type')}: {str(err.get('message'))[:200]}",
                        retryable=err.get("type") in _RETRYABLE_TYPES,
                    )
                # ping, content_block_stop and event types added later need nothing
        if not stopped and stop_reason is None:
            raise ModelError("model stream ended early", retryable=True)
        return ModelResponse(
            text="".join(text),
            tool_calls=tools.result(),
            input_tokens=_input_tokens(usage),
            output_tokens=usage.get("output_tokens"),
            finish_reason=_finish(stop_reason),
            model=self._model,
        )


class _ToolUseBlocks:
    """Streamed tool_use blocks: id, name and (empty) input at content_block_start, then the
    input as JSON pieces that replace it."""

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[ToolCall, list[str]]] = {}

    def start(self, index: Any, block: dict[str, Any]) -> None:
        if not isinstance(index, int):
            raise ModelError("model stream sent a tool_use block without an index", retryable=True)
        start_input = json.dumps(block.get("input") or {}, ensure_ascii=False)
        name = str(block.get("name") or "")
        self._blocks[index] = (ToolCall(str(block.get("id") or ""), name, start_input), [])

    def feed(self, index: Any, piece: str) -> None:
        if index not in self._blocks:
            raise ModelError("model stream sent input for an unknown block", retryable=True)
        self._blocks[index][1].append(piece)

    def result(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(call.id or f"toolu_{i}", call.name, "".join(pieces) or call.arguments)
            for i, (call, pieces) in sorted(self._blocks.items())
        )


def to_anthropic_messages(
    messages: tuple[ChatMessage, ...] | list[ChatMessage],
) -> tuple[str, list[dict[str, Any]]]:
    """The top-level system text and the alternating user/assistant turns the API requires:
    system messages lifted out, tool results as user `tool_result` blocks answering the
    previous assistant's `tool_use` blocks, same-role neighbours merged, a user turn first."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    open_ids: list[str] = []  # tool_use ids of the last assistant turn still awaiting a result

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    def close_open() -> None:
        add("user", [_tool_result(i, NO_RESULT, error=True) for i in open_ids])
        open_ids.clear()

    for m in messages:
        if m.role == "system":
            if m.content and m.content.strip():
                system.append(m.content)
        elif m.role == "tool":
            call_id = _safe_id(m.tool_call_id or "")
            if call_id in open_ids:
                open_ids.remove(call_id)
                add("user", [_tool_result(call_id, m.content or "")])
            else:  # its tool_use fell out of the history window: keep the content as text
                add("user", _text(f"[result of {m.name or 'a tool'}]\n{m.content or ''}"))
        else:
            close_open()
            blocks = _text(m.content)
            if m.role == "assistant":
                for call in m.tool_calls:
                    blocks.append(_tool_use(call))
                    open_ids.append(_safe_id(call.id))
            add(m.role, blocks)
    close_open()
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": _text(OMITTED)})
    for turn in out:  # tool_result blocks must open their user turn
        turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    return "\n\n".join(system), out


def _text(content: str | None) -> list[dict[str, Any]]:
    """A text block, or none: the API refuses empty and whitespace-only text blocks."""
    return [{"type": "text", "text": content}] if content and content.strip() else []


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        args = {}  # the loop already answered the bad JSON with an invalid_arguments result
    return {
        "type": "tool_use",
        "id": _safe_id(call.id),
        "name": call.name,
        "input": args if isinstance(args, dict) else {},
    }


def _tool_result(call_id: str, content: str, *, error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": content}
    if error:
        block["is_error"] = True
    return block


def _safe_id(call_id: str) -> str:
    """Tool ids from another provider (a fallback mid-run) may use characters the API refuses."""
    return _ID_CHARS.sub("_", call_id) or "toolu_0"


def _event(data: str) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ModelError("model stream sent invalid JSON", retryable=True) from exc
    if not isinstance(event, dict):
        raise ModelError("model stream sent an unexpected event", retryable=True)
    return event


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _finish(stop_reason: Any) -> str | None:
    if not isinstance(stop_reason, str):
        return None
    return _FINISH.get(stop_reason, stop_reason)


def _input_tokens(usage: dict[str, Any]) -> int | None:
    """All input the call was billed for: cache reads and writes are reported apart."""
    if not isinstance(usage.get("input_tokens"), int):
        return None
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(n for k in keys if isinstance(n := usage.get(k), int))


def _raise_for_status(status: int, headers: Mapping[str, str], body: bytes) -> None:
    if status < 400:
        return
    retry_after: float | None = None
    try:
        if "retry-after-ms" in headers:
            retry_after = float(headers["retry-after-ms"]) / 1000
        elif "retry-after" in headers:
            retry_after = float(headers["retry-after"])
    except ValueError:
        retry_after = None
    text = body.decode("utf-8", "replace")
    try:
        err = _dict(_dict(json.loads(body)).get("error"))
        detail = f"{err.get('type')}: {err.get('message')}" if err else text
    except ValueError:
        detail = text
    detail = detail[:200].replace("\n", " ")
    if request_id := headers.get("request-id"):
        detail += f" (request-id {request_id})"
    retryable = status in (408, 409, 429) or status >= 500
    should_retry = headers.get("x-should-retry", "").lower()
    if should_retry in ("true", "false"):  # the API's own word wins over the status
        retryable = should_retry == "true"
    raise ModelError(
        f"model endpoint answered HTTP {status}: {detail}",
        retryable=retryable,
        retry_after=retry_after,
        status=status,
    )
