"""Read model for the operator console: sessions, transcripts with runs, usage, dead letters.

Queries the console needs and the hot path does not, kept apart from the Store Protocol. The
SQL is written once, in the dialect both backends share, with `?` placeholders; the few
expressions that differ (now, day, key parts) come from each backend's `_Dialect`. SQLite runs
it through the store's reader and writer, PostgreSQL through its pool; `console(store)` picks.
Nothing here is on the message path.
"""

from __future__ import annotations

import json
import re
import sqlite3
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from core.errors import StoreError
from core.models import InboundMessage, Reply, SessionKey
from core.store.base import RunRecord, Store
from core.store.sqlite import SqliteStore

__all__ = [
    "FAILED_RUN_STATUSES",
    "Console",
    "DeadLetter",
    "EntryRow",
    "QuotaRow",
    "SessionRow",
    "UsageRow",
    "console",
]

# runs whose messages got an apology instead of an answer: their messages can be retried
FAILED_RUN_STATUSES = ("model_error", "timeout", "error", "empty")
_FAILED = "(" + ", ".join(f"'{s}'" for s in FAILED_RUN_STATUSES) + ")"  # for SQL: IN {_FAILED}


@dataclass(slots=True)
class SessionRow:
    key: str
    agent: str
    channel: str
    account: str
    conversation: str
    thread: str | None
    customer: str | None  # the sender's name (or id) of the newest message
    customer_id: str | None
    last_activity: float | None
    messages: int = 0
    pending: int = 0  # waiting for a turn, or inside the one running now
    held: int = 0  # kept for the operator while the bot is paused
    overflow: int = 0
    unpaired: int = 0
    unsent: int = 0  # reply parts not delivered yet
    failed: int = 0  # reply parts that failed for good
    leased: bool = False  # a runner holds the session (on some replica)
    working: bool = False  # a run is in progress (or about to start)
    last_run_status: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    reset_at: float = 0.0

    @property
    def paused(self) -> bool:
        return bool(self.state.get("handoff"))


@dataclass(slots=True)
class EntryRow:
    """One inbound message or reply part, with its delivery state and the run it belongs to."""

    id: str  # "in-<inbox id>" | "out-<outbox id>"
    role: str  # "user" | "assistant"
    text: str
    ts: float
    status: str  # inbox: pending, done, held...; outbox: pending, sent, failed
    run_id: str | None
    sender: str | None = None
    buttons: list[dict[str, str]] = field(default_factory=list)
    attachments: int = 0
    delivery: str | None = None
    error: str | None = None
    attempts: int = 0


@dataclass(slots=True)
class UsageRow:
    day: str  # YYYY-MM-DD, UTC
    agent: str
    channel: str
    messages: int = 0
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    credits: float = 0.0


@dataclass(slots=True)
class QuotaRow:
    day: str
    scope: str  # "user" | "channel"
    key: str
    used: float


@dataclass(slots=True)
class DeadLetter:
    kind: str  # "outbox": a reply part that failed for good; "inbox": a message of a failed run
    id: int
    session: str
    channel: str
    text: str
    error: str | None
    ts: float
    attempts: int = 0
    run_id: str | None = None
    run_status: str | None = None


@dataclass(frozen=True, slots=True)
class _Dialect:
    now: str  # the current time as epoch seconds
    day: str  # "{col}" (epoch seconds) as YYYY-MM-DD, UTC
    agent: str  # the agent part of the `session` column
    channel: str  # its channel part
    lower: str  # "{col}" with A-Z lowercased, and nothing else (as SQLite's lower() does)
    paused: str  # whether the JSON session state "{col}" has a handoff (an operator has it)
    said: str  # what an inbox payload "{col}" shows an operator: text, sender name and id


_SQLITE = _Dialect(
    now="((julianday('now') - 2440587.5) * 86400.0)",
    paused="json_extract({col}, '$.handoff') IS NOT NULL",
    said="coalesce(json_extract({col}, '$.text'), '') || ' '"
    " || coalesce(json_extract({col}, '$.sender.name'), '') || ' '"
    " || coalesce(json_extract({col}, '$.sender.id'), '')",
    day="date({col}, 'unixepoch')",
    agent="substr(session, 1, instr(session, ':') - 1)",
    channel=(
        "substr(substr(session, instr(session, ':') + 1), 1,"
        " instr(substr(session, instr(session, ':') + 1), ':') - 1)"
    ),
    lower="lower({col})",
)
_POSTGRES = _Dialect(
    now="extract(epoch from clock_timestamp())",  # leases run on the database clock
    paused="({col})::jsonb -> 'handoff' IS NOT NULL AND ({col})::jsonb -> 'handoff' <> 'null'",
    said="concat_ws(' ', ({col})::jsonb ->> 'text', ({col})::jsonb #>> '{{sender,name}}',"
    " ({col})::jsonb #>> '{{sender,id}}')",
    day="to_char(to_timestamp({col}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    agent="split_part(session, ':', 1)",
    channel="split_part(session, ':', 2)",
    lower="translate({col}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')",
)


def _count(status: str) -> str:
    return f"sum(CASE WHEN status = '{status}' THEN 1 ELSE 0 END)"


CANDIDATES_MAX = 5_000  # sessions asked for (limit + offset) that are read from the newest rows
_SESSIONS = f"""
WITH i AS (
  SELECT session, max(received_at) AS last_in, count(*) AS messages,
    {_count("pending")} AS pending, {_count("held")} AS held, {_count("overflow")} AS overflow,
    {_count("unpaired")} AS unpaired, max(id) AS last_id
  FROM inbox {{where}} GROUP BY session),
o AS (
  SELECT session, max(created_at) AS last_out, {_count("pending")} AS unsent,
    {_count("failed")} AS failed
  FROM outbox {{where}} GROUP BY session),
k AS (SELECT session FROM i UNION SELECT session FROM o
  UNION SELECT key AS session FROM sessions {{where_key}})
SELECT k.session, s.state, s.reset_at, s.lease_owner, i.last_in, o.last_out, i.messages,
  i.pending, i.held, i.overflow, i.unpaired, o.unsent, o.failed, i.last_id,
  CASE WHEN s.lease_owner IS NOT NULL AND s.lease_until > {{now}} THEN 1 ELSE 0 END
FROM k LEFT JOIN i ON i.session = k.session LEFT JOIN o ON o.session = k.session
LEFT JOIN sessions s ON s.key = k.session {{matching}}
ORDER BY CASE WHEN coalesce(i.held, 0) > 0 OR {{paused}} THEN 0 ELSE 1 END,
  CASE WHEN coalesce(i.last_in, 0) > coalesce(o.last_out, 0) THEN i.last_in
  ELSE coalesce(o.last_out, 0) END DESC, k.session LIMIT ? OFFSET ?
"""
# the key (agent, channel, account, conversation, thread) or any message the customer sent,
# which holds their name and id as the platform gave them; case-insensitive for ASCII
_MATCHING = """WHERE {key} LIKE ? ESCAPE '\\'
  OR k.session IN (SELECT session FROM inbox WHERE {payload} LIKE ? ESCAPE '\\')"""
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

_ENTRIES = """
SELECT entry, role, body, ts, status, run_id, delivery, error, attempts FROM (
 SELECT 'in-' || id AS entry, 'user' AS role, payload AS body, received_at AS ts, 0 AS o,
  id AS n, status, run_id, NULL AS delivery, NULL AS error, 0 AS attempts
 FROM inbox WHERE session = ?
 UNION ALL
 SELECT 'out-' || id, 'assistant', reply, created_at, 1, id, status, run_id, delivery, error,
  attempts
 FROM outbox WHERE session = ?
) AS t ORDER BY ts DESC, o DESC, n DESC LIMIT ?
"""

_RUN_COLUMNS = (
    "id, session, status, started_at, ended_at, steps, tool_calls, input_tokens,"
    " output_tokens, credits, limits_hit, error, inbox_ids, detail"
)


class Console(ABC):
    """What the console reads (and the two repairs it makes) over one store."""

    dialect: _Dialect

    @abstractmethod
    async def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only query written with `?` placeholders."""

    @abstractmethod
    async def _update(self, sql: str, args: tuple[Any, ...]) -> str | None:
        """Run an UPDATE ... RETURNING session; the session, or None when nothing changed."""

    @abstractmethod
    async def watermark(self) -> tuple[Any, ...]:
        """A cheap value that changes when messages arrive, runs commit or parts are sent."""

    async def sessions(self, limit: int, *, offset: int = 0, query: str = "") -> list[SessionRow]:
        """The sessions waiting for an operator (paused, or holding messages), then the most
        recently active, newest first: among 10,000 later ones, a paused session fell off the
        list, and its customer's held messages waited with nobody seeing them. `query`: only
        sessions whose key, or a message of which, contains it (a name, a phone number, a
        chat id, words the customer wrote)."""
        if not query:
            candidates = await self._candidates(limit + offset)
            if candidates is None:  # a page that deep: every session is read
                return await self._sessions("", (limit, offset))
            if not candidates:
                return []
            return await self._sessions(
                "", (*candidates, *candidates, *candidates, limit, offset), among=len(candidates)
            )
        # in the text, the sender's name and id (not the stored JSON's field names and
        # ids); lowercased as the databases lowercase (ASCII only); a phone number as its
        # digits ("+1 555-000 0003" finds 15550000003)
        if re.fullmatch(r"[+\d\s().-]+", query) and sum(c.isdigit() for c in query) >= 5:
            query = re.sub(r"\D", "", query)
        pattern = "%" + re.sub(r"([\\%_])", r"\\\1", query.translate(_ASCII_LOWER)) + "%"
        return await self._sessions("", (pattern, pattern, limit, offset), matching=True)

    async def session(self, key: str) -> SessionRow | None:
        rows = await self._sessions(key, (key, key, key, 1, 0))
        return rows[0] if rows else None

    async def _candidates(self, want: int) -> tuple[str, ...] | None:
        """The sessions the first `want` of the list are among, read from the newest rows
        only (the list read every row ever stored, once a second while a console was open):
        those waiting for an operator (held messages, paused), and the sessions of the
        newest inbox and outbox rows, read further back until `want` of them were active at
        or after the oldest row read (a session not seen was last active before it), or no
        row is left. None past CANDIDATES_MAX: the caller reads everything."""
        if want > CANDIDATES_MAX:
            return None
        waiting = await self._fetch(
            "SELECT session FROM inbox WHERE status IN ('held', 'unpaired')"
            f" UNION SELECT key FROM sessions s WHERE {self.dialect.paused.format(col='s.state')}"
        )
        newest = want * 4
        while True:
            last: dict[str, float] = {}
            since = float("-inf")  # every session not seen was last active before this
            for table, at in (("inbox", "received_at"), ("outbox", "created_at")):
                rows = await self._fetch(
                    f"SELECT session, count(*), max(t), min(t) FROM (SELECT session, {at} AS t"
                    f" FROM {table} ORDER BY id DESC LIMIT ?) AS w GROUP BY session",
                    (newest,),
                )
                for session, _, latest, _ in rows:
                    last[session] = max(last.get(session, float("-inf")), latest)
                if sum(r[1] for r in rows) == newest:  # rows are left further back
                    since = max(since, min(r[3] for r in rows))
            settled = sum(1 for t in last.values() if t >= since)
            if settled >= want or since == float("-inf") or newest > CANDIDATES_MAX * 64:
                break
            newest *= 4
        candidates = {r[0] for r in waiting} | set(last)
        # three lists of them are parameters: SQLite takes 32,766
        return tuple(sorted(candidates)) if len(candidates) <= 10_000 else None

    async def _sessions(
        self, key: str, args: tuple[Any, ...], *, matching: bool = False, among: int = 0
    ) -> list[SessionRow]:
        marks = ", ".join("?" * among)
        sql = _SESSIONS.format(
            where="WHERE session = ?" if key else f"WHERE session IN ({marks})" if among else "",
            where_key="WHERE key = ?" if key else f"WHERE key IN ({marks})" if among else "",
            now=self.dialect.now,
            paused=self.dialect.paused.format(col="s.state"),
            matching=_MATCHING.format(
                key=self.dialect.lower.format(col="k.session"),
                payload=self.dialect.lower.format(col=self.dialect.said.format(col="payload")),
            )
            if matching
            else "",
        )
        rows = await self._fetch(sql, args)
        out = [_session_row(r) for r in rows]
        if not out:
            return out
        last_ids = tuple(r[13] for r in rows if r[13] is not None)
        if last_ids:
            found = await self._fetch(
                f"SELECT session, payload FROM inbox WHERE id IN ({_marks(last_ids)})", last_ids
            )
            _add_customers(out, {s: p for s, p in found})
        keys = tuple(r.key for r in out)
        runs = await self._fetch(
            f"SELECT r.session, r.status FROM runs r WHERE r.session IN ({_marks(keys)})"
            " AND r.status != 'command' AND r.started_at = (SELECT max(x.started_at) FROM runs x"
            "  WHERE x.session = r.session AND x.status != 'command')",
            keys,
        )
        last = {s: st for s, st in runs}
        for row in out:
            row.last_run_status = last.get(row.key)
        return out

    async def entries(self, key: str, limit: int) -> list[EntryRow]:
        """The newest `limit` messages and reply parts of a session (all epochs), in the
        order they happened: messages as received, replies as stored (= delivery order)."""
        rows = await self._fetch(_ENTRIES, (key, key, limit))
        return [_entry(r) for r in reversed(rows)]

    async def runs(self, key: str, limit: int) -> list[RunRecord]:
        """The session's newest runs, oldest first."""
        rows = await self._fetch(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE session = ? ORDER BY started_at DESC LIMIT ?",
            (key, limit),
        )
        return [_run(r) for r in reversed(rows)]

    async def usage(self, since: float) -> list[UsageRow]:
        """Messages, runs, tokens and credits per UTC day, agent and channel. A command's reply
        and a quota's refusal are no runs: neither asked the model."""
        d = self.dialect
        messages = await self._fetch(
            f"SELECT {d.day.format(col='received_at')}, {d.agent}, channel, count(*)"
            " FROM inbox WHERE received_at >= ? GROUP BY 1, 2, 3",
            (since,),
        )
        runs = await self._fetch(
            f"SELECT {d.day.format(col='started_at')}, {d.agent}, {d.channel}, count(*),"
            " sum(input_tokens), sum(output_tokens), sum(credits) FROM runs"
            " WHERE started_at >= ? AND status NOT IN ('command', 'quota') GROUP BY 1, 2, 3",
            (since,),
        )
        return _usage(messages, runs)

    async def quotas(self, since_day: str, limit: int) -> list[QuotaRow]:
        rows = await self._fetch(
            "SELECT day, scope, key, used FROM usage WHERE day >= ?"
            " ORDER BY day DESC, scope, used DESC, key LIMIT ?",
            (since_day, limit),
        )
        return [QuotaRow(r[0], r[1], r[2], float(r[3])) for r in rows]

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        """Reply parts that failed for good, and messages whose run failed, newest first."""
        parts = await self._fetch(
            "SELECT id, session, channel, reply, error, attempts, created_at, run_id FROM outbox"
            " WHERE status = 'failed' ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        messages = await self._fetch(
            "SELECT i.id, i.session, i.channel, i.payload, i.received_at, r.id, r.status, r.error"
            " FROM inbox i JOIN runs r ON r.id = i.run_id"
            f" WHERE i.status = 'done' AND r.status IN {_FAILED} ORDER BY i.id DESC LIMIT ?",
            (limit,),
        )
        out = [_dead_outbox(r) for r in parts] + [_dead_inbox(r) for r in messages]
        out.sort(key=lambda dl: dl.ts, reverse=True)
        return out[:limit]

    async def retry_outbox(self, part_id: int) -> str | None:
        """Put a failed reply part back to pending (attempts reset), with its session's older
        failed parts, so they go out in order (retried newest first, as the console lists
        them, the person read the answers backwards); returns its session, or None when
        there is no such failed part."""
        return await self._update(
            "UPDATE outbox SET status = 'pending', attempts = 0, error = NULL, not_before = NULL"
            " WHERE status = 'failed' AND id <= ?"
            " AND session = (SELECT session FROM outbox WHERE id = ? AND status = 'failed')"
            " RETURNING session",
            (part_id, part_id),
        )

    async def retry_inbox(self, inbox_id: int) -> str | None:
        """Queue a message of a failed run again, with its session's older such messages (so
        they are answered in order); returns its session, or None."""
        failed = f"run_id IN (SELECT id FROM runs WHERE status IN {_FAILED})"
        return await self._update(
            f"UPDATE inbox SET status = 'pending' WHERE status = 'done' AND {failed}"
            " AND id <= ? AND session = (SELECT session FROM inbox"
            f" WHERE id = ? AND status = 'done' AND {failed}) RETURNING session",
            (inbox_id, inbox_id),
        )


def console(store: Store) -> Console:
    """The console queries for this store, or StoreError for a store they do not know."""
    if isinstance(store, SqliteStore):
        return _SqliteConsole(store)
    try:
        from core.store.postgres import PostgresStore
    except ImportError:  # asyncpg is optional, and then so is its store
        PostgresStore = None  # type: ignore[assignment,misc]
    if PostgresStore is not None and isinstance(store, PostgresStore):
        return _PostgresConsole(store)
    raise StoreError(f"the admin console does not support {type(store).__name__}")


class _SqliteConsole(Console):
    dialect = _SQLITE

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await self._store._read(lambda c: _all(c, sql, args))

    async def _update(self, sql: str, args: tuple[Any, ...]) -> str | None:
        def op(c: sqlite3.Connection) -> str | None:
            rows = _all(c, sql, args)
            return str(rows[0][0]) if rows else None

        session: str | None = await self._store._write(op)
        return session

    async def watermark(self) -> tuple[Any, ...]:
        def read(c: sqlite3.Connection) -> tuple[Any, ...]:
            # data_version moves whenever another connection (the writer) commits
            version = _all(c, "PRAGMA data_version")
            marks = _all(c, f"SELECT {_MARKS}, (SELECT max(rowid) FROM runs)")
            return (*version[0], *marks[0])

        return await self._store._read(read)


class _PostgresConsole(Console):
    dialect = _POSTGRES

    def __init__(self, store: Any) -> None:
        self._store = store

    async def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._store._conn() as c:
            return [tuple(r) for r in await c.fetch(_numbered(sql), *args)]

    async def _update(self, sql: str, args: tuple[Any, ...]) -> str | None:
        async with self._store._conn() as c:
            session = await c.fetchval(_numbered(sql), *args)
            if session is not None:  # wake whichever replica picks the session up
                channel = self._store.inbox_channel
                await c.execute("SELECT pg_notify($1, $2)", channel, f"- {session}")
        return None if session is None else str(session)

    async def watermark(self) -> tuple[Any, ...]:
        async with self._store._conn() as c:
            return tuple(await c.fetchrow(f"SELECT {_MARKS}"))


# ids only grow, and the pending counts read the partial indexes: cheap every second
_MARKS = (
    "(SELECT max(id) FROM inbox), (SELECT max(id) FROM outbox),"
    " (SELECT count(*) FROM inbox WHERE status = 'pending'),"
    " (SELECT count(*) FROM outbox WHERE status = 'pending')"
)


def _marks(values: tuple[Any, ...]) -> str:
    return ",".join("?" * len(values))


def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's $1, $2... (the SQL here has no other question marks)."""
    counter = iter(range(1, 10_000))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


def _all(c: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    return c.execute(sql, args).fetchall()


# ---- rows ----


def _session_row(r: Any) -> SessionRow:
    key = str(r[0])
    try:
        k = SessionKey.parse(key)
        parts = (k.agent, k.channel, k.account, k.conversation, k.thread)
    except ValueError:
        parts = ("?", "?", "?", key, None)
    last = max((float(t) for t in (r[4], r[5]) if t is not None), default=None)
    row = SessionRow(key, *parts, customer=None, customer_id=None, last_activity=last)
    row.state = _json_object(r[1])
    row.reset_at = float(r[2] or 0.0)
    row.messages, row.pending, row.held = int(r[6] or 0), int(r[7] or 0), int(r[8] or 0)
    row.overflow, row.unpaired = int(r[9] or 0), int(r[10] or 0)
    row.unsent, row.failed = int(r[11] or 0), int(r[12] or 0)
    row.leased = bool(r[14])
    row.working = row.leased and row.pending > 0
    return row


def _add_customers(rows: list[SessionRow], payloads: dict[str, str]) -> None:
    for row in rows:
        payload = payloads.get(row.key)
        if payload is None:
            continue
        sender = InboundMessage.model_validate_json(payload).sender
        row.customer, row.customer_id = sender.name or sender.id, sender.id


def _entry(r: Any) -> EntryRow:
    entry_id, role, body, ts, status, run_id, delivery, error, attempts = r
    if role == "user":
        msg = InboundMessage.model_validate_json(body)
        sender = msg.sender.name or msg.sender.id
        text = msg.text or (f"[{msg.kind}: {msg.button_value}]" if msg.button_value else "")
        files = len(msg.attachments)
        return EntryRow(entry_id, role, text, float(ts), status, run_id, sender, attachments=files)
    reply = Reply.model_validate_json(body)
    return EntryRow(
        entry_id,
        role,
        reply.text,
        float(ts),
        status,
        run_id,
        buttons=[b.model_dump() for b in reply.buttons],
        attachments=len(reply.attachments),
        delivery=delivery,
        error=error,
        attempts=int(attempts or 0),
    )


def _run(r: Any) -> RunRecord:
    return RunRecord(
        id=r[0],
        session=r[1],
        status=r[2],
        started_at=float(r[3]),
        ended_at=None if r[4] is None else float(r[4]),
        steps=int(r[5]),
        tool_calls=int(r[6]),
        input_tokens=int(r[7]),
        output_tokens=int(r[8]),
        credits=float(r[9] or 0.0),
        limits_hit=list(json.loads(r[10] or "[]")),
        error=r[11],
        inbox_ids=list(json.loads(r[12] or "[]")),
        detail=_json_object(r[13]),
    )


def _usage(messages: list[Any], runs: list[Any]) -> list[UsageRow]:
    out: dict[tuple[str, str, str], UsageRow] = {}

    def row(day: str, agent: str, channel: str) -> UsageRow:
        k = (day, unquote(agent), unquote(channel))
        if k not in out:
            out[k] = UsageRow(*k)
        return out[k]

    for day, agent, channel, count in messages:
        row(day, agent, channel).messages += int(count)
    for day, agent, channel, count, tin, tout, credits in runs:
        u = row(day, agent, channel)
        u.runs += int(count)
        u.input_tokens += int(tin or 0)
        u.output_tokens += int(tout or 0)
        u.credits += float(credits or 0.0)
    return sorted(out.values(), key=lambda u: (u.day, u.agent, u.channel))


def _dead_outbox(r: Any) -> DeadLetter:
    part_id, session, channel, body, error, attempts, ts, run_id = r
    text = Reply.model_validate_json(body).text
    return DeadLetter(
        "outbox", int(part_id), session, channel, text, error, float(ts), int(attempts or 0), run_id
    )


def _dead_inbox(r: Any) -> DeadLetter:
    inbox_id, session, channel, payload, ts, run_id, run_status, run_error = r
    text = InboundMessage.model_validate_json(payload).text
    return DeadLetter(
        "inbox", int(inbox_id), session, channel, text, run_error, float(ts), 0, run_id, run_status
    )


def _json_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
