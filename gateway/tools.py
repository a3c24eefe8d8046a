"""The tools an agent can be granted, built from configuration."""

from __future__ import annotations

from core.agent.builtin import SearchKnowledge, SendButtons
from core.agent.http_tools import HttpTool
from core.agent.session_tools import (
    CurrentTime,
    HandoffToHuman,
    ReadResult,
    SetContext,
    SetState,
    UpdatePlan,
)
from core.agent.tools import Tool, ToolRegistry
from core.knowledge import KnowledgeBase
from gateway.agents_config import AgentSettings, HttpToolSettings

__all__ = ["BUILTIN_TOOLS", "agent_tools"]

BUILTIN_TOOLS = (
    "search_knowledge",
    "send_buttons",
    "update_plan",
    "set_state",
    "set_context",
    "current_time",
    "read_result",
    "handoff_to_human",
)


def agent_tools(
    agent: AgentSettings, knowledge: KnowledgeBase, http: dict[str, HttpToolSettings]
) -> ToolRegistry:
    """The tools this agent is granted (`tools`), or every configured tool when unset."""
    every: list[Tool] = [
        SearchKnowledge(knowledge),
        SendButtons(),
        UpdatePlan(),
        SetState(),
        SetContext(),
        CurrentTime(agent.timezone),
        ReadResult(),
        HandoffToHuman(),
    ]
    every.extend(HttpTool(section.spec(name)) for name, section in http.items())
    return ToolRegistry(every).select(agent.tools)
