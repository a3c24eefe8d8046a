"""PostgreSQL store (asyncpg): several gateway replicas on one database.

Leases use the database clock, so replicas with drifting clocks agree on expiry. A stored
message NOTIFYs the other replicas (LISTEN/NOTIFY needs no extra service); each notification
names the store instance that sent it, so a replica does not wake itself twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

from core.errors import SessionPaused, StoreError
from core.models import InboundMessage, OutboundPart, Reply, SessionKey
from core.store.base import (
    DELIVERY_RANK,
    HistoryEntry,
    InboxItem,
    InboxStatus,
    KvWatchers,
    Note,
    PutResult,
    Quota,
    RunRecord,
    SessionRecord,
    TranscriptEntry,
    delivery_rank,
    history_entries,
    keep_handoff,
    outbound_parts,
    prune_statements,
    replies_json,
    run_json,
    stored_handoff,
    transcript_entries,
    utc_day,
)
from core.store.grouped import GroupedPuts, Put
from core.store.postgres_schema import MIGRATIONS

__all__ = ["PostgresStore"]

_KV_PUT = (
    "INSERT INTO channel_state (namespace, key, value, updated_at) VALUES ($1, $2, $3, $4)"
    " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
    " updated_at = excluded.updated_at"
)

log = logging.getLogger(__name__)
# NOTIFY channels span the whole database: a deployment in a schema of its own (?search_path=)
# gets its own pair, named after the schema; "public" keeps the plain names
NOTIFY_CHANNEL = "switchboard_inbox"
KV_CHANNEL = "switchboard_kv"  # payload: JSON [namespace, key] of a changed entry
NOW = "extract(epoch from clock_timestamp())"
MIGRATION_LOCK = 0x5B0A_4D01  # pg_advisory_xact_lock key for schema changes
STATEMENT_TIMEOUT_S = 10.0  # a stalled server or a lock held elsewhere: StoreError, not a hang
ACQUIRE_TIMEOUT_S = 10.0  # every pooled connection busy (stuck) that long: StoreError
CLOSE_TIMEOUT_S = 5.0  # closing politely; then the connections are dropped (a stalled server)
PING_TIMEOUT_S = 2.0
MIGRATION_TIMEOUT_S = 3600.0  # an index built over a large table at an upgrade
# what the driver raises when the server, the network or a pooled connection fails:
# InternalClientError comes from a connection the server closed while the pool handed it out
# (a restart, a failover, idle_session_timeout); TimeoutError from the two timeouts above
DRIVER_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
# SQLSTATE classes of a server that cannot be reached or cannot work now (connection, out of
# resources, shutting down, system and internal errors): every other error is a refusal of
# what was sent, and the puts of a refused group are tried alone to find the one it was
UNREACHABLE = ("08", "53", "57", "58", "XX")
# inbound puts go one put or group at a time (their order kept), so one that waits on a row
# lock (a session another replica is committing) holds up the others: for at most this long,
# then a group goes put by put and a put alone fails (503: the platform delivers it again)
LOCK_TIMEOUT_MS = 1000


class PostgresStore:
    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self._dsn = dsn
        self._min, self._max = min_size, max_size
        self._pool: asyncpg.Pool | None = None
        self._id = uuid.uuid4().hex[:12]
        self._listener: asyncpg.Connection | None = None
        self._on_notify: Callable[[str], None] | None = None
        self._kv_watchers = KvWatchers()
        self._relisten: asyncio.Task[None] | None = None
        self._closed = False
        self.inbox_channel, self.kv_channel = NOTIFY_CHANNEL, KV_CHANNEL
        self._puts = GroupedPuts(self._put_many, _refused)

    # lifecycle

    async def start(self) -> None:
        self._closed = False
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min,
                max_size=self._max,
                reset=_no_session_state,
                command_timeout=STATEMENT_TIMEOUT_S,
            )
            async with self._pool.acquire() as c, c.transaction():
                schema = await c.fetchval("SELECT current_schema()")
                if schema is None:
                    raise StoreError("no schema of the URL's search_path exists; create it first")
                self.inbox_channel, self.kv_channel = _channels(schema)
                await c.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
                await c.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
                )
                current = await c.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
                for version, sql in MIGRATIONS:
                    if version > current:
                        await c.execute(sql, timeout=MIGRATION_TIMEOUT_S)
                        await c.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
        # ValueError, OverflowError: the driver could not read the URL (a bad port, sslmode…)
        except StoreError:
            await self.aclose()
            raise
        except (ValueError, OverflowError, *DRIVER_ERRORS) as exc:
            await self.aclose()
            raise StoreError(f"cannot open PostgreSQL store: {exc}") from exc

    async def aclose(self) -> None:
        self._closed = True
        await self._puts.aclose()
        if self._relisten is not None:
            self._relisten.cancel()
            await asyncio.gather(self._relisten, return_exceptions=True)
            self._relisten = None
        if self._listener is not None:
            self._listener.remove_termination_listener(self._listener_lost)
            try:
                await asyncio.wait_for(self._listener.close(), CLOSE_TIMEOUT_S)
            except Exception:  # a stalled server never says goodbye
                self._listener.terminate()
            self._listener = None
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), CLOSE_TIMEOUT_S)
            except Exception:
                self._pool.terminate()
            self._pool = None

    async def listen(self, on_session: Callable[[str], None]) -> None:
        """Call `on_session(session)` when another replica stores a message for it."""
        self._on_notify = on_session
        await self._ensure_listener()

    async def _ensure_listener(self) -> None:
        if self._listener is None and (self._relisten is None or self._relisten.done()):
            await self._connect_listener()

    async def watch_kv(self, namespace: str, on_change: Callable[[str | None], None]) -> None:
        """Call `on_change(key)` after any replica changes an entry of `namespace` (this one
        too), and `on_change(None)` when the LISTEN connection is lost or made again."""
        self._kv_watchers.add(namespace, on_change)
        await self._ensure_listener()

    def kv_watched(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()

    async def _connect_listener(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(self._dsn)
            await conn.add_listener(self.inbox_channel, self._notified)
            await conn.add_listener(self.kv_channel, self._kv_notified)
            conn.add_termination_listener(self._listener_lost)
        except BaseException as exc:
            # a close cancels a reconnection at any await: a connection made by then is
            # dropped here, not left to the garbage collector (a ResourceWarning in a test)
            if conn is not None:
                conn.terminate()
            if isinstance(exc, DRIVER_ERRORS):
                raise StoreError(f"cannot LISTEN on PostgreSQL: {exc}") from exc
            raise
        self._listener = conn
        self._kv_watchers.forget_all()  # a read made before now may predate news nobody heard

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        origin, _, session = payload.partition(" ")
        if origin != self._id and session and self._on_notify is not None:
            self._on_notify(session)

    def _kv_notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            namespace, key = json.loads(payload)
        except (ValueError, TypeError):
            return
        self._kv_watchers.changed(namespace, key)

    def _listener_lost(self, conn: Any) -> None:
        if self._listener is conn:
            self._listener = None  # watched entries may change unseen until the next one
        self._kv_watchers.forget_all()
        if self._closed:
            return
        if self._relisten is None or self._relisten.done():
            log.warning("lost the LISTEN connection; reconnecting (polling covers the gap)")
            self._relisten = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                await self._connect_listener()
                return
            except StoreError as exc:
                log.warning("%s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    @contextlib.asynccontextmanager
    async def _conn(self, *, tx: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for one store call, which ends within STATEMENT_TIMEOUT_S
        however many statements it makes. A call that times out drops its connection:
        handing it back would wait for the server to cancel the statement, a second timeout
        when the server has stalled (a call cancelled otherwise hands it back, as asyncpg
        cancels the statement)."""
        if self._pool is None:
            raise StoreError("store is not running")
        pool, c = self._pool, None
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT_S):
                c = await pool.acquire(timeout=ACQUIRE_TIMEOUT_S)
                if tx:
                    async with c.transaction():
                        yield c
                else:
                    yield c
        except TimeoutError as exc:
            if c is not None:  # the server stopped answering: not handed back to wait on it
                c.terminate()
            raise StoreError(
                f"store operation failed: no answer within {STATEMENT_TIMEOUT_S:g} s"
            ) from exc
        except DRIVER_ERRORS as exc:
            raise StoreError(f"store operation failed: {str(exc) or type(exc).__name__}") from exc
        finally:
            if c is not None:
                await pool.release(c)

    async def ping(self) -> None:
        """Ready: within PING_TIMEOUT_S in all (a pooled connection included), the inbox
        readable (a server that answers SELECT 1 can still be stuck on the tables every
        webhook writes) and the server taking writes (after a failover the old primary may
        come back as a standby, or read-only, and refuse every one)."""
        try:
            async with asyncio.timeout(PING_TIMEOUT_S), self._conn() as c:
                row = await c.fetchrow(
                    "SELECT (SELECT count(*) FROM (SELECT 1 FROM inbox LIMIT 1) AS t),"
                    " pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'"
                )
        except TimeoutError:
            raise StoreError(f"store did not answer within {PING_TIMEOUT_S:g} s") from None
        if row[1] or row[2]:
            what = "a standby (in recovery)" if row[1] else "read-only"
            raise StoreError(f"store is {what}: it cannot take writes")

    # inbox

    async def put_inbound(
        self, session: str, msg: InboundMessage, max_pending: int, *, unpaired: bool = False
    ) -> PutResult:
        """Stored with the puts made while the last group was on its way (core.store.grouped)."""
        return await self._puts.put(Put(session, msg, max_pending, unpaired))

    async def _put_many(self, puts: Sequence[Put]) -> list[PutResult]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT out_id, out_status FROM sb_put_inbound_many($1, $2, $3, $4, $5, $6, $7,"
                " $8, $9, $10, $11, $12) ORDER BY out_n",
                [p.session for p in puts],
                [p.msg.channel for p in puts],
                [p.msg.account for p in puts],
                [p.msg.platform_id for p in puts],
                [p.msg.model_dump_json() for p in puts],
                [p.unpaired for p in puts],
                [p.max_pending for p in puts],
                [p.msg.received_at for p in puts],
                time.time(),
                self.inbox_channel,
                [f"{self._id} {p.session}" for p in puts],
                LOCK_TIMEOUT_MS,
            )
        return [PutResult(r[0], InboxStatus(r[1])) for r in rows]

    async def pending(self, session: str) -> list[InboxItem]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT id, payload FROM inbox WHERE session = $1 AND status = 'pending'"
                " ORDER BY id",
                session,
            )
        return [InboxItem(r[0], InboundMessage.model_validate_json(r[1])) for r in rows]

    async def run_messages(self, run_id: str) -> list[InboundMessage]:
        async with self._conn() as c:
            rows = await c.fetch("SELECT payload FROM inbox WHERE run_id = $1 ORDER BY id", run_id)
        return [InboundMessage.model_validate_json(r[0]) for r in rows]

    async def hold_pending(self, session: str) -> int:
        return await self._set_status(session, "pending", "held")

    async def release_held(self, session: str) -> int:
        changed = await self._set_status(session, "held", "pending")
        if changed:
            async with self._conn() as c:
                await c.execute("SELECT pg_notify($1, $2)", self.inbox_channel, f"- {session}")
        return changed

    async def move_work(self, old: str, new: str, before: float) -> tuple[int, int]:
        async with self._conn(tx=True) as c:
            # the session's row, locked: no replica takes its lease while the work moves
            await c.execute("INSERT INTO sessions (key) VALUES ($1) ON CONFLICT DO NOTHING", old)
            held = await c.fetchval(
                "SELECT lease_owner IS NOT NULL AND lease_until >= "
                f"{NOW} FROM sessions WHERE key = $1 FOR UPDATE",
                old,
            )
            if held:
                return 0, 0
            moved = []
            for table, at in (("inbox", "received_at"), ("outbox", "created_at")):
                result = await c.execute(
                    f"UPDATE {table} SET session = $1 WHERE session = $2 AND status = 'pending'"
                    f" AND {at} < $3",
                    new,
                    old,
                    before,
                )
                moved.append(int(result.split()[-1]))
            if any(moved):
                await c.execute("SELECT pg_notify($1, $2)", self.inbox_channel, f"- {new}")
        return moved[0], moved[1]

    async def release_unpaired(self, channel: str, sender: str) -> int:
        async with self._conn() as c:
            rows = await c.fetch(
                "UPDATE inbox SET status = 'pending' WHERE channel = $1 AND status = 'unpaired'"
                " AND payload::jsonb -> 'sender' ->> 'id' = $2 RETURNING session",
                channel,
                sender,
            )
            for session in {r[0] for r in rows}:
                await c.execute("SELECT pg_notify($1, $2)", self.inbox_channel, f"- {session}")
        return len(rows)

    async def _set_status(self, session: str, old: str, new: str) -> int:
        async with self._conn() as c:
            result = await c.execute(
                "UPDATE inbox SET status = $1 WHERE session = $2 AND status = $3", new, session, old
            )
        return int(result.rsplit(" ", 1)[-1])

    async def prune(
        self, before: float, *, keep_namespaces: Sequence[str] = (), limit: int = 1000
    ) -> dict[str, int]:
        # numbers and the day inlined (each statement names different ones; asyncpg refuses
        # a parameter a statement does not use); the namespaces are the one parameter
        day = utc_day(before)
        # the session rows it deletes are locked in no set order, and a group of puts locks
        # its sessions' rows in key order: waiting on each other they deadlocked, or the puts
        # waited out their lock timeout (a 503). The prune leaves a row another holds.
        statements = prune_statements(
            repr(float(before)),
            f"'{day}'",
            NOW,
            str(int(limit)),
            "namespace <> ALL($1::text[])",
            "FOR UPDATE OF s SKIP LOCKED",
        )
        deleted = {}
        async with self._conn(tx=True) as c:
            for table, sql in statements:
                args = [list(keep_namespaces)] if "$1" in sql else []
                result = await c.execute(sql, *args)
                deleted[table] = int(result.split()[-1])
        return deleted

    async def queue_depth(self) -> int:
        async with self._conn() as c:
            return int(await c.fetchval("SELECT count(*) FROM inbox WHERE status = 'pending'"))

    async def sessions_with_work(self) -> list[str]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT w.session FROM (SELECT session FROM inbox WHERE status = 'pending'"
                " UNION SELECT session FROM outbox WHERE status = 'pending') AS w"
                " LEFT JOIN sessions s ON s.key = w.session"
                f" WHERE s.lease_owner IS NULL OR s.lease_until < {NOW}"
            )
        return [r[0] for r in rows]

    # sessions and history

    async def get_session(self, session: str) -> SessionRecord:
        async with self._conn() as c:
            row = await c.fetchrow("SELECT epoch, state FROM sessions WHERE key = $1", session)
        if row is None:
            return SessionRecord(session, 0, {})
        return SessionRecord(session, row[0], json.loads(row[1]))

    async def set_state(self, session: str, state: dict[str, Any]) -> None:
        async with self._conn() as c:
            await c.execute(
                "INSERT INTO sessions (key, state) VALUES ($1, $2)"
                " ON CONFLICT (key) DO UPDATE SET state = excluded.state",
                session,
                json.dumps(state),
            )

    async def reset_session(self, session: str, at: float | None = None) -> None:
        async with self._conn() as c:
            await c.execute(
                "INSERT INTO sessions (key, epoch, reset_at) VALUES ($1, 1, $2)"
                " ON CONFLICT (key) DO UPDATE SET epoch = sessions.epoch + 1, state = '{}',"
                " reset_at = excluded.reset_at",
                session,
                time.time() if at is None else at,
            )

    async def history(self, session: str, limit: int) -> list[HistoryEntry]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT m.id, m.role, m.content, m.run_id, m.created_at, m.reply FROM messages m"
                " WHERE m.session = $1 AND m.epoch = (SELECT coalesce(max(epoch), 0)"
                " FROM sessions WHERE key = $1) ORDER BY m.id DESC LIMIT $2",
                session,
                limit,
            )
        return history_entries(rows)

    async def transcript(self, session: str, limit: int) -> list[TranscriptEntry]:
        async with self._conn() as c:
            rows = await c.fetch(
                "WITH since AS (SELECT coalesce(max(reset_at), 0) AS t FROM sessions"
                "  WHERE key = $1)"
                " SELECT entry, role, body, ts FROM ("
                " SELECT 'in-' || id AS entry, 'user' AS role, payload AS body,"
                "  received_at AS ts, received_at AS k, 0 AS o, id AS n FROM inbox, since"
                "  WHERE session = $1 AND received_at > since.t"
                " UNION ALL"  # replies as in the SQLite store (see there)
                " SELECT 'out-' || id, 'assistant', reply, created_at,"
                "  max(k0) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING), 1, id FROM ("
                "  SELECT o.id, o.reply, o.created_at, coalesce((SELECT max(i.received_at)"
                "   FROM inbox i WHERE i.run_id = o.run_id AND i.session = o.session),"
                "   o.created_at) AS k0 FROM outbox o WHERE o.session = $1) AS r, since"
                "  WHERE r.k0 >= since.t"
                ") AS t ORDER BY k DESC, o DESC, n DESC LIMIT $2",
                session,
                limit,
            )
        return transcript_entries(rows)

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
        async with self._conn(tx=True) as c:
            row = await c.fetchrow(
                "SELECT lease_owner, epoch, state FROM sessions WHERE key = $1 FOR UPDATE",
                run.session,
            )
            if row is None or row[0] != owner:
                raise StoreError(f"lease on {run.session} is no longer held")
            if unless_paused and stored_handoff(row[2]):
                raise SessionPaused(f"an operator took {run.session}")
            epoch, now = row[1], time.time()
            if state is not None:
                kept = keep_handoff(state, row[2])
                await c.execute("UPDATE sessions SET state = $1 WHERE key = $2", kept, run.session)
            await c.execute(
                "UPDATE inbox SET status = 'done', run_id = $1 WHERE id = ANY($2::bigint[])"
                " AND status = 'pending'",
                run.id,
                run.inbox_ids,
            )
            if user_text and remember:
                await c.execute(
                    "INSERT INTO messages (session, epoch, role, content, run_id, created_at)"
                    " VALUES ($1, $2, 'user', $3, $4, $5)",
                    run.session,
                    epoch,
                    user_text,
                    run.id,
                    now,
                )
            encoded = replies_json(replies)
            if remember:
                await _insert_history(c, run.session, epoch, run.id, encoded, now)
            await _insert_run(c, run)
            return await _insert_outbox(c, run.session, run.id, encoded)

    async def record_run(self, run: RunRecord) -> None:
        async with self._conn() as c:
            await _insert_run(c, run)

    async def enqueue_replies(self, session: str, replies: list[Reply]) -> list[OutboundPart]:
        async with self._conn(tx=True) as c:
            epoch = await c.fetchval("SELECT epoch FROM sessions WHERE key = $1", session)
            encoded = replies_json(replies)
            await _insert_history(c, session, epoch or 0, None, encoded, time.time())
            return await _insert_outbox(c, session, None, encoded)

    async def outbox_pending(self, session: str) -> list[OutboundPart]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT id, run_id, seq, reply, attempts, not_before FROM outbox"
                " WHERE session = $1 AND status = 'pending' ORDER BY id",
                session,
            )
        return outbound_parts(session, rows)

    async def mark_sent(self, part_id: int, platform_id: str | None) -> None:
        async with self._conn() as c:
            await c.execute(
                "UPDATE outbox SET status = 'sent', platform_id = $1, sent_at = $2,"
                " attempts = attempts + 1 WHERE id = $3",
                platform_id,
                time.time(),
                part_id,
            )

    async def mark_failed(
        self, part_id: int, error: str, *, permanent: bool, not_before: float | None = None
    ) -> None:
        async with self._conn() as c:
            await c.execute(
                "UPDATE outbox SET status = $1, error = $2, attempts = attempts + 1,"
                " not_before = $3 WHERE id = $4",
                "failed" if permanent else "pending",
                error,
                not_before,
                part_id,
            )

    async def update_delivery(
        self, channel: str, platform_id: str, status: str, error: str | None = None
    ) -> bool:
        async with self._conn() as c:
            result = await c.execute(
                "UPDATE outbox SET delivery = $1, error = coalesce($2, error)"
                f" WHERE channel = $3 AND platform_id = $4 AND {DELIVERY_RANK} < $5",
                status,
                error,
                channel,
                platform_id,
                delivery_rank(status),
            )
            if not result.endswith(" 0"):
                return True
            known = await c.fetchval(
                "SELECT 1 FROM outbox WHERE channel = $1 AND platform_id = $2",
                channel,
                platform_id,
            )
        return known is not None

    async def delivery(self, part_id: int) -> tuple[str, str | None, str | None] | None:
        async with self._conn() as c:
            row = await c.fetchrow(
                "SELECT status, delivery, error FROM outbox WHERE id = $1", part_id
            )
        return None if row is None else (row[0], row[1], row[2])

    async def quoted(self, session: str, platform_id: str) -> tuple[str, str] | None:
        channel = SessionKey.parse(session).channel
        async with self._conn() as c:
            sent = await c.fetchval(
                "SELECT reply FROM outbox WHERE channel = $1 AND platform_id = $2"
                " AND session = $3 LIMIT 1",
                channel,
                platform_id,
                session,
            )
            if sent is not None:
                return "assistant", Reply.model_validate_json(sent).text
            got = await c.fetchval(
                "SELECT payload FROM inbox WHERE session = $1 AND platform_id = $2",
                session,
                platform_id,
            )
        if got is not None:
            return "user", InboundMessage.model_validate_json(got).text
        return None

    async def last_inbound_at(self, session: str) -> float | None:
        async with self._conn() as c:
            value = await c.fetchval(
                "SELECT max(received_at) FROM inbox WHERE session = $1",
                session,
            )
        return None if value is None else float(value)

    async def kv_get(self, namespace: str, key: str) -> str | None:
        async with self._conn() as c:
            value = await c.fetchval(
                "SELECT value FROM channel_state WHERE namespace = $1 AND key = $2", namespace, key
            )
        return None if value is None else str(value)

    async def kv_delete(self, namespace: str, key: str, *, announce: bool = False) -> None:
        await self._kv_write(
            namespace, key, announce, "DELETE FROM channel_state WHERE namespace = $1 AND key = $2"
        )

    async def kv_items(self, namespace: str) -> dict[str, str]:
        async with self._conn() as c:
            rows = await c.fetch(
                "SELECT key, value FROM channel_state WHERE namespace = $1", namespace
            )
        return {r[0]: r[1] for r in rows}

    async def kv_set(self, namespace: str, key: str, value: str, *, announce: bool = False) -> None:
        await self._kv_write(namespace, key, announce, _KV_PUT, value, time.time())

    async def _kv_write(
        self, namespace: str, key: str, announce: bool, statement: str, *more: Any
    ) -> None:
        """`statement` changes the entry ($1 namespace, $2 key, then `more`). Announced: with
        a NOTIFY to every replica in the same statement (a data-modifying WITH runs whether or
        not it is read), so the change and its news commit together. Only watched namespaces
        are announced: PostgreSQL serializes the commits of notifying transactions, and each
        replica wakes for them."""
        args = (namespace, key, *more)
        async with self._conn() as c:
            if not announce:
                await c.execute(statement, *args)
                return
            n = len(args)
            await c.execute(
                f"WITH change AS ({statement}) SELECT pg_notify(${n + 1}, ${n + 2})",
                *args,
                self.kv_channel,
                json.dumps([namespace, key]),
            )

    async def reserve_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: Note | None = None
    ) -> Quota | None:
        try:
            async with self._conn(tx=True) as c:
                for q in limits:
                    # the upsert locks the counter row: concurrent reservations queue here
                    used = await c.fetchval(
                        "INSERT INTO usage (day, scope, key, used) VALUES ($1, $2, $3, 0)"
                        " ON CONFLICT (day, scope, key) DO UPDATE SET used = usage.used"
                        " RETURNING used",
                        day,
                        q.scope,
                        q.key,
                    )
                    if used + amount > q.limit:
                        raise _Refused(q)  # rolls the transaction back
                for q in limits:
                    await c.execute(
                        "UPDATE usage SET used = used + $1 WHERE day = $2 AND scope = $3"
                        " AND key = $4",
                        amount,
                        day,
                        q.scope,
                        q.key,
                    )
                if note is not None:
                    await c.execute(_KV_PUT, *note, time.time())
        except _Refused as refused:
            return refused.quota
        return None

    async def release_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: tuple[str, str] | None = None
    ) -> bool:
        async with self._conn(tx=True) as c:
            if (
                note is not None
                and await c.fetchval(
                    "DELETE FROM channel_state WHERE namespace = $1 AND key = $2 RETURNING key",
                    *note,
                )
                is None
            ):
                return False
            for q in limits:
                await c.execute(
                    "UPDATE usage SET used = greatest(used - $1, 0) WHERE day = $2 AND scope = $3"
                    " AND key = $4",
                    amount,
                    day,
                    q.scope,
                    q.key,
                )
        return True

    async def usage(self, day: str, scope: str, key: str) -> float:
        async with self._conn() as c:
            used = await c.fetchval(
                "SELECT used FROM usage WHERE day = $1 AND scope = $2 AND key = $3",
                day,
                scope,
                key,
            )
        return float(used or 0.0)

    # leases, on the database clock

    async def acquire_lease(self, session: str, owner: str, ttl: float) -> bool:
        async with self._conn() as c:
            row = await c.fetchval(
                "INSERT INTO sessions (key, lease_owner, lease_until)"
                f" VALUES ($1, $2, {NOW} + $3) ON CONFLICT (key) DO UPDATE"
                " SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until"
                " WHERE sessions.lease_owner IS NULL OR sessions.lease_owner = excluded.lease_owner"
                f" OR sessions.lease_until < {NOW} RETURNING 1",
                session,
                owner,
                ttl,
            )
        return row is not None

    async def renew_lease(self, session: str, owner: str, ttl: float) -> bool:
        async with self._conn() as c:
            result = await c.execute(
                f"UPDATE sessions SET lease_until = {NOW} + $1 WHERE key = $2 AND lease_owner = $3",
                ttl,
                session,
                owner,
            )
        return not result.endswith(" 0")

    async def renew_leases(self, sessions: Sequence[str], owner: str, ttl: float) -> set[str]:
        if not sessions:
            return set()
        async with self._conn() as c:
            # rows locked in key order, as a group of inbound puts locks them (see grouped)
            rows = await c.fetch(
                "WITH mine AS (SELECT key FROM sessions WHERE lease_owner = $2"
                ' AND key = ANY($3::text[]) ORDER BY key COLLATE "C" FOR UPDATE)'
                f" UPDATE sessions s SET lease_until = {NOW} + $1 FROM mine"
                " WHERE s.key = mine.key AND s.lease_owner = $2 RETURNING s.key",
                ttl,
                owner,
                list(sessions),
            )
        return {row[0] for row in rows}

    async def release_lease(self, session: str, owner: str) -> None:
        """Let go; with work left (a replica draining hands a session back), wake the others
        now rather than at their next sweep."""
        async with self._conn() as c:
            await c.execute(
                "WITH released AS (UPDATE sessions SET lease_owner = NULL, lease_until = NULL"
                " WHERE key = $1 AND lease_owner = $2 RETURNING key)"
                " SELECT pg_notify($3, $4) FROM released"
                " WHERE EXISTS (SELECT 1 FROM inbox WHERE session = $1 AND status = 'pending')"
                " OR EXISTS (SELECT 1 FROM outbox WHERE session = $1 AND status = 'pending')",
                session,
                owner,
                self.inbox_channel,
                f"{self._id} {session}",
            )


def _channels(schema: str) -> tuple[str, str]:
    """The (inbox, key-value) NOTIFY channels of the deployment in `schema`."""
    if schema == "public":
        return NOTIFY_CHANNEL, KV_CHANNEL
    tag = hashlib.sha256(schema.encode()).hexdigest()[:16]  # a channel name is at most 63 bytes
    return f"{NOTIFY_CHANNEL}_{tag}", f"{KV_CHANNEL}_{tag}"


async def _no_session_state(conn: asyncpg.Connection) -> None:
    """A pooled connection goes back as it is. The store leaves no session state on one (no
    SET, LISTEN, session advisory lock or open cursor: the listener has its own connection),
    so asyncpg's default reset (UNLISTEN *, RESET ALL, ...) would be a round trip per store
    call for nothing; an unfinished transaction is still rolled back by asyncpg itself."""


def _refused(exc: StoreError) -> bool:
    """The server, or the driver (a value it could not send: DataError, 22000), refused it."""
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None) if isinstance(cause, asyncpg.PostgresError) else None
    return isinstance(state, str) and state[:2] not in UNREACHABLE


class _Refused(Exception):
    def __init__(self, quota: Quota) -> None:
        super().__init__(quota.scope)
        self.quota = quota


async def _insert_history(
    c: asyncpg.Connection,
    session: str,
    epoch: int,
    run_id: str | None,
    replies: list[tuple[Reply, str]],
    now: float,
) -> None:
    for reply, encoded in replies:
        await c.execute(
            "INSERT INTO messages (session, epoch, role, content, reply, run_id, created_at)"
            " VALUES ($1, $2, 'assistant', $3, $4, $5, $6)",
            session,
            epoch,
            reply.text,
            encoded,
            run_id,
            now,
        )


async def _insert_run(c: asyncpg.Connection, run: RunRecord) -> None:
    limits_hit, inbox_ids, detail = run_json(run)
    await c.execute(
        "INSERT INTO runs (id, session, status, started_at, ended_at, steps, tool_calls,"
        " input_tokens, output_tokens, limits_hit, error, inbox_ids, detail, credits)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        " ON CONFLICT (id) DO UPDATE SET status = excluded.status,"
        " ended_at = excluded.ended_at, steps = excluded.steps,"
        " tool_calls = excluded.tool_calls, input_tokens = excluded.input_tokens,"
        " output_tokens = excluded.output_tokens, limits_hit = excluded.limits_hit,"
        " error = excluded.error, inbox_ids = excluded.inbox_ids, detail = excluded.detail,"
        " credits = excluded.credits",
        run.id,
        run.session,
        run.status,
        run.started_at,
        run.ended_at,
        run.steps,
        run.tool_calls,
        run.input_tokens,
        run.output_tokens,
        limits_hit,
        run.error,
        inbox_ids,
        detail,
        run.credits,
    )


async def _insert_outbox(
    c: asyncpg.Connection, session: str, run_id: str | None, replies: list[tuple[Reply, str]]
) -> list[OutboundPart]:
    """Each (reply, its JSON) as the next outbox part of the run."""
    parts = []
    channel, now = SessionKey.parse(session).channel, time.time()
    for seq, (reply, encoded) in enumerate(replies):
        part_id = await c.fetchval(
            "INSERT INTO outbox (session, channel, run_id, seq, reply, created_at)"
            " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            session,
            channel,
            run_id,
            seq,
            encoded,
            now,
        )
        parts.append(OutboundPart(id=part_id, session=session, run_id=run_id, seq=seq, reply=reply))
    return parts
