"""Access policy per channel (open, allowlist, pairing, blocklist) and per-user flood control."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio

import core.access as access_module
from core.access import (
    Access,
    AccessControl,
    AccessRule,
    Verdict,
    approve,
    for_how_long,
    pending_codes,
)
from core.agent.loop import AgentLoop, Limits
from core.agent.tools import ToolRegistry
from core.models import InboundMessage, Sender, SessionKey
from core.sessions import AgentProfile, DeliveryPolicy, QueueMode, SessionManager, SessionPolicy
from core.store import InboxStatus, SqliteStore, Store
from tests.conftest import ROOT
from tests.fakes import RecordingOutlet
from tests.test_sessions import EchoModel


@pytest_asyncio.fixture
async def make(store: Store) -> AsyncIterator[Callable[..., Any]]:
    managers: list[SessionManager] = []

    async def build(
        rule: AccessRule, mode: QueueMode = QueueMode.FOLLOWUP, delay_s: float = 0.0
    ) -> tuple[SessionManager, RecordingOutlet, EchoModel]:
        model, outlet = EchoModel(delay_s=delay_s), RecordingOutlet()
        profile = AgentProfile(
            name="default",
            instructions="x",
            loop=AgentLoop(model, ToolRegistry(), Limits()),
            policy=SessionPolicy(queue_mode=mode),
        )
        manager = SessionManager(
            store,
            {"default": profile},
            {"test": outlet},
            delivery=DeliveryPolicy(base_delay_s=0.01),
            access={"test": rule},
        )
        await manager.start()
        managers.append(manager)
        return manager, outlet, model

    yield build
    for m in managers:
        await m.aclose(grace_s=1)


def _msg(text: str, sender: str, pid: str) -> InboundMessage:
    return InboundMessage(
        channel="test", conversation=sender, sender=Sender(id=sender), text=text, platform_id=pid
    )


def _key(sender: str) -> SessionKey:
    return SessionKey("default", "test", "default", sender)


async def _settle(manager: SessionManager) -> None:
    await asyncio.wait_for(manager.wait_idle(), 10)


async def test_allowlist_and_blocklist(make: Any, store: Store) -> None:
    rule = AccessRule(mode=Access.ALLOWLIST, allow=frozenset({"ana"}), block=frozenset({"eve"}))
    manager, outlet, _ = await make(rule)
    assert (await manager.submit(_msg("hi", "ana", "1"))).status is InboxStatus.PENDING
    stranger = [await manager.submit(_msg(f"hey {i}", "bob", f"b{i}")) for i in range(2)]
    assert {r.status for r in stranger} == {InboxStatus.REFUSED}
    assert (await manager.submit(_msg("spam", "eve", "e1"))).status is InboxStatus.REFUSED
    await _settle(manager)
    assert outlet.texts(_key("ana")) == ["echo: hi"]
    assert outlet.texts(_key("bob")) == ["Sorry, this assistant is private."]  # told once
    assert outlet.texts(_key("eve")) == []  # blocked: not even told
    stored = await store.transcript(str(_key("bob")), 10)
    assert [e.role for e in stored] == ["assistant"]  # only the notice: nothing of theirs kept


async def test_pairing_keeps_messages_until_the_operator_approves(make: Any, store: Store) -> None:
    manager, outlet, model = await make(AccessRule(mode=Access.PAIRING))
    first = await manager.submit(_msg("hello, can I book?", "zoe", "z1"))
    second = await manager.submit(_msg("for saturday", "zoe", "z2"))
    await _settle(manager)
    assert first.status is second.status is InboxStatus.UNPAIRED
    notices = outlet.texts(_key("zoe"))
    assert len(notices) == 1  # one code, not one per message
    code = re.search(r"code: ([A-Z0-9]{8})", notices[0]).group(1)  # type: ignore[union-attr]
    assert model.requests == []
    assert list(await pending_codes(store)) == [code]
    assert await approve(store, "WRONGCOD") is None
    assert await approve(store, code.lower()) == ("test", "zoe")
    assert await pending_codes(store) == {}
    await manager._sweep()  # the running gateway's sweeper (or NOTIFY) picks them up
    await _settle(manager)
    assert outlet.texts(_key("zoe"))[1:] == ["echo: hello, can I book?", "echo: for saturday"]
    await manager.submit(_msg("thanks", "zoe", "z3"))  # approved from now on
    await _settle(manager)
    assert outlet.texts(_key("zoe"))[-1] == "echo: thanks"


async def test_notices_about_a_message_reach_only_senders_who_may_be_answered(
    make: Any, store: Store
) -> None:
    """e.g. WhatsApp's "I can't read that kind of message": a blocked sender once got it."""
    rule = AccessRule(mode=Access.ALLOWLIST, allow=frozenset({"ana"}), block=frozenset({"ana2"}))
    manager, outlet, _ = await make(rule)
    for who in ("ana", "bob", "ana2"):
        await manager.notify(_key(who), "cannot read that", about=_msg("", who, f"n-{who}"))
    await _settle(manager)
    assert outlet.texts(_key("ana")) == ["cannot read that"]
    assert outlet.texts(_key("bob")) == outlet.texts(_key("ana2")) == []

    pairing, outlet, _ = await make(AccessRule(mode=Access.PAIRING, block=frozenset({"eve"})))
    assert not await pairing.access.admits(_msg("", "zoe", "z"))
    assert not await pairing.access.admits(_msg("", "eve", "e"))
    await store.kv_set(access_module.APPROVED, "test:zoe", "1")
    assert await pairing.access.admits(_msg("", "zoe", "z"))
    assert await pending_codes(store) == {}  # asking hands out no pairing code


async def test_pairing_codes_expire(make: Any, store: Store) -> None:
    manager, outlet, _ = await make(AccessRule(mode=Access.PAIRING, pairing_ttl_s=0.2))
    await manager.submit(_msg("hi", "late", "l1"))
    await _settle(manager)
    notice = outlet.texts(_key("late"))[0]
    code = re.search(r"code: ([A-Z0-9]{8})", notice).group(1)  # type: ignore[union-attr]
    await asyncio.sleep(0.3)
    assert await approve(store, code) is None  # expired
    assert await pending_codes(store) == {}


async def test_only_a_few_pairing_codes_wait_at_once(make: Any) -> None:
    manager, outlet, _ = await make(AccessRule(mode=Access.PAIRING))
    for i in range(25):
        await manager.submit(_msg("hi", f"crowd{i}", f"c{i}"))
    await _settle(manager)
    first = [outlet.texts(_key(f"crowd{i}"))[0] for i in range(25)]
    assert sum("not taking new people" in t for t in first) == 5  # 20 codes may wait at once


async def test_each_channel_has_its_own_pairing_codes(store: Store) -> None:
    """One pool served every channel: twenty web chat posts, each with a made-up cookie, left
    every new Telegram, Slack and WhatsApp customer told "not taking new people" for an
    hour."""
    rule = AccessRule(mode=Access.PAIRING)
    access = AccessControl({"web": rule, "telegram": rule}, store)

    def msg(channel: str, sender: str) -> InboundMessage:
        return InboundMessage(
            channel=channel, conversation=sender, sender=Sender(id=sender), platform_id=sender
        )

    for i in range(21):
        verdict = await access.check(msg("web", f"cookie-{i:02d}-0123456789abcdef"))
    assert verdict.notice is not None
    assert "not taking new people" in verdict.notice
    customer = await access.check(msg("telegram", "4242"))
    assert customer.notice is not None
    assert "code:" in customer.notice


async def test_a_flood_is_coalesced_never_dropped(make: Any) -> None:
    rule = AccessRule(flood_messages=3, flood_window_s=60)
    manager, outlet, model = await make(rule, delay_s=0.2)
    for i in range(8):
        assert (await manager.submit(_msg(f"m{i}", "fast", f"f{i}"))).status is InboxStatus.PENDING
    await _settle(manager)
    texts = outlet.texts(_key("fast"))
    assert sum("answer them together" in t for t in texts) == 1  # told once, politely
    answered = [x for t in texts if t.startswith("echo: ") for x in t[6:].split(" | ")]
    assert answered == [f"m{i}" for i in range(8)]  # nothing dropped, order kept
    assert len(model.requests) < 8  # coalesced into fewer turns despite followup mode


async def test_flood_control_forgets_senders_gone_quiet(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that heard from many people keeps only the recent ones in memory, and
    forgetting changes no verdict."""
    clock = [1000.0]
    fake_time = SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    monkeypatch.setattr(access_module, "time", fake_time)
    control = AccessControl({"test": AccessRule(flood_messages=2, flood_window_s=10)}, store)
    for n in range(5000):
        assert (await control.check(_msg("hi", f"u{n}", f"p{n}"))).store
    for _ in range(3):  # one sender floods: told once, coalesced
        verdict = await control.check(_msg("again", "u1", "x"))
    assert verdict.coalesce
    assert len(control._recent) == 5000
    clock[0] += access_module.SWEEP_EVERY_S + 1  # everyone has gone quiet, the episode is over
    assert await control.check(_msg("back", "u7", "p-back")) == Verdict(store=True)
    assert set(control._recent) == {"test:u7"}
    assert control._flooding == {}


async def test_pairing_from_the_command_line(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    store = SqliteStore(db)
    await store.start()
    manager = SessionManager(store, {}, {}, access={"test": AccessRule(mode=Access.PAIRING)})
    await manager.submit(_msg("hi", "cli-user", "x1"))
    (code,) = await pending_codes(store)
    await store.aclose()
    config = tmp_path / "sb.toml"
    # the service's configuration: a channel whose secret lives in the service's environment,
    # which the operator's shell does not have (pairing needs only the store)
    config.write_text(
        f'[store]\nurl = "sqlite:///{db}"\n'
        '[channels.telegram]\nenabled = true\nmode = "polling"\ntoken = "${TG_TOKEN_UNSET}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}
    env.pop("TG_TOKEN_UNSET", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "pairing", *args, "--config", str(config)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = await asyncio.to_thread(cli, "list")
    assert listed.returncode == 0, listed.stderr
    assert code in listed.stdout
    assert "test:cli-user" in listed.stdout
    done = await asyncio.to_thread(cli, "approve", code)
    assert done.returncode == 0, done.stderr
    again = await asyncio.to_thread(cli, "approve", code)
    assert again.returncode == 1
    assert "Traceback" not in again.stderr
    store = SqliteStore(db)
    await store.start()
    try:
        assert [i.message.text for i in await store.pending(str(_key("cli-user")))] == ["hi"]
    finally:
        await store.aclose()
    # a store that does not exist yet is not made by the operator's command
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/none/db.sqlite"\n')
    missing = await asyncio.to_thread(cli, "list")
    assert missing.returncode == 2
    assert "no store at" in missing.stderr
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 seconds"),
        (1, "1 second"),
        (55.4, "55 seconds"),
        (60, "1 minute"),
        (600, "10 minutes"),
        (5400, "90 minutes"),
        (86400, "24 hours"),
        (-5, "0 seconds"),
    ],
)
def test_a_time_left_reads_as_people_say_it(seconds: float, text: str) -> None:
    """The pairing notice said "valid for 1 minutes"; the CLI "expires in 0 min" at 55 s."""
    assert for_how_long(seconds) == text
