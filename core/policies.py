"""What a session manager is configured with: agents, queue modes, quotas, live outlets."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from core.agent.loop import AgentLoop, Limits
from core.models import InboundMessage, SessionKey
from core.store.base import Quota

__all__ = [
    "HELP_REPLY",
    "OVERFLOW_NOTICE",
    "RESET_REPLY",
    "AgentProfile",
    "KvWatchingStore",
    "LiveOutlet",
    "NotifyingStore",
    "QueueMode",
    "QuotaPolicy",
    "SessionPolicy",
]

OVERFLOW_NOTICE = (
    "I'm still working through your earlier messages, so I couldn't queue that last one. "
    "Please send it again after my reply."
)
RESET_REPLY = "Okay, let's start over. What can I help you with?"
HELP_REPLY = (
    "Just write your question. Commands: /reset starts a fresh conversation, /help shows this."
)


class QueueMode(StrEnum):
    COLLECT = "collect"  # what arrived mid-run becomes the next turn, answered together
    FOLLOWUP = "followup"  # each queued message gets its own turn, in order
    STEER = "steer"  # injected into the running turn before its next model call
    INTERRUPT = "interrupt"  # the running turn is cancelled; its reply is never sent


@runtime_checkable
class LiveOutlet(Protocol):
    """Optional: live feedback while a run is in progress (typing, streamed text)."""

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        """A run starts; `newest` is the newest message it answers (mark it read, quote it)."""

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None: ...

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None: ...


@runtime_checkable
class NotifyingStore(Protocol):
    """Optional: a store shared by replicas tells each one about messages the others stored."""

    async def listen(self, on_session: Callable[[str], None]) -> None: ...


@runtime_checkable
class KvWatchingStore(Protocol):
    """A store that says when an entry of a key-value namespace changes, so a process may
    remember entries (SQLite: its only writer hears itself; PostgreSQL: every replica hears by
    NOTIFY). `on_change(key)` follows every change made with `kv_set(..., announce=True)` or
    `kv_delete(..., announce=True)`, this process's own too: the writers of a watched namespace
    announce, and other writes pay nothing for it. `on_change(None)` means news may have been
    missed: forget them all. Remember nothing while `kv_watched()` is False."""

    async def watch_kv(self, namespace: str, on_change: Callable[[str | None], None]) -> None: ...

    def kv_watched(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    queue_mode: QueueMode = QueueMode.COLLECT
    debounce_s: float = 0.0
    max_pending: int = 100
    history_turns: int = 10
    lease_ttl_s: float = 15.0


@dataclass(frozen=True, slots=True)
class ChannelPolicy:
    """What a channel overrides of the agent's policy for its sessions (None: the agent's)."""

    queue_mode: QueueMode | None = None
    debounce_s: float | None = None

    def applied(self, policy: SessionPolicy) -> SessionPolicy:
        changes = {
            name: value
            for name in ("queue_mode", "debounce_s")
            if (value := getattr(self, name)) is not None
        }
        return dataclasses.replace(policy, **changes) if changes else policy


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    """Credits a run costs, and how many a person and a channel may spend per (UTC) day.
    A limit of 0 means unlimited. `credits_per_run = None` charges the run's worst case:
    its token budget in thousands of tokens."""

    credits_per_run: float | None = 1.0
    user_daily: float = 0.0
    channel_daily: float = 0.0
    message: str = (
        "You've reached today's limit for questions here. Please try again tomorrow, or "
        "contact us directly."
    )

    def credits(self, limits: Limits) -> float:
        if self.credits_per_run is None:
            return limits.token_budget / 1000
        return self.credits_per_run

    def quotas(self, key: SessionKey, sender: str) -> list[Quota]:
        out = []
        if self.user_daily > 0:
            out.append(Quota("user", f"{key.channel}:{key.account}:{sender}", self.user_daily))
        if self.channel_daily > 0:
            out.append(Quota("channel", f"{key.channel}:{key.account}", self.channel_daily))
        return out


@dataclass(slots=True)
class AgentProfile:
    name: str
    instructions: str
    loop: AgentLoop
    policy: SessionPolicy = field(default_factory=SessionPolicy)
    output_rules: Mapping[str, str] = field(default_factory=dict)  # per channel
    greeting: str = "Hello! How can I help you today?"
    workspace_dir: Path | None = None  # one folder per session under it (kept tool results)
