"""End to end, once through the webhook route and once through the long-polling loop: the real
gateway, a fake model, and the fake Bot API checking everything the adapter sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from core.sessions import HELP_REPLY, RESET_REPLY
from tests.fake_openai import FakeOpenAI, Text, ToolCalls, last_user_text
from tests.fake_telegram import (
    ANA,
    BOB,
    FORUM,
    GROUP,
    FakeTelegram,
    Gateway,
    running_fake,
    running_gateway,
    until,
    write_config,
)

Start = Callable[..., Awaitable[Gateway]]


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch) as fake:
        yield fake


@pytest.fixture(params=["webhook", "polling"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture
async def gw(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI, mode: str
) -> AsyncIterator[Gateway]:
    async with running_gateway(write_config(tmp_path, tg, fake_openai.url, mode=mode), tg) as g:
        yield g


def user_texts(fake_openai: FakeOpenAI) -> list[str]:
    return [last_user_text(body) for body in fake_openai.requests]


async def test_private_chat(gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    await gw.deliver(tg.message(ANA, "/start"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    await gw.deliver(tg.message(ANA, "hello **there** <3"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 2)
    await gw.deliver(tg.message(ANA, "/reset"))
    await gw.deliver(tg.message(ANA, "/help"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 4)
    greeting, echo, reset, help_ = tg.in_chat(ANA.id)
    assert greeting.text == "Hello! How can I help you today?"
    assert echo.text == "echo: hello there <3"
    assert echo.html == "echo: hello <b>there</b> &lt;3"
    assert (reset.text, help_.text) == (RESET_REPLY, HELP_REPLY)
    assert (ANA.id, "typing", None) in tg.actions
    assert user_texts(fake_openai) == ["hello **there** <3"]
    assert not tg.rejected


async def test_group_mention_gating(gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    chat = GROUP["id"]
    for ignored in (
        tg.message(BOB, "lunch at 1?", chat=GROUP),
        tg.message(BOB, "/help@other_bot", chat=GROUP),
        tg.message(BOB, "ask @other_bot", chat=GROUP),
    ):
        await gw.deliver(ignored)
    assert gw.inbox() == []
    mention = tg.message(BOB, "@switchboard_test_bot what time is it?", chat=GROUP)
    await gw.deliver(mention)
    await until(lambda: len(tg.in_chat(chat)) == 1)
    [answer] = tg.in_chat(chat)
    assert answer.text == "echo: what time is it?"
    assert answer.reply_to == mention["message"]["message_id"]
    reply = tg.message(ANA, "and tomorrow?", chat=GROUP, reply_to=answer)
    await gw.deliver(reply)
    await gw.deliver(tg.message(ANA, "/help@switchboard_test_bot", chat=GROUP))
    await until(lambda: len(tg.in_chat(chat)) == 3)
    second, help_ = tg.in_chat(chat)[1:]
    quote = "[in reply to your message: «echo: what time is it?»]"  # what "and tomorrow" is about
    assert second.text == f"echo: {quote}\nand tomorrow?"
    assert second.reply_to == reply["message"]["message_id"]
    assert help_.text == HELP_REPLY
    assert user_texts(fake_openai) == [  # who wrote each message, in a group
        "[from: Bob, id 222222]\nwhat time is it?",
        f"[from: Ana, id 111111]\n{quote}\nand tomorrow?",
    ]
    assert len(gw.inbox()) == 3


async def test_topic_isolation(gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    chat = FORUM["id"]
    tg.forums[chat] = {7, 9}
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot I am Alice", chat=FORUM, thread=7))
    await gw.deliver(tg.message(BOB, "@switchboard_test_bot I am Bob", chat=FORUM, thread=9))
    await until(lambda: len(tg.in_chat(chat)) == 2)
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot who am I?", chat=FORUM, thread=7))
    await until(lambda: len(tg.in_chat(chat)) == 3)
    by_thread = {(s.thread, s.text) for s in tg.in_chat(chat)}
    assert by_thread == {
        (7, "echo: I am Alice"),
        (9, "echo: I am Bob"),
        (7, "echo: who am I?"),
    }
    sessions = {session for session, _ in gw.inbox()}
    assert len(sessions) == 2
    assert {s.rsplit(":", 1)[1] for s in sessions} == {"7", "9"}
    for body in fake_openai.requests:
        seen = json.dumps(body["messages"])
        assert not ("Alice" in seen and "Bob" in seen)
    assert {(c, t) for c, _, t in tg.actions if c == chat} <= {(chat, 7), (chat, 9)}


async def test_duplicate_update_answered_once(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    update = tg.message(ANA, "only once, please")
    if gw.mode == "webhook":
        await gw.deliver(update)
        await gw.deliver(update)  # Telegram retried: the first answer was lost in transit
    else:
        tg.push(update)
        await gw.deliver(update)  # the same update twice in one getUpdates batch
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    await asyncio.sleep(0.5)
    assert [s.text for s in tg.in_chat(ANA.id)] == ["echo: only once, please"]
    assert len(fake_openai.requests) == 1
    assert len(gw.inbox()) == 1


async def test_a_redelivered_photo_keeps_the_file_its_message_points_to(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The redelivery downloads the same bytes to the same content-named path; it used to
    delete that path as "its own copy", leaving the stored message pointing at nothing."""
    photo = [{**tg.add_file(b"picture" * 50, "photos/file_9.jpg"), "width": 9, "height": 9}]
    update = tg.message(ANA, None, caption="again?", photo=photo)
    if gw.mode == "webhook":
        await gw.deliver(update)
        await gw.deliver(update)
    else:
        tg.push(update)
        await gw.deliver(update)
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    await asyncio.sleep(0.3)
    [(_, stored)] = gw.inbox()
    [attachment] = stored["attachments"]
    assert await asyncio.to_thread(Path(attachment["path"]).read_bytes) == b"picture" * 50


async def test_every_photo_of_an_album_addressed_in_a_group_reaches_the_agent(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """Only an album's first photo carries the caption that mentions the bot; the others
    were dropped as not addressed to it."""
    mention = "@switchboard_test_bot"
    photos = [
        [{**tg.add_file(bytes([i]) * 64, f"photos/album_{i}.jpg"), "width": 9, "height": 9}]
        for i in range(3)
    ]
    first = tg.message(
        ANA,
        None,
        chat=GROUP,
        caption=f"{mention} which one is best?",
        caption_entities=[{"type": "mention", "offset": 0, "length": len(mention)}],
        photo=photos[0],
        media_group_id="album-1",
    )
    rest = [
        tg.message(ANA, None, chat=GROUP, photo=p, media_group_id="album-1") for p in photos[1:]
    ]
    for update in [first, *rest]:
        await gw.deliver(update)
    await gw.deliver(tg.message(ANA, None, chat=GROUP, photo=photos[0], media_group_id="other"))
    await until(lambda: len(gw.inbox()) == 3)
    await asyncio.sleep(0.3)
    assert len(gw.inbox()) == 3  # an album nobody addressed to the bot is still not for it
    assert all(len(m["attachments"]) == 1 for _, m in gw.inbox())


async def test_an_album_is_answered_once_not_photo_by_photo(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """Its photos come as separate updates: the first was answered alone, then the rest."""
    photos = [
        [{**tg.add_file(bytes([i]) * 64, f"photos/trip_{i}.jpg"), "width": 9, "height": 9}]
        for i in range(3)
    ]
    first = tg.message(ANA, None, caption="which one?", photo=photos[0], media_group_id="trip")
    await gw.deliver(first)
    for p in photos[1:]:
        await asyncio.sleep(0.15)  # as Telegram sends them: one by one
        await gw.deliver(tg.message(ANA, None, photo=p, media_group_id="trip"))
    await until(lambda: len(tg.in_chat(ANA.id)) >= 1)
    await asyncio.sleep(0.3)
    assert len(tg.in_chat(ANA.id)) == 1
    assert len(fake_openai.requests) == 1
    assert last_user_text(fake_openai.requests[0]).count("[attachment image") == 3


async def test_button_round_trip(gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI) -> None:
    long_value = "confirm-order-2025-000123:" + "table-for-four-at-nine-by-the-window" * 2
    buttons = [{"label": "Yes", "value": "yes"}, {"label": "Later", "value": long_value}]
    fake_openai.script(
        ToolCalls([("send_buttons", json.dumps({"buttons": buttons}))]),
        Text("Shall I **book** it?"),
    )
    await gw.deliver(tg.message(ANA, "book a table"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    [question] = tg.in_chat(ANA.id)
    assert question.text == "Shall I book it?"
    keys = question.buttons()
    assert [k["text"] for k in keys] == ["Yes", "Later"]
    assert keys[0]["callback_data"] == "yes"
    assert keys[1]["callback_data"] != long_value
    assert len(keys[1]["callback_data"].encode()) <= 64
    fake_openai.responder = lambda body: Text(f"you chose: {last_user_text(body)}")
    press = tg.press(ANA, question, keys[1]["callback_data"])
    await gw.deliver(press)
    await until(lambda: len(tg.in_chat(ANA.id)) == 2 and len(tg.answered) == 1)
    assert tg.answered == [press["callback_query"]["id"]]
    said = tg.in_chat(ANA.id)[1].text
    assert said == f"you chose: [pressed the button: Later (value: {long_value})]"
    stored = gw.inbox()[-1][1]
    assert (stored["kind"], stored["text"], stored["button_value"]) == (
        "button",
        "Later",
        long_value,
    )


async def test_a_press_whose_stored_value_is_gone_never_shows_our_token(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """A value too long for callback_data is kept in the store under a token; when it is gone
    (the store was replaced), the model used to read the token as what was pressed."""
    buttons = [{"label": "Later", "value": "later-" + "x" * 80}]
    fake_openai.script(
        ToolCalls([("send_buttons", json.dumps({"buttons": buttons}))]),
        Text("Shall I book it?"),
    )
    await gw.deliver(tg.message(ANA, "book a table"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    [question] = tg.in_chat(ANA.id)
    token = question.buttons()[0]["callback_data"]
    with contextlib.closing(sqlite3.connect(gw.db)) as db, db:
        db.execute("DELETE FROM channel_state WHERE key = ?", (token,))
    await gw.deliver(tg.press(ANA, question, token))
    await until(lambda: len(tg.in_chat(ANA.id)) == 2)
    assert last_user_text(fake_openai.requests[-1]) == "[pressed the button: Later]"


async def test_a_button_tapped_twice_is_one_turn(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """Each tap is its own update (its own update_id and query id): both were stored and the
    agent answered the choice twice. Both taps get their spinner stopped."""
    fake_openai.script(
        ToolCalls([("send_buttons", json.dumps({"buttons": [{"label": "Yes", "value": "y"}]}))]),
        Text("Shall I book it?"),
    )
    await gw.deliver(tg.message(ANA, "book a table"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    [question] = tg.in_chat(ANA.id)
    fake_openai.responder = lambda body: Text(f"you chose: {last_user_text(body)}", delay_s=0.3)
    taps = [tg.press(ANA, question, "y"), tg.press(ANA, question, "y")]
    for tap in taps:
        await gw.deliver(tap)
    await until(lambda: len(tg.in_chat(ANA.id)) == 2 and len(tg.answered) == 2)
    await asyncio.sleep(0.6)
    assert [m.text for m in tg.in_chat(ANA.id)][1:] == [
        "you chose: [pressed the button: Yes (value: y)]"
    ]
    assert len(fake_openai.requests) == 3  # the tool call, the question, one answer
    assert sorted(tg.answered) == sorted(t["callback_query"]["id"] for t in taps)


async def test_photo_with_caption(
    gw: Gateway, tg: FakeTelegram, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    picture = bytes(range(256)) * 40
    small = tg.add_file(b"thumbnail", "photos/file_1.jpg")
    big = tg.add_file(picture, "photos/file_2.jpg")
    photo = [{**small, "width": 90, "height": 67}, {**big, "width": 1280, "height": 960}]
    await gw.deliver(tg.message(ANA, None, caption="Is this the right part?", photo=photo))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    seen = user_texts(fake_openai)[0]
    assert seen.startswith("Is this the right part?\n")
    assert "[attachment image photo.jpg image/jpeg: a photo (1280x960)]" in seen
    [saved] = [p for p in (tmp_path / "files").rglob("*") if p.is_file()]
    assert saved.read_bytes() == picture
    assert [p["file_id"] for m, p in tg.calls if m == "getFile"] == [big["file_id"]]
