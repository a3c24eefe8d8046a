"""Outbound through the real gateway: long replies in ordered valid chunks, 429 storms, blocked
users, refused HTML, resumed parts, and streamed previews that never leave a second copy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from channels.telegram.client import RATES, TelegramClient, is_parse_error
from channels.telegram.live import Live
from channels.telegram.markdown import render
from channels.telegram.rich import MAX_UNITS
from channels.telegram.settings import TelegramSettings
from core.errors import ChannelError
from core.models import Attachment, InboundMessage, Reply, Sender, SessionKey
from core.store import SqliteStore
from tests.fake_openai import FakeOpenAI, Text, ToolCalls, last_user_text
from tests.fake_telegram import (
    ANA,
    BOB,
    GROUP,
    FakeTelegram,
    Gateway,
    User,
    running_fake,
    running_gateway,
    until,
    utf16,
    write_config,
)

Start = Callable[..., Awaitable[Gateway]]


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch) as fake:
        yield fake


@pytest_asyncio.fixture
async def start(tmp_path: Path, fake_openai: FakeOpenAI) -> AsyncIterator[Start]:
    async with contextlib.AsyncExitStack() as stack:

        async def go(tg: FakeTelegram, extra: str = "") -> Gateway:
            config = write_config(tmp_path, tg, fake_openai.url, extra=extra)
            return await stack.enter_async_context(running_gateway(config, tg))

        yield go


def long_markdown(min_chars: int = 10_000) -> tuple[str, list[str]]:
    """Markdown full of entities, with numbered marks to check order and completeness."""
    parts, marks, i = [], [], 0
    while sum(len(p) for p in parts) < min_chars:
        m = [f"m{i:03d}{x}" for x in "abcdef"]
        marks += m
        parts.append(
            f"## Part {m[0]}\n\nSome **bold {m[1]}** and _italic_ text, `code {m[2]}`, a "
            f"[link](https://example.com/{i}?a=1&b=2) & <not a tag> 😀 ~~old~~.\n\n"
            f"- item {m[3]}\n- item *two*\n  1. nested\n\n"
            f"```python\nif x < {i} and y > 2:\n    print('{m[4]}')\n```\n\n"
            f"> quoted **{m[5]}** line\n> second line\n\n"
        )
        i += 1
    return "".join(parts), marks


async def test_a_long_markdown_reply_arrives_as_ordered_valid_chunks(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    text, marks = long_markdown()
    assert len(text) > 10_000
    fake_openai.responder = lambda body: Text(text)
    gw = await start(tg)
    await gw.deliver(tg.message(ANA, "tell me everything"))
    expected = render(text).chunks()
    await until(lambda: len(tg.in_chat(ANA.id)) == len(expected))
    await asyncio.sleep(0.3)
    sent = tg.in_chat(ANA.id)
    assert len(sent) == len(expected) >= 2
    assert [s.text for s in sent] == [plain for _, plain in expected]
    assert all(s.html is not None and utf16(s.text) <= MAX_UNITS for s in sent)
    joined = "\n".join(s.text for s in sent)
    positions = [joined.find(m) for m in marks]
    assert -1 not in positions
    assert positions == sorted(positions)
    assert sum(len(s.entities) for s in sent) > 100
    assert not tg.rejected
    assert tg.drafts  # streamed as a draft first: private chat


async def test_a_429_storm_ends_with_every_message_delivered_once(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    users = [User(500_000 + i, f"U{i}") for i in range(6)]
    tg.flood(9, 0.6)  # longer than the outbox's own first backoff: only honouring it waits enough
    gw = await start(tg, "streaming = false\n")
    await asyncio.gather(*(gw.deliver(tg.message(u, f"hello {i}")) for i, u in enumerate(users)))
    await until(lambda: all(len(tg.in_chat(u.id)) == 1 for u in users), timeout=20)
    await asyncio.sleep(0.3)
    for i, u in enumerate(users):
        assert [s.text for s in tg.in_chat(u.id)] == [f"echo: hello {i}"]
    assert sum("Too Many Requests" in r for r in tg.rejected) >= 9
    assert tg.early_retries == 0  # every retry waited for retry_after
    outcomes = gw.outbox()
    assert [o["status"] for o in outcomes] == ["sent"] * 6
    assert sum(o["attempts"] for o in outcomes) == 6 + 9  # each refusal was recorded


async def test_a_blocked_user_stops_retries_until_they_write_again(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.3)
    tg.blocked.add(ANA.id)
    gw = await start(tg, 'streaming = false\n[agent]\nqueue_mode = "followup"\n')
    await gw.deliver(tg.message(ANA, "first"))
    await gw.deliver(tg.message(ANA, "second"))
    await until(lambda: len(gw.outbox()) == 2 and all(o["status"] == "failed" for o in gw.outbox()))
    first, second = gw.outbox()
    assert first["attempts"] == second["attempts"] == 1  # failed once, not retried
    assert "blocked" in first["error"]
    assert len([w for w in tg.writes_to(ANA.id)]) == 1  # the second failed fast, no API call
    assert await gw.kv("telegram_blocked", str(ANA.id))
    tg.blocked.clear()
    await gw.deliver(tg.message(ANA, "I unblocked you"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    assert tg.in_chat(ANA.id)[0].text == "echo: I unblocked you"


async def test_an_operator_can_send_a_blocked_reply_again_once_unblocked(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The dead letter's retry was refused from the stored block without asking Telegram,
    though the console answered "retried"."""
    tg.blocked.add(ANA.id)
    token = "operator-token-0123456789"
    gw = await start(tg, f'streaming = false\n[admin]\ntoken = "{token}"\n')
    await gw.deliver(tg.message(ANA, "first"))
    await until(lambda: len(gw.outbox()) == 1 and gw.outbox()[0]["status"] == "failed")
    tg.blocked.clear()  # unblocked, without writing
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as admin:
        r = await admin.post(
            "/admin/api/dead-letters/retry",
            json={"kind": "outbox", "id": 1},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 202, r.text
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    assert tg.in_chat(ANA.id)[0].text == "echo: first"


async def test_a_chunk_telegram_still_refuses_is_sent_as_plain_text(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    tg.refuse_html = True
    fake_openai.responder = lambda body: Text("**Bold** and `code` <kept>")
    gw = await start(tg, "streaming = false\n")
    await gw.deliver(tg.message(ANA, "hi"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    [sent] = tg.in_chat(ANA.id)
    assert (sent.text, sent.html) == ("Bold and code <kept>", None)
    assert any("can't parse entities" in r for r in tg.rejected)
    await until(lambda: gw.outbox()[0]["status"] == "sent")


async def test_a_failed_chunk_is_retried_without_resending_the_earlier_ones(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "word " * 60 for i in range(40))
    expected = [plain for _, plain in render(text).chunks()]
    assert len(expected) >= 3
    fake_openai.responder = lambda body: Text(text)
    tg.fail_next("sendMessage", 502, "Bad Gateway", after=1)
    gw = await start(tg, "streaming = false\n")
    await gw.deliver(tg.message(ANA, "long one"))
    await until(lambda: len(tg.in_chat(ANA.id)) == len(expected))
    await asyncio.sleep(0.3)
    assert [s.text for s in tg.in_chat(ANA.id)] == expected
    [part] = gw.outbox()
    assert (part["status"], part["attempts"]) == ("sent", 2)  # one failure, then the rest
    assert part["platform_id"] == str(tg.in_chat(ANA.id)[0].message_id)


async def test_a_restart_in_the_middle_of_a_long_reply_sends_each_message_once(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The gateway stops while the third message of a reply is on its way; the part was never
    counted as tried, and its saved progress used to be read only for parts that had been."""
    text = "\n\n".join(f"Paragraph {i}: " + "word " * 60 for i in range(40))
    expected = [plain for _, plain in render(text).chunks()]
    assert len(expected) >= 4
    fake_openai.responder = lambda body: Text(text)
    tg.stall_next("sendMessage", after=2)
    config = write_config(tmp_path, tg, fake_openai.url, extra="streaming = false\n")
    async with running_gateway(config, tg) as gw:
        await gw.deliver(tg.message(ANA, "long one"))
        await until(lambda: tg.methods().count("sendMessage") == 3)
    assert len(tg.in_chat(ANA.id)) == 2
    async with running_gateway(config, tg) as gw:
        await until(lambda: [o["status"] for o in gw.outbox()] == ["sent"])
    assert [s.text for s in tg.in_chat(ANA.id)] == expected


async def test_private_previews_are_drafts_and_the_final_message_replaces_them(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    words = " ".join(f"w{i}" for i in range(20))
    fake_openai.responder = lambda body: Text(words, chunk_delay_s=0.065)
    gw = await start(tg)
    await gw.deliver(tg.message(ANA, "stream please"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    assert len(tg.drafts) >= 2
    assert all(words.startswith(text) for _, _, text in tg.drafts)
    assert [s.text for s in tg.in_chat(ANA.id, include_deleted=True)] == [words]
    typing = [a for a in tg.actions if a[0] == ANA.id]
    assert typing


async def test_without_drafts_private_previews_are_edited_in_place(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    tg.drafts_supported = False
    words = " ".join(f"w{i}" for i in range(16))
    fake_openai.responder = lambda body: Text(f"**{words}**", chunk_delay_s=0.08)
    gw = await start(tg)
    await gw.deliver(tg.message(ANA, "one"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1 and tg.in_chat(ANA.id)[0].text == words)
    await gw.deliver(tg.message(ANA, "two"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 2 and tg.in_chat(ANA.id)[1].text == words)
    await asyncio.sleep(0.3)
    assert [s.text for s in tg.in_chat(ANA.id, include_deleted=True)] == [words, words]
    assert tg.in_chat(ANA.id)[0].edits >= 1
    assert tg.in_chat(ANA.id)[0].html == f"<b>{words}</b>"
    assert tg.methods().count("sendMessageDraft") == 1  # learnt once, not asked again


async def test_a_chat_that_refuses_a_draft_edits_messages_and_the_others_keep_drafts(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """One chat's 400 to sendMessageDraft turned drafts off for every chat until a restart."""
    tg.drafts_refused.add(ANA.id)
    words = " ".join(f"w{i}" for i in range(16))
    fake_openai.responder = lambda body: Text(words, chunk_delay_s=0.08)
    gw = await start(tg)
    await gw.deliver(tg.message(ANA, "one"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1 and tg.in_chat(ANA.id)[0].text == words)
    assert tg.in_chat(ANA.id)[0].edits >= 1  # its preview was a message, edited
    await gw.deliver(tg.message(BOB, "two"))
    await until(lambda: len(tg.in_chat(BOB.id)) == 1 and tg.in_chat(BOB.id)[0].text == words)
    assert {chat for chat, _, _ in tg.drafts} == {BOB.id}  # Bob still got drafts


async def test_a_discarded_run_deletes_its_preview(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    slow = " ".join(f"slow{i}" for i in range(40))
    fake_openai.script(Text(slow, chunk_delay_s=0.1))
    fake_openai.responder = lambda body: Text("the new answer")
    gw = await start(tg, '[agent]\nqueue_mode = "interrupt"\n')
    chat = GROUP["id"]
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot first", chat=GROUP))
    await until(lambda: len(tg.in_chat(chat)) == 1)  # the preview is up
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot no, this", chat=GROUP))
    await until(lambda: [s.text for s in tg.in_chat(chat)] == ["the new answer"])
    everything = tg.in_chat(chat, include_deleted=True)
    assert [s.deleted for s in everything] == [True, False]
    assert everything[0].text.startswith("slow0")


@pytest.mark.parametrize(
    ("said", "markup"),
    [
        ('Bad Request: can\'t parse entities: Unsupported start tag "x" at byte offset 3', True),
        ("Bad Request: can't find end of the entity starting at byte offset 12", True),
        ("Bad Request: Can't parse message text: unexpected end tag", True),
        ("Bad Request: chat not found", False),
        ("Bad Request: message thread not found", False),
    ],
)
def test_a_markup_refusal_is_known_by_more_than_one_wording(said: str, markup: bool) -> None:
    """The wording of Telegram's markup errors is not a contract (reference/channels.md)."""
    assert is_parse_error(ChannelError(said, code="bad_request")) is markup
    assert not is_parse_error(ChannelError(said, retryable=True, code="flood"))


async def test_client_limits_space_messages_per_chat_and_per_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    monkeypatch.setitem(RATES, "chat", (1, 0.1))
    monkeypatch.setitem(RATES, "group", (2, 1.0))
    async with running_fake(monkeypatch, real_limits=True) as tg:
        section = TelegramSettings(enabled=True, token=tg.token, api_base=tg.url)
        client = TelegramClient(section)
        try:
            for _ in range(2):
                await client.send_text(ANA.id, "a", "a")
            for i in range(3):
                await client.send_text(-100 - i, "g", "g")
            for _ in range(3):
                await client.send_text(GROUP["id"], "g", "g")
            await client.edit_text(GROUP["id"], 1, "edited", "edited")  # edits: no group budget
        finally:
            await client.aclose()
    private = [t for t, _ in tg.writes_to(ANA.id)]
    assert private[1] - private[0] >= 0.08
    others = [tg.writes_to(-100 - i)[0][0] for i in range(3)]
    assert others[2] - others[0] < 0.2  # separate chats do not wait for each other
    group = [t for t, _ in tg.writes_to(GROUP["id"])]
    assert group[2] - group[0] >= 0.45  # two per second in a group, per its own budget
    assert group[3] - group[2] < 0.3


async def test_group_preview_edits_once_a_second_rolls_over_and_becomes_the_reply(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    text = " ".join(f"a-rather-long-streamed-word-number-{i:04d}" for i in range(150))
    expected = [plain for _, plain in render(text).chunks()]
    assert len(expected) == 2
    fake_openai.responder = lambda body: Text(text, chunk_delay_s=0.012)
    chat = GROUP["id"]
    async with running_fake(monkeypatch, real_limits=True) as tg:
        async with running_gateway(write_config(tmp_path, tg, fake_openai.url), tg) as gw:
            mention = tg.message(ANA, "@switchboard_test_bot go on", chat=GROUP)
            await gw.deliver(mention)
            await until(lambda: [s.text for s in tg.in_chat(chat)] == expected, timeout=25)
            await asyncio.sleep(0.5)
        everything = tg.in_chat(chat, include_deleted=True)
        times = [t for t, _ in tg.writes_to(chat)]
    assert [s.text for s in everything] == expected  # the previews became the reply
    assert everything[0].edits >= 1
    assert everything[0].reply_to == mention["message"]["message_id"]
    assert everything[1].reply_to is None
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))


async def test_in_a_group_the_answer_to_a_button_press_becomes_its_preview(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The preview quoted nothing (a press is not typed) but the reply meant to quote the
    bot's own question, so the preview was deleted and the answer sent anew."""
    fake_openai.script(
        ToolCalls([("send_buttons", json.dumps({"buttons": [{"label": "Yes", "value": "y"}]}))]),
        Text("Shall I?"),
    )
    chat = GROUP["id"]
    gw = await start(tg)
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot book it", chat=GROUP))
    await until(lambda: tg.in_chat(chat) and tg.in_chat(chat)[0].buttons())
    [question] = tg.in_chat(chat)
    answer = " ".join(f"word{i}" for i in range(60))
    fake_openai.responder = lambda body: Text(answer, chunk_delay_s=0.04)
    await gw.deliver(tg.press(ANA, question, "y"))
    await until(lambda: [s.text for s in tg.in_chat(chat)] == ["Shall I?", answer], timeout=15)
    await asyncio.sleep(0.3)
    everything = tg.in_chat(chat, include_deleted=True)
    assert [s.text for s in everything] == ["Shall I?", answer]  # no preview deleted
    assert everything[1].edits >= 1
    assert everything[1].reply_to is None


async def test_a_429_on_a_preview_edit_is_waited_out(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The live preview retried its edit every second through a 429's retry_after."""
    text = " ".join(f"word-{i:04d}" for i in range(300))
    assert len(render(text).chunks()) == 1
    fake_openai.responder = lambda body: Text(text, chunk_delay_s=0.01)
    gw = await start(tg)
    chat = GROUP["id"]
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot go on", chat=GROUP))
    await until(lambda: tg.in_chat(chat))  # the preview is up
    tg.flood(1, 1.5)  # the next edit is refused: nothing may reach the chat for 1.5 s
    await until(lambda: [s.text for s in tg.in_chat(chat)] == [text], timeout=20)
    assert sum("Too Many Requests" in r for r in tg.rejected) == 1
    assert tg.early_retries == 0


async def test_a_reply_to_a_group_upgraded_to_a_supergroup_goes_to_the_supergroup(
    start: Start, tg: FakeTelegram
) -> None:
    """Telegram answers 400 with migrate_to_chat_id; the reply was failed for good."""
    supergroup = -1009876543210
    tg.fail_next(
        "sendMessage",
        400,
        "Bad Request: group chat was upgraded to a supergroup chat",
        parameters={"migrate_to_chat_id": supergroup},
    )
    gw = await start(tg, "streaming = false\n")
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot hello", chat=GROUP))
    await until(lambda: tg.in_chat(supergroup), timeout=20)
    assert [s.text for s in tg.in_chat(supergroup)] == ["echo: hello"]
    assert tg.in_chat(GROUP["id"]) == []
    await until(lambda: [o["status"] for o in gw.outbox()] == ["sent"])


async def test_a_429_on_the_typing_action_is_waited_out(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("channels.telegram.live.TYPING_EVERY_S", 0.2)
    fake_openai.responder = lambda body: Text("done thinking", delay_s=1.6)
    tg.fail_next("sendChatAction", 429, "Too Many Requests: retry after 1", retry_after=1.0)
    gw = await start(tg, "streaming = false\n")
    await gw.deliver(tg.message(ANA, "think hard"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    asked = [t for t, (m, _) in zip(tg.stamps, tg.calls, strict=True) if m == "sendChatAction"]
    assert len(asked) >= 2
    assert asked[1] - asked[0] >= 0.95  # not every 0.2 s while refused


async def test_typing_is_refreshed_while_the_run_lasts_and_stops_after(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("channels.telegram.live.TYPING_EVERY_S", 0.2)
    fake_openai.responder = lambda body: Text("done thinking", delay_s=0.9)
    gw = await start(tg, "streaming = false\n")
    await gw.deliver(tg.message(ANA, "think hard"))
    await until(lambda: len(tg.in_chat(ANA.id)) == 1)
    during = len(tg.actions)
    await asyncio.sleep(0.5)
    assert during >= 3  # about every 0.2 s for 0.9 s
    assert len(tg.actions) == during  # stopped with the run
    assert set(tg.actions) == {(ANA.id, "typing", None)}


async def test_a_restart_between_preview_and_reply_still_replaces_the_preview(
    tmp_path: Path, tg: FakeTelegram
) -> None:

    store = SqliteStore(tmp_path / "live.db")
    await store.start()
    client = TelegramClient(TelegramSettings(enabled=True, token=tg.token, api_base=tg.url))
    key = SessionKey("default", "telegram", "123456789", str(GROUP["id"]))
    asking = InboundMessage(
        channel="telegram",
        account="123456789",
        conversation=str(GROUP["id"]),
        sender=Sender(id=str(ANA.id)),
        text="@bot what now?",
        platform_id="1001:77",
    )
    try:
        before = Live(client, store, streaming=True)
        await before.run_started(key, "run1", asking)
        await before.run_delta(key, "run1", "partial **answer**")
        await until(lambda: len(tg.in_chat(GROUP["id"])) == 1)
        await before.aclose()  # the process dies here, before run_ended and the final send
        after = Live(client, store, streaming=True)
        handed = await after.take(key, "run1")
        assert handed.ids == [tg.in_chat(GROUP["id"])[0].message_id]
        # kept until the taker has them in its own record: a stop before would lose them
        assert (await after.take(key, "run1")).ids == handed.ids
        await after.handed(key, "run1")
        assert (await after.take(key, "run1")).ids == []  # handed over once
        assert (await after.take(key, "other-run")).ids == []
    finally:
        await client.aclose()
        await store.aclose()


async def test_a_reply_failing_for_good_keeps_the_preview_it_was_edited_into(
    start: Start, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The first chunk of a long reply was edited into the run's preview, the second failed
    for good. The preview's record stayed in the store, so the next run took that message
    over (or, quoting another message, deleted it): the delivered half of the answer went."""
    words = " ".join(f"w{i:04d}" for i in range(1000))  # two messages
    assert len(render(words).chunks()) == 2
    fake_openai.responder = lambda body: Text(words, chunk_delay_s=0.002)
    gw = await start(tg)
    chat = GROUP["id"]
    # the preview's first message goes out; every later one is refused for good
    tg.fail_next("sendMessage", 403, "Forbidden: bot was kicked from the group", times=9, after=1)
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot tell me everything", chat=GROUP))
    await until(lambda: [o["status"] for o in gw.outbox()] == ["failed"], timeout=15)
    tg._failures.clear()
    (first,) = tg.in_chat(chat)
    assert first.text.startswith("w0000")
    assert first.text.split()[-1] != "w0999"
    fake_openai.responder = lambda body: Text("short answer", chunk_delay_s=0.3)
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot and now?", chat=GROUP))
    await until(lambda: any(s.text == "short answer" for s in tg.in_chat(chat)), timeout=15)
    await asyncio.sleep(0.3)
    assert first in tg.in_chat(chat)
    assert first.text.startswith("w0000")


@pytest.mark.parametrize(
    ("name", "url", "html"),
    [  # a file's name is whoever named it: "x](tg://…) [y" made a second link
        (
            "x](tg://resolve?domain=evil) [y",
            "https://f.io/a.pdf",
            '<a href="https://f.io/a.pdf">x](tg://resolve?domain=evil) [y</a>',
        ),
        ("a]b_c*.pdf", "https://f.io/a b.pdf", '<a href="https://f.io/a%20b.pdf">a]b_c*.pdf</a>'),
    ],
)
def test_a_reply_files_name_is_shown_as_it_is(name: str, url: str, html: str) -> None:
    from channels.telegram.outbound import _chunks

    reply = Reply(text="hi", attachments=(Attachment(kind="document", name=name, url=url),))
    assert _chunks(reply, "s") == [(f"hi\n\n{html}", f"hi\n\n{name}")]


async def test_what_delivery_remembers_of_blocked_chats_is_bounded(tmp_path: Path) -> None:
    """It remembered every chat it ever sent to, for good."""
    from channels.telegram import outbound

    store = SqliteStore(tmp_path / "s.db")
    await store.start()
    try:
        delivery = outbound.Delivery(None, store, None)  # type: ignore[arg-type]
        for chat in range(outbound.BLOCKED_KEEP + 500):
            key = SessionKey("default", "telegram", "123456789", str(chat))
            await delivery._check_blocked(key, chat, 1)
        assert len(delivery._blocked) == outbound.BLOCKED_KEEP
    finally:
        await store.aclose()
