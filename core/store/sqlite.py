"""SQLite store (sqlite3, WAL): the embedded default for one gateway process.

Writes go through one writer task that groups whatever is queued into a single transaction,
so a burst of webhooks costs one fsync, not one each; the whole batch (BEGIN, every op,
COMMIT) runs in one call on the writer connection's own thread. WAL lets reads run beside the
writer, on two more connections:
- lookups of a few rows by key (a session's pending messages, its record, its recent history,
  its outbox) run on the event loop's own connection, which never waits for a lock: they take
  a few microseconds, and handing each to a thread cost several times that in CPU;
- reads that may scan (listings, counts, transcripts), and any lookup SQLite would make wait,
  run on a reader thread.
The writer's and the reader's connections each live on a single thread for their whole life;
the loop's is only ever used by the event loop.

The WAL is copied back into the database file (a checkpoint) by the reader's thread, ten
times a second while there are writes, not by the commit that happens to fill it: such a
checkpoint took 1.3 to 4 ms here, and every webhook in that batch (and queued behind it)
waited for its acknowledgement. Small and often, because a checkpoint's flush of the database
file also delays the writer's next sync of the WAL: every 0.5 s, it stalled acknowledgements
by up to 20 ms at 1,000 webhooks/s. A checkpoint beside the writer cannot let the WAL start
over (the writer keeps adding to it), so once the WAL holds a thousand pages the writer copies
the few pages added since, before its next batch, and that batch starts the WAL afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

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
    owner_is_gone,
    prune_statements,
    replies_json,
    run_json,
    stored_handoff,
    transcript_entries,
    utc_day,
)
from core.store.sqlite_schema import MIGRATIONS

__all__ = ["SqliteStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")
WriteOp = Callable[[sqlite3.Connection], Any]
WAL_RESTART_PAGES = 1000  # SQLite's own auto-checkpoint size
PING_TIMEOUT_S = 2.0  # how long /readyz waits for a write once writes have failed


class _Op:
    __slots__ = ("durable", "fn", "future")

    def __init__(self, fn: WriteOp, future: asyncio.Future[Any], durable: bool) -> None:
        self.fn = fn
        self.future = future
        self.durable = durable


class _Db:
    """One sqlite3 connection and the one thread that ever touches it (from open to close)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: ThreadPoolExecutor | None = None
        self.conn: sqlite3.Connection | None = None

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn, thread = self.conn, self._thread
        if conn is None or thread is None:
            raise StoreError("store is not running")
        return await asyncio.get_running_loop().run_in_executor(thread, fn, conn)

    async def open(self, path: str) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self.conn = await asyncio.get_running_loop().run_in_executor(self._thread, _connect, path)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        thread.shutdown(wait=False)


class SqliteStore:
    """Store on one SQLite file; `path` may be ":memory:" only for single-connection use."""

    def __init__(
        self, path: str | Path, *, max_batch: int = 512, checkpoint_interval_s: float = 0.1
    ) -> None:
        self._path = str(path)
        self._max_batch = max_batch
        self._checkpoint_interval_s = checkpoint_interval_s
        self._writer = _Db("sqlite-writer")
        self._reader = self._writer if self._path == ":memory:" else _Db("sqlite-reader")
        self._local: sqlite3.Connection | None = None  # the event loop's, for lookups
        self._ops: deque[_Op] = deque()  # queued for the writer, oldest first
        self._kv_watchers = KvWatchers()
        self._wake: asyncio.Event  # set when there is something queued (or closing); made by start
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._written: asyncio.Event  # committed since the last checkpoint; made by start
        self._restart_wal = False  # the writer checkpoints before its next batch
        self._write_fault: str | None = None  # the disk refused the last write (full, I/O)
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._lost: str | None = None  # why nothing more is written (the file went away)

    # lifecycle

    async def start(self) -> None:
        try:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            await self._writer.open(self._path)
            await self._writer.call(_migrate)
            await self._writer.call(_free_leases_of_gone_processes)
            self._file = _file_id(self._path) if self._path != ":memory:" else None
            self._lost = None
            if self._reader is not self._writer:
                await self._writer.call(_no_autocheckpoint)
                await self._reader.open(self._path)
                # used only from the event loop, whichever thread runs it (one at a time)
                self._local = _connect(self._path, wait_ms=0, any_thread=True)
        except (sqlite3.Error, OSError) as exc:
            await self._close_connections()
            raise StoreError(f"cannot open SQLite store at {self._path}: {exc}") from exc
        self._closing = False
        self._wake = asyncio.Event()  # of this loop: a closed store may start again in another
        self._written = asyncio.Event()
        self._task = asyncio.create_task(self._write_loop(), name="sqlite-writer")
        if self._reader is not self._writer:
            self._checkpointer = asyncio.create_task(
                self._checkpoint_forever(), name="sqlite-checkpoint"
            )

    async def aclose(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            await asyncio.gather(self._checkpointer, return_exceptions=True)
            self._checkpointer = None
        if self._task is not None:
            self._closing = True  # the writer finishes what is queued, then returns
            self._wake.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._close_connections()

    async def _close_connections(self) -> None:
        local, self._local = self._local, None
        if local is not None:
            local.close()
        await self._reader.close()
        if self._writer is not self._reader:
            await self._writer.close()

    async def ping(self) -> None:
        """Reachable, and taking writes: once the disk has refused one (full, read-only, an
        I/O error) or another process held the file locked past the busy timeout, a small
        write must succeed before the store counts as ready again. The answer comes within
        PING_TIMEOUT_S; a probe still waiting for the lock goes on, and clears the fault when
        it gets through."""
        if self._lost is not None:
            raise StoreError(self._lost)
        if self._write_fault is None:
            await self._read(lambda c: _fetchone(c, "SELECT 1"))
            return
        fault = self._write_fault
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await self._write(_probe_write, durable=False)
        except TimeoutError:
            raise StoreError(f"store cannot write: {fault}") from None

    # write path: one writer, grouped commits

    async def _write(self, fn: WriteOp, *, durable: bool = True) -> Any:
        """Run `fn` in the next batch. A batch of only non-durable ops (leases: they mean
        nothing once this process is gone) commits without waiting for the disk; any durable
        op makes its batch, and everything written before it, durable."""
        if self._task is None or self._task.done() or self._closing:
            raise StoreError("store is not running")
        if self._lost is not None:
            raise StoreError(self._lost)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.append(_Op(fn, fut, durable))
        self._wake.set()
        # a caller that gives up cancels only its wait: the op stays queued and is written
        return await fut

    async def _write_loop(self) -> None:
        ops = self._ops
        while True:
            if not ops:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [ops.popleft() for _ in range(min(len(ops), self._max_batch))]
            if self._lost is None and self._file is not None and not self._same_file():
                await self._save_lost_file()
            if self._lost is not None:  # nothing more is acknowledged as stored
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(StoreError(self._lost))
                continue
            try:
                if self._restart_wal:  # copy what is left, so that this batch starts it over
                    self._restart_wal = False
                    with contextlib.suppress(sqlite3.Error):  # the next checkpoint tries again
                        await self._writer.call(_checkpoint)
                outcomes = await self._writer.call(
                    partial(
                        _run_batch,
                        fns=[op.fn for op in batch],
                        durable=any(op.durable for op in batch),
                    )
                )
            except asyncio.CancelledError:
                for op in (*batch, *ops):
                    if not op.future.done():
                        op.future.set_exception(StoreError("store closed"))
                ops.clear()
                raise
            except Exception as exc:  # the thread itself failed: nothing was committed
                outcomes = [_Failed(exc)] * len(batch)
            else:
                self._written.set()
            self._note_faults(outcomes)
            for op, outcome in zip(batch, outcomes, strict=True):
                if op.future.done():
                    continue
                if isinstance(outcome, _Failed):
                    op.future.set_exception(outcome.error())
                else:
                    op.future.set_result(outcome)

    def _same_file(self) -> bool:
        try:
            return _file_id(self._path) == self._file
        except OSError:  # deleted
            return False

    async def _save_lost_file(self) -> None:
        """The database file was deleted or replaced while open: what this process wrote
        lives on only in its open handle. Copy it back to the path (or beside the file that
        replaced it), and accept no more writes, so nothing is acknowledged that a restart
        would lose."""
        try:
            target = await self._writer.call(partial(_save_copy, path=self._path))
            saved = f"its contents were saved to {target}"
        except (sqlite3.Error, OSError) as exc:
            saved = f"saving its contents failed: {exc}"
        self._lost = (
            f"the SQLite file {self._path} was deleted or replaced while the gateway ran; "
            f"{saved}; restart the gateway"
        )
        log.error("%s", self._lost)

    def _note_faults(self, outcomes: list[Any]) -> None:
        faults = [o.exc for o in outcomes if isinstance(o, _Failed) and _disk_fault(o.exc)]
        if faults:
            fault = faults[0]
            if self._write_fault is None:
                log.error("SQLite cannot write (not ready until it can): %s", fault)
            self._write_fault = str(fault)
        elif self._write_fault is not None and not all(isinstance(o, _Failed) for o in outcomes):
            log.info("SQLite writes work again")
            self._write_fault = None

    async def _checkpoint_forever(self) -> None:
        """Copy the WAL into the database while there are writes (PASSIVE: it never blocks
        the writer), and ask the writer to start the WAL over once it is big."""
        failing = False  # said once, not ten times a second
        while True:
            await self._written.wait()
            await asyncio.sleep(self._checkpoint_interval_s)
            self._written.clear()
            try:
                wal_pages = await self._reader.call(_checkpoint)
            except (sqlite3.Error, StoreError) as exc:
                if not failing:
                    log.warning("SQLite checkpoint failed (the WAL grows until one works): %s", exc)
                failing = True
                continue
            if failing:
                log.info("SQLite checkpoints work again")
                failing = False
            if wal_pages >= WAL_RESTART_PAGES:
                self._restart_wal = True

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._reader.call(fn)
        except sqlite3.Error as exc:
            raise StoreError(f"store read failed: {exc}") from exc

    async def _lookup(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read of a few rows by key, right here on the event loop's connection; on the
        reader thread when SQLite would make it wait (a WAL reader rarely has to)."""
        if self._local is not None:
            try:
                return fn(self._local)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise StoreError(f"store read failed: {exc}") from exc
            except sqlite3.Error as exc:
                raise StoreError(f"store read failed: {exc}") from exc
        return await self._read(fn)

    # inbox

    async def put_inbound(
        self, session: str, msg: InboundMessage, max_pending: int, *, unpaired: bool = False
    ) -> PutResult:
        payload = msg.model_dump_json()

        def op(c: sqlite3.Connection) -> PutResult:
            # the count, then a plain insert: `INSERT … SELECT … RETURNING` in one statement
            # makes SQLite stage the row in a temporary table, which costs more than the
            # second statement (the writer serializes both, so the count cannot go stale)
            if unpaired:
                status = InboxStatus.UNPAIRED
            else:
                (queued,) = _fetchone(
                    c,
                    "SELECT count(*) FROM inbox WHERE session = ? AND status = 'pending'",
                    (session,),
                )
                status = InboxStatus.PENDING if queued < max_pending else InboxStatus.OVERFLOW
            cur = c.execute(
                "INSERT INTO inbox (session, channel, account, platform_id, payload, status,"
                " received_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (channel, account, platform_id) DO NOTHING",
                (
                    session,
                    msg.channel,
                    msg.account,
                    msg.platform_id,
                    payload,
                    status.value,
                    msg.received_at,
                ),
            )
            if cur.rowcount == 1:
                assert cur.lastrowid is not None
                return PutResult(cur.lastrowid, status)
            existing = _fetchone(
                c,
                "SELECT id FROM inbox WHERE channel = ? AND account = ? AND platform_id = ?",
                (msg.channel, msg.account, msg.platform_id),
            )
            return PutResult(existing[0], InboxStatus.DUPLICATE)

        result: PutResult = await self._write(op)
        return result

    async def pending(self, session: str) -> list[InboxItem]:
        rows = await self._lookup(
            lambda c: _fetchall(
                c,
                "SELECT id, payload FROM inbox WHERE session = ? AND status = 'pending'"
                " ORDER BY id",
                (session,),
            )
        )
        return [InboxItem(r[0], InboundMessage.model_validate_json(r[1])) for r in rows]

    async def run_messages(self, run_id: str) -> list[InboundMessage]:
        rows = await self._lookup(
            lambda c: _fetchall(
                c, "SELECT payload FROM inbox WHERE run_id = ? ORDER BY id", (run_id,)
            )
        )
        return [InboundMessage.model_validate_json(r[0]) for r in rows]

    async def hold_pending(self, session: str) -> int:
        return await self._set_status(session, "pending", "held")

    async def release_held(self, session: str) -> int:
        return await self._set_status(session, "held", "pending")

    async def move_work(self, old: str, new: str, before: float) -> tuple[int, int]:
        def op(c: sqlite3.Connection) -> tuple[int, int]:
            held = c.execute(
                "SELECT 1 FROM sessions WHERE key = ? AND lease_owner IS NOT NULL"
                " AND lease_until >= ?",
                (old, time.time()),
            ).fetchone()
            if held is not None:
                return 0, 0
            moved = [
                c.execute(
                    f"UPDATE {table} SET session = ? WHERE session = ? AND status = 'pending'"
                    f" AND {at} < ?",
                    (new, old, before),
                ).rowcount
                for table, at in (("inbox", "received_at"), ("outbox", "created_at"))
            ]
            return moved[0], moved[1]

        result: tuple[int, int] = await self._write(op)
        return result

    async def release_unpaired(self, channel: str, sender: str) -> int:
        def op(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "UPDATE inbox SET status = 'pending' WHERE channel = ? AND status = 'unpaired'"
                " AND json_extract(payload, '$.sender.id') = ?",
                (channel, sender),
            )
            return cur.rowcount

        released: int = await self._write(op)
        return released

    async def _set_status(self, session: str, old: str, new: str) -> int:
        def op(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "UPDATE inbox SET status = ? WHERE session = ? AND status = ?", (new, session, old)
            )
            return cur.rowcount

        changed: int = await self._write(op)
        return changed

    async def prune(
        self, before: float, *, keep_namespaces: Sequence[str] = (), limit: int = 1000
    ) -> dict[str, int]:
        statements = prune_statements(
            ":before",
            ":day",
            ":now",
            ":limit",
            "namespace NOT IN (SELECT value FROM json_each(:kept))",
        )
        values = {
            "before": before,
            "day": utc_day(before),
            "now": time.time(),
            "limit": limit,
            "kept": json.dumps(list(keep_namespaces)),
        }

        def op(c: sqlite3.Connection) -> dict[str, int]:
            return {table: c.execute(sql, values).rowcount for table, sql in statements}

        deleted: dict[str, int] = await self._write(op)
        return deleted

    async def queue_depth(self) -> int:
        row = await self._read(
            lambda c: _fetchone(c, "SELECT count(*) FROM inbox WHERE status = 'pending'")
        )
        return int(row[0])

    async def sessions_with_work(self) -> list[str]:
        rows = await self._read(
            lambda c: _fetchall(
                c,
                "SELECT w.session FROM (SELECT session FROM inbox WHERE status = 'pending'"
                " UNION SELECT session FROM outbox WHERE status = 'pending') AS w"
                " LEFT JOIN sessions s ON s.key = w.session"
                " WHERE s.lease_owner IS NULL OR s.lease_until < ?",
                (time.time(),),
            )
        )
        return [r[0] for r in rows]

    # sessions and history

    async def get_session(self, session: str) -> SessionRecord:
        row = await self._lookup(
            lambda c: _fetchone(c, "SELECT epoch, state FROM sessions WHERE key = ?", (session,))
        )
        if row is None:
            return SessionRecord(session, 0, {})
        return SessionRecord(session, row[0], json.loads(row[1]))

    async def set_state(self, session: str, state: dict[str, Any]) -> None:
        text = json.dumps(state)

        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO sessions (key, state) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET state = excluded.state",
                (session, text),
            )

        await self._write(op)

    async def reset_session(self, session: str, at: float | None = None) -> None:
        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO sessions (key, epoch, reset_at) VALUES (?, 1, ?)"
                " ON CONFLICT (key) DO UPDATE SET epoch = epoch + 1, state = '{}',"
                " reset_at = excluded.reset_at",
                (session, time.time() if at is None else at),
            )

        await self._write(op)

    async def history(self, session: str, limit: int) -> list[HistoryEntry]:
        rows = await self._lookup(
            lambda c: _fetchall(
                c,
                "SELECT m.id, m.role, m.content, m.run_id, m.created_at, m.reply FROM messages m"
                " WHERE m.session = ? AND m.epoch = (SELECT coalesce(max(epoch), 0)"
                " FROM sessions WHERE key = ?) ORDER BY m.id DESC LIMIT ?",
                (session, session, limit),
            )
        )
        return history_entries(rows)

    async def transcript(self, session: str, limit: int) -> list[TranscriptEntry]:
        rows = await self._read(
            lambda c: _fetchall(
                c,
                # a reply sorts right after the newest message its run answered (it may have
                # been committed after later messages arrived), else by when it was created,
                # and never before a reply created earlier (an operator's, say); since a
                # reset, a reply shows if what it answered came after it (k0)
                "WITH since AS (SELECT coalesce(max(reset_at), 0) AS t FROM sessions WHERE key = ?)"
                " SELECT entry, role, body, ts FROM ("
                " SELECT 'in-' || id AS entry, 'user' AS role, payload AS body,"
                "  received_at AS ts, received_at AS k, 0 AS o, id AS n FROM inbox, since"
                "  WHERE session = ? AND received_at > since.t"  # the /reset itself is not shown
                " UNION ALL"
                " SELECT 'out-' || id, 'assistant', reply, created_at,"
                "  max(k0) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING), 1, id FROM ("
                "  SELECT o.id, o.reply, o.created_at, coalesce((SELECT max(i.received_at)"
                "   FROM inbox i WHERE i.run_id = o.run_id AND i.session = o.session),"
                "   o.created_at) AS k0 FROM outbox o WHERE o.session = ?), since"
                "  WHERE k0 >= since.t"
                ") ORDER BY k DESC, o DESC, n DESC LIMIT ?",
                (session, session, session, limit),
            )
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
        encoded = replies_json(replies)

        def op(c: sqlite3.Connection) -> list[OutboundPart]:
            row = _fetchone(
                c, "SELECT lease_owner, epoch, state FROM sessions WHERE key = ?", (run.session,)
            )
            if row is None or row[0] != owner:
                raise _LeaseLost(run.session)
            if unless_paused and stored_handoff(row[2]):
                raise SessionPaused(f"an operator took {run.session}")
            epoch, now = row[1], time.time()
            if state is not None:
                kept = keep_handoff(state, row[2])
                c.execute("UPDATE sessions SET state = ? WHERE key = ?", (kept, run.session))
            marks = ",".join("?" * len(run.inbox_ids))
            c.execute(
                f"UPDATE inbox SET status = 'done', run_id = ? WHERE id IN ({marks})"
                " AND status = 'pending'",
                (run.id, *run.inbox_ids),
            )
            if user_text and remember:
                c.execute(
                    "INSERT INTO messages (session, epoch, role, content, run_id, created_at)"
                    " VALUES (?, ?, 'user', ?, ?, ?)",
                    (run.session, epoch, user_text, run.id, now),
                )
            for reply, text in encoded if remember else ():
                c.execute(
                    "INSERT INTO messages (session, epoch, role, content, reply, run_id,"
                    " created_at) VALUES (?, ?, 'assistant', ?, ?, ?, ?)",
                    (run.session, epoch, reply.text, text, run.id, now),
                )
            _insert_run(c, run)
            return _insert_outbox(c, run.session, run.id, encoded)

        parts: list[OutboundPart] = await self._write(op)
        return parts

    async def record_run(self, run: RunRecord) -> None:
        def op(c: sqlite3.Connection) -> None:
            _insert_run(c, run)

        await self._write(op)

    async def enqueue_replies(self, session: str, replies: list[Reply]) -> list[OutboundPart]:
        encoded = replies_json(replies)

        def op(c: sqlite3.Connection) -> list[OutboundPart]:
            row = _fetchone(c, "SELECT epoch FROM sessions WHERE key = ?", (session,))
            epoch, now = (row[0] if row else 0), time.time()
            for reply, text in encoded:
                c.execute(
                    "INSERT INTO messages (session, epoch, role, content, reply, created_at)"
                    " VALUES (?, ?, 'assistant', ?, ?, ?)",
                    (session, epoch, reply.text, text, now),
                )
            return _insert_outbox(c, session, None, encoded)

        parts: list[OutboundPart] = await self._write(op)
        return parts

    async def outbox_pending(self, session: str) -> list[OutboundPart]:
        rows = await self._lookup(
            lambda c: _fetchall(
                c,
                "SELECT id, run_id, seq, reply, attempts, not_before FROM outbox"
                " WHERE session = ? AND status = 'pending' ORDER BY id",
                (session,),
            )
        )
        return outbound_parts(session, rows)

    async def mark_sent(self, part_id: int, platform_id: str | None) -> None:
        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "UPDATE outbox SET status = 'sent', platform_id = ?, sent_at = ?,"
                " attempts = attempts + 1 WHERE id = ?",
                (platform_id, time.time(), part_id),
            )

        await self._write(op)

    async def mark_failed(
        self, part_id: int, error: str, *, permanent: bool, not_before: float | None = None
    ) -> None:
        status = "failed" if permanent else "pending"

        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "UPDATE outbox SET status = ?, error = ?, attempts = attempts + 1,"
                " not_before = ? WHERE id = ?",
                (status, error, not_before, part_id),
            )

        await self._write(op)

    async def update_delivery(
        self, channel: str, platform_id: str, status: str, error: str | None = None
    ) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE outbox SET delivery = ?, error = coalesce(?, error)"
                f" WHERE channel = ? AND platform_id = ? AND {DELIVERY_RANK} < ?",
                (status, error, channel, platform_id, delivery_rank(status)),
            )
            if cur.rowcount > 0:
                return True
            row = _fetchone(
                c,
                "SELECT 1 FROM outbox WHERE channel = ? AND platform_id = ?",
                (channel, platform_id),
            )
            return row is not None

        found: bool = await self._write(op)
        return found

    async def delivery(self, part_id: int) -> tuple[str, str | None, str | None] | None:
        row = await self._lookup(
            lambda c: _fetchone(
                c, "SELECT status, delivery, error FROM outbox WHERE id = ?", (part_id,)
            )
        )
        return None if row is None else (row[0], row[1], row[2])

    async def quoted(self, session: str, platform_id: str) -> tuple[str, str] | None:
        channel = _channel_of(session)

        def op(c: sqlite3.Connection) -> tuple[str, str] | None:
            sent = _fetchone(
                c,
                "SELECT reply FROM outbox WHERE channel = ? AND platform_id = ? AND session = ?"
                " LIMIT 1",
                (channel, platform_id, session),
            )
            if sent is not None:
                return "assistant", Reply.model_validate_json(sent[0]).text
            got = _fetchone(
                c,
                "SELECT payload FROM inbox WHERE session = ? AND platform_id = ?",
                (session, platform_id),
            )
            if got is not None:
                return "user", InboundMessage.model_validate_json(got[0]).text
            return None

        found: tuple[str, str] | None = await self._lookup(op)
        return found

    async def last_inbound_at(self, session: str) -> float | None:
        row = await self._lookup(
            lambda c: _fetchone(
                c,
                "SELECT max(received_at) FROM inbox WHERE session = ?",
                (session,),
            )
        )
        return None if row is None or row[0] is None else float(row[0])

    async def kv_get(self, namespace: str, key: str) -> str | None:
        row = await self._lookup(
            lambda c: _fetchone(
                c,
                "SELECT value FROM channel_state WHERE namespace = ? AND key = ?",
                (namespace, key),
            )
        )
        return None if row is None else str(row[0])

    async def kv_delete(self, namespace: str, key: str, *, announce: bool = False) -> None:
        def op(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM channel_state WHERE namespace = ? AND key = ?", (namespace, key))

        await self._write(op)
        if announce:
            self._kv_watchers.changed(namespace, key)

    async def kv_items(self, namespace: str) -> dict[str, str]:
        rows = await self._read(
            lambda c: _fetchall(
                c, "SELECT key, value FROM channel_state WHERE namespace = ?", (namespace,)
            )
        )
        return {r[0]: r[1] for r in rows}

    async def kv_set(self, namespace: str, key: str, value: str, *, announce: bool = False) -> None:
        def op(c: sqlite3.Connection) -> None:
            _kv_put(c, namespace, key, value)

        await self._write(op)
        if announce:
            self._kv_watchers.changed(namespace, key)

    async def watch_kv(self, namespace: str, on_change: Callable[[str | None], None]) -> None:
        """Call `on_change(key)` after each announced change of an entry of `namespace`: this
        process is the store's only writer, so it makes (and hears of) every one."""
        self._kv_watchers.add(namespace, on_change)

    def kv_watched(self) -> bool:
        return True

    async def reserve_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: Note | None = None
    ) -> Quota | None:
        def op(c: sqlite3.Connection) -> Quota | None:
            for q in limits:
                row = _fetchone(
                    c,
                    "SELECT used FROM usage WHERE day = ? AND scope = ? AND key = ?",
                    (day, q.scope, q.key),
                )
                if (row[0] if row else 0.0) + amount > q.limit:
                    return q
            for q in limits:
                c.execute(
                    "INSERT INTO usage (day, scope, key, used) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (day, scope, key) DO UPDATE SET used = used + excluded.used",
                    (day, q.scope, q.key, amount),
                )
            if note is not None:
                _kv_put(c, *note)
            return None

        refused: Quota | None = await self._write(op)
        return refused

    async def release_usage(
        self, day: str, amount: float, limits: list[Quota], *, note: tuple[str, str] | None = None
    ) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            if (
                note is not None
                and _fetchone(
                    c,
                    "DELETE FROM channel_state WHERE namespace = ? AND key = ? RETURNING key",
                    note,
                )
                is None
            ):
                return False
            for q in limits:
                c.execute(
                    "UPDATE usage SET used = max(used - ?, 0) WHERE day = ? AND scope = ?"
                    " AND key = ?",
                    (amount, day, q.scope, q.key),
                )
            return True

        released: bool = await self._write(op)
        return released

    async def usage(self, day: str, scope: str, key: str) -> float:
        row = await self._lookup(
            lambda c: _fetchone(
                c,
                "SELECT used FROM usage WHERE day = ? AND scope = ? AND key = ?",
                (day, scope, key),
            )
        )
        return float(row[0]) if row else 0.0

    # leases: kept only for as long as this process lives, so never waited on the disk for

    async def acquire_lease(self, session: str, owner: str, ttl: float) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            now = time.time()
            cur = c.execute(
                "INSERT INTO sessions (key, lease_owner, lease_until) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET lease_owner = excluded.lease_owner,"
                " lease_until = excluded.lease_until"
                " WHERE sessions.lease_owner IS NULL OR sessions.lease_owner = excluded.lease_owner"
                " OR sessions.lease_until < ?",
                (session, owner, now + ttl, now),
            )
            return cur.rowcount > 0

        acquired: bool = await self._write(op, durable=False)
        return acquired

    async def renew_lease(self, session: str, owner: str, ttl: float) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE sessions SET lease_until = ? WHERE key = ? AND lease_owner = ?",
                (time.time() + ttl, session, owner),
            )
            return cur.rowcount > 0

        renewed: bool = await self._write(op, durable=False)
        return renewed

    async def renew_leases(self, sessions: Sequence[str], owner: str, ttl: float) -> set[str]:
        if not sessions:
            return set()
        keys = json.dumps(list(sessions))

        def op(c: sqlite3.Connection) -> set[str]:
            rows = c.execute(
                "UPDATE sessions SET lease_until = ? WHERE lease_owner = ?"
                " AND key IN (SELECT value FROM json_each(?)) RETURNING key",
                (time.time() + ttl, owner, keys),
            ).fetchall()
            return {row[0] for row in rows}

        renewed: set[str] = await self._write(op, durable=False)
        return renewed

    async def release_lease(self, session: str, owner: str) -> None:
        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "UPDATE sessions SET lease_owner = NULL, lease_until = NULL"
                " WHERE key = ? AND lease_owner = ?",
                (session, owner),
            )

        await self._write(op, durable=False)


class _LeaseLost(Exception):
    def __init__(self, session: str) -> None:
        super().__init__(f"lease on {session} is no longer held")


class _Failed:
    """What one op of a batch raised, carried back from the writer thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def error(self) -> StoreError:
        if isinstance(self.exc, StoreError):  # SessionPaused among them
            return type(self.exc)(str(self.exc))
        if isinstance(self.exc, _LeaseLost):
            return StoreError(str(self.exc))
        return StoreError(f"store write failed: {self.exc}")


_DISK_FAULTS = frozenset(
    {
        sqlite3.SQLITE_BUSY,  # another process holds the file locked
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_PERM,
    }
)


def _disk_fault(exc: BaseException) -> bool:
    """A write the disk or the file refused (or another process kept locked), as opposed to
    one bad statement."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _DISK_FAULTS


def _free_leases_of_gone_processes(conn: sqlite3.Connection) -> None:
    """At start: a SQLite file serves processes of one machine, so a lease held by one that
    no longer runs (killed, crashed) is freed now rather than after its ttl, and its sessions
    resume at once."""
    owners = [r[0] for r in conn.execute("SELECT DISTINCT lease_owner FROM sessions")]
    gone = [o for o in owners if o is not None and owner_is_gone(o)]
    if gone:
        marks = ",".join("?" * len(gone))
        conn.execute(
            f"UPDATE sessions SET lease_owner = NULL, lease_until = NULL"
            f" WHERE lease_owner IN ({marks})",
            gone,
        )
        log.info("freed the session leases of %d process(es) that no longer run", len(gone))


def _file_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _save_copy(conn: sqlite3.Connection, path: str) -> str:
    """On the writer's thread: the whole database, as this connection sees it, to `path`, or
    beside it when another file took its place; returns where."""
    target = f"{path}.recovered" if os.path.exists(path) else path
    copy = sqlite3.connect(target)
    try:
        conn.backup(copy)
    finally:
        copy.close()
    return target


def _probe_write(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT INTO channel_state (namespace, key, value, updated_at)"
        " VALUES ('store.health', 'write-probe', '', ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET updated_at = excluded.updated_at",
        (time.time(),),
    )


def _run_batch(conn: sqlite3.Connection, fns: list[WriteOp], durable: bool = True) -> list[Any]:
    """On the writer's thread: every op in one transaction, one result (or _Failed) each.
    Durable: the commit waits for the disk (WAL: a FULL commit syncs every frame before it)."""
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    try:
        conn.execute("BEGIN IMMEDIATE")
        results = [fn(conn) for fn in fns]
        conn.execute("COMMIT")
    except Exception as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        if _disk_fault(exc):  # every op would meet it (and wait out the lock) again; the
            return [_Failed(exc)] * len(fns)  # store logs the fault once, not per write
        if len(fns) > 1:  # one bad op must not fail its neighbours: redo them one by one
            return [one for fn in fns for one in _run_batch(conn, [fn], durable)]
        if not isinstance(exc, _LeaseLost | SessionPaused):
            log.error("store write failed", exc_info=exc)
        return [_Failed(exc)]
    return results


def _connect(path: str, wait_ms: int = 5000, any_thread: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=not any_thread)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={wait_ms}")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _no_autocheckpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_autocheckpoint=0")


def _checkpoint(conn: sqlite3.Connection) -> int:
    """A PASSIVE checkpoint (it waits for nobody); returns the pages in the WAL."""
    _, wal_pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(wal_pages)


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply the migrations this file has not seen. Each runs in its own transaction, which
    first looks whether another process starting at the same time applied it (an ALTER TABLE
    run twice fails)."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    current = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
    for version, script in MIGRATIONS:
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = "SELECT 1 FROM schema_version WHERE version = ?"
            if conn.execute(done, (version,)).fetchone() is None:
                for statement in filter(str.strip, script.split(";")):  # none holds a ";"
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _kv_put(c: sqlite3.Connection, namespace: str, key: str, value: str) -> None:
    c.execute(
        "INSERT INTO channel_state (namespace, key, value, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " updated_at = excluded.updated_at",
        (namespace, key, value, time.time()),
    )


def _channel_of(session: str) -> str:
    return SessionKey.parse(session).channel


def _fetchone(c: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
    return c.execute(sql, args).fetchone()


def _fetchall(c: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    return c.execute(sql, args).fetchall()


def _insert_run(c: sqlite3.Connection, run: RunRecord) -> None:
    limits_hit, inbox_ids, detail = run_json(run)
    c.execute(
        "INSERT OR REPLACE INTO runs (id, session, status, started_at, ended_at, steps,"
        " tool_calls, input_tokens, output_tokens, credits, limits_hit, error, inbox_ids,"
        " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run.id,
            run.session,
            run.status,
            run.started_at,
            run.ended_at,
            run.steps,
            run.tool_calls,
            run.input_tokens,
            run.output_tokens,
            run.credits,
            limits_hit,
            run.error,
            inbox_ids,
            detail,
        ),
    )


def _insert_outbox(
    c: sqlite3.Connection, session: str, run_id: str | None, replies: list[tuple[Reply, str]]
) -> list[OutboundPart]:
    """Each (reply, its JSON) as the next outbox part of the run."""
    parts = []
    now = time.time()
    for seq, (reply, encoded) in enumerate(replies):
        cur = c.execute(
            "INSERT INTO outbox (session, channel, run_id, seq, reply, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (session, _channel_of(session), run_id, seq, encoded, now),
        )
        assert cur.lastrowid is not None
        parts.append(
            OutboundPart(id=cur.lastrowid, session=session, run_id=run_id, seq=seq, reply=reply)
        )
    return parts
