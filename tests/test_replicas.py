"""Several gateway processes on one PostgreSQL database: one runner per session across
replicas, nothing lost or answered twice when a replica is SIGKILLed, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from channels.web import conversation_of
from tests.conftest import ROOT, pg_schema
from tests.fake_openai import FakeOpenAI, Text, last_user_text

_TAG = re.compile(r"\b(s\d+)-m\d+\b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Replica:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest_asyncio.fixture
async def cluster(tmp_path: Path, fake_openai: FakeOpenAI) -> AsyncIterator[Callable[..., Any]]:
    """start(n, **agent) -> replicas on one fresh schema; everything is stopped afterwards."""
    replicas: list[Replica] = []
    async with pg_schema() as url:

        async def start(n: int, *, lease_ttl_s: float = 3.0, grace_s: float = 1.0) -> list[Replica]:
            started = []
            for i in range(n):
                port = _free_port()
                config = tmp_path / f"replica{len(replicas)}.toml"
                config.write_text(
                    f"[server]\nport = {port}\nshutdown_grace_s = {grace_s}\n"
                    f'[store]\nurl = "{url}"\nlease_ttl_s = {lease_ttl_s}\npoll_interval_s = 0.3\n'
                    f'[model]\nprovider = "openai"\nbase_url = "{fake_openai.url}"\n'
                    'name = "fake"\nmax_retries = 0\n'
                    '[agent]\nqueue_mode = "followup"\nmax_concurrent_runs = 16\n'
                )
                log = tmp_path / f"replica{len(replicas)}.log"
                env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "gateway",
                            "--log-level",
                            "WARNING",
                            "run",
                            "--config",
                            str(config),
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                replica = Replica(proc, f"http://127.0.0.1:{port}", log)
                replicas.append(replica)
                started.append(replica)
                del i
            async with httpx.AsyncClient(timeout=2) as client:
                for replica in started:
                    await _wait_healthy(client, replica)
            return started

        start.url = url  # type: ignore[attr-defined]
        try:
            yield start
        finally:
            for r in replicas:
                if r.alive:
                    r.proc.kill()
                r.proc.wait(timeout=10)


async def _wait_healthy(client: httpx.AsyncClient, replica: Replica) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert replica.alive, replica.log.read_text()
        try:
            if (await client.get(replica.url + "/healthz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica did not start:\n{replica.log.read_text()}")


def _cookie(session: int) -> dict[str, str]:
    """The web chat's session cookie, as a browser would send it."""
    return {"Cookie": f"switchboard_chat=session-{session:04d}-abcdefgh"}


def _session_of(key: str, sessions: int) -> int:
    """Which of `_cookie`'s sessions a session key is (keys end in a digest of the cookie)."""
    ends = {conversation_of(f"session-{s:04d}-abcdefgh"): s for s in range(sessions)}
    return ends[key.rsplit(":", 1)[1]]


async def _post(client: httpx.AsyncClient, replicas: list[Replica], s: int, m: int) -> None:
    """Post one message to a random live replica, as a load balancer would (retrying the
    next replica when one is gone)."""
    body = {"text": f"s{s}-m{m}", "client_id": f"s{s}-m{m}"}
    for _ in range(20):
        live = [r for r in replicas if r.alive]
        target = random.choice(live)
        try:
            r = await client.post(target.url + "/chat/messages", json=body, headers=_cookie(s))
        except httpx.HTTPError:
            await asyncio.sleep(0.05)
            continue
        assert r.status_code == 202, r.text
        return
    raise AssertionError("no replica accepted the message")


async def _replies(url: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT session, reply FROM outbox ORDER BY id")
    finally:
        await conn.close()
    out: dict[str, list[str]] = {}
    for session, reply in rows:
        out.setdefault(session, []).append(json.loads(reply)["text"])
    return out


async def _wait_for_replies(url: str, expected: int, timeout: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        replies = await _replies(url)
        if sum(len(v) for v in replies.values()) >= expected or time.monotonic() > deadline:
            return replies
        await asyncio.sleep(0.2)


@pytest.mark.timeout(180)
async def test_three_replicas_one_killed_every_message_answered_once_in_order(
    cluster: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.02)
    fake_openai.session_of = lambda body: (
        m.group(1) if (m := _TAG.search(last_user_text(body))) else None
    )
    replicas = await cluster(3)
    sessions, per_session = 100, 10
    sent = 0
    killed = asyncio.Event()

    async def converse(s: int) -> None:
        nonlocal sent
        for m in range(per_session):
            await _post(client, replicas, s, m)
            sent += 1
            if sent >= sessions * per_session // 2 and not killed.is_set():
                killed.set()
                replicas[0].proc.send_signal(signal.SIGKILL)
            await asyncio.sleep(random.random() * 0.01)

    async with httpx.AsyncClient(timeout=10) as client:
        await asyncio.gather(*(converse(s) for s in range(sessions)))
    assert killed.is_set()
    assert not replicas[0].alive
    replies = await _wait_for_replies(cluster.url, sessions * per_session, timeout=90)  # type: ignore[attr-defined]
    assert len(replies) == sessions
    for session, texts in replies.items():
        s = _session_of(session, sessions)
        assert texts == [f"echo: s{s}-m{m}" for m in range(per_session)], session
    assert fake_openai.overlaps == 0


async def test_a_dead_replicas_session_is_taken_over_after_its_lease_expires(
    cluster: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=30)
    ttl = 2.0
    (a,) = await cluster(1, lease_ttl_s=ttl)
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(
            a.url + "/chat/messages", json={"text": "s1-m0", "client_id": "x"}, headers=_cookie(1)
        )
        while not fake_openai.requests:  # A is mid-run, holding the lease
            await asyncio.sleep(0.05)
        fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}")
        a.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        (b,) = await cluster(1, lease_ttl_s=ttl)
        replies = await _wait_for_replies(cluster.url, 1, timeout=30)  # type: ignore[attr-defined]
        took = time.monotonic() - killed_at
    assert list(replies.values()) == [["echo: s1-m0"]]
    assert len(fake_openai.requests) == 2  # the dead run, then the takeover
    assert took < ttl + 8  # expiry + sweep, with room for a slow machine
    assert b.alive


async def test_sigterm_finishes_the_running_turn_and_releases_leases(
    cluster: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=1.0)
    (a,) = await cluster(1, grace_s=10.0, lease_ttl_s=30.0)
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(
            a.url + "/chat/messages", json={"text": "s2-m0", "client_id": "y"}, headers=_cookie(2)
        )
        while not fake_openai.requests:
            await asyncio.sleep(0.05)
    a.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(a.proc.wait, 15) == 0
    assert list((await _replies(cluster.url)).values()) == [["echo: s2-m0"]]  # type: ignore[attr-defined]
    conn = await asyncpg.connect(cluster.url)  # type: ignore[attr-defined]
    try:
        held = await conn.fetchval("SELECT count(*) FROM sessions WHERE lease_owner IS NOT NULL")
    finally:
        await conn.close()
    assert held == 0


async def test_sigterm_past_the_grace_hands_the_turn_back(
    cluster: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text("too slow", delay_s=30)
    (a,) = await cluster(1, grace_s=0.3, lease_ttl_s=30.0)
    async with httpx.AsyncClient(timeout=5) as client:
        await client.post(
            a.url + "/chat/messages", json={"text": "s3-m0", "client_id": "z"}, headers=_cookie(3)
        )
        while not fake_openai.requests:
            await asyncio.sleep(0.05)
    a.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(a.proc.wait, 15) == 0
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}")
    started = time.monotonic()
    await cluster(1, lease_ttl_s=30.0)  # the lease was released: no 30 s wait
    replies = await _wait_for_replies(cluster.url, 1, timeout=20)  # type: ignore[attr-defined]
    assert list(replies.values()) == [["echo: s3-m0"]]
    assert time.monotonic() - started < 15


async def _messages_on_stream(replica: Replica, session: int, want: int) -> list[str]:
    """The `message` events one page gets on its stream from `replica`, until `want`."""
    texts: list[str] = []
    async with (
        httpx.AsyncClient(timeout=None) as client,
        client.stream("GET", replica.url + "/chat/events", headers=_cookie(session)) as resp,
    ):
        event = ""
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "message":
                texts.append(json.loads(line.removeprefix("data: "))["text"])
                if len(texts) >= want:
                    return texts
    return texts


@pytest.mark.timeout(120)
async def test_a_page_gets_every_reply_whichever_replica_runs_the_turn(
    cluster: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    """Two tabs of one browser have their streams open on different replicas, and each turn
    runs on one of them: both tabs get every reply live (the other tab once got none)."""
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.1)
    replicas = await cluster(2)
    tabs = [asyncio.create_task(_messages_on_stream(r, 7, 3)) for r in replicas]
    await asyncio.sleep(0.5)  # the streams are open
    async with httpx.AsyncClient(timeout=5) as client:
        for m in range(3):
            body = {"text": f"s7-m{m}", "client_id": f"s7-m{m}"}
            target = replicas[m % 2].url
            r = await client.post(target + "/chat/messages", json=body, headers=_cookie(7))
            assert r.status_code == 202, r.text
    for tab in tabs:
        assert await asyncio.wait_for(tab, 30) == [f"echo: s7-m{m}" for m in range(3)]
    # the news travelled; nothing stays behind (a row per conversation and start did)
    conn = await asyncpg.connect(cluster.url)  # type: ignore[attr-defined]
    try:
        kept = "SELECT count(*) FROM channel_state WHERE namespace = 'web.replies'"
        assert await conn.fetchval(kept) == 0
    finally:
        await conn.close()
