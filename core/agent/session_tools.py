"""Built-in tools over the session itself: state slots, time, kept results, human handoff."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from pydantic import BaseModel, Field

from core.agent.tools import ToolContext
from core.errors import ToolError

__all__ = [
    "CurrentTime",
    "HandoffToHuman",
    "ReadResult",
    "SetContext",
    "SetState",
    "UpdatePlan",
]

Scalar = str | int | float | bool | None


class PlanArgs(BaseModel):
    goal: str = Field(max_length=500, description="What the person wants, in one line.")
    approach: str = Field(default="", max_length=1000, description="How you will get there.")
    progress: str = Field(default="", max_length=1000, description="What is done, what is next.")


class UpdatePlan:
    """update_plan: overwrite the session's plan slot, shown to you at the start of every turn."""

    name: ClassVar[str] = "update_plan"
    description: ClassVar[str] = (
        "Record the plan for this conversation (goal, approach, progress). It is shown to you "
        "at the start of every later turn; overwrite it as things move on."
    )
    args_model: ClassVar[type[BaseModel]] = PlanArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: PlanArgs, ctx: ToolContext) -> dict[str, Any]:
        ctx.state["plan"] = args.model_dump()
        return {"ok": True}


class ContextArgs(BaseModel):
    paths: list[str] = Field(
        max_length=20, description="Knowledge sources to re-read on later turns (source paths)."
    )


class SetContext:
    """set_context: the session's reading list of knowledge paths."""

    name: ClassVar[str] = "set_context"
    description: ClassVar[str] = (
        "Set the reading list for this conversation: knowledge source paths you will want to "
        "re-read on later turns. Replaces the previous list."
    )
    args_model: ClassVar[type[BaseModel]] = ContextArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: ContextArgs, ctx: ToolContext) -> dict[str, Any]:
        ctx.state["context"] = [p[:300] for p in args.paths]
        return {"ok": True, "context": ctx.state["context"]}


class StateArgs(BaseModel):
    values: dict[str, Scalar] = Field(
        max_length=50, description="Flow variables to set (ids, choices, current step)."
    )
    replace: bool = Field(default=False, description="Drop variables not given here.")


class SetState:
    """set_state: flow variables (ids, choices, current step) kept between turns."""

    name: ClassVar[str] = "set_state"
    description: ClassVar[str] = (
        "Remember flow variables for this conversation (ids, choices, the current step). "
        "Values are merged into what is there unless replace is true; null removes a key."
    )
    args_model: ClassVar[type[BaseModel]] = StateArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: StateArgs, ctx: ToolContext) -> dict[str, Any]:
        current = {} if args.replace else dict(ctx.state.get("state") or {})
        for key, value in args.values.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key[:100]] = value
        if len(json.dumps(current)) > 8000:
            raise ToolError("state would exceed 8000 characters; keep only what the flow needs")
        ctx.state["state"] = current
        return {"ok": True, "state": current}


class TimeArgs(BaseModel):
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone, e.g. Europe/Madrid (default: ours)."
    )


class CurrentTime:
    """current_time: the date and time now, in the business's zone or one asked for."""

    name: ClassVar[str] = "current_time"
    description: ClassVar[str] = "The current date, time and weekday (timezone aware)."
    args_model: ClassVar[type[BaseModel]] = TimeArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    def __init__(self, timezone: str = "UTC") -> None:
        self._default = ZoneInfo(timezone)

    async def __call__(self, args: TimeArgs, ctx: ToolContext) -> dict[str, Any]:
        try:
            zone = ZoneInfo(args.timezone) if args.timezone else self._default
        except (KeyError, ValueError, OSError) as exc:  # OSError: a zone folder ("Europe")
            raise ToolError(f"unknown timezone {args.timezone!r}") from exc
        now = datetime.now(zone)
        return {
            "iso": now.isoformat(timespec="seconds"),
            "weekday": now.strftime("%A"),
            "timezone": str(zone),
        }


class ReadArgs(BaseModel):
    result_id: str = Field(pattern=r"^[0-9a-f]{1,8}-\d{1,4}$", description="From a data card.")
    offset: int = Field(default=0, ge=0, description="First item (or character) to return.")
    limit: int = Field(default=20, ge=1, le=200, description="Items (lists) to return.")


class ReadResult:
    """read_result: page through a big tool result kept in the session's workspace."""

    name: ClassVar[str] = "read_result"
    description: ClassVar[str] = (
        "Read part of a large tool result that was summarized as a data card: items of a "
        "list, or characters of anything else, from offset."
    )
    args_model: ClassVar[type[BaseModel]] = ReadArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0
    page_chars: ClassVar[int] = 3000

    async def __call__(self, args: ReadArgs, ctx: ToolContext) -> dict[str, Any]:
        if ctx.workspace is None:
            raise ToolError("no kept results in this conversation")
        path = ctx.workspace / "results" / f"{args.result_id}.json"
        if not path.is_file():
            raise ToolError(f"no kept result {args.result_id!r}")
        value = json.loads(path.read_text("utf-8"))
        if isinstance(value, list):
            items = value[args.offset : args.offset + args.limit]
            return {"items": items, "offset": args.offset, "total": len(value)}
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        part = text[args.offset : args.offset + self.page_chars]
        return {"text": part, "offset": args.offset, "total_chars": len(text)}


class HandoffArgs(BaseModel):
    reason: str = Field(min_length=1, max_length=500, description="Why a person should take over.")


class HandoffToHuman:
    """handoff_to_human: pause the bot in this conversation and call an operator."""

    name: ClassVar[str] = "handoff_to_human"
    description: ClassVar[str] = (
        "Hand this conversation to a human operator (the person asks for one, or you cannot "
        "help). The bot then stays silent here until an operator hands it back. Tell the "
        "person a colleague will follow up."
    )
    args_model: ClassVar[type[BaseModel]] = HandoffArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: HandoffArgs, ctx: ToolContext) -> dict[str, Any]:
        ctx.handoff = re.sub(r"\s+", " ", args.reason).strip()
        return {"ok": True, "detail": "An operator has been notified."}
