"""Tools: a Protocol, a registry, and validated calls whose failures are results, not crashes."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ValidationError

from core.agent.model import ToolSpec
from core.errors import ToolError
from core.models import Button

__all__ = ["Tool", "ToolContext", "ToolRegistry", "ToolResult"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ToolContext:
    """What a tool may know about the run calling it."""

    session: str
    run_id: str
    state: dict[str, Any] = field(default_factory=dict)
    buttons: list[Button] = field(default_factory=list)  # quick replies for the final answer


class Tool(Protocol):
    """An async tool. The model sees only name, description and the argument JSON schema."""

    name: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[BaseModel]]
    read_only: ClassVar[bool]
    timeout_s: ClassVar[float]

    async def __call__(self, args: Any, ctx: ToolContext) -> Any:
        """Return a JSON-serializable result or raise ToolError."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str  # JSON text given back to the model
    ok: bool
    error: str | None = None  # short code: unknown_tool, invalid_arguments, timeout, failed, ...


class ToolRegistry:
    def __init__(self, tools: list[Tool] | None = None, *, max_result_chars: int = 6000) -> None:
        self._tools: dict[str, Tool] = {}
        self._max_result_chars = max_result_chars
        for tool in tools or []:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"duplicate tool name {tool.name!r}")
        self._tools[tool.name] = tool

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(
            ToolSpec(t.name, t.description, _schema(t.args_model)) for t in self._tools.values()
        )

    async def call(self, name: str, raw_args: str, ctx: ToolContext) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return _error("unknown_tool", f"There is no tool named {name!r}. Tools: {available}.")
        try:
            data = json.loads(raw_args) if raw_args.strip() else {}
        except json.JSONDecodeError as exc:
            return _error("invalid_arguments", f"Arguments are not valid JSON ({exc.msg}).")
        try:
            args = tool.args_model.model_validate(data)
        except ValidationError as exc:
            return _error("invalid_arguments", _validation_detail(exc))
        try:
            async with asyncio.timeout(tool.timeout_s):
                result = await tool(args, ctx)
        except TimeoutError:
            return _error("timeout", f"{name} took longer than {tool.timeout_s:g} s.")
        except ToolError as exc:
            return _error("failed", str(exc)[:300])
        except Exception:
            log.exception("tool %s failed", name, extra={"session": ctx.session})
            return _error("failed", f"{name} failed unexpectedly.")
        text = json.dumps(result, ensure_ascii=False, default=str)
        if len(text) > self._max_result_chars:
            cut = text[: self._max_result_chars]
            text = json.dumps({"truncated": True, "size": len(text), "preview": cut})
        return ToolResult(text, ok=True)


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


def _error(code: str, detail: str) -> ToolResult:
    return ToolResult(json.dumps({"error": code, "detail": detail}), ok=False, error=code)


def _validation_detail(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts) + ". Fix them and call the tool again."
