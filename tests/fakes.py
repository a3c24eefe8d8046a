"""In-process fakes of our Protocols. They fail loudly on anything they do not support."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.agent.model import ChatMessage, DeltaSink, ModelRequest, ModelResponse, ToolCall, ToolSpec
from core.errors import ChannelError, StoreError
from core.models import InboundMessage, OutboundPart, SessionKey

__all__ = ["RecordingOutlet", "ScriptedModel", "calls", "failing_puts", "text"]


@dataclass
class ScriptedModel:
    """Replays hand-written responses; a callable step is given the request."""

    steps: deque[ModelResponse | Callable[[ModelRequest], ModelResponse]] = field(
        default_factory=deque
    )
    requests: list[ModelRequest] = field(default_factory=list)
    delay_s: float = 0.0

    def add(self, *steps: ModelResponse | Callable[[ModelRequest], ModelResponse]) -> None:
        self.steps.extend(steps)

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not self.steps:
            raise AssertionError(f"ScriptedModel has no step left for call {len(self.requests)}")
        step = self.steps.popleft()
        response = step(request) if callable(step) else step
        if response.text and on_delta is not None:
            await on_delta(response.text)
        return response

    async def aclose(self) -> None:
        return None


def text(t: str, **kw: Any) -> ModelResponse:
    return ModelResponse(
        text=t,
        input_tokens=kw.pop("input_tokens", 50),
        output_tokens=kw.pop("output_tokens", 10),
        finish_reason="stop",
        **kw,
    )


def calls(*pairs: tuple[str, str], **kw: Any) -> ModelResponse:
    return ModelResponse(
        text=kw.pop("text", ""),
        tool_calls=tuple(ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(pairs)),
        input_tokens=kw.pop("input_tokens", 50),
        output_tokens=kw.pop("output_tokens", 10),
        finish_reason="tool_calls",
    )


@dataclass
class RecordingOutlet:
    """An Outlet (and LiveOutlet) that records what it was asked to deliver."""

    sent: list[tuple[SessionKey, OutboundPart]] = field(default_factory=list)
    events: list[tuple[str, SessionKey, str]] = field(default_factory=list)
    newest: list[str] = field(default_factory=list)  # per run started: its newest message
    fail_with: deque[ChannelError] = field(default_factory=deque)
    name: str = "test"
    output_rules: str = ""

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        if self.fail_with:
            raise self.fail_with.popleft()
        self.sent.append((key, part))
        return f"p{part.id}"

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        self.events.append(("started", key, run_id))
        self.newest.append(newest.platform_id)

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        self.events.append(("delta", key, text))

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        self.events.append(("discarded" if discarded else "ended", key, run_id))

    def texts(self, key: SessionKey | None = None) -> list[str]:
        return [p.reply.text for k, p in self.sent if key is None or k == key]


class Deltas:
    """An on_delta sink that records what it was given, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, text: str) -> None:
        self.seen.append(text)


ADD_SPEC = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"first": {"type": "integer"}, "second": {"type": "integer"}},
        "required": ["first", "second"],
    },
)


def simple_request(
    text: str = "hello",
    *,
    tools: tuple[ToolSpec, ...] = (),
    tool_choice: Any = "auto",
    max_tokens: int = 350,
    temperature: float = 0.2,
) -> ModelRequest:
    """A system line and one user message: what the HTTP model client tests send."""
    return ModelRequest(
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", text)),
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=max_tokens,
        temperature=temperature,
    )


def failing_puts(monkeypatch: Any, store: Any, times: int, reason: str = "disk is full") -> None:
    """The store's next `times` put_inbound calls raise StoreError (a full disk, an outage);
    the ones after go through."""
    original = store.put_inbound
    left = [times]

    async def put_inbound(*args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise StoreError(reason)
        return await original(*args, **kwargs)

    monkeypatch.setattr(store, "put_inbound", put_inbound)


def count_calls(monkeypatch: Any, target: object, method: str, calls: Counter[str]) -> None:
    """`target.method` (a coroutine function) counts its calls in `calls[method]`."""
    original = getattr(target, method)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[method] += 1
        return await original(*args, **kwargs)

    monkeypatch.setattr(target, method, counted)


def fail_first(
    monkeypatch: Any, target: object, method: str, times: int, error: Exception
) -> list[int]:
    """`target.method` raises `error` on its next `times` calls, then works; the returned
    one-item list is how many failures are left (set it to arm more)."""
    original, left = getattr(target, method), [times]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise error
        return await original(*args, **kwargs)

    monkeypatch.setattr(target, method, flaky)
    return left
