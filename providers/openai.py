"""OpenAI-compatible Chat Completions over aiohttp (OpenAI, vLLM, Ollama, llama.cpp, ...)."""

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

__all__ = ["OpenAIClient", "RetryPolicy"]

log = logging.getLogger(__name__)


class OpenAIClient(HttpModelClient):
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        stream: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            path="chat/completions",
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            model=model,
            timeout_s=timeout_s,
            stream=stream,
            retry=retry,
        )

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [_message_json(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if request.tools:
            body["tool_choice"] = request.tool_choice
        if self._stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }

    def _check_status(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        _raise_for_status(status, headers, body.decode("utf-8", "replace"))

    def _read_once(self, body: bytes) -> ModelResponse:
        try:
            data = json.loads(body)
            choice = data["choices"][0]
            msg = choice.get("message") or {}
            calls = tuple(
                ToolCall(
                    id=str(c.get("id") or f"call_{i}"),
                    name=str(c["function"]["name"]),
                    arguments=_arguments(c["function"].get("arguments")),
                )
                for i, c in enumerate(msg.get("tool_calls") or [])
            )
            usage = _usage(data.get("usage"))
            return ModelResponse(
                text=_text(msg.get("content")),
                tool_calls=calls,
                input_tokens=_count(usage, "prompt_tokens"),
                output_tokens=_count(usage, "completion_tokens"),
                finish_reason=_finish(choice.get("finish_reason")),
                model=self._model,
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError("model returned a malformed response", retryable=True) from exc

    async def _complete_stream(self, payload: bytes, sink: DeltaSink) -> ModelResponse:
        text: list[str] = []
        assembler = _ToolCallAssembler()
        usage: dict[str, Any] = {}
        finish: str | None = None
        async with self._events(payload) as events:
            async for sse in events:
                if sse.data.strip() == "[DONE]":
                    break
                try:
                    chunk = json.loads(sse.data)
                except ValueError as exc:
                    raise ModelError("model stream sent invalid JSON", retryable=True) from exc
                if not isinstance(chunk, dict):
                    raise ModelError("model stream sent an unexpected chunk", retryable=True)
                if "error" in chunk:
                    raise ModelError(
                        f"model stream error: {str(chunk['error'])[:200]}",
                        retryable=_passing(chunk["error"]),
                    )
                usage = _usage(chunk.get("usage")) or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if piece := _text(delta.get("content")):
                        text.append(piece)
                        await sink(piece)
                    assembler.feed(delta.get("tool_calls") or [])
                    finish = _finish(choice.get("finish_reason")) or finish
        if finish is None and not usage:
            raise ModelError("model stream ended early", retryable=True)
        return ModelResponse(
            text="".join(text),
            tool_calls=assembler.result(),
            input_tokens=_count(usage, "prompt_tokens"),
            output_tokens=_count(usage, "completion_tokens"),
            finish_reason=finish,
            model=self._model,
        )


# an error event's code or type that says the trouble passes (OpenAI's server_error, vLLM's
# and OpenRouter's overloaded or rate-limited upstreams): worth one more try
_PASSING = re.compile(r"overload|server_error|rate_limit|unavailable|timeout|capacity", re.I)


def _passing(error: object) -> bool:
    if not isinstance(error, dict):
        return False
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int) and _passing_status(code):  # OpenRouter: HTTP statuses as codes
        return True
    return any(isinstance(v, str) and _PASSING.search(v) for v in (code, kind))


def _passing_status(status: int) -> bool:
    """An HTTP status worth asking again after."""
    return status in (408, 409, 425, 429) or status >= 500


class _ToolCallAssembler:
    """Assembles streamed tool calls: id and name come first, then argument pieces.

    Providers differ: most give each call its own index; some send every call at index 0 and
    tell them apart only by a new id; some send no index at all."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, str]] = {}
        self._slots: dict[int, int] = {}  # the provider's index -> our call slot

    def feed(self, deltas: list[Any]) -> None:
        for d in deltas:
            if not isinstance(d, dict):
                continue
            raw_index, raw_id, fn = d.get("index"), d.get("id"), d.get("function")
            index = raw_index if isinstance(raw_index, int) else -1
            new_id = raw_id if isinstance(raw_id, str) else ""
            fn = fn if isinstance(fn, dict) else {}
            slot = self._slots.get(index)
            if slot is None and index == -1 and self.calls:
                slot = max(self.calls)
            current = self.calls.get(slot) if slot is not None else None
            if current is None or (new_id and current["id"] and new_id != current["id"]):
                slot = max(self.calls, default=-1) + 1
                current = self.calls[slot] = {"id": "", "name": "", "arguments": ""}
            assert slot is not None
            self._slots[index] = slot
            current["id"] = current["id"] or new_id
            current["name"] = _name(current["name"], str(fn.get("name") or ""))
            current["arguments"] += _arguments(fn.get("arguments"))

    def result(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
            for i, c in sorted(self.calls.items())
            if c["name"]
        )


def _name(known: str, piece: str) -> str:
    """A tool's name from its deltas: OpenAI sends it whole, once; some compatible servers
    send it whole with every delta, others in pieces ("cu", "rrent_time")."""
    if piece.startswith(known):
        return piece
    return known + piece


def _text(content: Any) -> str:
    """A message's or a delta's content: a string, or (some servers) a list of text parts;
    anything else is a malformed answer (TypeError, made a ModelError by the caller)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    raise TypeError(f"content is a {type(content).__name__}")


def _arguments(value: Any) -> str:
    """A tool call's arguments: a JSON string as the API sends them (some servers send the
    object itself)."""
    if value is None or isinstance(value, str):
        return value or ""
    return json.dumps(value, ensure_ascii=False)


def _usage(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(usage: dict[str, Any], key: str) -> int | None:
    n = usage.get(key)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _finish(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _raise_for_status(status: int, headers: Mapping[str, str], text: str) -> None:
    if status < 400:
        return
    retry_after: float | None = None
    try:
        retry_after = float(headers.get("retry-after", ""))
    except ValueError:
        retry_after = None
    detail = text[:200].replace("\n", " ")
    raise ModelError(
        f"model endpoint answered HTTP {status}: {detail}",
        retryable=_passing_status(status),
        retry_after=retry_after,
        status=status,
    )


def _message_json(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out
