"""The ModelClient Protocol and the chat types every provider maps to and from."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "ChatMessage",
    "DeltaSink",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "ToolCall",
    "ToolSpec",
    "estimate_messages",
    "estimate_tokens",
    "estimate_tools",
]

DeltaSink = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # tool name, for role="tool"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Literal["auto", "none"] = "auto"
    max_tokens: int = 350
    temperature: float = 0.2
    # time.monotonic() by which the run needs its answer: a retry that would wait past it gives
    # up at once instead, so a fallback model, or the apology, still comes in time
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class ModelResponse:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int | None = None  # None when the provider reported no usage
    output_tokens: int | None = None
    finish_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    model: str | None = None  # the configured model that answered (a fallback's, say)


class ModelClient(Protocol):
    """One chat completion with tools. Text is pushed to `on_delta` as it streams (clients
    that cannot stream push it once). Retries are the client's job; raise ModelError when
    they are spent, or as soon as any text has been pushed (a retry would repeat it)."""

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse: ...

    async def aclose(self) -> None: ...


def estimate_tokens(text: str) -> int:
    """A provider-neutral estimate (about four characters a token) for budgeting."""
    return (len(text) + 3) // 4


def estimate_tools(tools: tuple[ToolSpec, ...]) -> int:
    """What the tool definitions add to every call's input (a model is shown them each time)."""
    return sum(
        estimate_tokens(t.name)
        + estimate_tokens(t.description)
        + 8
        + estimate_tokens(json.dumps(t.parameters, separators=(",", ":")))
        for t in tools
    )


def estimate_messages(messages: tuple[ChatMessage, ...] | list[ChatMessage]) -> int:
    total = 0
    for m in messages:
        total += 4 + estimate_tokens(m.content or "")
        for call in m.tool_calls:
            total += estimate_tokens(call.name) + estimate_tokens(call.arguments) + 4
    return total
