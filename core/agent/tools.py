"""Tools: a Protocol, a registry, and validated calls whose failures are results, not crashes."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from core.agent.model import ToolSpec, estimate_tools
from core.errors import ToolError
from core.models import Button

__all__ = [
    "CONSENT",
    "PENDING",
    "Echoes",
    "NeedsConfirmation",
    "ResultTiers",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "describe",
]

log = logging.getLogger(__name__)
READ_RESULT = "read_result"  # core.agent.session_tools.ReadResult, which pages kept results


@dataclass(slots=True)
class ToolContext:
    """What a tool may know about the run calling it."""

    session: str
    run_id: str
    state: dict[str, Any] = field(default_factory=dict)  # plan / context / state slots
    buttons: list[Button] = field(default_factory=list)  # quick replies for the final answer
    workspace: Path | None = None  # the session's own folder (kept tool results, skill files)
    results: int = 0  # tool results kept in the workspace during this run
    handoff: str | None = None  # set when the agent hands the conversation to a person
    senders: tuple[str, ...] = ()  # who wrote what this run answers: who may confirm its actions


class Tool(Protocol):
    """An async tool. The model sees only name, description and the argument JSON schema
    (from `args_model`). Class attributes or instance attributes both satisfy it."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def args_model(self) -> type[BaseModel]: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def timeout_s(self) -> float: ...

    async def __call__(self, args: Any, ctx: ToolContext) -> Any:
        """Return a JSON-serializable result or raise ToolError."""


@runtime_checkable
class NeedsConfirmation(Protocol):
    """Optional: a tool that changes things may require the person's confirmation button."""

    @property
    def confirm(self) -> bool: ...


@runtime_checkable
class Echoes(Protocol):
    """Optional: a tool whose results hold no facts from outside the run (they repeat what the
    model wrote, or tell the time), so they ground no amount in the answer."""

    @property
    def echoes(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str  # JSON text given back to the model
    ok: bool
    error: str | None = None  # short code: unknown_tool, invalid_arguments, timeout, failed, ...


@dataclass(frozen=True, slots=True)
class ResultTiers:
    """How big tool results reach the model: inline up to `inline_chars`; larger ones as a
    compact data card while the whole result is kept in the session's workspace for
    `read_result`; beyond `keep_chars` only a preview of that size is kept."""

    inline_chars: int = 4000
    keep_chars: int = 1_000_000


class ToolRegistry:
    def __init__(
        self, tools: list[Tool] | None = None, *, tiers: ResultTiers | None = None
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._tiers = tiers or ResultTiers()
        self._specs: tuple[ToolSpec, ...] | None = None
        self._specs_tokens: int | None = None
        for tool in tools or []:
            self.add(tool)

    def select(self, names: list[str] | None) -> ToolRegistry:
        """A registry with only these tools (None: all), for an agent's own tool grant, and
        `read_result` with any grant: a big result's card points to it, and it reads only
        what the agent's own tools returned."""
        chosen = ToolRegistry(tiers=self._tiers)
        for name, tool in self._tools.items():
            if names is None or name in names or name == READ_RESULT:
                chosen.add(tool)
        return chosen

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"duplicate tool name {tool.name!r}")
        self._tools[tool.name] = tool
        self._specs, self._specs_tokens = None, None

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def grounds(self, name: str) -> bool:
        """Whether this tool's results are facts an answer may quote (see Echoes)."""
        tool = self._tools.get(name)
        return tool is not None and not (isinstance(tool, Echoes) and tool.echoes)

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model is shown; built once (JSON schemas are costly to derive per call)."""
        if self._specs is None:
            self._specs = tuple(
                ToolSpec(t.name, t.description, _schema(t.args_model)) for t in self._tools.values()
            )
        return self._specs

    def specs_tokens(self) -> int:
        """What the specs add to every call's input (estimate_tools), also worked out once:
        dumping every schema to JSON at each turn took 6 % of the gateway's CPU."""
        if self._specs_tokens is None:
            self._specs_tokens = estimate_tools(self.specs())
        return self._specs_tokens

    async def call(
        self, name: str, raw_args: str, ctx: ToolContext, *, confirmed: bool = False
    ) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return _error("unknown_tool", f"There is no tool named {name!r}. Tools: {available}.")
        try:
            data = json.loads(raw_args, parse_constant=_not_json) if raw_args.strip() else {}
        except json.JSONDecodeError as exc:
            return _error("invalid_arguments", f"Arguments are not valid JSON ({exc.msg}).")
        except ValueError as exc:  # NaN or Infinity, which Python reads and JSON has not
            return _error("invalid_arguments", f"Arguments are not valid JSON ({exc}).")
        except RecursionError:
            return _error("invalid_arguments", "Arguments are nested too deeply.")
        try:
            args = tool.args_model.model_validate(data)
        except ValidationError as exc:
            return _error("invalid_arguments", _validation_detail(exc))
        if isinstance(tool, NeedsConfirmation) and tool.confirm and not confirmed:
            return _ask_confirmation(tool, args, ctx)
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
        text = _json(result)
        if len(text) > self._tiers.inline_chars:
            text = self._card(name, result, text, ctx)
        return ToolResult(text, ok=True)

    def _card(self, name: str, result: Any, text: str, ctx: ToolContext) -> str:
        """A compact description of a big result; the result itself is kept for read_result."""
        truncated = len(text) > self._tiers.keep_chars
        kept: Any = text[: self._tiers.keep_chars] if truncated else result
        card: dict[str, Any] = {"size_chars": len(text), **describe(kept)}
        if ctx.workspace is not None:
            ctx.results += 1
            result_id = f"{ctx.run_id[:8]}-{ctx.results}"
            folder = ctx.workspace / "results"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{result_id}.json").write_text(json.dumps(kept, default=str), "utf-8")
            except OSError as exc:  # a workspace_dir we cannot write: the run goes on (it
                # used to end in "something went wrong"), with the sample alone
                log.warning(
                    "a big %s result not kept: %s", name, exc, extra={"session": ctx.session}
                )
                card["not_kept"] = "Only this sample of the result is available."
            else:
                card["result_id"] = result_id
                card["read_with"] = f"{READ_RESULT}(result_id, offset, limit)"
        if truncated:
            card["truncated_to_chars"] = self._tiers.keep_chars
        return json.dumps(card, ensure_ascii=False, default=str)


# the values of the Confirm and Cancel buttons an action needing consent gets: its token is
# never shown to the model (it could offer a button of that value to someone else)
CONSENT = re.compile(r"^(confirm|cancel):([0-9a-f]{8})$")
PENDING = "pending_actions"  # session state slot: actions waiting for the person's confirmation
CONFIRM_TTL_S = 3600.0


def _ask_confirmation(tool: Tool, args: BaseModel, ctx: ToolContext) -> ToolResult:
    """Keep the call for later and put Confirm / Cancel buttons on the answer."""
    token = secrets.token_hex(4)
    pending = ctx.state.setdefault(PENDING, {})
    now = time.time()
    for old in [t for t, a in pending.items() if now - a.get("at", 0) > CONFIRM_TTL_S]:
        del pending[old]
    pending[token] = {
        "tool": tool.name,
        "args": args.model_dump(mode="json"),
        "at": now,
        "by": list(ctx.senders),  # in a group, only they may press Confirm
    }
    ctx.buttons[:] = [
        Button(label="Confirm", value=f"confirm:{token}"),
        Button(label="Cancel", value=f"cancel:{token}"),
    ]
    detail = (
        f"{tool.name} changes something, so it runs only after the person confirms. Say "
        "exactly what will happen and ask them to press Confirm or Cancel."
    )
    return ToolResult(json.dumps({"status": "awaiting_confirmation", "detail": detail}), ok=True)


def refused_press(tool: str) -> ToolResult:
    """A Confirm or Cancel pressed by someone other than whoever asked for the action."""
    detail = (
        f"Someone other than the person who asked pressed a button for {tool}: nothing was "
        "done, and it still waits for that person's Confirm or Cancel."
    )
    return ToolResult(json.dumps({"error": "not_yours", "detail": detail}), ok=False)


def describe(value: Any) -> dict[str, Any]:
    """Type, shape and a small sample of a JSON-like value."""
    if isinstance(value, list):
        card: dict[str, Any] = {"type": "list", "items": len(value), "sample": value[:2]}
        if value and all(isinstance(v, dict) for v in value[:50]):
            card["columns"] = sorted({k for v in value[:50] for k in v})[:30]
        return _trim_sample(card)
    if isinstance(value, dict):
        sample = {k: value[k] for k in list(value)[:5]}
        return _trim_sample({"type": "object", "keys": list(value)[:30], "sample": sample})
    text = str(value)
    return {"type": "text", "chars": len(text), "sample": text[:500]}


def _trim_sample(card: dict[str, Any]) -> dict[str, Any]:
    sample = json.dumps(card["sample"], ensure_ascii=False, default=str)
    if len(sample) > 800:
        card["sample"] = sample[:800] + " …"
    return card


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _json(result: Any) -> str:
    """A result as the model is shown it: JSON, so a NaN or an infinity (an endpoint's, a
    script's) becomes null."""
    try:
        return json.dumps(result, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(result), ensure_ascii=False, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _error(code: str, detail: str) -> ToolResult:
    return ToolResult(json.dumps({"error": code, "detail": detail}), ok=False, error=code)


def _validation_detail(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts) + ". Fix them and call the tool again."
