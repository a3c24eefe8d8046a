"""Session-state tools, time, kept results and human handoff, through the loop and the manager."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from core.agent.loop import AgentLoop, Limits
from core.agent.model import ModelRequest
from core.agent.session_tools import (
    CurrentTime,
    HandoffToHuman,
    ReadResult,
    SetContext,
    SetState,
    UpdatePlan,
)
from core.agent.tools import ResultTiers, ToolContext, ToolRegistry
from core.models import InboundMessage, Sender, SessionKey
from core.sessions import AgentProfile, DeliveryPolicy, SessionManager
from core.store import InboxStatus, Store
from tests.fakes import RecordingOutlet, ScriptedModel, calls, text

KEY = SessionKey("default", "test", "default", "c1")


def _msg(t: str, pid: str) -> InboundMessage:
    return InboundMessage(
        channel="test", conversation="c1", sender=Sender(id="u"), text=t, platform_id=pid
    )


@pytest_asyncio.fixture
async def rig(store: Store, tmp_path: Path) -> AsyncIterator[tuple[SessionManager, ScriptedModel]]:
    model = ScriptedModel()
    tools = ToolRegistry(
        [UpdatePlan(), SetState(), SetContext(), HandoffToHuman(), ReadResult()],
        tiers=ResultTiers(inline_chars=200),
    )
    profile = AgentProfile(
        name="default",
        instructions="agent",
        loop=AgentLoop(model, tools, Limits()),
        workspace_dir=tmp_path / "ws",
    )
    outlet = RecordingOutlet()
    manager = SessionManager(
        store, {"default": profile}, {"test": outlet}, delivery=DeliveryPolicy(base_delay_s=0.01)
    )
    manager.outlet = outlet  # type: ignore[attr-defined]
    await manager.start()
    yield manager, model
    await manager.aclose(grace_s=1)


async def _settle(manager: SessionManager) -> None:
    await asyncio.wait_for(manager.wait_idle(), 10)


async def test_state_slots_persist_and_reach_the_next_turn(
    rig: tuple[SessionManager, ScriptedModel], store: Store
) -> None:
    manager, model = rig
    model.add(
        calls(
            ("update_plan", '{"goal": "book a rental", "progress": "asked for dates"}'),
            ("set_state", '{"values": {"bike": "e-bike", "days": 2}}'),
            ("set_context", '{"paths": ["services-and-prices.md"]}'),
        ),
        text("Which dates?"),
        text("Booked."),
    )
    await manager.submit(_msg("I want an e-bike", "1"))
    await _settle(manager)
    state = (await store.get_session(str(KEY))).state
    assert state["plan"]["goal"] == "book a rental"
    assert state["state"] == {"bike": "e-bike", "days": 2}
    assert state["context"] == ["services-and-prices.md"]
    await manager.submit(_msg("from Friday", "2"))
    await _settle(manager)
    system = model.requests[-1].messages[0].content or ""
    assert "book a rental" in system
    assert "e-bike" in system


async def test_set_state_merges_removes_and_replaces() -> None:
    ctx = ToolContext(session="s", run_id="r", state={"state": {"a": 1, "b": 2}})
    tools = ToolRegistry([SetState()])
    await tools.call("set_state", '{"values": {"b": null, "c": "x"}}', ctx)
    assert ctx.state["state"] == {"a": 1, "c": "x"}
    await tools.call("set_state", '{"values": {"z": true}, "replace": true}', ctx)
    assert ctx.state["state"] == {"z": True}
    big = json.dumps({"values": {f"k{i}": "v" * 300 for i in range(40)}})
    result = await tools.call("set_state", big, ctx)
    assert result.error == "failed"
    assert ctx.state["state"] == {"z": True}


async def test_current_time_is_timezone_aware() -> None:
    tools = ToolRegistry([CurrentTime("Europe/Madrid")])
    ctx = ToolContext(session="s", run_id="r")
    here = json.loads((await tools.call("current_time", "{}", ctx)).content)
    assert here["timezone"] == "Europe/Madrid"
    assert here["iso"][-6:] in ("+01:00", "+02:00")
    tokyo = json.loads(
        (await tools.call("current_time", '{"timezone": "Asia/Tokyo"}', ctx)).content
    )
    assert tokyo["iso"].endswith("+09:00")
    bad = await tools.call("current_time", '{"timezone": "Mars/Olympus"}', ctx)
    assert bad.error == "failed"


async def test_current_time_names_a_zone_folder_as_unknown() -> None:
    """A folder of zones (zoneinfo raises IsADirectoryError): an error the model can correct."""
    tools = ToolRegistry([CurrentTime()])
    ctx = ToolContext(session="s", run_id="r")
    bad = await tools.call("current_time", '{"timezone": "Europe"}', ctx)
    assert json.loads(bad.content) == {"error": "failed", "detail": "unknown timezone 'Europe'"}


async def test_read_result_pages_through_a_kept_list(tmp_path: Path) -> None:
    class Rows:
        name = "rows"
        description = "many rows"
        args_model = __import__("pydantic").create_model("RowsArgs")
        read_only = True
        timeout_s = 1.0

        async def __call__(self, args: Any, ctx: ToolContext) -> list[dict[str, int]]:
            return [{"id": i, "price": i * 10} for i in range(100)]

    tools = ToolRegistry([Rows(), ReadResult()], tiers=ResultTiers(inline_chars=200))
    ctx = ToolContext(session="s", run_id="0123abcd", workspace=tmp_path)
    card = json.loads((await tools.call("rows", "{}", ctx)).content)
    assert card["type"] == "list"
    assert card["items"] == 100
    assert card["columns"] == ["id", "price"]
    args = json.dumps({"result_id": card["result_id"], "offset": 40, "limit": 3})
    page = json.loads((await tools.call("read_result", args, ctx)).content)
    assert page["items"] == [{"id": i, "price": i * 10} for i in (40, 41, 42)]
    assert page["total"] == 100
    escape = await tools.call("read_result", '{"result_id": "../../etc/passwd"}', ctx)
    assert escape.error == "invalid_arguments"


async def test_handoff_pauses_the_bot_and_hand_back_answers_held_messages(
    rig: tuple[SessionManager, ScriptedModel], store: Store
) -> None:
    manager, model = rig
    model.add(
        calls(("handoff_to_human", '{"reason": "asks for a refund"}')),
        text("A colleague will follow up here."),
    )
    await manager.submit(_msg("I want a refund", "1"))
    await _settle(manager)
    assert (await store.get_session(str(KEY))).state["handoff"]["reason"] == "asks for a refund"
    calls_before = len(model.requests)
    result = await manager.submit(_msg("hello? anyone?", "2"))
    await _settle(manager)
    assert result.status is InboxStatus.PENDING
    assert len(model.requests) == calls_before  # the bot stays silent while paused
    assert await store.pending(str(KEY)) == []
    assert [e.text for e in await store.transcript(str(KEY), 10) if e.role == "user"][-1] == (
        "hello? anyone?"
    )
    model.add(lambda req: _answer_with_last_user_text(req))
    assert await manager.hand_back(KEY) == 1
    await _settle(manager)
    outlet: RecordingOutlet = manager.outlet  # type: ignore[attr-defined]
    assert outlet.texts()[-1] == "got: hello? anyone?"
    assert "handoff" not in (await store.get_session(str(KEY))).state


def _answer_with_last_user_text(request: ModelRequest) -> Any:
    last = request.messages[-1].content or ""
    return text("got: " + last.split("\n")[1])
