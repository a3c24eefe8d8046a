"""The store contract, run against SQLite and PostgreSQL: dedupe, queue cap, FIFO, atomic
turns, leases, history, outbox, durability; plus the SQLite writer's group commit."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from core.errors import SessionPaused, StoreError
from core.models import InboundMessage, OutboundPart, Reply, Sender
from core.store import InboxStatus, Quota, RunRecord, SqliteStore, Store
from core.store import sqlite as sqlite_module
from core.store.base import utc_day
from core.store.postgres import PostgresStore
from tests.conftest import pg_schema

S1 = "default:web:default:alice"
S2 = "default:web:default:bob"
_ids = itertools.count(1)


def msg(
    platform_id: str | None = None,
    *,
    text: str = "hello",
    channel: str = "web",
    account: str = "default",
    conversation: str = "alice",
    received_at: float | None = None,
) -> InboundMessage:
    return InboundMessage(
        channel=channel,
        account=account,
        conversation=conversation,
        sender=Sender(id=conversation),
        text=text,
        platform_id=platform_id or f"p{next(_ids)}",
        received_at=time.time() if received_at is None else received_at,
    )


def run_for(session: str, inbox_ids: list[int], run_id: str | None = None) -> RunRecord:
    return RunRecord(
        id=run_id or f"run-{next(_ids)}",
        session=session,
        started_at=time.time(),
        status="ok",
        ended_at=time.time(),
        steps=2,
        tool_calls=1,
        input_tokens=120,
        output_tokens=30,
        limits_hit=["max_steps"],
        inbox_ids=list(inbox_ids),
        detail={"note": "x"},
    )


async def turn(
    store: Store, session: str, user_text: str, *replies: str, owner: str = "w1"
) -> list[OutboundPart]:
    """Put one message, take the lease and commit a turn answering it."""
    put = await store.put_inbound(session, msg(text=user_text), 100)
    assert await store.acquire_lease(session, owner, 30.0)
    parts = await store.complete_turn(
        owner, run_for(session, [put.id]), user_text, [Reply(text=r) for r in replies]
    )
    await store.release_lease(session, owner)
    return parts


Opener = Callable[[], Awaitable[Store]]


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens (and later closes) stores on one backing database: a restart is a second open."""
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(pg_schema()) if request.param == "postgres" else ""
        opened: list[Store] = []

        async def open_one() -> Store:
            s: Store = PostgresStore(url) if url else SqliteStore(tmp_path / "test.db")
            await s.start()
            opened.append(s)
            return s

        yield open_one
        for s in opened:
            await s.aclose()


@pytest_asyncio.fixture
async def store(open_store: Opener) -> Store:
    return await open_store()


async def query(store: Store, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """Read the rows with an independent connection (what another process would see)."""
    if isinstance(store, SqliteStore):
        with contextlib.closing(sqlite3.connect(store._path)) as conn, conn:
            return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    assert isinstance(store, PostgresStore)
    import asyncpg

    n = iter(range(1, 100))
    conn = await asyncpg.connect(store._dsn)
    try:
        rows = await conn.fetch(re.sub(r"\?", lambda _: f"${next(n)}", sql), *args)
    finally:
        await conn.close()
    return [tuple(r) for r in rows]


# inbox


async def test_put_inbound_stores_once_and_returns_pending(store: Store) -> None:
    m = msg("tg-1", text="first")
    put = await store.put_inbound(S1, m, 10)
    assert put.status is InboxStatus.PENDING
    assert put.id > 0
    items = await store.pending(S1)
    assert [(i.id, i.message) for i in items] == [(put.id, m)]


async def test_redelivery_is_duplicate_with_same_id_and_not_stored_twice(
    store: Store,
) -> None:
    first = await store.put_inbound(S1, msg("tg-1", text="first"), 10)
    again = await store.put_inbound(S1, msg("tg-1", text="first (redelivered)"), 10)
    assert again.status is InboxStatus.DUPLICATE
    assert again.id == first.id
    items = await store.pending(S1)
    assert [i.message.text for i in items] == ["first"]


async def test_same_platform_id_on_other_account_or_channel_is_a_different_message(
    store: Store,
) -> None:
    base = await store.put_inbound(S1, msg("42", channel="telegram", account="bot-a"), 10)
    other_account = await store.put_inbound(S1, msg("42", channel="telegram", account="bot-b"), 10)
    other_channel = await store.put_inbound(S1, msg("42", channel="slack", account="bot-a"), 10)
    assert other_account.status is InboxStatus.PENDING
    assert other_channel.status is InboxStatus.PENDING
    assert len({base.id, other_account.id, other_channel.id}) == 3
    assert len(await store.pending(S1)) == 3


async def test_the_pending_cap_holds_when_many_arrive_at_once(store: Store) -> None:
    results = await asyncio.gather(
        *(store.put_inbound(S1, msg(text=f"m{i}"), 5) for i in range(30))
    )
    statuses = [r.status for r in results]
    assert statuses.count(InboxStatus.PENDING) == 5
    assert statuses.count(InboxStatus.OVERFLOW) == 25
    assert len(await store.pending(S1)) == 5


async def test_max_pending_overflow_is_kept_but_not_pending(store: Store) -> None:
    a = await store.put_inbound(S1, msg(text="a"), 2)
    b = await store.put_inbound(S1, msg(text="b"), 2)
    c = await store.put_inbound(S1, msg("over", text="c"), 2)
    assert [a.status, b.status, c.status] == [
        InboxStatus.PENDING,
        InboxStatus.PENDING,
        InboxStatus.OVERFLOW,
    ]
    assert [i.message.text for i in await store.pending(S1)] == ["a", "b"]
    # kept: a redelivery of the overflowed message is recognised, and it is in the transcript
    again = await store.put_inbound(S1, msg("over", text="c"), 2)
    assert again == type(again)(c.id, InboxStatus.DUPLICATE)
    assert "c" in [e.text for e in await store.transcript(S1, 10)]
    # the cap counts pending messages of this session only
    other = await store.put_inbound(S2, msg(text="x", conversation="bob"), 2)
    assert other.status is InboxStatus.PENDING


class _InboxModel:
    """What the inbox should answer a put: the first id of a platform id again (dedupe), else
    unpaired, else pending under the session's cap, else overflow; and the pending order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}  # platform id -> inbox id
        self.pending: dict[str, list[str]] = {}  # session -> platform ids, in order

    def check(self, session: str, platform_id: str, unpaired: bool, cap: int, put: Any) -> None:
        if platform_id in self.ids:
            assert put == type(put)(self.ids[platform_id], InboxStatus.DUPLICATE)
            return
        queue = self.pending.setdefault(session, [])
        if unpaired:
            expected = InboxStatus.UNPAIRED
        elif len(queue) < cap:
            expected = InboxStatus.PENDING
            queue.append(platform_id)
        else:
            expected = InboxStatus.OVERFLOW
        assert (platform_id, put.status) == (platform_id, expected)
        assert put.id not in self.ids.values()
        self.ids[platform_id] = put.id

    async def check_pending(self, store: Store) -> None:
        for session, queue in self.pending.items():
            assert [i.message.platform_id for i in await store.pending(session)] == queue


async def test_puts_match_a_model_of_the_queue_cap_dedupe_and_pairing(store: Store) -> None:
    """Random puts (redeliveries, unpaired senders, several sessions and caps) give exactly
    the statuses and ids a plain model of the inbox gives."""
    rnd = random.Random(8)
    sessions = [S1, S2, "default:web:default:carol"]
    model = _InboxModel()
    for _ in range(300):
        session = rnd.choice(sessions)
        platform_id = f"model-{rnd.randrange(200)}"
        unpaired = rnd.random() < 0.15
        cap = rnd.randrange(1, 40)
        put = await store.put_inbound(session, msg(platform_id), cap, unpaired=unpaired)
        model.check(session, platform_id, unpaired, cap, put)
    await model.check_pending(store)


async def test_puts_made_at_once_match_the_model_in_the_order_made(store: Store) -> None:
    """Bursts of puts made together (grouped into one transaction each: SQLite's writer,
    PostgreSQL's grouped puts) give the statuses and ids of the same puts made one by one; a
    platform id belongs to one conversation, as on every platform."""
    rnd = random.Random(9)
    sessions = [S1, S2, "default:web:default:carol"]
    model = _InboxModel()
    for _ in range(6):
        burst = []
        for _ in range(50):
            n = rnd.randrange(150)
            burst.append((sessions[n % 3], f"burst-{n}", n % 7 == 0, rnd.randrange(1, 30)))
        results = await asyncio.gather(
            *(store.put_inbound(s, msg(p), cap, unpaired=u) for s, p, u, cap in burst)
        )
        for (session, platform_id, unpaired, cap), put in zip(burst, results, strict=True):
            model.check(session, platform_id, unpaired, cap, put)
    await model.check_pending(store)


async def test_pending_is_fifo_per_session_and_isolated(store: Store) -> None:
    for i in range(4):
        await store.put_inbound(S1, msg(text=f"a{i}"), 100)
        await store.put_inbound(S2, msg(text=f"b{i}", conversation="bob"), 100)
    a = await store.pending(S1)
    b = await store.pending(S2)
    assert [i.message.text for i in a] == ["a0", "a1", "a2", "a3"]
    assert [i.message.text for i in b] == ["b0", "b1", "b2", "b3"]
    assert [i.id for i in a] == sorted(i.id for i in a)
    assert not {i.id for i in a} & {i.id for i in b}
    assert await store.pending("default:web:default:nobody") == []


# turns


async def test_complete_turn_commits_everything(store: Store, tmp_path: Path) -> None:
    puts = [await store.put_inbound(S1, msg(text=t), 100) for t in ("q1", "q2", "later")]
    assert await store.acquire_lease(S1, "w1", 30.0)
    run = run_for(S1, [puts[0].id, puts[1].id], run_id="run-abc")
    replies = [Reply(text="part one"), Reply(text="part two")]
    parts = await store.complete_turn("w1", run, "q1\n\nq2", replies)

    # exactly the run's messages are done
    assert [i.message.text for i in await store.pending(S1)] == ["later"]
    rows = await query(store, "SELECT id, status, run_id FROM inbox ORDER BY id")
    assert rows == [
        (puts[0].id, "done", "run-abc"),
        (puts[1].id, "done", "run-abc"),
        (puts[2].id, "pending", None),
    ]
    # history: the user turn, then the assistant parts
    hist = await store.history(S1, 10)
    assert [(h.role, h.content, h.run_id) for h in hist] == [
        ("user", "q1\n\nq2", "run-abc"),
        ("assistant", "part one", "run-abc"),
        ("assistant", "part two", "run-abc"),
    ]
    assert hist[1].reply == replies[0]
    # outbox parts in order
    assert [(p.seq, p.reply.text, p.run_id, p.session) for p in parts] == [
        (0, "part one", "run-abc", S1),
        (1, "part two", "run-abc", S1),
    ]
    assert parts[0].id < parts[1].id
    assert await store.outbox_pending(S1) == parts
    # the run is recorded
    runs = await query(
        store,
        "SELECT id, session, status, steps, tool_calls, input_tokens, output_tokens,"
        " limits_hit, inbox_ids FROM runs",
    )
    assert runs == [
        (
            "run-abc",
            S1,
            "ok",
            2,
            1,
            120,
            30,
            '["max_steps"]',
            f"[{puts[0].id}, {puts[1].id}]",
        )
    ]


async def test_a_turn_keeps_the_handoff_an_operator_set_while_it_ran(store: Store) -> None:
    """The turn's new state is built from its copy of the old one; written as it was, it
    undid the operator's pause and the bot answered the customer again."""
    put = await store.put_inbound(S1, msg(text="q"), 100)
    await store.set_state(S1, {"plan": "old"})
    assert await store.acquire_lease(S1, "w1", 30.0)
    pause = {"reason": "operator", "at": 1.0, "run": None}
    await store.set_state(S1, {"plan": "old", "handoff": pause})  # the operator, meanwhile
    await store.complete_turn("w1", run_for(S1, [put.id]), "q", [], {"plan": "new"})
    assert (await store.get_session(S1)).state == {"plan": "new", "handoff": pause}


async def test_a_turn_unless_paused_writes_nothing_once_an_operator_has_the_session(
    store: Store,
) -> None:
    """The check for a pause is made in the commit's transaction: made by a read before it,
    a pause that came between the two let the answer through."""
    put = await store.put_inbound(S1, msg(text="q"), 100)
    assert await store.acquire_lease(S1, "w1", 30.0)
    pause = {"reason": "operator", "at": 1.0, "run": None}
    await store.set_state(S1, {"plan": "old", "handoff": pause})
    with pytest.raises(SessionPaused):
        await store.complete_turn(
            "w1", run_for(S1, [put.id]), "q", [Reply(text="a")], {"plan": "new"}, unless_paused=True
        )
    assert [i.id for i in await store.pending(S1)] == [put.id]
    assert await store.outbox_pending(S1) == []
    assert await store.history(S1, 10) == []
    assert await query(store, "SELECT id FROM runs") == []
    assert (await store.get_session(S1)).state == {"plan": "old", "handoff": pause}
    # the lease is checked first: a run that lost it is told so, paused or not
    with pytest.raises(StoreError) as lost:
        await store.complete_turn("w2", run_for(S1, [put.id]), "q", [], unless_paused=True)
    assert not isinstance(lost.value, SessionPaused)
    # handed back: the same commit goes through
    await store.set_state(S1, {"plan": "old"})
    await store.complete_turn(
        "w1", run_for(S1, [put.id]), "q", [Reply(text="a")], {"plan": "new"}, unless_paused=True
    )
    assert await store.pending(S1) == []
    assert [p.reply.text for p in await store.outbox_pending(S1)] == ["a"]


async def test_complete_turn_without_the_lease_raises_and_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    put = await store.put_inbound(S1, msg(text="q"), 100)
    assert await store.acquire_lease(S1, "owner-a", 30.0)
    with pytest.raises(StoreError):
        await store.complete_turn(
            "owner-b", run_for(S1, [put.id], run_id="stolen"), "q", [Reply(text="answer")]
        )
    assert [i.id for i in await store.pending(S1)] == [put.id]
    assert await store.outbox_pending(S1) == []
    assert await store.history(S1, 10) == []
    assert await query(store, "SELECT id FROM runs") == []
    # after release, nobody holds it: still refused
    await store.release_lease(S1, "owner-a")
    with pytest.raises(StoreError):
        await store.complete_turn("owner-a", run_for(S1, [put.id]), "q", [Reply(text="a")])
    assert [i.id for i in await store.pending(S1)] == [put.id]


# leases


async def test_lease_acquire_renew_release(store: Store) -> None:
    assert await store.acquire_lease(S1, "a", 30.0)
    assert await store.acquire_lease(S1, "a", 30.0)  # the same owner re-acquires
    assert not await store.acquire_lease(S1, "b", 30.0)
    assert await store.renew_lease(S1, "a", 30.0)
    assert not await store.renew_lease(S1, "b", 30.0)
    await store.release_lease(S1, "b")  # not the owner: no effect
    assert not await store.acquire_lease(S1, "b", 30.0)
    await store.release_lease(S1, "a")
    assert not await store.renew_lease(S1, "a", 30.0)
    assert await store.acquire_lease(S1, "b", 30.0)
    # leases are per session
    assert await store.acquire_lease(S2, "a", 30.0)


async def test_leases_renew_together_only_where_still_held(store: Store) -> None:
    s3 = "default:web:default:carol"
    for s in (S1, S2, s3):
        assert await store.acquire_lease(s, "a", 0.3)
    await store.release_lease(S2, "a")  # released: not renewed, not taken back
    await store.release_lease(s3, "a")
    assert await store.acquire_lease(s3, "b", 30.0)  # taken by another replica
    never = "default:web:default:never-leased"
    assert await store.renew_leases([S1, S2, s3, never], "a", 30.0) == {S1}
    assert await store.renew_leases([], "a", 30.0) == set()
    await asyncio.sleep(0.4)  # past the first ttl: S1 is still held by the renewal
    assert not await store.acquire_lease(S1, "b", 30.0)
    assert await store.acquire_lease(S2, "b", 30.0)
    assert not await store.acquire_lease(s3, "a", 30.0)


async def test_lease_can_be_taken_over_after_expiry(store: Store) -> None:
    assert await store.acquire_lease(S1, "a", 0.05)
    assert not await store.acquire_lease(S1, "b", 0.05)
    await asyncio.sleep(0.15)
    assert await store.acquire_lease(S1, "b", 30.0)
    assert not await store.renew_lease(S1, "a", 30.0)
    assert not await store.acquire_lease(S1, "a", 30.0)


async def test_renew_extends_the_lease(store: Store) -> None:
    assert await store.acquire_lease(S1, "a", 0.2)
    await asyncio.sleep(0.1)
    assert await store.renew_lease(S1, "a", 30.0)
    await asyncio.sleep(0.2)  # past the first ttl, within the renewed one
    assert not await store.acquire_lease(S1, "b", 30.0)


# history and transcript


async def test_history_limit_returns_newest_oldest_first(store: Store) -> None:
    for i in (1, 2, 3):
        await turn(store, S1, f"u{i}", f"a{i}")
    assert [h.content for h in await store.history(S1, 3)] == ["a2", "u3", "a3"]
    assert [h.content for h in await store.history(S1, 100)] == [
        "u1",
        "a1",
        "u2",
        "a2",
        "u3",
        "a3",
    ]
    assert [h.role for h in await store.history(S1, 2)] == ["user", "assistant"]
    assert await store.history(S2, 10) == []


async def test_history_only_shows_current_epoch_after_reset(store: Store) -> None:
    await turn(store, S1, "old question", "old answer")
    await store.reset_session(S1)
    assert await store.history(S1, 10) == []
    await turn(store, S1, "new question", "new answer")
    assert [h.content for h in await store.history(S1, 10)] == ["new question", "new answer"]


async def test_transcript_in_time_order_since_last_reset(store: Store) -> None:
    await turn(store, S1, "before reset", "old reply")
    assert [e.text for e in await store.transcript(S1, 10)] == ["before reset", "old reply"]
    await asyncio.sleep(0.01)
    await store.reset_session(S1)
    await asyncio.sleep(0.01)
    assert await store.transcript(S1, 10) == []

    first = await store.put_inbound(S1, msg(text="one"), 100)
    await asyncio.sleep(0.01)
    assert await store.acquire_lease(S1, "w", 30.0)
    parts = await store.complete_turn(
        "w", run_for(S1, [first.id]), "one", [Reply(text="reply one")]
    )
    await asyncio.sleep(0.01)
    second = await store.put_inbound(S1, msg(text="two"), 100)
    entries = await store.transcript(S1, 10)
    assert [(e.id, e.role, e.text) for e in entries] == [
        (f"in-{first.id}", "user", "one"),
        (f"out-{parts[0].id}", "assistant", "reply one"),
        (f"in-{second.id}", "user", "two"),
    ]
    assert entries[1].reply == Reply(text="reply one")
    assert [e.ts for e in entries] == sorted(e.ts for e in entries)
    # the limit keeps the newest entries
    assert [e.text for e in await store.transcript(S1, 2)] == ["reply one", "two"]
    # other sessions are not mixed in
    assert await store.transcript(S2, 10) == []


async def test_a_message_queued_behind_a_reset_belongs_to_the_fresh_session(store: Store) -> None:
    """A runs; /reset and then C arrive meanwhile. The reset is processed after A's turn, C is
    answered in the fresh session, and the transcript showed C's answer without C (it kept
    only messages received after the reset was processed)."""
    a = await store.put_inbound(S1, msg(text="A"), 100)
    reset = await store.put_inbound(S1, msg(text="/reset"), 100)
    c = await store.put_inbound(S1, msg(text="C"), 100)
    assert await store.acquire_lease(S1, "w", 30.0)
    await store.complete_turn("w", run_for(S1, [a.id]), "A", [Reply(text="answer A")])
    await asyncio.sleep(0.01)
    [item] = [i for i in await store.pending(S1) if i.id == reset.id]
    await store.reset_session(S1, item.message.received_at)
    await store.complete_turn(
        "w", run_for(S1, [reset.id]), "", [Reply(text="fresh start")], remember=False
    )
    await store.complete_turn("w", run_for(S1, [c.id]), "C", [Reply(text="answer C")])
    entries = await store.transcript(S1, 10)
    assert [e.text for e in entries] == ["fresh start", "C", "answer C"]


# session state


async def test_transcript_puts_a_reply_after_what_it_answered(store: Store) -> None:
    """A message that arrives while a run streams must not split that run from its reply."""
    first = await store.put_inbound(S1, msg(text="one"), 100)
    await asyncio.sleep(0.01)
    second = await store.put_inbound(S1, msg(text="two"), 100)  # arrives mid-run
    await asyncio.sleep(0.01)
    assert await store.acquire_lease(S1, "w", 30.0)
    await store.complete_turn("w", run_for(S1, [first.id]), "one", [Reply(text="re: one")])
    entries = await store.transcript(S1, 10)
    assert [e.text for e in entries] == ["one", "re: one", "two"]
    assert second.id > first.id


async def test_transcript_never_puts_a_reply_before_one_sent_earlier(store: Store) -> None:
    """An operator answers while the session is handed off; the agent's reply to the held
    message comes later: the person saw the operator's first, and so does the transcript."""
    held = await store.put_inbound(S1, msg(text="after handoff"), 100)
    await asyncio.sleep(0.01)
    await store.enqueue_replies(S1, [Reply(text="OPERATOR")])
    await asyncio.sleep(0.01)
    assert await store.acquire_lease(S1, "w", 30.0)
    await store.complete_turn("w", run_for(S1, [held.id]), "x", [Reply(text="echo")])
    entries = await store.transcript(S1, 10)
    assert [e.text for e in entries] == ["after handoff", "OPERATOR", "echo"]


async def test_set_state_and_get_session(store: Store) -> None:
    fresh = await store.get_session(S1)
    assert (fresh.key, fresh.epoch, fresh.state) == (S1, 0, {})
    state = {"plan": {"goal": "book a repair"}, "context": ["hours.md"], "state": {"step": 2}}
    await store.set_state(S1, state)
    assert (await store.get_session(S1)).state == state
    await store.set_state(S1, {"state": {"step": 3}})  # overwritten, not merged
    assert (await store.get_session(S1)).state == {"state": {"step": 3}}
    assert (await store.get_session(S2)).state == {}
    await store.reset_session(S1)
    after = await store.get_session(S1)
    assert (after.epoch, after.state) == (1, {})


# outbox


async def test_outbox_mark_sent_and_failed(store: Store, tmp_path: Path) -> None:
    sent, retry, dead = await store.enqueue_replies(
        S1, [Reply(text="sent"), Reply(text="retry"), Reply(text="dead")]
    )
    assert [p.seq for p in (sent, retry, dead)] == [0, 1, 2]

    await store.mark_sent(sent.id, "platform-9")
    assert [p.id for p in await store.outbox_pending(S1)] == [retry.id, dead.id]

    await store.mark_failed(retry.id, "429", permanent=False)
    await store.mark_failed(retry.id, "429", permanent=False)
    pending = await store.outbox_pending(S1)
    assert [(p.id, p.attempts) for p in pending] == [(retry.id, 2), (dead.id, 0)]

    await store.mark_failed(dead.id, "403 forbidden", permanent=True)
    assert [p.id for p in await store.outbox_pending(S1)] == [retry.id]

    rows = await query(store, "SELECT id, status, platform_id, error FROM outbox ORDER BY id")
    assert rows == [
        (sent.id, "sent", "platform-9", None),
        (retry.id, "pending", None, "429"),
        (dead.id, "failed", None, "403 forbidden"),
    ]


async def test_sessions_with_work(store: Store) -> None:
    s_inbox, s_outbox, s_done = "k:web:default:in", "k:web:default:out", "k:web:default:done"
    await store.put_inbound(s_inbox, msg(text="waiting", conversation="in"), 100)
    await store.enqueue_replies(s_outbox, [Reply(text="undelivered")])
    parts = await turn(store, s_done, "q", "a")
    await store.mark_sent(parts[0].id, None)
    assert sorted(await store.sessions_with_work()) == [s_inbox, s_outbox]

    for part in await store.outbox_pending(s_outbox):
        await store.mark_failed(part.id, "gone", permanent=True)
    assert await store.sessions_with_work() == [s_inbox]


# durability


async def test_data_survives_a_restart(open_store: Opener) -> None:
    first = await open_store()
    put = await first.put_inbound(S1, msg("tg-7", text="still there?"), 100)
    await first.set_state(S1, {"state": {"step": 1}})
    await turn(first, S2, "q", "unsent answer")
    await first.aclose()

    second = await open_store()
    try:
        assert [(i.id, i.message.text) for i in await second.pending(S1)] == [
            (put.id, "still there?")
        ]
        assert (await second.get_session(S1)).state == {"state": {"step": 1}}
        assert [p.reply.text for p in await second.outbox_pending(S2)] == ["unsent answer"]
        assert [h.content for h in await second.history(S2, 10)] == ["q", "unsent answer"]
        redelivered = await second.put_inbound(S1, msg("tg-7", text="still there?"), 100)
        assert (redelivered.id, redelivered.status) == (put.id, InboxStatus.DUPLICATE)
        assert sorted(await second.sessions_with_work()) == [S1, S2]
    finally:
        await second.aclose()


# the writer


async def test_group_commit_uses_far_fewer_transactions(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    batches: list[int] = []
    original = sqlite_module._run_batch

    def counting(conn: sqlite3.Connection, fns: list[Any], durable: bool = True) -> list[Any]:
        batches.append(len(fns))
        return original(conn, fns, durable)

    monkeypatch.setattr(sqlite_module, "_run_batch", counting)
    results = await asyncio.gather(
        *(store.put_inbound(S1, msg(f"burst-{i}", text=f"m{i}"), 1000) for i in range(500))
    )
    assert all(r.status is InboxStatus.PENDING for r in results)
    assert len({r.id for r in results}) == 500
    assert len(await store.pending(S1)) == 500
    assert sum(batches) == 500
    assert 1 <= len(batches) < 100


async def test_only_lease_batches_commit_without_waiting_for_the_disk(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    seen: list[tuple[int, bool, str]] = []
    original = sqlite_module._run_batch

    def recording(conn: sqlite3.Connection, fns: list[Any], durable: bool = True) -> list[Any]:
        results = original(conn, fns, durable)
        level = conn.execute("PRAGMA synchronous").fetchone()[0]
        seen.append((len(fns), durable, {1: "NORMAL", 2: "FULL"}[level]))
        return results

    monkeypatch.setattr(sqlite_module, "_run_batch", recording)
    assert await store.acquire_lease(S1, "me", 30)
    assert await store.renew_lease(S1, "me", 30)
    await store.put_inbound(S1, msg(text="kept"), 10)
    await store.release_lease(S1, "me")
    await asyncio.gather(store.acquire_lease(S2, "me", 30), store.put_inbound(S2, msg(), 10))
    assert seen == [
        (1, False, "NORMAL"),
        (1, False, "NORMAL"),
        (1, True, "FULL"),
        (1, False, "NORMAL"),
        (2, True, "FULL"),  # one durable op makes its whole batch durable
    ]


async def test_one_failing_op_does_not_fail_its_batch(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    batches: list[int] = []
    original = sqlite_module._run_batch

    def counting(conn: sqlite3.Connection, fns: list[Any], durable: bool = True) -> list[Any]:
        batches.append(len(fns))
        return original(conn, fns, durable)

    monkeypatch.setattr(sqlite_module, "_run_batch", counting)

    def poison(c: sqlite3.Connection) -> None:
        # writes something, then fails: the write must be rolled back
        c.execute(
            "INSERT INTO inbox (session, channel, account, platform_id, payload, status,"
            " received_at) VALUES ('poison', 'web', 'default', 'px', '{}', 'pending', 0)"
        )
        raise RuntimeError("boom")

    results = await asyncio.gather(
        store.put_inbound(S1, msg(text="n1"), 100),
        store.put_inbound(S1, msg(text="n2"), 100),
        store._write(poison),
        store.put_inbound(S1, msg(text="n3"), 100),
        return_exceptions=True,
    )
    assert batches[0] == 4  # they really were one batch
    assert isinstance(results[2], StoreError)
    assert [getattr(r, "status", None) for r in (results[0], results[1], results[3])] == [
        InboxStatus.PENDING
    ] * 3
    assert [i.message.text for i in await store.pending(S1)] == ["n1", "n2", "n3"]
    assert await store.pending("poison") == []
    assert await store.sessions_with_work() == [S1]


class _Refusing(sqlite3.Connection):
    """A connection on which every statement fails with one SQLite error code."""

    code = sqlite3.SQLITE_BUSY

    def execute(self, *args: Any) -> sqlite3.Cursor:
        err = sqlite3.OperationalError(f"refused ({self.code})")
        err.sqlite_errorcode = self.code
        raise err


class _Corrupt(_Refusing):
    code = sqlite3.SQLITE_CORRUPT


async def test_lookups_stay_on_the_loop_unless_sqlite_would_wait(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    await store.put_inbound(S1, msg(text="here"), 10)
    handed: list[str] = []
    original = store._reader.call

    async def counting(fn: Callable[[sqlite3.Connection], Any]) -> Any:
        handed.append("reader")
        return await original(fn)

    monkeypatch.setattr(store._reader, "call", counting)
    assert [i.message.text for i in await store.pending(S1)] == ["here"]
    assert (await store.get_session(S1)).epoch == 0
    assert handed == []  # no thread hand-off for a lookup

    assert store._local is not None
    store._local.close()
    store._local = sqlite3.connect(store._path, factory=_Refusing)
    assert [i.message.text for i in await store.pending(S1)] == ["here"]  # busy: the thread
    assert handed == ["reader"]
    store._local.close()
    store._local = sqlite3.connect(store._path, factory=_Corrupt)
    with pytest.raises(StoreError, match="store read failed"):  # any other error is one
        await store.pending(S1)


async def test_operations_after_close_raise_store_error(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "closed.db")
    await s.start()
    await s.put_inbound(S1, msg(text="x"), 10)
    await s.aclose()
    with pytest.raises(StoreError):
        await s.put_inbound(S1, msg(text="y"), 10)
    with pytest.raises(StoreError):
        await s.pending(S1)
    with pytest.raises(StoreError):
        await s.ping()
    with pytest.raises(StoreError):
        await s.acquire_lease(S1, "a", 1.0)


async def test_queued_writes_finish_before_close(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "drain.db")
    await s.start()
    tasks = [asyncio.create_task(s.put_inbound(S1, msg(text=f"d{i}"), 100)) for i in range(20)]
    await asyncio.sleep(0)  # queued, not yet committed
    await s.aclose()
    assert all(t.result().status is InboxStatus.PENDING for t in tasks)
    rows = await query(s, "SELECT count(*) FROM inbox")
    assert rows == [(20,)]


async def test_a_closed_sqlite_store_starts_again_with_its_data(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "again.db")
    await store.start()
    await store.put_inbound(S1, msg(text="before"), 10)
    await store.aclose()
    with pytest.raises(StoreError):
        await store.pending(S1)
    await store.start()
    try:
        assert [i.message.text for i in await store.pending(S1)] == ["before"]
        await store.put_inbound(S1, msg(text="after"), 10)
        assert len(await store.pending(S1)) == 2
    finally:
        await store.aclose()


async def test_the_wal_is_checkpointed_beside_the_writer_and_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits never checkpoint (that stalled a batch for milliseconds); a checkpoint on the
    reader's thread copies the WAL into the database while writes go on, and the writer
    starts the WAL over once it is big, so it does not grow with everything ever written."""
    monkeypatch.setattr(sqlite_module, "WAL_RESTART_PAGES", 50)
    path = tmp_path / "wal.db"
    wal = tmp_path / "wal.db-wal"
    store = SqliteStore(path, checkpoint_interval_s=0.02)
    await store.start()
    try:
        autocheckpoint = await store._writer.call(
            lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        )
        assert autocheckpoint == 0
        written = 0

        async def writer() -> None:  # writes without pause: checkpoints run beside them
            nonlocal written
            while written < 6_000_000:  # an amount, not a time: the WAL's floor is fixed
                await store.put_inbound(S1, msg(text="x" * 4000), 100_000)
                written += 4000

        await asyncio.gather(*(writer() for _ in range(8)))
        assert len(await store.pending(S1)) == written // 4000
        # (closing the last connection checkpoints and removes the WAL: read it while open)
        assert path.stat().st_size > written / 2  # copied into the database
        # and the WAL is started over: by the next writes once the checkpoint has caught up
        # (on a loaded machine it may still be behind when the burst ends)
        async with asyncio.timeout(10):
            while wal.stat().st_size >= written / 2:
                await store.put_inbound(S1, msg(text="y"), 100_000)
                await asyncio.sleep(0.05)
    finally:
        await store.aclose()


async def test_a_failing_checkpoint_is_logged_once_until_one_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = True

    def checkpoint(conn: sqlite3.Connection) -> int:
        if broken:
            raise sqlite3.OperationalError("disk I/O error")
        return 0

    monkeypatch.setattr(sqlite_module, "_checkpoint", checkpoint)
    caplog.set_level(logging.INFO, logger=sqlite_module.__name__)
    store = SqliteStore(tmp_path / "ckpt.db", checkpoint_interval_s=0.01)
    await store.start()
    try:
        for i in range(5):  # a write, then a checkpoint attempt after it, five times
            await store.put_inbound(S1, msg(text=f"w{i}"), 100)
            await asyncio.sleep(0.05)
        broken = False
        await store.put_inbound(S1, msg(text="again"), 100)
        for _ in range(500):  # the next checkpoint, however slow the machine
            if any("again" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.01)
    finally:
        await store.aclose()
    said = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert said == [
        "SQLite checkpoint failed (the WAL grows until one works): disk I/O error",
        "SQLite checkpoints work again",
    ]
    assert len(await query(store, "SELECT id FROM inbox")) == 6  # writes went on


async def test_ping(store: Store) -> None:
    assert await store.ping() is None


async def test_start_on_an_unusable_path_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    s = SqliteStore(blocker / "sub" / "db.sqlite")
    with pytest.raises(StoreError):
        await s.start()


@pytest_asyncio.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "writer.db")
    await s.start()
    yield s
    await s.aclose()


async def test_migrations_are_idempotent(open_store: Opener) -> None:
    first = await open_store()
    await first.put_inbound(S1, msg(text="kept"), 10)
    second = await open_store()  # applies nothing twice, loses nothing
    assert [i.message.text for i in await second.pending(S1)] == ["kept"]
    assert await query(second, "SELECT version FROM schema_version ORDER BY version") == [
        (version,) for version, _ in migrations_of(second)
    ]


async def test_an_old_schema_is_migrated_forward_keeping_its_data(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.store.postgres as pg_module
    import core.store.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "MIGRATIONS", sqlite_module.MIGRATIONS[:1])
    monkeypatch.setattr(pg_module, "MIGRATIONS", pg_module.MIGRATIONS[:1])
    old = await open_store()
    kept = msg(text="from v1")  # written as the code of v1 wrote it
    await query(
        old,
        "INSERT INTO inbox (session, channel, account, platform_id, payload, status,"
        " received_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
        (S1, kept.channel, kept.account, kept.platform_id, kept.model_dump_json(), 1.0),
    )
    await old.aclose()
    monkeypatch.undo()
    new = await open_store()
    assert [i.message.text for i in await new.pending(S1)] == ["from v1"]
    assert await new.reserve_usage("2026-01-01", 1.0, [Quota("user", "u", 5.0)]) is None  # v2
    assert await new.usage("2026-01-01", "user", "u") == 1.0
    await new.put_inbound(S1, msg(text="after"), 10)  # v3 (PostgreSQL): one round trip
    assert [i.message.text for i in await new.pending(S1)] == ["from v1", "after"]
    assert await new.last_inbound_at(S1) is not None  # indexed since v3 (SQLite), v4
    versions = await query(new, "SELECT version FROM schema_version ORDER BY version")
    assert versions == [(version,) for version, _ in migrations_of(new)]


async def test_last_inbound_is_the_newest_arrival_of_that_session_found_by_index(
    store: Store,
) -> None:
    assert await store.last_inbound_at(S1) is None
    for n, at in enumerate((1000.0, 3000.0, 2000.0)):  # a late redelivery of an older one
        await store.put_inbound(S1, msg(f"m{n}", received_at=at), 10)
    await store.put_inbound(S2, msg("other", received_at=9000.0), 10)
    assert await store.last_inbound_at(S1) == 3000.0
    sql = "SELECT max(received_at) FROM inbox WHERE session = $1"
    if isinstance(store, SqliteStore):
        plan = await query(store, "EXPLAIN QUERY PLAN " + sql.replace("$1", "?"), (S1,))
    else:
        import asyncpg

        conn = await asyncpg.connect(store._dsn)  # type: ignore[attr-defined]
        try:
            await conn.execute("SET enable_seqscan = off")  # a tiny table would be scanned
            plan = [tuple(r) for r in await conn.fetch("EXPLAIN " + sql, S1)]
        finally:
            await conn.close()
    assert "inbox_received" in str(plan)


def migrations_of(store: Store) -> list[tuple[int, str]]:
    import core.store.postgres_schema as pg_schema_module
    import core.store.sqlite_schema as sqlite_schema_module

    if isinstance(store, SqliteStore):
        return sqlite_schema_module.MIGRATIONS
    return pg_schema_module.MIGRATIONS


async def test_expired_lease_hides_nothing_from_the_sweep(store: Store) -> None:
    await store.put_inbound(S1, msg(text="orphan"), 10)
    assert await store.acquire_lease(S1, "dead-replica", 0.2)
    assert await store.sessions_with_work() == []  # held by a live lease
    await asyncio.sleep(0.3)
    assert await store.sessions_with_work() == [S1]  # expired: another replica takes it
    assert await store.acquire_lease(S1, "new-replica", 5.0)


@contextlib.asynccontextmanager
async def replicas(*urls: str) -> AsyncIterator[list[PostgresStore]]:
    """One started PostgresStore per URL, as separate gateway replicas would have."""
    stores = [PostgresStore(url) for url in urls]
    try:
        for s in stores:
            await s.start()
        yield stores
    finally:
        for s in stores:
            await s.aclose()


async def test_postgres_notifies_other_replicas_not_itself(pg_url: str) -> None:
    async with replicas(pg_url, pg_url) as (a, b):
        heard: asyncio.Queue[str] = asyncio.Queue()
        await a.listen(heard.put_nowait)
        await a.put_inbound(S1, msg(text="from a"), 10)  # a's own message: no wake-up
        started = time.monotonic()
        await b.put_inbound(S2, msg(text="from b"), 10)
        assert await asyncio.wait_for(heard.get(), 5) == S2
        assert time.monotonic() - started < 1.0  # milliseconds in practice; no polling
        await asyncio.sleep(0.1)
        assert heard.empty()


async def test_postgres_deployments_in_other_schemas_never_wake_each_other() -> None:
    """NOTIFY channels span the database: a deployment in another schema (?search_path=, as
    the README advises) woke runners for every session of this one, which took leases and
    wrote rows in its own tables."""
    async with (
        pg_schema() as url_a,
        pg_schema() as url_b,
        replicas(url_a, url_a, url_b) as (a, a2, b),
    ):
        heard_a: asyncio.Queue[str] = asyncio.Queue()
        heard_b: asyncio.Queue[str] = asyncio.Queue()
        await a.listen(heard_a.put_nowait)
        await b.listen(heard_b.put_nowait)
        await a2.put_inbound(S1, msg(text="for deployment a"), 10)
        assert await asyncio.wait_for(heard_a.get(), 5) == S1
        await asyncio.sleep(0.2)
        assert heard_b.empty()
        assert await b.sessions_with_work() == []


async def test_postgres_a_lease_let_go_with_work_left_wakes_the_other_replicas(
    pg_url: str,
) -> None:
    """A draining replica handed a session back in silence: the others took it at their next
    sweep (poll_interval_s), not at once."""
    async with replicas(pg_url, pg_url) as (a, b):
        heard: asyncio.Queue[str] = asyncio.Queue()
        await b.listen(heard.put_nowait)
        assert await a.acquire_lease(S1, "a", 30.0)
        await a.release_lease(S1, "a")  # nothing left to do: nobody is woken
        await asyncio.sleep(0.2)
        assert heard.empty()
        assert await a.acquire_lease(S1, "a", 30.0)
        await a.put_inbound(S1, msg(text="arrived meanwhile"), 10)
        assert await asyncio.wait_for(heard.get(), 5) == S1
        await a.release_lease(S1, "a")
        assert await asyncio.wait_for(heard.get(), 5) == S1


async def test_delivery_reports_only_move_forward(store: Store) -> None:
    (part,) = await store.enqueue_replies(S1, [Reply(text="hi")])
    await store.mark_sent(part.id, "wamid.1")
    assert await store.update_delivery("web", "wamid.1", "read")
    assert await store.update_delivery("web", "wamid.1", "delivered")  # late: known, ignored
    assert await store.delivery(part.id) == ("sent", "read", None)
    assert await store.update_delivery("web", "wamid.1", "failed", "131026")
    assert await store.delivery(part.id) == ("sent", "failed", "131026")
    assert not await store.update_delivery("web", "wamid.unknown", "read")
    await store.kv_set("ns", "k", "v")
    await store.kv_delete("ns", "k")
    assert await store.kv_get("ns", "k") is None


async def test_what_a_reply_quotes_is_found_by_its_platform_id(store: Store) -> None:
    (part,) = await store.enqueue_replies(S1, [Reply(text="Option B: the blue one")])
    await store.mark_sent(part.id, "wamid.OUT1")
    await store.put_inbound(S1, msg("wamid.IN1", text="my order 991", account="1001"), 10)
    assert await store.quoted(S1, "wamid.OUT1") == ("assistant", "Option B: the blue one")
    assert await store.quoted(S1, "wamid.IN1") == ("user", "my order 991")
    assert await store.quoted(S1, "wamid.nope") is None
    # another conversation's messages, though the platform names them by id: never quoted
    assert await store.quoted(S2, "wamid.OUT1") is None
    assert await store.quoted(S2, "wamid.IN1") is None


async def test_every_announced_key_value_change_is_told_to_the_namespace_watchers(
    store: Store,
) -> None:
    from core.policies import KvWatchingStore

    assert isinstance(store, KvWatchingStore)
    heard: list[str | None] = []
    await store.watch_kv("ns", heard.append)
    assert store.kv_watched()
    heard.clear()  # PostgreSQL: a new LISTEN connection first says "forget everything"
    await store.kv_set("ns", "a", "1", announce=True)
    await store.kv_set("other", "b", "1", announce=True)  # another namespace: not told
    await store.kv_set("ns", "quiet", "1")  # not announced: nobody is told (no NOTIFY)
    assert await store.kv_get("ns", "quiet") == "1"
    await store.kv_delete("ns", "quiet")
    await store.kv_set("ns", "a", "2", announce=True)
    assert await store.kv_get("ns", "a") == "2"  # announced or not, the change is made
    await store.kv_delete("ns", "a", announce=True)
    assert await store.kv_get("ns", "a") is None
    assert await store.kv_get("ns", "quiet") is None
    deadline = time.monotonic() + 5
    while len(heard) < 3 and time.monotonic() < deadline:  # PostgreSQL: by NOTIFY
        await asyncio.sleep(0.01)
    assert heard == ["a", "a", "a"]


async def test_queue_depth_counts_pending_messages(store: Store) -> None:
    assert await store.queue_depth() == 0
    await store.put_inbound(S1, msg(text="a"), 10)
    await store.put_inbound(S2, msg(text="b", conversation="bob"), 10)
    assert await store.queue_depth() == 2


async def test_postgres_gives_connections_back_without_a_reset_round_trip(pg_url: str) -> None:
    """One store call is one round trip: no UNLISTEN/RESET ALL on release. An unfinished
    transaction is still rolled back before the connection is reused."""
    store = PostgresStore(pg_url, min_size=1, max_size=1)
    await store.start()
    try:
        assert store._pool is not None
        # the driver looks up the array types a put sends once per connection
        await store.put_inbound(S2, msg(text="first on this connection", conversation="bob"), 10)
        sent: list[str] = []
        async with store._pool.acquire() as conn:
            conn.add_query_logger(lambda record: sent.append(record.query))
        await store.put_inbound(S1, msg(text="one trip"), 10)
        await store.pending(S1)
        assert len(sent) == 2  # the put and the read, nothing else
        assert not [q for q in sent if "RESET" in q or "UNLISTEN" in q]

        async with store._pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute("UPDATE inbox SET status = 'held'")
        assert [i.message.text for i in await store.pending(S1)] == ["one trip"]
    finally:
        await store.aclose()


async def test_prune_deletes_only_what_is_over(store: Store) -> None:
    """Retention: answered messages, history, sent and failed parts, ended runs, earlier
    days' usage, stale channel state and the sessions left empty go; anything with work,
    a lease or a kept namespace stays."""
    parts = await turn(store, S1, "old question", "old answer")
    await store.mark_sent(parts[0].id, "wamid.1")
    await store.put_inbound(S2, msg(text="still waiting", conversation="bob"), 100)
    held = "default:web:default:carol"
    await store.put_inbound(held, msg(text="for the operator", conversation="carol"), 100)
    await store.hold_pending(held)
    notice = "default:web:default:dave"
    await store.enqueue_replies(notice, [Reply(text="not sent yet")])
    leased = "default:web:default:erin"
    assert await store.acquire_lease(leased, "w9", 60.0)
    await store.kv_set("scratch", "k", "v")
    await store.kv_set("keep.me", "k", "v")
    # two days back: yesterday's counter is not over yet within an hour after midnight UTC
    over = utc_day(time.time() - 2 * 86400)
    await store.reserve_usage(over, 1.0, [Quota("user", "alice", 5)])
    await store.reserve_usage(utc_day(time.time()), 1.0, [Quota("user", "alice", 5)])

    sessions = {r[0] for r in await query(store, "SELECT key FROM sessions")}
    early = await store.prune(time.time() - 3600, keep_namespaces=["keep.me"])
    assert {t: n for t, n in early.items() if n} == {"usage": 1}  # the old counter only
    deleted = await store.prune(time.time() + 1, keep_namespaces=["keep.me"], limit=1)
    assert deleted == {
        "inbox": 1,
        "messages": 1,  # the question; the answer is left: the limit
        "outbox": 1,
        "runs": 1,
        "usage": 0,  # gone in the first call
        "channel_state": 1,
        "sessions": 0,  # alice still has a history row
    }
    calls = 1
    while any(deleted.values()):
        deleted = await store.prune(time.time() + 1, keep_namespaces=["keep.me"], limit=1)
        calls += 1
    assert calls <= 5

    assert await store.history(S1, 10) == []
    assert [i.message.text for i in await store.pending(S2)] == ["still waiting"]
    assert [r[0] for r in await query(store, "SELECT status FROM inbox ORDER BY id")] == [
        "pending",
        "held",
    ]
    assert [p.reply.text for p in await store.outbox_pending(notice)] == ["not sent yet"]
    assert await store.kv_get("scratch", "k") is None
    assert await store.kv_get("keep.me", "k") == "v"
    assert await store.usage(over, "user", "alice") == 0
    assert await store.usage(utc_day(time.time()), "user", "alice") == 1
    assert S1 in sessions
    assert leased in sessions
    assert {r[0] for r in await query(store, "SELECT key FROM sessions")} == sessions - {S1}


async def test_the_console_lists_from_the_newest_rows_what_a_full_read_would(
    store: Store,
) -> None:
    """The session list read every row ever stored (once a second while a console was
    open); it reads the newest rows and the sessions waiting for an operator, and must list
    exactly what reading everything would, in the same order."""
    from core.store.admin import console

    admin = console(store)
    paused = "default:web:default:paused"
    await turn(store, paused, "old", "answer")
    await store.set_state(paused, {"handoff": {"reason": "r", "at": 1.0, "run": None}})
    held = "default:web:default:held"
    await store.put_inbound(held, msg(text="for a person", conversation="held"), 100)
    await store.hold_pending(held)
    for n in range(60):
        await turn(store, f"default:web:default:s{n:02d}", f"q{n}", f"a{n}")
    hot = "default:web:default:hot"
    for n in range(40):  # the newest rows are all one session's
        await turn(store, hot, f"h{n}", f"ha{n}")
    await store.enqueue_replies("default:web:default:notice", [Reply(text="a notice")])

    for limit, offset in ((10, 0), (10, 10), (25, 40), (200, 0)):
        listed = [r.key for r in await admin.sessions(limit, offset=offset)]
        everything = [r.key for r in await admin._sessions("", (limit, offset))]
        assert listed == everything, (limit, offset)
    first = [r.key for r in await admin.sessions(5)]
    assert first[:2] == sorted([paused, held], key=first.index)  # waiting for an operator
    assert first[2:4] == ["default:web:default:notice", hot]
    assert len(await admin._candidates(5) or ()) < 64  # not every session


def test_processes_migrating_one_old_database_at_once_apply_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes opening a database from before an ALTER TABLE: one failed with
    "duplicate column name" (the version was read before the lock was taken)."""
    import threading

    from core.store.sqlite_schema import MIGRATIONS

    for n in range(10):
        path = tmp_path / f"old{n}.db"
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:3])
            sqlite_module._migrate(conn)
        monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS)
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def open_it(
            path: Path = path,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            with contextlib.closing(
                sqlite3.connect(path, isolation_level=None, timeout=10)
            ) as conn:
                start.wait()
                try:
                    sqlite_module._migrate(conn)
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with contextlib.closing(sqlite3.connect(path)) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM schema_version")]
        assert sorted(versions) == [v for v, _ in MIGRATIONS]


async def test_the_console_reads_further_back_when_the_newest_rows_cover_other_times(
    store: Store,
) -> None:
    """The newest messages were sent an hour ago, the newest replies now: the list stopped at
    as many sessions as it was asked for, and left out one answered in between."""
    from core.store.admin import console

    x, a, b = (f"default:web:default:{n}" for n in ("x", "a", "b"))
    hour_ago = time.time() - 3600
    await store.put_inbound(x, msg(text="x", conversation="x", received_at=hour_ago - 100), 100)
    await store.put_inbound(b, msg(text="b", conversation="b", received_at=hour_ago - 50), 100)
    for n in range(8):  # the newest inbox rows, all an hour old
        await store.put_inbound(
            a, msg(text=f"a{n}", conversation="a", received_at=hour_ago + n), 100
        )
    await store.enqueue_replies(x, [Reply(text="an operator's reply")])
    await store.enqueue_replies(b, [Reply(text=f"part {n}") for n in range(8)])
    admin = console(store)
    assert [r.key for r in await admin.sessions(2)] == [b, x]
    assert [r.key for r in await admin._sessions("", (2, 0))] == [b, x]


@pytest_asyncio.fixture
async def pg_store(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_url)
    await store.start()
    yield store
    await store.aclose()


@contextlib.asynccontextmanager
async def _holding_row(pg_url: str, session: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another replica's transaction holding a session's row (committing a turn, say) until
    the callable it gives lets go."""
    import asyncpg

    conn = await asyncpg.connect(pg_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT 1 FROM sessions WHERE key = $1 FOR UPDATE", session)
        yield tx.rollback
    finally:
        await conn.close()


async def test_postgres_stores_a_burst_in_groups_and_a_refused_put_fails_alone(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pg_store
    sizes: list[int] = []
    original = store._put_many

    async def counting(puts: Any) -> Any:
        sizes.append(len(puts))
        return await original(puts)

    monkeypatch.setattr(store._puts, "_store_many", counting)
    # a NUL, which PostgreSQL text cannot hold: the server refuses that one put
    ids = [f"g{n}" if n != 7 else "g\x007" for n in range(20)]
    results = await asyncio.gather(
        *(store.put_inbound(S1, msg(i), 100) for i in ids), return_exceptions=True
    )
    assert max(sizes) > 1  # they were grouped (the first alone, the rest behind it)
    assert isinstance(results[7], StoreError)
    kept = [r for n, r in enumerate(results) if n != 7]
    assert all(getattr(r, "status", None) is InboxStatus.PENDING for r in kept)
    items = await store.pending(S1)
    assert [i.message.platform_id for i in items] == [i for i in ids if "\x00" not in i]


async def test_postgres_a_put_waiting_on_a_locked_session_holds_the_others_up_a_second_at_most(
    pg_url: str, pg_store: PostgresStore
) -> None:
    """Another replica holds a session's row (committing a turn): that session's put waits
    at most the lock timeout, then fails (a 503: the platform delivers it again), and the
    puts of other sessions made meanwhile are stored after it, in order."""
    from core.store.postgres import LOCK_TIMEOUT_MS

    store = pg_store
    await store.put_inbound(S1, msg(text="before"), 100)
    async with _holding_row(pg_url, S1) as let_go:
        started = time.monotonic()
        waiting = asyncio.create_task(store.put_inbound(S1, msg(text="held"), 100))
        await asyncio.sleep(0.05)
        others = await asyncio.gather(
            *(store.put_inbound(S2, msg(text=f"b{i}", conversation="bob"), 100) for i in range(8))
        )
        with pytest.raises(StoreError, match="lock"):
            await waiting
        assert time.monotonic() - started < LOCK_TIMEOUT_MS / 1000 + 5  # not the 10 s timeout
        assert all(r.status is InboxStatus.PENDING for r in others)
        assert [i.message.text for i in await store.pending(S2)] == [f"b{i}" for i in range(8)]
        await let_go()
        assert (await store.put_inbound(S1, msg(text="again"), 100)).status is InboxStatus.PENDING


async def test_postgres_retention_leaves_a_session_row_another_transaction_holds(
    pg_url: str, pg_store: PostgresStore
) -> None:
    """The prune locked the empty sessions it deleted in no set order, while a group of puts
    locks its sessions in key order: the two waited on each other (a deadlock, or the puts'
    lock timeout, a 503). It now leaves a row another transaction holds, and waits for none."""
    store = pg_store
    for key in (S1, S2):  # sessions with nothing left: both due to go
        await query(store, "INSERT INTO sessions (key) VALUES (?)", (key,))
    async with _holding_row(pg_url, S1) as let_go:
        async with asyncio.timeout(5):  # it waited for the holder: 10 s, then a StoreError
            deleted = await store.prune(time.time() + 1)
        assert deleted["sessions"] == 1
        await let_go()
    assert [r[0] for r in await query(store, "SELECT key FROM sessions")] == [S1]
    assert (await store.prune(time.time() + 1))["sessions"] == 1  # once let go


async def test_postgres_a_listen_connection_cut_short_by_a_close_is_dropped(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close cancels a LISTEN reconnection at any await; the connection made by then was
    left to the garbage collector (a ResourceWarning that failed another test)."""
    import asyncpg

    store = pg_store
    made: list[asyncpg.Connection] = []
    real_connect = asyncpg.connect

    async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        made.append(await real_connect(*args, **kwargs))
        return made[-1]

    async def held(*args: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(asyncpg, "connect", connect)
    monkeypatch.setattr(asyncpg.Connection, "add_listener", held)
    task = asyncio.create_task(store._connect_listener())
    while not made:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert made[0].is_closed()
