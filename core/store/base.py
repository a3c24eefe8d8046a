"""The Store Protocol: inbox, sessions, history, outbox and runs, all durable."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from core.models import InboundMessage, OutboundPart, Reply

__all__ = [
    "DELIVERY_RANK",
    "HistoryEntry",
    "InboxItem",
    "InboxStatus",
    "KvWatchers",
    "PutResult",
    "Quota",
    "RunRecord",
    "SessionRecord",
    "Store",
    "TranscriptEntry",
    "delivery_rank",
    "history_entries",
    "keep_handoff",
    "outbound_parts",
    "prune_statements",
    "replies_json",
    "run_json",
    "stored_handoff",
    "transcript_entries",
    "utc_day",
]


class KvWatchers:
    """Who watches which key-value namespace (see core.policies.KvWatchingStore): a store
    calls `changed` for each change it makes or hears of, and `forget_all` when it may have
    missed some."""

    def __init__(self) -> None:
        self._by_namespace: dict[str, list[Callable[[str | None], None]]] = {}

    def add(self, namespace: str, on_change: Callable[[str | None], None]) -> None:
        self._by_namespace.setdefault(namespace, []).append(on_change)

    def changed(self, namespace: str, key: str) -> None:
        for on_change in self._by_namespace.get(namespace, ()):
            on_change(key)

    def forget_all(self) -> None:
        for watchers in self._by_namespace.values():
            for on_change in watchers:
                on_change(None)


# delivery reports only move forward: sent < delivered < read; failed is final
DELIVERY_RANK = (
    "CASE coalesce(delivery, '') WHEN 'failed' THEN 4 WHEN 'read' THEN 3"
    " WHEN 'delivered' THEN 2 WHEN 'sent' THEN 1 ELSE 0 END"
)


def delivery_rank(status: str) -> int:
    """Where a delivery report stands; an update must rank above the stored one."""
    return {"sent": 1, "delivered": 2, "read": 3, "failed": 5}.get(status, 1)


def utc_day(t: float) -> str:
    """The UTC day of unix time `t`, as daily usage counters name it ("2026-12-01")."""
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def prune_statements(
    before: str, day: str, now: str, limit: str, kept: str, skip_locked: str = ""
) -> list[tuple[str, str]]:
    """Store.prune's statements, (table, SQL), in the dialect's placeholders: `before`, `day`
    (its UTC day), `now` and `limit` are values, `kept` the namespaces kept (a condition on
    `namespace`), `skip_locked` the dialect's clause that leaves the session rows another
    transaction holds (a put, a commit: whatever holds one is using it). Only what is over
    is deleted: never a pending, held or unpaired message, an undelivered reply part, a
    running run, or a session with work, a lease or a row left."""
    one = f"LIMIT {limit}"
    return [
        ("inbox", "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox WHERE received_at <"
         f" {before} AND status IN ('done', 'overflow') {one})"),
        ("messages", "DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE"
         f" created_at < {before} {one})"),
        ("outbox", "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE created_at <"
         f" {before} AND status IN ('sent', 'failed') {one})"),
        ("runs", f"DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE ended_at < {before}"
         f" {one})"),
        ("usage", "DELETE FROM usage WHERE (day, scope, key) IN (SELECT day, scope, key FROM"
         f" usage WHERE day < {day} {one})"),
        ("channel_state", "DELETE FROM channel_state WHERE (namespace, key) IN (SELECT"
         f" namespace, key FROM channel_state WHERE updated_at < {before} AND {kept} {one})"),
        ("sessions", "DELETE FROM sessions WHERE key IN (SELECT s.key FROM sessions s WHERE"
         f" (s.lease_owner IS NULL OR s.lease_until < {now})"
         " AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.session = s.key)"
         " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session = s.key)"
         " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.session = s.key"
         f" AND o.status = 'pending') {one} {skip_locked})"),
    ]  # fmt: skip


class InboxStatus(StrEnum):
    PENDING = "pending"  # stored, waiting for (or inside) a turn
    DONE = "done"  # answered by a committed turn
    OVERFLOW = "overflow"  # kept, but over the session's queue cap: the user was told
    HELD = "held"  # kept for a human operator while the bot is paused in this session
    UNPAIRED = "unpaired"  # kept until the operator approves this person (pairing)
    DUPLICATE = "duplicate"  # a redelivery of something already stored (never stored twice)
    REFUSED = "refused"  # not stored: the sender is blocked or not on the allowlist


@dataclass(frozen=True, slots=True)
class PutResult:
    id: int
    status: InboxStatus


@dataclass(frozen=True, slots=True)
class InboxItem:
    id: int
    message: InboundMessage


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    role: str  # "user" | "assistant"
    content: str
    run_id: str | None
    created_at: float
    id: int = 0
    reply_json: str | None = None  # for assistant entries: the reply with its buttons

    @property
    def reply(self) -> Reply | None:
        """The reply, parsed only when asked for (the prompt needs just the text)."""
        return Reply.model_validate_json(self.reply_json) if self.reply_json else None


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """What the person saw: each inbound message and each reply part, in time order."""

    id: str  # "in-<inbox id>" or "out-<outbox id>"
    role: str  # "user" | "assistant"
    text: str
    ts: float
    reply: Reply | None = None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    key: str
    epoch: int
    state: dict[str, Any]


Note = tuple[str, str, str]  # (namespace, key, value) of a kv entry


@dataclass(frozen=True, slots=True)
class Quota:
    scope: str  # "user" | "channel"
    key: str
    limit: float


@dataclass(slots=True)
class RunRecord:
    """A run as data: what it did, what it cost, which limits it hit, how it ended."""

    id: str
    session: str
    started_at: float
    status: str = "running"  # ok | limit | empty | timeout | model_error | cancelled | error
    # | command (the gateway answered) | quota (refused by a quota)
    ended_at: float | None = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    credits: float = 0.0
    limits_hit: list[str] = field(default_factory=list)
    error: str | None = None
    inbox_ids: list[int] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


def stored_handoff(stored: str | None) -> Any:
    """The handoff a session's stored state (JSON) holds, if any: an operator has the
    session."""
    try:
        current = json.loads(stored or "{}")
    except ValueError:
        return None
    return current.get("handoff") if isinstance(current, dict) else None


def keep_handoff(state: dict[str, Any], stored: str | None) -> str:
    """A turn's new session state, as JSON, keeping a handoff that an operator set while the
    turn ran (the turn's state is a copy from before: written as it is, it undid the pause,
    and the bot answered the customer again)."""
    handoff = stored_handoff(stored)
    if handoff and not state.get("handoff"):
        state = {**state, "handoff": handoff}
    return json.dumps(state)


def replies_json(replies: list[Reply]) -> list[tuple[Reply, str]]:
    """Each reply with its JSON, encoded once for both the history and the outbox."""
    return [(reply, reply.model_dump_json()) for reply in replies]


def run_json(run: RunRecord) -> tuple[str, str, str]:
    """The run's list and dict columns as JSON: limits hit, inbox ids, detail."""
    return (
        json.dumps(run.limits_hit),
        json.dumps(run.inbox_ids),
        json.dumps(run.detail, default=str),
    )


# Row decoding shared by the backends: both select the same columns in the same order.


def history_entries(rows: list[Any]) -> list[HistoryEntry]:
    """(id, role, content, run_id, created_at, reply) rows, newest first; oldest first out."""
    return [
        HistoryEntry(
            role=r[1],
            content=r[2],
            run_id=r[3],
            created_at=r[4],
            id=r[0],
            reply_json=r[5] or None,
        )
        for r in reversed(rows)
    ]


def transcript_entries(rows: list[Any]) -> list[TranscriptEntry]:
    """(entry id, role, payload or reply JSON, ts) rows, newest first, as entries oldest first."""
    out = []
    for entry_id, role, payload, ts in reversed(rows):
        if role == "user":
            msg = InboundMessage.model_validate_json(payload)
            out.append(TranscriptEntry(entry_id, role, msg.text, ts))
        else:
            reply = Reply.model_validate_json(payload)
            out.append(TranscriptEntry(entry_id, role, reply.text, ts, reply))
    return out


def outbound_parts(session: str, rows: list[Any]) -> list[OutboundPart]:
    """(id, run_id, seq, reply JSON, attempts, not_before) rows as outbox parts."""
    return [
        OutboundPart(
            id=r[0],
            session=session,
            run_id=r[1],
            seq=r[2],
            reply=Reply.model_validate_json(r[3]),
            attempts=r[4],
            not_before=r[5],
        )
        for r in rows
    ]


class Store(Protocol):
    """Durable state. Implementations: SQLite (embedded default); PostgreSQL (scale-out)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreError when the store cannot serve requests."""

    # inbox
    async def put_inbound(
        self, session: str, msg: InboundMessage, max_pending: int, *, unpaired: bool = False
    ) -> PutResult:
        """Store a message once (dedupe on channel + account + platform id), durably;
        `unpaired` keeps it aside until the operator approves its sender."""

    async def pending(self, session: str) -> list[InboxItem]:
        """Messages of the session not yet answered, oldest first."""

    async def run_messages(self, run_id: str) -> list[InboundMessage]:
        """The inbound messages a committed run answered, oldest first (e.g. to reply to the
        triggering message in a group)."""

    async def hold_pending(self, session: str) -> int:
        """Park the session's pending messages (the bot is paused for a human); returns how
        many. Held messages are kept and shown in transcripts, but start no run."""

    async def release_held(self, session: str) -> int:
        """Give held messages back to the bot (the operator handed the session back)."""

    async def move_work(self, old: str, new: str, before: float) -> tuple[int, int]:
        """Move a session's unanswered messages and undelivered reply parts stored before
        `before` (unix time) to another session (its agent is no longer served), in their
        order, unless a replica holds its lease; returns how many of each."""

    async def release_unpaired(self, channel: str, sender: str) -> int:
        """Queue the messages a person sent before the operator approved them."""

    async def prune(
        self, before: float, *, keep_namespaces: Sequence[str] = (), limit: int = 1000
    ) -> dict[str, int]:
        """Delete what was over before `before` (unix seconds), up to `limit` rows per table
        (see prune_statements; channel state of `keep_namespaces` is kept); returns how many
        per table. Called again while any table gave `limit`."""

    async def queue_depth(self) -> int:
        """Messages stored and waiting for (or inside) a run, across all sessions."""

    async def sessions_with_work(self) -> list[str]:
        """Sessions with pending inbox messages or undelivered outbox parts that no live runner
        holds (no lease, or an expired one): the work a replica should pick up."""

    # sessions and history
    async def get_session(self, session: str) -> SessionRecord: ...

    async def set_state(self, session: str, state: dict[str, Any]) -> None: ...

    async def reset_session(self, session: str, at: float | None = None) -> None:
        """Start a fresh conversation: history and state are no longer shown to the model.
        `at`: when the person asked (the /reset message's arrival; default now): the
        transcript shows what they sent after it, even if it was queued behind the reset."""

    async def history(self, session: str, limit: int) -> list[HistoryEntry]:
        """The newest `limit` entries of the current epoch, oldest first."""

    async def transcript(self, session: str, limit: int) -> list[TranscriptEntry]:
        """The newest `limit` inbound messages and reply parts since the last reset."""

    # turns and outbox
    async def complete_turn(
        self,
        owner: str,
        run: RunRecord,
        user_text: str,
        replies: list[Reply],
        state: dict[str, Any] | None = None,
        *,
        remember: bool = True,
        unless_paused: bool = False,
    ) -> list[OutboundPart]:
        """In one transaction: mark the run's inbox messages answered, append history (unless
        `remember` is False: a command's reply is no part of the conversation), store the
        reply parts in the outbox, record the run and (when given) the new session state.
        Raises StoreError if `owner` no longer holds the session's lease, and SessionPaused
        if `unless_paused` and an operator has the session (its stored state holds a
        handoff); either way nothing is written."""

    async def record_run(self, run: RunRecord) -> None:
        """Record a run that produced no committed reply (cancelled, failed)."""

    async def enqueue_replies(self, session: str, replies: list[Reply]) -> list[OutboundPart]:
        """Store reply parts that answer no inbox message (notices, greetings)."""

    async def outbox_pending(self, session: str) -> list[OutboundPart]: ...

    async def mark_sent(self, part_id: int, platform_id: str | None) -> None: ...

    async def mark_failed(
        self, part_id: int, error: str, *, permanent: bool, not_before: float | None = None
    ) -> None:
        """A failed send: a dead letter when `permanent`, else pending again, tried no sooner
        than `not_before` (unix time), after a restart too."""

    async def update_delivery(
        self, channel: str, platform_id: str, status: str, error: str | None = None
    ) -> bool:
        """Record a platform's delivery report (sent, delivered, read, failed) for the part it
        confirmed under `platform_id`; reports only move forward (a late "delivered" never
        replaces "read"). False when no such part is known."""

    async def delivery(self, part_id: int) -> tuple[str, str | None, str | None] | None:
        """(outbox status, platform delivery status, last error) of a reply part."""

    async def quoted(self, session: str, platform_id: str) -> tuple[str, str] | None:
        """The message a person's reply quotes, when it is one of this session's the store
        knows: ("assistant", text) for a reply part sent under `platform_id`, ("user", text)
        for a message stored; None otherwise (another conversation's message included)."""

    async def last_inbound_at(self, session: str) -> float | None:
        """When the person last wrote in this session (e.g. WhatsApp's 24-hour window)."""

    # small durable state for adapters (polling offsets, long button ids, cached identities)
    async def kv_get(self, namespace: str, key: str) -> str | None: ...

    async def kv_set(self, namespace: str, key: str, value: str, *, announce: bool = False) -> None:
        """`announce`: tell those watching `namespace` (KvWatchingStore), in every replica.
        Only announced changes are told; the writers of a watched namespace announce."""

    async def kv_delete(self, namespace: str, key: str, *, announce: bool = False) -> None: ...

    async def kv_items(self, namespace: str) -> dict[str, str]:
        """Every key of a (small) namespace, e.g. the pending pairing codes."""

    # quotas: daily usage counters
    async def reserve_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: Note | None = None
    ) -> Quota | None:
        """Add `amount` to every counter in one transaction if none would pass its limit;
        otherwise change nothing and return the first quota that would be exceeded. `note`:
        (namespace, key, value) set in the same transaction, so a reservation is never left
        without the note that says whose it is (the process may die between two writes)."""

    async def release_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: tuple[str, str] | None = None
    ) -> bool:
        """Give back a reservation (the run failed before producing anything). `note`:
        (namespace, key) taken in the same transaction; without it there, nothing is given
        back (someone took it and gave back already). True when given back."""

    async def usage(self, day: str, scope: str, key: str) -> float: ...

    # leases: one runner per session, across processes
    async def acquire_lease(self, session: str, owner: str, ttl: float) -> bool: ...

    async def renew_lease(self, session: str, owner: str, ttl: float) -> bool: ...

    async def renew_leases(self, sessions: Sequence[str], owner: str, ttl: float) -> set[str]:
        """Renew, in one statement, those of `sessions` whose lease `owner` still holds;
        returns them (the rest were released, expired and taken, or never held)."""

    async def release_lease(self, session: str, owner: str) -> None: ...


def local_owner() -> str:
    """A lease owner id for this process: `host:pid:random` (the random part tells apart two
    runs that got the same pid, e.g. a container's pid 1 after a restart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def owner_is_gone(owner: str) -> bool:
    """Whether `owner` (as `local_owner` makes them) was a process on this machine that runs
    no more: its pid is free, or it is this process's pid under another id. Anything else
    (another machine, a pid in use, another format) may be alive and keeps its lease."""
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # not this run (its id is new): an earlier one, with the same pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
