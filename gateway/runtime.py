"""The composition root: builds store, model, tools, agent and session manager from Settings."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from channels.base import ChannelAdapter
from core.agent.builtin import SearchKnowledge, SendButtons
from core.agent.loop import AgentLoop, Limits
from core.agent.model import ModelClient
from core.agent.offline import OfflineModel
from core.agent.openai import OpenAIClient, RetryPolicy
from core.agent.session_tools import (
    CurrentTime,
    HandoffToHuman,
    ReadResult,
    SetContext,
    SetState,
    UpdatePlan,
)
from core.agent.tools import ToolRegistry
from core.knowledge import KnowledgeBase
from core.sessions import AgentProfile, SessionManager, SessionPolicy
from core.store import SqliteStore, Store
from gateway.settings import Settings

__all__ = ["Runtime", "build_model", "build_store"]

log = logging.getLogger(__name__)
DEFAULT_AGENT = "default"


def build_store(settings: Settings) -> Store:
    url = settings.store.url
    if url.startswith(("postgresql:", "postgres:")):
        from core.store.postgres import PostgresStore  # optional extra: asyncpg

        return PostgresStore(url, max_size=settings.store.pool_size)
    return SqliteStore(settings.sqlite_path())


def build_model(settings: Settings) -> ModelClient:
    m = settings.model
    if m.provider == "offline":
        return OfflineModel(delay_s=0.02)
    return OpenAIClient(
        base_url=m.base_url or "https://api.openai.com/v1",
        model=m.name or "",
        api_key=m.api_key.get_secret_value() if m.api_key else None,
        timeout_s=m.timeout_s,
        stream=m.stream,
        retry=RetryPolicy(attempts=m.max_retries),
    )


@dataclass
class Runtime:
    """Everything with a lifecycle, started in order and closed in reverse."""

    settings: Settings
    store: Store
    model: ModelClient
    manager: SessionManager
    knowledge: KnowledgeBase

    @classmethod
    def build(
        cls,
        settings: Settings,
        channels: Mapping[str, ChannelAdapter],
        *,
        store: Store | None = None,
        model: ModelClient | None = None,
    ) -> Runtime:
        a = settings.agent
        knowledge = KnowledgeBase.from_dir(a.knowledge_dir)
        model = model or build_model(settings)
        tools = ToolRegistry(
            [
                SearchKnowledge(knowledge),
                SendButtons(),
                UpdatePlan(),
                SetState(),
                SetContext(),
                CurrentTime(a.timezone),
                ReadResult(),
                HandoffToHuman(),
            ]
        )
        lim = a.limits
        loop = AgentLoop(
            model,
            tools,
            Limits(
                max_steps=lim.max_steps,
                max_tool_calls=lim.max_tool_calls,
                max_output_tokens=lim.max_output_tokens,
                token_budget=lim.token_budget,
                run_timeout_s=lim.run_timeout_s,
                temperature=lim.temperature,
            ),
        )
        profile = AgentProfile(
            name=DEFAULT_AGENT,
            instructions=a.instructions,
            loop=loop,
            policy=SessionPolicy(
                queue_mode=a.queue_mode,
                debounce_s=a.debounce_ms / 1000,
                max_pending=a.max_pending,
                history_turns=a.history_turns,
                lease_ttl_s=settings.store.lease_ttl_s,
            ),
            output_rules={name: ch.output_rules for name, ch in channels.items()},
            greeting=a.greeting,
            workspace_dir=Path(a.workspace_dir),
        )
        store = store or build_store(settings)
        manager = SessionManager(
            store,
            {DEFAULT_AGENT: profile},
            channels,
            max_concurrent_runs=a.max_concurrent_runs,
            owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        )
        return cls(settings, store, model, manager, knowledge)

    async def start(self) -> None:
        await self.store.start()
        await self.manager.start(sweep_interval_s=self.settings.store.poll_interval_s)
        log.info(
            "runtime started: store=%s model=%s knowledge=%d sections",
            self.settings.store.url,
            self.settings.model.provider,
            len(self.knowledge.sections),
        )

    async def aclose(self, grace_s: float = 5.0) -> None:
        await self.manager.aclose(grace_s)
        await self.model.aclose()
        await self.store.aclose()
