"""The tools an agent can be granted, built from configuration."""

from __future__ import annotations

from pathlib import Path

from core.agent.builtin import SendButtons
from core.agent.http_tools import HttpTool
from core.agent.knowledge_tools import ReadKnowledge, SearchKnowledge
from core.agent.model import ChatMessage, estimate_messages
from core.agent.prompt import system_prompt
from core.agent.session_tools import (
    CurrentTime,
    HandoffToHuman,
    ReadResult,
    SetContext,
    SetState,
    UpdatePlan,
)
from core.agent.skill_tools import LoadSkill, RunSkillScript
from core.agent.tools import Tool, ToolRegistry
from core.knowledge import KnowledgeBase
from core.skills import Skill, discover_skills, skills_prompt
from gateway.agents_config import AgentSettings, HttpToolSettings

__all__ = ["BUILTIN_TOOLS", "agent_instructions", "agent_tools", "standing_tokens"]

BUILTIN_TOOLS = (
    "search_knowledge",
    "read_knowledge",
    "send_buttons",
    "update_plan",
    "set_state",
    "set_context",
    "current_time",
    "read_result",
    "handoff_to_human",
    "load_skill",
    "run_skill_script",
)


def agent_tools(
    agent: AgentSettings,
    knowledge: KnowledgeBase,
    http: dict[str, HttpToolSettings],
    skills: list[Skill],
) -> ToolRegistry:
    """The tools this agent is granted (`tools`), or every configured tool when unset."""
    every: list[Tool] = [
        SearchKnowledge(knowledge),
        ReadKnowledge(knowledge),
        SendButtons(),
        UpdatePlan(),
        SetState(),
        SetContext(),
        CurrentTime(agent.timezone),
        ReadResult(),
        HandoffToHuman(),
    ]
    if skills:
        every.append(LoadSkill(skills))
        every.append(
            RunSkillScript(
                skills,
                Path(agent.workspace_dir),
                timeout_s=agent.skill_timeout_s,
                memory_mb=agent.skill_memory_mb,
                max_output_bytes=agent.skill_max_output_bytes,
            )
        )
    every.extend(HttpTool(section.spec(name)) for name, section in http.items())
    return ToolRegistry(every).select(agent.tools)


def agent_instructions(agent: AgentSettings, skills: list[Skill]) -> str:
    """The agent's instructions, followed by what its skills are for (when it may run them)."""
    granted = agent.tools is None or "run_skill_script" in agent.tools
    parts = [agent.instructions, skills_prompt(skills) if granted else ""]
    return "\n\n".join(p for p in parts if p)


# what a channel's output rules add to the system prompt (the longest is about 70 tokens)
OUTPUT_RULES_TOKENS = 100


def standing_tokens(agent: AgentSettings, http: dict[str, HttpToolSettings]) -> int:
    """The tokens every model call of this agent spends before the conversation: the system
    prompt (instructions, skills, safety and output rules) and the tool definitions, estimated
    as the agent loop estimates them against `token_budget`."""
    skills = discover_skills(agent.skills_dir)
    tools = agent_tools(agent, KnowledgeBase([]), http, skills)  # descriptions need no index
    prompt = ChatMessage("system", system_prompt(agent_instructions(agent, skills), "", {}))
    return estimate_messages([prompt]) + OUTPUT_RULES_TOKENS + tools.specs_tokens()
