"""What the WhatsApp channel keeps in memory to spare the store a read, and the store still
answers for: open text menus (known in memory while the store tells of every change: SQLite,
its only writer; PostgreSQL, by NOTIFY), and the 24-hour window (open while this process has
just heard from the customer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from channels.base import ChannelContext
from channels.whatsapp.client import GraphClient
from channels.whatsapp.menus import NS_MENU, Menus
from channels.whatsapp.sender import Sender
from channels.whatsapp.settings import WhatsAppSettings
from core.models import SessionKey
from core.store import Store
from tests.fake_whatsapp import until

S1, S2 = "support:whatsapp:100:111", "support:whatsapp:100:222"
MENU = [("Billing", "billing"), ("Orders", "orders"), ("Returns", "returns"), ("Other", "other")]


class CountingReads:
    """The store, with its kv reads counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def kv_get(self, namespace: str, key: str) -> str | None:
        self.reads += 1
        return await self.store.kv_get(namespace, key)


async def test_a_menu_is_seen_until_another_reply_ends_it(store: Store) -> None:
    menus = Menus(store)
    assert await menus.get(S1) == []
    await menus.show(S1, MENU)
    assert await menus.get(S1) == MENU
    assert await menus.get(S2) == []
    await menus.show(S1, [])
    assert await menus.get(S1) == []
    assert await store.kv_get(NS_MENU, S1) == ""


async def test_open_menus_survive_a_restart(store: Store) -> None:
    await Menus(store).show(S1, MENU)
    await Menus(store).show(S2, MENU)
    await Menus(store).show(S2, [])
    again = Menus(store)
    assert await again.get(S1) == MENU
    assert await again.get(S2) == []


async def test_only_the_first_look_at_a_session_costs_a_store_read(store: Store) -> None:
    counted = CountingReads(store)
    menus = Menus(counted)
    await menus.show(S1, MENU)
    await menus.start()  # after: no news of that change can arrive mid-read below
    for _ in range(5):
        assert await menus.get(S2) == []
        await menus.show(S2, [])  # a reply without a menu in a session that never had one
    assert counted.reads == 1  # on either store: both tell of every change
    assert await menus.get(S1) == MENU


async def test_a_menu_shown_elsewhere_on_the_same_store_is_heard(store: Store) -> None:
    here, there = Menus(store), Menus(store)
    await here.start()
    await there.start()
    assert await here.get(S1) == []  # remembered
    await there.show(S1, MENU)
    await until(lambda: _is(here.get(S1), MENU))


@pytest.fixture
async def replica(store: Store) -> AsyncIterator[Store]:
    """A second replica's store: another process on the same PostgreSQL database."""
    from core.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    other = PostgresStore(store._dsn)
    await other.start()
    yield other
    await other.aclose()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_replicas_remember_menus_and_hear_when_another_changes_one(
    store: Store, replica: Store
) -> None:
    counted = CountingReads(store)
    here, there = Menus(counted), Menus(replica)
    await here.start()
    await there.start()
    assert await here.get(S1) == []
    assert await here.get(S1) == []
    assert counted.reads == 1  # remembered: the store tells of changes
    await there.show(S1, MENU)  # another replica sends a menu
    await until(lambda: _is(here.get(S1), MENU))
    reads = counted.reads
    assert await here.get(S1) == MENU
    assert counted.reads == reads  # remembered again
    await there.show(S1, [])  # and ends it
    await until(lambda: _is(here.get(S1), []))


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_lost_listen_connection_forgets_what_was_remembered(
    store: Store, replica: Store
) -> None:
    from core.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    assert isinstance(replica, PostgresStore)
    counted = CountingReads(store)
    here = Menus(counted)
    await here.start()
    assert await here.get(S1) == []
    reads = counted.reads
    listener = store._listener
    assert listener is not None
    async with replica._conn() as c:  # the connection dies; changes may pass unheard
        await c.execute("SELECT pg_terminate_backend($1)", listener.get_server_pid())
    await until(lambda: store._listener not in (None, listener))  # reconnected
    assert await here.get(S1) == []
    assert counted.reads == reads + 1  # forgotten when the connection was lost
    assert await here.get(S1) == []
    assert counted.reads == reads + 1  # remembered again


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_nothing_is_remembered_while_news_of_changes_could_be_missed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = CountingReads(store)
    here = Menus(counted)
    await here.start()
    monkeypatch.setattr(store, "kv_watched", lambda: False)  # LISTEN is down
    for _ in range(3):
        assert await here.get(S1) == []
    assert counted.reads == 3
    monkeypatch.undo()
    assert await here.get(S1) == []
    assert counted.reads == 4  # what was read meanwhile was not kept
    assert await here.get(S1) == []
    assert counted.reads == 4


async def _is(got: Awaitable[Any], want: Any) -> bool:
    return bool(await got == want)


class CountingWindowReads(CountingReads):
    async def last_inbound_at(self, session: str) -> float | None:
        self.reads += 1
        return await self.store.last_inbound_at(session)


async def test_a_message_heard_here_opens_the_window_without_a_store_read(
    store: Store, tmp_path: Path
) -> None:
    counted = CountingWindowReads(store)
    ctx = ChannelContext(store=counted, files_dir=tmp_path)
    graph = GraphClient("http://127.0.0.1:9", "v21.0", "token", 1.0)
    sender = Sender(WhatsAppSettings(), ctx, graph, Menus(store))
    key = SessionKey.parse(S1)
    sender.heard(S1, time.time() - 3600)
    assert await sender.window_open(key)
    assert counted.reads == 0
    sender.heard(S1, time.time() - 25 * 3600)  # older news changes nothing
    assert await sender.window_open(key)
    stale = SessionKey.parse(S2)
    sender.heard(S2, time.time() - 25 * 3600)  # too old to tell: the store decides
    assert not await sender.window_open(stale)
    assert counted.reads == 2  # its last stored message, then the "seen" mark
    await graph.aclose()


class SlowReads(CountingReads):
    """kv_get reads the store at once, then answers only when told."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.answer = asyncio.Event()

    async def kv_get(self, namespace: str, key: str) -> str | None:
        value = await self.store.kv_get(namespace, key)
        await self.answer.wait()
        return value


async def test_a_read_that_overlapped_a_new_menu_is_not_remembered(store: Store) -> None:
    slow = SlowReads(store)
    menus = Menus(slow)
    reading = asyncio.create_task(menus.get(S1))  # reads "no menu"...
    await asyncio.sleep(0.05)
    await menus.show(S1, MENU)  # ...and a menu is shown before that answer is back
    slow.answer.set()
    assert await reading == []  # that read was right when it was made
    assert await menus.get(S1) == MENU  # but it did not overwrite what show() knows
