"""The store goes away: webhooks and the web chat answer 503 so the platform redelivers later,
/readyz says so, nothing is acknowledged that was not stored, and once the store is back the
redelivered messages are answered exactly once.

Two kinds of outage, one per store:
- SQLite is embedded, so it cannot be unplugged; it is wrapped in `Outage`, a Store that raises
  StoreError from every call while it is down (and can fail after N writes: a notification with
  three messages whose second one does not make it);
- PostgreSQL is reached through `PgProxy`, a TCP relay on 127.0.0.1: going down closes the
  relay's listening socket and terminates every backend it opened with pg_terminate_backend
  from an admin connection (what a database restart or failover does to a gateway), so the
  store's pool really loses its connections and cannot open new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from channels.web import conversation_of
from core.errors import StoreError
from core.models import SessionKey
from core.store import SqliteStore, Store
from gateway.app import build_app
from gateway.settings import load_settings
from tests.conftest import PG_BASE, pg_schema
from tests.fake_openai import FakeOpenAI, Text, last_user_text
from tests.fake_slack import BOT_TOKEN, SIGNING_SECRET, TEAM, FakeSlack, event, message
from tests.fake_slack import sign as slack_sign
from tests.fake_telegram import ANA, SECRET, FakeTelegram
from tests.fake_whatsapp import APP_SECRET, TOKEN, VERIFY_TOKEN, FakeGraph, payload, text_message
from tests.fake_whatsapp import sign as wa_sign

WA_USER = "15551234567"
DM = "D0DM000001"
COOKIE = {"Cookie": "switchboard_chat=outage-browser-session-0001"}
WEB_SESSION = conversation_of("outage-browser-session-0001")


class Outage:
    """A Store that forwards to a real one, or raises StoreError from every call while down.
    `fail_after` lets that many writes through first (a failure in the middle of a request)."""

    _WRITES = frozenset({"put_inbound", "kv_set", "update_delivery", "enqueue_replies"})

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.down = False
        self.fail_after: int | None = None

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name in ("start", "aclose") or not inspect.iscoroutinefunction(target):
            return target  # e.g. kv_watched(): no I/O, nothing to fail

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.fail_after is not None and name in self._WRITES:
                if self.fail_after == 0:
                    self.down = True
                self.fail_after -= 1
            if self.down:
                raise StoreError("database unavailable (test outage)")
            return await target(*args, **kwargs)

        return call


class PgProxy:
    """A TCP relay to PostgreSQL that can be cut: the database, as the gateway sees it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._backend_ports: set[int] = set()
        self.flowing = asyncio.Event()  # cleared: a stalled server (nothing moves, no error)
        self.flowing.set()

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self, admin: asyncpg.Connection) -> None:
        """Refuse new connections and kill the open ones at the server."""
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = ANY($1)",
            list(self._backend_ports),
        )
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            await self.flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self._backend_ports.add(up_writer.get_extra_info("sockname")[1])
            await asyncio.gather(
                _pipe(reader, up_writer, self.flowing), _pipe(up_reader, writer, self.flowing)
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._pipes.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    try:
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@dataclass
class Rig:
    """The real app on a random port with every channel, against local fakes."""

    url: str
    runner: web.AppRunner
    model: FakeOpenAI
    graph: FakeGraph
    tg: FakeTelegram
    slack: FakeSlack
    http: httpx.AsyncClient
    go_down: Callable[[], Any]
    come_back: Callable[[], Any]
    outage: Outage | None

    @property
    def store(self) -> Store:
        from gateway.keys import RUNTIME

        return self.runner.app[RUNTIME].store

    # what each platform would send

    async def whatsapp(self, data: dict[str, Any]) -> httpx.Response:
        raw = json.dumps(data).encode()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": wa_sign(raw)}
        return await self.http.post("/webhooks/whatsapp", content=raw, headers=headers)

    async def telegram(self, update: dict[str, Any]) -> httpx.Response:
        headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET}
        return await self.http.post("/webhooks/telegram", json=update, headers=headers)

    async def slack_event(self, body: dict[str, Any], retry: int = 0) -> httpx.Response:
        raw = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **slack_sign(SIGNING_SECRET, raw)}
        if retry:
            headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_error"})
        return await self.http.post("/webhooks/slack", content=raw, headers=headers)

    async def web(self, text: str, cid: str) -> httpx.Response:
        body = {"text": text, "client_id": cid}
        return await self.http.post("/chat/messages", json=body, headers=COOKIE)

    # what the people received

    def replies(self) -> dict[str, list[str]]:
        return {
            "whatsapp": self.graph.texts(WA_USER),
            "telegram": [s.text for s in self.tg.in_chat(ANA.id)],
            "slack": [m["text"] for m in self.slack.posted(DM)],
        }

    async def web_replies(self) -> list[str]:
        key = SessionKey("default", "web", "default", WEB_SESSION)
        entries = await self.store.transcript(str(key), 100)
        return [e.text for e in entries if e.role == "assistant"]

    async def inbound_texts(self) -> list[str]:
        """Every message text in every session's transcript (what the store accepted)."""
        keys = [
            SessionKey("default", "whatsapp", "1001", WA_USER),
            SessionKey("default", "telegram", "123456789", str(ANA.id)),
            SessionKey("default", "slack", TEAM, DM),
            SessionKey("default", "web", "default", WEB_SESSION),
        ]
        texts: list[str] = []
        for key in keys:
            texts += [
                e.text for e in await self.store.transcript(str(key), 100) if e.role == "user"
            ]
        return texts


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def rig(
    request: pytest.FixtureRequest, tmp_path: Path, fake_openai: FakeOpenAI
) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        graph, tg, slack = FakeGraph(), FakeTelegram(), FakeSlack()
        for fake in (graph, tg, slack):
            await fake.start()
            stack.push_async_callback(fake.aclose)
        outage: Outage | None = None
        if request.param == "postgres":
            url = await stack.enter_async_context(pg_schema())
            base = urlsplit(PG_BASE)
            proxy = PgProxy((base.hostname or "127.0.0.1", base.port or 5432))
            await proxy.up()
            stack.push_async_callback(proxy.aclose)
            parts = urlsplit(url)
            user = (parts.username or "") + (f":{parts.password}" if parts.password else "")
            netloc = f"{user}@127.0.0.1:{proxy.port}"
            store_url = urlunsplit(parts._replace(netloc=netloc))
            admin = await asyncpg.connect(PG_BASE)
            stack.push_async_callback(admin.close)
            store: Store | None = None

            async def go_down() -> None:
                await proxy.down(admin)

            async def come_back() -> None:
                await proxy.up()

        else:
            store_url = f"sqlite:///{tmp_path}/sb.db"
            outage = Outage(SqliteStore(tmp_path / "sb.db"))
            store = outage  # type: ignore[assignment]

            async def go_down() -> None:
                assert outage is not None
                outage.down = True

            async def come_back() -> None:
                assert outage is not None
                outage.down, outage.fail_after = False, None

        config = tmp_path / "switchboard.toml"
        config.write_text(
            '[server]\nport = 0\nshutdown_grace_s = 0.3\npublic_url = "https://bot.example.com"\n'
            f'[store]\nurl = "{store_url}"\npoll_interval_s = 0.3\nlease_ttl_s = 3\n'
            f'[model]\nprovider = "openai"\nbase_url = "{fake_openai.url}"\nname = "fake"\n'
            "max_retries = 0\n"
            '[agent]\nqueue_mode = "followup"\n'
            f'[channels]\nmedia_dir = "{tmp_path}/files"\n'
            "[channels.whatsapp]\nenabled = true\n"
            f'access_token = "{TOKEN}"\napp_secret = "{APP_SECRET}"\n'
            f'verify_token = "{VERIFY_TOKEN}"\nphone_number_id = "1001"\n'
            f'api_base = "{graph.url}"\n'
            "[channels.telegram]\nenabled = true\n"
            f'token = "{tg.token}"\nmode = "webhook"\nwebhook_secret = "{SECRET}"\n'
            f'api_base = "{tg.url}"\nbot_username = "{tg.username}"\nstreaming = false\n'
            "[channels.slack]\nenabled = true\n"
            f'bot_token = "{BOT_TOKEN}"\nsigning_secret = "{SIGNING_SECRET}"\n'
            f'api_base = "{slack.api_base}"\nbot_user_id = "U0BOT00001"\n'
            'streaming = "off"\nstatus_messages = false\n',
            encoding="utf-8",
        )
        settings = load_settings(config, environ={})
        app = build_app(settings, store=store)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)
        )
        yield Rig(
            f"http://127.0.0.1:{port}",
            runner,
            fake_openai,
            graph,
            tg,
            slack,
            http,
            go_down,
            come_back,
            outage,
        )


async def until(check: Callable[[], Any], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)


@pytest.fixture(autouse=True)
def _ptb_timedelta(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


@pytest.mark.timeout(90)
async def test_every_route_answers_503_while_the_store_is_down_then_redelivery_is_answered_once(
    rig: Rig,
) -> None:
    wa = text_message("wa during outage", mid="wamid.OUTAGE1")
    tg = rig.tg.message(ANA, "tg during outage")
    sl = event(message(DM, "slack during outage"))
    statuses = payload("statuses")

    await rig.go_down()
    assert (await rig.http.get("/healthz")).status_code == 200  # alive, just not ready
    ready = await rig.http.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "unavailable"
    for name, resp in [
        ("whatsapp", await rig.whatsapp(wa)),
        ("whatsapp statuses", await rig.whatsapp(statuses)),
        ("telegram", await rig.telegram(tg)),
        ("slack", await rig.slack_event(sl)),
        ("web", await rig.web("web during outage", "w1")),
    ]:
        assert resp.status_code == 503, (name, resp.status_code, resp.text)
        assert "error" in resp.json(), name
    await asyncio.sleep(0.5)
    assert rig.model.requests == []  # nothing was taken in, so nothing is answered

    await rig.come_back()
    await until(lambda: _ready(rig))
    assert await rig.inbound_texts() == []  # nothing from the outage was stored
    # the platforms redeliver what was refused (Slack marks it as a retry)
    assert (await rig.whatsapp(wa)).status_code == 200
    assert (await rig.telegram(tg)).status_code == 200
    assert (await rig.slack_event(sl, retry=1)).status_code == 200
    assert (await rig.web("web during outage", "w1")).status_code == 202
    expected = {
        "whatsapp": ["echo: wa during outage"],
        "telegram": ["echo: tg during outage"],
        "slack": ["echo: slack during outage"],
    }
    await until(lambda: rig.replies() == expected)
    await until(lambda: _equals(rig.web_replies(), ["echo: web during outage"]))
    # and a second redelivery is a duplicate: stored once, answered once
    assert (await rig.whatsapp(wa)).status_code == 200
    assert (await rig.telegram(tg)).status_code == 200
    assert (await rig.slack_event(sl, retry=2)).status_code == 200
    again = await rig.web("web during outage", "w1")
    assert again.status_code == 202
    assert again.json()["duplicate"] is True
    await asyncio.sleep(0.5)
    assert rig.replies() == expected
    assert await rig.web_replies() == ["echo: web during outage"]
    assert len(rig.model.requests) == 4
    assert sorted(await rig.inbound_texts()) == sorted(
        ["wa during outage", "tg during outage", "slack during outage", "web during outage"]
    )


async def _ready(rig: Rig) -> bool:
    return (await rig.http.get("/readyz")).status_code == 200


async def _equals(got: Any, want: Any) -> bool:
    return bool(await got == want)


@pytest.mark.timeout(90)
async def test_a_turn_that_ends_while_the_store_is_down_is_answered_once_after(rig: Rig) -> None:
    """The reply cannot be committed during the outage: nothing is sent, and the message stays
    pending; once the store is back it is answered, once."""
    rig.model.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.8)
    assert (await rig.whatsapp(text_message("slow one", mid="wamid.SLOW1"))).status_code == 200
    await until(lambda: rig.model.requests)  # the run has started
    await rig.go_down()
    await asyncio.sleep(2.0)  # the model answers into an outage
    assert rig.graph.texts(WA_USER) == []
    rig.model.responder = None
    await rig.come_back()
    await until(lambda: rig.graph.texts(WA_USER), timeout=30)
    await asyncio.sleep(1.0)
    assert rig.graph.texts(WA_USER) == ["echo: slow one"]
    assert len(rig.model.requests) >= 2  # the turn was redone, its first reply never sent


@pytest.mark.parametrize("rig", ["sqlite"], indirect=True)  # needs the wrapped store
async def test_a_notification_cut_short_by_the_store_is_refused_and_redelivery_completes_it(
    rig: Rig,
) -> None:
    """Three messages in one WhatsApp notification; the store fails after the first. The 503
    makes Meta redeliver all three: the first is a duplicate, the other two are new."""
    assert rig.outage is not None
    data = payload("three_messages")
    rig.outage.fail_after = 1
    assert (await rig.whatsapp(data)).status_code == 503
    await rig.come_back()
    assert (await rig.whatsapp(data)).status_code == 200
    await until(lambda: len(rig.graph.texts(WA_USER)) == 3)
    await asyncio.sleep(0.5)
    texts = rig.graph.texts(WA_USER)
    assert len(texts) == 3
    assert texts == ["echo: first", "echo: second", "echo: third"]


async def test_sqlite_is_not_ready_while_its_disk_refuses_writes(tmp_path: Path) -> None:
    """Reads still worked on a full disk, so /readyz said ready while every write failed.
    SQLite's query_only makes the writer's connection refuse writes as a read-only file does
    (SQLITE_READONLY), one of the disk faults."""
    store = SqliteStore(str(tmp_path / "sb.db"))
    await store.start()
    try:
        await store.ping()

        def refuse(on: bool) -> Callable[[Any], None]:
            return lambda conn: conn.execute(f"PRAGMA query_only={'ON' if on else 'OFF'}")

        await store._writer.call(refuse(True))
        with pytest.raises(StoreError):
            await store.kv_set("ns", "k", "v")
        with pytest.raises(StoreError):
            await store.ping()  # a probe write, which fails too
        await store._writer.call(refuse(False))
        await store.ping()  # the probe write works: ready again
        await store.kv_set("ns", "k", "v")
        assert await store.kv_get("ns", "k") == "v"
    finally:
        await store.aclose()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_sqlite_file_deleted_or_replaced_while_open_is_saved_and_not_written(
    tmp_path: Path, how: str
) -> None:
    """Writes went on into the deleted file, were acknowledged, and were gone at the next
    start. Now nothing more is acknowledged, /readyz fails, and what was stored is copied
    back to the path (or beside the file that replaced it)."""
    path = tmp_path / "sb.db"
    store = SqliteStore(str(path))
    await store.start()
    try:
        await store.kv_set("ns", "kept", "yes")
        for name in ("sb.db", "sb.db-wal", "sb.db-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        if how == "replaced":
            sqlite3.connect(path).close()  # an empty database where ours was
        with pytest.raises(StoreError, match="deleted or replaced"):
            await store.kv_set("ns", "lost", "no")
        with pytest.raises(StoreError, match="restart the gateway"):
            await store.ping()
    finally:
        await store.aclose()
    saved = path if how == "deleted" else tmp_path / "sb.db.recovered"
    again = SqliteStore(str(saved))
    await again.start()
    try:
        assert await again.kv_get("ns", "kept") == "yes"
        assert await again.kv_get("ns", "lost") is None
    finally:
        await again.aclose()


async def test_sqlite_frees_at_start_the_leases_of_processes_that_no_longer_run(
    tmp_path: Path,
) -> None:
    """After a crash, the restarted gateway resumed the crashed run's sessions only once the
    dead process's leases expired (15 s). A lease that may still be held is kept."""
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    host = socket.gethostname()
    owners = {
        "dead": f"{host}:{exited.stdout.strip()}:aaaaaa",
        "earlier-self": f"{host}:{os.getpid()}:bbbbbb",  # this pid, another run
        "alive": f"{host}:{os.getppid()}:cccccc",
        "elsewhere": f"another-host:{exited.stdout.strip()}:dddddd",
    }
    path = str(tmp_path / "sb.db")
    store = SqliteStore(path)
    await store.start()
    for session, owner in owners.items():
        assert await store.acquire_lease(session, owner, 600.0)
    await store.aclose()
    again = SqliteStore(path)
    await again.start()
    try:
        taken = {s: await again.acquire_lease(s, "new-owner", 60.0) for s in owners}
    finally:
        await again.aclose()
    assert taken == {"dead": True, "earlier-self": True, "alive": False, "elsewhere": False}


async def test_a_postgresql_url_the_driver_cannot_read_is_a_store_error() -> None:
    """`run` once died with the driver's traceback (an sslmode it does not know, say)."""
    from core.store.postgres import PostgresStore

    store = PostgresStore(PG_BASE + "?sslmode=bogus")
    with pytest.raises(StoreError, match="cannot open PostgreSQL store"):
        await store.start()


async def test_postgresql_stuck_on_the_inbox_is_not_ready_and_its_calls_end(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session holds the inbox locked (a stalled server, a migration elsewhere): every
    webhook hung with no time limit while /readyz, which asked only SELECT 1, said ready."""
    from core.models import InboundMessage, Sender
    from core.store.postgres import PostgresStore

    monkeypatch.setattr("core.store.postgres.STATEMENT_TIMEOUT_S", 0.5)
    monkeypatch.setattr("core.store.postgres.PING_TIMEOUT_S", 0.3)
    store = PostgresStore(pg_url)
    await store.start()
    blocker = await asyncpg.connect(pg_url)
    msg = InboundMessage(
        channel="test", conversation="c", sender=Sender(id="u"), text="hi", platform_id="stuck-1"
    )
    try:
        await store.ping()
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        async with asyncio.timeout(5):
            with pytest.raises(StoreError):
                await store.ping()
            with pytest.raises(StoreError):
                await store.put_inbound("s", msg, 100)
        await lock.rollback()
        await store.ping()
        assert (await store.put_inbound("s", msg, 100)).id > 0
    finally:
        await blocker.close()
        await store.aclose()


async def _store_behind_a_proxy(pg_url: str) -> tuple[PgProxy, Any]:
    """A started PostgresStore reaching `pg_url`'s database through a PgProxy."""
    from core.store.postgres import PostgresStore

    base = urlsplit(PG_BASE)
    proxy = PgProxy((base.hostname or "127.0.0.1", base.port or 5432))
    await proxy.up()
    parts = urlsplit(pg_url)
    user = (parts.username or "") + (f":{parts.password}" if parts.password else "")
    store = PostgresStore(urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}")))
    await store.start()
    return proxy, store


def _short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STATEMENT_TIMEOUT_S", "ACQUIRE_TIMEOUT_S", "CLOSE_TIMEOUT_S"):
        monkeypatch.setattr(f"core.store.postgres.{name}", 0.5)


async def test_postgresql_stalled_ends_each_call_in_time_and_closes(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that stops answering (no error, no closed socket): the first webhook took two
    statement timeouts to fail (the cancel asyncpg sends waited too), and SIGTERM never ended
    the process (closing the pool waited for the server)."""
    from core.models import InboundMessage, Sender

    _short_timeouts(monkeypatch)
    proxy, store = await _store_behind_a_proxy(pg_url)

    def msg(n: int) -> InboundMessage:
        return InboundMessage(
            channel="test", conversation="c", sender=Sender(id="u"), text="hi", platform_id=f"{n}"
        )

    try:
        await store.put_inbound("s", msg(0), 100)
        proxy.flowing.clear()
        for n in (1, 2):
            started = time.monotonic()
            with pytest.raises(StoreError):
                await store.put_inbound("s", msg(n), 100)
            assert time.monotonic() - started < 0.9  # one statement timeout, and a little
        started = time.monotonic()
        await store.aclose()
        assert time.monotonic() - started < 2.0
    finally:
        await store.aclose()
        await proxy.aclose()


async def test_shutdown_with_postgresql_stalled_mid_turn_ends_in_time(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the server had stopped answering: the runners kept retrying after the
    manager closed, and closing the pool waited for the server, so the process never ended."""
    from core.agent.loop import AgentLoop, Limits
    from core.agent.tools import ToolRegistry
    from core.models import InboundMessage, Sender
    from core.sessions import AgentProfile, SessionManager
    from tests.fakes import RecordingOutlet
    from tests.test_sessions import EchoModel

    _short_timeouts(monkeypatch)
    monkeypatch.setattr("core.sessions.CANCEL_WAIT_S", 0.5)
    proxy, store = await _store_behind_a_proxy(pg_url)
    model = EchoModel(delay_s=0.5)
    loop = AgentLoop(model, ToolRegistry([]), Limits())
    profile = AgentProfile(name="default", instructions="x", loop=loop)
    manager = SessionManager(store, {"default": profile}, {"test": RecordingOutlet()})
    await manager.start()
    try:
        for n in range(4):
            sender = Sender(id=f"u{n}")
            await manager.submit(
                InboundMessage(
                    channel="test",
                    conversation=f"c{n}",
                    sender=sender,
                    text="hi",
                    platform_id=f"{n}",
                )
            )
        while not model.requests:
            await asyncio.sleep(0.01)
        proxy.flowing.clear()  # mid-turn: the commits will not be answered
        started = time.monotonic()
        await manager.aclose(grace_s=0.5)
        await store.aclose()
        assert time.monotonic() - started < 5.0
    finally:
        await manager.aclose(grace_s=0)
        await store.aclose()
        await proxy.aclose()


async def test_a_pooled_connection_the_server_closed_is_a_store_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg raises InternalClientError ("cannot switch to state ...") for a connection the
    server closed while the pool handed it out; it escaped as it was, and a sweeper or a
    heartbeat that met it stopped for good."""
    from core.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    await store.start()
    assert store._pool is not None

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise asyncpg.InternalClientError("cannot switch to state 12")

    monkeypatch.setattr(type(store._pool), "acquire", broken)  # its slot is read-only
    try:
        with pytest.raises(StoreError, match="cannot switch to state"):
            await store.sessions_with_work()
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_postgresql_that_cannot_take_writes_is_not_ready(pg_url: str) -> None:
    """After a failover the old primary can come back read-only (or as a standby): /readyz
    read the inbox, said ready, and every webhook got a 503."""
    from core.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    await store.start()
    assert store._pool is not None
    writable = store._pool
    read_only = await asyncpg.create_pool(
        pg_url + "&default_transaction_read_only=on", min_size=1, max_size=1
    )
    try:
        await store.ping()
        store._pool = read_only
        with pytest.raises(StoreError, match="read-only"):
            await store.ping()
        store._pool = writable
        await store.ping()
    finally:
        store._pool = writable
        await read_only.close()
        await store.aclose()


async def test_postgresql_readiness_answers_within_its_deadline_and_says_why(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting for a pooled connection was outside the ping's 2 s (up to 10 s more), and a
    timeout was reported as "store operation failed: " with no reason."""
    from core.store.postgres import PostgresStore

    monkeypatch.setattr("core.store.postgres.PING_TIMEOUT_S", 0.3)
    store = PostgresStore(pg_url)
    await store.start()
    assert store._pool is not None

    async def stalled(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(30)

    async def timing_out(*args: Any, **kwargs: Any) -> Any:
        raise TimeoutError

    try:
        monkeypatch.setattr(type(store._pool), "acquire", stalled)
        async with asyncio.timeout(2):
            with pytest.raises(StoreError, match=r"did not answer within 0\.3 s"):
                await store.ping()
        monkeypatch.setattr(type(store._pool), "acquire", timing_out)
        with pytest.raises(StoreError, match="store operation failed: no answer within"):
            await store.sessions_with_work()
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_sqlite_locked_by_another_process_is_not_ready_and_recovers(tmp_path: Path) -> None:
    """Another process held the file's write lock: every webhook waited out the busy timeout
    and got a 503 (a batch of them one after another, each waiting again), while /readyz,
    which only read, said ready."""
    path = tmp_path / "sb.db"
    store = SqliteStore(str(path))
    await store.start()
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        await store.ping()
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreError, match="locked"):
            await store.kv_set("ns", "k", "v")
        async with asyncio.timeout(4):  # the probe write gives up on /readyz's behalf in 2 s
            with pytest.raises(StoreError, match="cannot write: database is locked"):
                await store.ping()
        other.execute("ROLLBACK")
        async with asyncio.timeout(10):
            while True:  # the probe still queued gets through and clears the fault
                with contextlib.suppress(StoreError):
                    await store.ping()
                    break
                await asyncio.sleep(0.1)
        await store.kv_set("ns", "k", "v")
        assert await store.kv_get("ns", "k") == "v"
    finally:
        other.close()
        await store.aclose()
