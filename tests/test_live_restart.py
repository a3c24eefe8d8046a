"""Live previews across a crash: a process killed while its preview is on screen (or between the
commit and the final send) leaves one message behind, which the restarted gateway replaces or
deletes, so the person sees the complete answer once and nothing cut off.

A test cannot SIGKILL the gateway it runs in, so each one stops the first gateway gracefully (its
cancelled run deletes its preview) and then puts back what a kill would have left: the preview
message in the chat, its record in the store, the thinking reaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from core.models import SessionKey
from core.store import SqliteStore
from gateway.keys import RUNTIME
from tests.fake_openai import FakeOpenAI, Text
from tests.fake_slack import (
    TEAM,
    FakeSlack,
    _SlackError,
    event,
    gateway_config,
    message,
    run_gateway,
)
from tests.fake_telegram import (
    ANA,
    GROUP,
    FakeTelegram,
    Gateway,
    Sent,
    running_fake,
    running_gateway,
    until,
    write_config,
)

SLOW = " ".join(f"slow{i}" for i in range(40))  # about 4 s: cut short by the "crash"
ANSWER = " ".join(f"answer{i}" for i in range(12)) + " END"
DM = "D0DM000001"


async def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll an async check until it gives something truthy."""
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(0.02)
    return result


async def put_back(db: Path, namespace: str, key: str, raw: str | None) -> None:
    """The store's record as the killed process left it."""
    if not raw:
        return
    store = SqliteStore(db)
    await store.start()
    try:
        await store.kv_set(namespace, key, raw)
    finally:
        await store.aclose()


# Telegram


@pytest_asyncio.fixture
async def tg(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeTelegram]:
    async with running_fake(monkeypatch, drafts_supported=False) as fake:
        yield fake


async def previewing(gw: Gateway, tg: FakeTelegram, chat: dict[str, Any] | None) -> Sent:
    """Ana asks (in `chat`, else privately); the preview of the answer, once it is up."""
    chat_id = chat["id"] if chat else ANA.id
    await gw.deliver(tg.message(ANA, "@switchboard_test_bot hello", chat=chat))
    await until(lambda: len(tg.in_chat(chat_id)) == 1)
    (preview,) = tg.in_chat(chat_id)
    return preview


@pytest.mark.parametrize(
    "where", ["group", "group, asked again", "private", "group, previews then switched off"]
)
async def test_telegram_a_run_cut_short_leaves_no_preview_behind(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI, where: str
) -> None:
    """The killed run's preview stayed in the chat and the redone run (a new run id) answered
    in a second message: its saved ids were ignored, then overwritten by the new run's."""
    group = where.startswith("group")
    chat_id = GROUP["id"] if group else ANA.id
    chat = GROUP if group else None
    session = str(SessionKey("default", "telegram", str(tg.bot.id), str(chat_id)))
    fake_openai.script(Text(SLOW, chunk_delay_s=0.1))
    fake_openai.responder = lambda body: Text(ANSWER, chunk_delay_s=0.05)
    config = write_config(tmp_path, tg, fake_openai.url)
    async with running_gateway(config, tg) as gw:
        preview = await previewing(gw, tg, chat)
        saved = await eventually(lambda: gw.kv("telegram_preview", session))
        if where == "group, asked again":  # answered together: the reply quotes this one
            again = tg.message(ANA, "@switchboard_test_bot are you there?", chat=chat)
            await gw.deliver(again)
    for sent in tg.in_chat(chat_id, include_deleted=True):
        sent.deleted = False  # killed: nothing was deleted
    await put_back(tmp_path / "sb.db", "telegram_preview", session, saved)
    if where.endswith("switched off"):  # the operator turned previews off before the restart
        config.write_text(config.read_text() + "streaming = false\n")

    async with running_gateway(config, tg) as gw:
        await until(lambda: any(s.text == ANSWER for s in tg.in_chat(chat_id)))
        await until(lambda: [o["status"] for o in gw.outbox()] == ["sent"])
        await asyncio.sleep(0.3)
        left = await gw.kv("telegram_preview", session)
    (final,) = tg.in_chat(chat_id)
    assert final.text == ANSWER
    assert not left
    if where.startswith("group") and where != "group, asked again":  # edited into the answer
        assert final.message_id == preview.message_id
    if where == "group, asked again":  # the old preview quoted the first message: deleted
        assert final.reply_to == again["message"]["message_id"]
        assert preview.deleted


async def test_telegram_a_stop_while_the_final_edit_waits_out_a_429_leaves_one_message(
    tmp_path: Path, tg: FakeTelegram, fake_openai: FakeOpenAI
) -> None:
    """The reply took the run's preview over and the store's record of it was dropped, but a
    one-message reply kept the preview only in memory: stopped while it waited out a 429, the
    restarted gateway sent the reply anew beside the cut-off preview (SIGTERM or SIGKILL)."""
    chat_id = GROUP["id"]
    session = str(SessionKey("default", "telegram", str(tg.bot.id), str(chat_id)))
    fake_openai.responder = lambda body: Text(ANSWER, chunk_delay_s=0.15)
    config = write_config(tmp_path, tg, fake_openai.url)
    async with running_gateway(config, tg) as gw:
        preview = await previewing(gw, tg, GROUP)
        # a retry_after the restarted gateway still waits out (it is stored with the part)
        tg.fail_next("editMessageText", 429, "Too Many Requests", times=100, retry_after=2)
        await until(lambda: [o["attempts"] for o in gw.outbox()] == [1], timeout=15)
    tg._failures.clear()
    assert preview.text != ANSWER

    async with running_gateway(config, tg) as gw:
        await until(lambda: [o["status"] for o in gw.outbox()] == ["sent"])
        await asyncio.sleep(0.3)
        left = await gw.kv("telegram_preview", session)
        progress = await gw.app[RUNTIME].store.kv_items("telegram_progress")
    (final,) = tg.in_chat(chat_id, include_deleted=True)
    assert (final.message_id, final.text) == (preview.message_id, ANSWER)
    assert left is None
    assert progress == {}


# Slack


class HeldFinals(FakeSlack):
    """FakeSlack that, while `hold` is set, fails the final edit of a preview (the one with
    blocks) as Slack does when it is down, so the reply part stays in the outbox."""

    hold = False

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.hold and args.get("blocks"):
            raise _SlackError("internal_error")
        return super()._chat_update(args)


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[HeldFinals]:
    fake = HeldFinals()
    await fake.start()
    yield fake
    await fake.aclose()


SLACK_SESSION = str(SessionKey("default", "slack", TEAM, DM))


@pytest.mark.parametrize("previews_after", ["update", "off"])
async def test_slack_a_run_cut_short_leaves_no_preview_behind(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI, previews_after: str
) -> None:
    """The preview was kept in memory only: after the restart the redone run posted a second,
    complete message under the cut-off one, and the thinking reaction stayed for good."""
    fake_openai.script(Text(SLOW, chunk_delay_s=0.1))
    fake_openai.responder = lambda body: Text(ANSWER, chunk_delay_s=0.05)
    config = gateway_config(tmp_path, slack, fake_openai.url)
    asking = message(DM, "hello there")
    async with run_gateway(config) as gw:
        await gw.post(event(asking))
        await slack.wait_for(lambda: slack.called("chat.update"))  # posted, then edited
        saved = await gw.store.kv_get("slack_preview", SLACK_SESSION)
    for m in slack.messages[DM]:
        m.pop("deleted", None)  # killed: nothing was deleted, the reaction is still there
    slack.reactions[(DM, asking["ts"])] = {"eyes"}
    await put_back(tmp_path / "sb.db", "slack_preview", SLACK_SESSION, saved)
    if previews_after == "off":  # the operator turned previews off before the restart
        config = gateway_config(tmp_path, slack, fake_openai.url, extra='streaming = "off"\n')

    async with run_gateway(config) as gw:
        await slack.wait_for(lambda: any(m["text"] == ANSWER for m in slack.posted(DM)))
        await asyncio.sleep(0.3)
        assert [m["text"] for m in slack.posted(DM)] == [ANSWER]
        await slack.wait_for(lambda: slack.reactions[(DM, asking["ts"])] == set(), timeout=5)
        assert not await gw.store.kv_get("slack_preview", SLACK_SESSION)


async def test_slack_a_restart_between_the_commit_and_the_final_send_replaces_the_preview(
    tmp_path: Path, slack: HeldFinals, fake_openai: FakeOpenAI
) -> None:
    """The committed reply was sent after the restart as a new message, next to the preview
    it should have replaced."""
    fake_openai.responder = lambda body: Text(SLOW, chunk_delay_s=0.04)  # about 1.6 s
    config = gateway_config(tmp_path, slack, fake_openai.url)
    slack.hold = True
    async with run_gateway(config) as gw:
        await gw.post(event(message(DM, "hello there")))
        await slack.wait_for(lambda: any(c.get("blocks") for c in slack.called("chat.update")))
    assert [m["text"].endswith(" …") for m in slack.posted(DM)] == [True]  # still the preview
    slack.hold = False

    async with run_gateway(config) as gw:
        await slack.wait_for(lambda: any(m["text"] == SLOW for m in slack.posted(DM)))
        await asyncio.sleep(0.3)
        left = await gw.store.kv_get("slack_preview", SLACK_SESSION)
    assert [m["text"] for m in slack.posted(DM)] == [SLOW]
    assert len(slack.called("chat.postMessage")) == 1
    assert not left


async def test_slack_a_thinking_reaction_already_there_is_removed_when_the_run_ends(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """`already_reacted` (left by a run a restart cut short) counted as a failure, so the
    reaction was never removed."""
    config = gateway_config(tmp_path, slack, fake_openai.url, 'streaming = "off"\n')
    asking = message(DM, "hello again")
    slack.reactions[(DM, asking["ts"])] = {"eyes"}
    async with run_gateway(config) as gw:
        await gw.post(event(asking))
        await slack.wait_for(lambda: slack.posted(DM))
        await slack.wait_for(lambda: slack.reactions[(DM, asking["ts"])] == set(), timeout=5)
    assert slack.called("reactions.add")


@pytest.mark.parametrize("status_after", ["on", "off"])
async def test_slack_a_killed_runs_thinking_reaction_goes_when_the_next_run_answers_another(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI, status_after: str
) -> None:
    """The person wrote again before the restart: the redone run answered the newer message
    (and reacted there), and the killed run's reaction stayed on the first one for good."""
    fake_openai.script(Text(SLOW, chunk_delay_s=0.1))
    fake_openai.responder = lambda body: Text(ANSWER)
    config = gateway_config(tmp_path, slack, fake_openai.url, 'streaming = "off"\n')
    first = message(DM, "hello there")
    async with run_gateway(config) as gw:
        await gw.post(event(first))
        await slack.wait_for(lambda: slack.reactions.get((DM, first["ts"])) == {"eyes"})
        saved = await eventually(lambda: gw.store.kv_get("slack_thinking", SLACK_SESSION))
    slack.reactions[(DM, first["ts"])] = {"eyes"}  # killed: nothing was removed
    await put_back(tmp_path / "sb.db", "slack_thinking", SLACK_SESSION, saved)
    if status_after == "off":
        extra = 'streaming = "off"\nstatus_messages = false\n'
        config = gateway_config(tmp_path, slack, fake_openai.url, extra)

    again = message(DM, "are you there?")
    async with run_gateway(config) as gw:
        await gw.post(event(again))
        await slack.wait_for(lambda: any(m["text"] == ANSWER for m in slack.posted(DM)))
        await slack.wait_for(lambda: slack.reactions[(DM, first["ts"])] == set(), timeout=5)
        await slack.wait_for(lambda: not slack.reactions.get((DM, again["ts"])), timeout=5)
        await asyncio.sleep(0.3)
        assert not await gw.store.kv_get("slack_thinking", SLACK_SESSION)
