"""The long-polling loop: offsets confirmed only after storing, redelivery harmless, errors
backed off, a leftover webhook removed, and a prompt, clean stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from channels.base import ChannelContext
from channels.telegram import TelegramAdapter, TelegramSettings
from core.errors import StoreError
from core.models import InboundMessage, SessionKey
from core.store import PutResult, SqliteStore
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import (
    ANA,
    BOB,
    FakeTelegram,
    running_fake,
    running_gateway,
    until,
    write_config,
)


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch) as fake:
        yield fake


async def test_an_update_redelivered_after_a_restart_is_answered_once(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    update = tg.message(ANA, "are you there?")
    async with running_gateway(config, tg) as gw:
        await gw.deliver(update)
        await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    tg.push(update)  # as if the confirming getUpdates never reached Telegram before the crash
    async with running_gateway(config, tg) as gw:
        await until(lambda: any(o > update["update_id"] for o in tg.offsets[-3:]))
        await gw.deliver(tg.message(BOB, "and me?"))
        await until(lambda: len(tg.in_chat(BOB.id)) == 1)
        assert len(gw.inbox()) == 2
    assert [s.text for s in tg.in_chat(ANA.id)] == ["echo: are you there?"]
    assert len(fake_openai.requests) == 2


async def test_polling_backs_off_on_errors_and_carries_on(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    tg.fail_next("getUpdates", 502, "Bad Gateway", times=2)
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    async with running_gateway(config, tg) as gw:
        await gw.deliver(tg.message(ANA, "still polling?"))
        await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    calls = [t for t, (m, _) in zip(tg.stamps, tg.calls, strict=True) if m == "getUpdates"]
    assert calls[1] - calls[0] >= 0.4  # backed off after a failure
    assert calls[2] - calls[1] >= 0.9  # and longer after the next
    assert tg.in_chat(ANA.id)[0].text == "echo: still polling?"


@pytest.mark.parametrize(
    "poison",
    [
        {"chat": {"id": 5}},  # a chat without its type: python-telegram-bot cannot build it
        {"photo": "not a list of sizes"},
        {"text": {"not": "a string"}},
    ],
)
async def test_an_update_nobody_can_read_is_skipped_and_the_next_answered(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI, poison: dict[str, object]
) -> None:
    """The whole batch used to be parsed by python-telegram-bot, so one update it could not
    read failed every getUpdates: the offset never moved and nothing after it arrived."""
    bad = tg.message(ANA, "broken")
    bad["message"].update(poison)
    tg.push(bad)
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    async with running_gateway(config, tg) as gw:
        await gw.deliver(tg.message(BOB, "and me?"))
        await until(lambda: len(tg.in_chat(BOB.id)) == 1)
        await until(lambda: any(o > bad["update_id"] for o in tg.offsets))
    assert tg.in_chat(BOB.id)[0].text == "echo: and me?"


async def test_a_slow_download_in_one_chat_does_not_hold_up_another(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """A batch was handled update by update, so Bob's text waited for Ana's photo (up to a
    minute); each chat's updates now go in order, the chats side by side."""
    tg.file_delay_s = 2.0
    photo = [{**tg.add_file(b"picture", "photos/slow.jpg"), "width": 9, "height": 9}]
    tg.push(tg.message(ANA, None, caption="look", photo=photo))
    tg.push(tg.message(BOB, "quick question"))
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    async with running_gateway(config, tg):
        await until(lambda: tg.in_chat(ANA.id) and tg.in_chat(BOB.id), timeout=15)
    first = min(tg.in_chat(ANA.id) + tg.in_chat(BOB.id), key=lambda m: tg.sent.index(m))
    assert first.text == "echo: quick question"


async def test_a_leftover_webhook_is_removed_so_polling_works(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    tg.webhook = {"url": "https://old.example.com/webhooks/telegram"}
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    async with running_gateway(config, tg) as gw:
        await gw.deliver(tg.message(ANA, "hello"))
        await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    assert tg.webhook is None
    assert not any(r.startswith("Conflict") for r in tg.rejected)


async def test_stopping_cancels_a_hanging_long_poll_promptly(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling", poll_timeout_s=30)
    async with running_gateway(config, tg):
        await until(lambda: "getUpdates" in tg.methods())
        await asyncio.sleep(0.2)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 3.0


async def test_the_offset_moves_past_an_update_only_once_it_is_stored(
    tmp_path: Path, tg: FakeTelegram
) -> None:
    store = SqliteStore(tmp_path / "unit.db")
    await store.start()
    ctx = ChannelContext(store=store, files_dir=tmp_path / "files")
    stored: list[str] = []
    offsets_when_stored: list[list[int]] = []

    async def submit(msg: InboundMessage, key: SessionKey | None = None) -> PutResult:
        assert key == key_for(msg)  # the adapter hands over the key it made
        if not stored:
            stored.append("refused")
            raise StoreError("database is locked")
        stored.append(msg.platform_id)
        offsets_when_stored.append(list(tg.offsets))
        return await store.put_inbound(str(key_for(msg)), msg, 10)

    async def notify(key: SessionKey, text: str, *, about: InboundMessage | None = None) -> None:
        raise AssertionError("no notices expected")

    def key_for(msg: InboundMessage) -> SessionKey:
        return SessionKey.for_message("default", msg)

    ctx.bind(submit, notify, lambda ch, acc, conv, th: SessionKey("default", ch, acc, conv, th))
    section = TelegramSettings(
        enabled=True, token=tg.token, api_base=tg.url, mode="polling", poll_timeout_s=1
    )
    adapter = TelegramAdapter(section, ctx)
    update = tg.message(ANA, "store me")
    tg.push(update)
    await adapter.start()
    try:
        await until(lambda: len(stored) == 2)
        await until(lambda: any(o > update["update_id"] for o in tg.offsets))
    finally:
        await adapter.aclose()
        await store.aclose()
    assert stored == ["refused", f"{update['update_id']}:{update['message']['message_id']}"]
    assert all(o <= update["update_id"] for o in offsets_when_stored[0])
