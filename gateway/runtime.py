"""The composition root: builds store, model, tools, agent and session manager from Settings."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from channels.base import ChannelAdapter
from channels.telegram.adapter import IDENTITY_NS
from channels.telegram.outbound import MIGRATED_NS
from core.access import APPROVED
from core.agent.fallback import FallbackModel
from core.agent.loop import AgentLoop, Limits
from core.agent.model import ModelClient
from core.agent.offline import OfflineModel
from core.agent.scripted import ScriptedModel
from core.agent.tools import ToolRegistry
from core.knowledge import KnowledgeBase
from core.retention import Retention
from core.routing import Binding, Router
from core.sessions import AgentProfile, QuotaPolicy, SessionManager, SessionPolicy
from core.skills import Skill, discover_skills
from core.store import SqliteStore, Store
from core.store.base import local_owner
from core.telemetry import Telemetry
from gateway.agents_config import AgentSettings, ModelEndpoint, ModelSettings
from gateway.settings import PLATFORM_CHANNELS, Settings
from gateway.tools import agent_instructions, agent_tools
from providers.anthropic import DEFAULT_BASE_URL, AnthropicClient
from providers.openai import OpenAIClient, RetryPolicy

__all__ = ["Runtime", "build_model", "build_store"]

log = logging.getLogger(__name__)
# channel state retention never deletes: approved senders, the bot's learnt identity, a group's
# new chat id after it became a supergroup
KEPT_NAMESPACES = (APPROVED, IDENTITY_NS, MIGRATED_NS)


def build_store(settings: Settings) -> Store:
    url = settings.store.url
    if url.startswith(("postgresql:", "postgres:")):
        from core.store.postgres import PostgresStore  # optional extra: asyncpg

        return PostgresStore(url, max_size=settings.store.pool_size)
    return SqliteStore(settings.sqlite_path())


def build_model(m: ModelSettings) -> ModelClient:
    """The configured model, wrapped with its fallback when one is set."""
    primary = _client(m)
    if m.fallback is None:
        return primary
    return FallbackModel(primary, _client(m.fallback), cooldown_s=m.fallback.cooldown_s)


def _client(m: ModelEndpoint) -> ModelClient:
    key = m.api_key.get_secret_value() if m.api_key else None
    if m.provider == "anthropic":
        return AnthropicClient(
            model=m.name or "",
            api_key=key,
            base_url=m.base_url or DEFAULT_BASE_URL,
            timeout_s=m.timeout_s,
            stream=m.stream,
            retry=RetryPolicy(attempts=m.max_retries),
        )
    if m.provider == "scripted":
        return ScriptedModel.from_file(m.script or "", key="model.script")
    if m.provider == "offline":
        return OfflineModel(delay_s=0.02)
    return OpenAIClient(
        base_url=m.base_url or "https://api.openai.com/v1",
        model=m.name or "",
        api_key=key,
        timeout_s=m.timeout_s,
        stream=m.stream,
        retry=RetryPolicy(attempts=m.max_retries),
    )


@dataclass
class Runtime:
    """Everything with a lifecycle, started in order and closed in reverse."""

    settings: Settings
    store: Store
    models: list[ModelClient]
    manager: SessionManager
    agents: dict[str, AgentProfile]
    retention: Retention | None = None

    @classmethod
    def build(
        cls,
        settings: Settings,
        channels: Mapping[str, ChannelAdapter],
        *,
        store: Store | None = None,
        model: ModelClient | None = None,
        telemetry: Telemetry | None = None,
    ) -> Runtime:
        """`model` replaces every agent's configured model (tests, benchmarks)."""
        rules = {name: ch.output_rules for name, ch in channels.items()}
        knowledge: dict[tuple[str, str], KnowledgeBase] = {}
        models: list[ModelClient] = [model] if model else []
        profiles: dict[str, AgentProfile] = {}
        for name, agent in settings.resolved_agents().items():
            if agent.draft:
                log.info("agent %s is a draft: not served", name)
                continue
            a = agent.settings
            where = (a.knowledge_dir, _cache_path(a))
            kb = knowledge.get(where)
            if kb is None:
                kb = knowledge[where] = KnowledgeBase.load(*where)
            skills = discover_skills(a.skills_dir)
            client = model
            if client is None:
                client = build_model(agent.model)
                models.append(client)
            tools = agent_tools(a, kb, settings.tools.http, skills)
            profiles[name] = _profile(name, a, client, tools, skills, rules, settings)
        store = store or build_store(settings)
        router = Router([Binding(**b.model_dump()) for b in settings.bindings])
        manager = SessionManager(
            store,
            profiles,
            channels,
            max_concurrent_runs=settings.agent.max_concurrent_runs,
            owner=local_owner(),
            router=router,
            quota=_quota(settings),
            telemetry=telemetry,
            access={
                name: getattr(settings.channels, name).access_rule()
                for name in ("web", *PLATFORM_CHANNELS)
            },
            channel_policies={
                name: getattr(settings.channels, name).channel_policy()
                for name in ("web", *PLATFORM_CHANNELS)
            },
        )
        retention = None
        if settings.store.retention_days:
            folders = [Path(settings.channels.media_dir)]
            folders += [Path(a.settings.workspace_dir) for a in settings.resolved_agents().values()]
            retention = Retention(
                store,
                settings.store.retention_days,
                folders=folders,
                keep_namespaces=KEPT_NAMESPACES,
            )
        return cls(settings, store, models, manager, profiles, retention)

    async def start(self) -> None:
        await self.store.start()
        await self.manager.start(sweep_interval_s=self.settings.store.poll_interval_s)
        if self.retention is not None:
            self.retention.start()
        log.info(
            "runtime started: store=%s agents=%s",
            self.settings.store.url.split("@")[-1],
            ",".join(self.agents),
        )

    async def aclose(self, grace_s: float = 5.0) -> None:
        if self.retention is not None:
            await self.retention.aclose()
        await self.manager.aclose(grace_s)
        for model in self.models:
            await model.aclose()
        await self.store.aclose()


def _quota(settings: Settings) -> QuotaPolicy:
    q = settings.quotas
    return QuotaPolicy(
        credits_per_run=None if q.credits_per_run == "limits" else float(q.credits_per_run),
        user_daily=q.user_daily_credits,
        channel_daily=q.channel_daily_credits,
        message=q.message,
    )


def _cache_path(a: AgentSettings) -> str:
    """One stored index per knowledge directory, so agents with different ones never
    overwrite each other's."""
    if a.knowledge_dir == AgentSettings().knowledge_dir:
        return a.knowledge_cache
    digest = hashlib.sha1(a.knowledge_dir.encode(), usedforsecurity=False).hexdigest()[:8]
    stem, dot, ext = a.knowledge_cache.rpartition(".")
    return f"{stem}-{digest}{dot}{ext}" if dot else f"{a.knowledge_cache}-{digest}"


def _profile(
    name: str,
    a: AgentSettings,
    model: ModelClient,
    tools: ToolRegistry,
    skills: list[Skill],
    rules: dict[str, str],
    settings: Settings,
) -> AgentProfile:
    lim = a.limits
    limits = Limits(
        max_steps=lim.max_steps,
        max_tool_calls=lim.max_tool_calls,
        max_output_tokens=lim.max_output_tokens,
        token_budget=lim.token_budget,
        run_timeout_s=lim.run_timeout_s,
        temperature=lim.temperature,
    )
    return AgentProfile(
        name=name,
        instructions=agent_instructions(a, skills),
        loop=AgentLoop(model, tools, limits),
        policy=SessionPolicy(
            queue_mode=a.queue_mode,
            debounce_s=a.debounce_ms / 1000,
            max_pending=a.max_pending,
            history_turns=a.history_turns,
            lease_ttl_s=settings.store.lease_ttl_s,
        ),
        output_rules=rules,
        greeting=a.greeting,
        workspace_dir=Path(a.workspace_dir),
    )
