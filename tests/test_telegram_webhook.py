"""The webhook route: fail closed on the secret, 4xx for bad bodies, 200 for what is ignored,
bounded media downloads, and nothing slow on the request path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.fake_openai import FakeOpenAI, Text, last_user_text
from tests.fake_telegram import (
    ANA,
    GROUP,
    SECRET,
    FakeTelegram,
    Gateway,
    running_fake,
    running_gateway,
    until,
    write_config,
)


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch) as fake:
        yield fake


@pytest_asyncio.fixture
async def gw(tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI) -> AsyncIterator[Gateway]:
    config = write_config(
        tmp_path,
        tg,
        fake_openai.url,
        extra="media_timeout_s = 0.5\n",
        channels="max_media_bytes = 65536\n",
    )
    async with running_gateway(config, tg) as g:
        yield g


@pytest.mark.parametrize("secret", [None, "", "wrong-secret", SECRET + "x", SECRET[:-1]])
async def test_missing_or_wrong_secret_is_403_and_nothing_is_stored(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI, secret: str | None
) -> None:
    resp = await gw.post(tg.message(ANA, "let me in"), secret=secret)
    assert resp.status_code == 403
    await asyncio.sleep(0.2)
    assert gw.inbox() == []
    assert fake_openai.requests == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "Invalid JSON"),
        (b"[1, 2]", "Input should be an object"),
        (b'{"message": {"text": "no update id"}}', "update_id"),
        (b'{"update_id": "abc"}', "update_id"),
        (b'{"update_id": 1, "message": {"message_id": 1, "text": "no chat"}}', "chat"),
        (b'{"update_id": 1, "message": "hello"}', "message"),
        (b"\xff\xfe\x00", "JSON"),
    ],
)
async def test_bad_bodies_are_400_with_a_reason(gw: Gateway, body: bytes, reason: str) -> None:
    resp = await gw.post(body)
    assert resp.status_code == 400
    assert reason.lower() in resp.json()["error"].lower()
    assert gw.inbox() == []


@pytest.mark.parametrize(
    "update",
    [
        {
            "update_id": 5,
            "channel_post": {"message_id": 3, "chat": {"id": -100, "type": "channel"}},
        },
        {"update_id": 6, "my_chat_member": {"chat": {"id": -100, "type": "group"}}},
        {"update_id": 7, "poll": {"id": "1", "question": "?", "options": []}},
        {"update_id": 8},
        {"update_id": 9, "some_future_kind": {"x": 1}},
    ],
)
async def test_unknown_update_kinds_are_acknowledged_and_ignored(
    gw: Gateway, fake_openai: FakeOpenAI, update: dict[str, object]
) -> None:
    resp = await gw.post(update)
    assert resp.status_code == 200
    assert gw.inbox() == []


async def test_a_lone_surrogate_is_mended_not_refused(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """Half of a UTF-16 pair is valid JSON but no valid UTF-8: the message is kept with
    U+FFFD in its place (it once failed at the store, after the webhook was answered)."""
    resp = await gw.post(tg.message(ANA, "broken \ud83d emoji"))
    assert resp.status_code == 200
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    assert last_user_text(fake_openai.requests[0]).endswith("broken \ufffd emoji")


async def test_a_button_press_is_acknowledged_even_when_it_carries_nothing(
    gw: Gateway, tg: FakeTelegram
) -> None:
    query = tg.callback(ANA)  # from an inline-mode message: no chat, no data
    resp = await gw.post(query)
    assert resp.status_code == 200
    await until(lambda: tg.answered == [query["callback_query"]["id"]])
    assert gw.inbox() == []


async def test_a_redelivered_button_press_is_stored_and_answered_once(
    gw: Gateway, tg: FakeTelegram
) -> None:
    """Telegram redelivers an update whose acknowledgement it did not get; the press has one
    answer (a second is refused by Telegram) and is one message."""
    press = tg.callback(ANA, message=tg.message(ANA, "Book?")["message"], data="yes")
    assert (await gw.post(press)).status_code == 200
    assert (await gw.post(press)).status_code == 200
    await until(lambda: tg.answered == [press["callback_query"]["id"]])
    await until(lambda: len(gw.inbox()) == 1)
    await asyncio.sleep(0.2)  # a second answer would have been sent by now
    assert tg.methods().count("answerCallbackQuery") == 1
    assert len(gw.inbox()) == 1


async def test_the_webhook_answers_before_the_agent_does(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text("slow answer", delay_s=1.0)
    started = time.monotonic()
    resp = await gw.post(tg.message(ANA, "hi"))
    assert resp.status_code == 200
    assert time.monotonic() - started < 0.5
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)


async def test_a_file_over_the_cap_is_described_not_fetched(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    doc = tg.add_file(b"x" * 100, "documents/big.pdf", size=10 * 1024 * 1024)
    doc.update(file_name="big.pdf", mime_type="application/pdf")
    await gw.deliver(tg.message(ANA, None, caption="see attached", document=doc))
    await until(lambda: len(fake_openai.requests) == 1)
    seen = last_user_text(fake_openai.requests[0])
    assert 'a document "big.pdf", not downloaded (larger than the 64 KB limit)' in seen
    assert "getFile" not in tg.methods()


async def test_a_file_that_grows_past_the_cap_while_downloading_is_dropped(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    doc = tg.add_file(b"y" * 200_000, "documents/liar.bin", size=1000)  # both under-report
    await gw.deliver(tg.message(ANA, None, caption="small, honest", document=doc))
    await until(lambda: len(fake_openai.requests) == 1)
    assert "not downloaded (larger than" in last_user_text(fake_openai.requests[0])
    assert not [p for p in (tmp_path / "files").rglob("*") if p.is_file()]


async def test_a_slow_download_is_stored_in_time_and_described_as_missing(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    tg.file_delay_s = 3.0
    voice = tg.add_file(b"OggS" * 100, "voice/file_9.oga")
    voice.update(duration=4, mime_type="audio/ogg")
    started = time.monotonic()
    resp = await gw.post(tg.message(ANA, None, voice=voice))
    assert resp.status_code == 200
    assert time.monotonic() - started < 2.0  # bounded by media_timeout_s, not the download
    await until(lambda: len(fake_openai.requests) == 1)
    assert "a voice note (4 s), not downloaded (it took too long)" in last_user_text(
        fake_openai.requests[0]
    )


async def test_no_route_in_polling_mode(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    config = write_config(tmp_path, tg, fake_openai.url, mode="polling")
    async with running_gateway(config, tg) as gw:
        resp = await gw.post(tg.message(ANA, "hi"))
        assert resp.status_code in (404, 405)
        async with httpx.AsyncClient(base_url=gw.url) as client:
            assert (await client.get("/healthz")).status_code == 200


async def test_group_message_not_for_the_bot_is_200_and_not_stored(
    gw: Gateway, tg: FakeTelegram
) -> None:
    resp = await gw.post(tg.message(ANA, "just chatting", chat=GROUP))
    assert resp.status_code == 200
    assert gw.inbox() == []


async def test_a_group_message_before_the_bot_knows_its_username_is_retried_not_dropped(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """getMe failed at start: a mention was answered 200 and dropped (no username to match),
    and other bots' commands were taken for ours. Now Telegram is asked to retry until getMe
    works (the gateway tries it again for each such message)."""
    tg.fail_next("getMe", 502, "Bad Gateway", times=2)
    config = write_config(tmp_path, tg, fake_openai.url)
    async with running_gateway(config, tg) as gw:
        mention = tg.message(ANA, "@switchboard_test_bot are you there?", chat=GROUP)
        first = await gw.post(mention)
        assert first.status_code == 503
        assert "username" in first.json()["error"]
        assert (await gw.post(mention)).status_code == 200  # getMe works by now
        assert (await gw.post(tg.message(ANA, "/help@other_bot", chat=GROUP))).status_code == 200
        await until(lambda: len(tg.in_chat(GROUP["id"])) == 1)
        await asyncio.sleep(0.3)
        assert [m["text"] for _, m in gw.inbox()] == ["are you there?"]


async def test_a_text_right_after_a_photo_is_not_answered_before_it(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The photo's update was stored only once its file had downloaded, so the text sent
    after it was stored, and answered without the photo, first."""
    tg.file_delay_s = 0.6
    photo = [{**tg.add_file(b"picture", "photos/first.jpg"), "width": 9, "height": 9}]
    config = write_config(tmp_path, tg, fake_openai.url, extra="media_timeout_s = 2\n")
    async with running_gateway(config, tg) as gw:
        sent = asyncio.create_task(gw.post(tg.message(ANA, None, caption="look", photo=photo)))
        await asyncio.sleep(0.2)
        assert (await gw.post(tg.message(ANA, "what is in it?"))).status_code == 200
        assert (await sent).status_code == 200
        await until(lambda: "in it?" in "".join(last_user_text(b) for b in fake_openai.requests))
    assert "[attachment image" in last_user_text(fake_openai.requests[0])


async def test_an_edit_that_changes_nothing_the_agent_reads_is_not_answered_again(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """With edits read as new messages, an edit leaving the text as it was (Telegram sends one
    for a change of formatting too) got a second, identical answer."""
    config = write_config(tmp_path, tg, fake_openai.url, extra='edited_messages = "new"\n')
    async with running_gateway(config, tg) as gw:
        first = tg.message(ANA, "what time is it in Rome")
        await gw.deliver(first)
        await until(lambda: len(tg.in_chat(ANA.id)) == 1)
        for text in ("what time is it in Rome", "what time is it in Paris"):
            edit = tg.message(ANA, text, edited=True)
            edit["edited_message"]["message_id"] = first["message"]["message_id"]
            await gw.deliver(edit)
        await until(lambda: len(tg.in_chat(ANA.id)) == 2)
        await asyncio.sleep(0.3)
    assert len(tg.in_chat(ANA.id)) == 2
    assert "Paris" in last_user_text(fake_openai.requests[-1])
