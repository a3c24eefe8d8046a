"""Live feedback end to end: thinking status, streamed previews replaced by the final reply,
discarded runs leaving nothing behind."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.fake_openai import FakeOpenAI, Text, last_user_text
from tests.fake_slack import (
    BOT_USER,
    TEAM,
    FakeSlack,
    event,
    gateway_config,
    message,
    run_gateway,
)

DM, CHAN, THREAD = "D0DM000001", "C0CHAN0001", "1750000100.000200"
WORDS = " ".join(f"word{i}" for i in range(24))


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    yield fake
    await fake.aclose()


def mention(text: str, ts: str = THREAD) -> dict[str, Any]:
    inner = message(CHAN, f"<@{BOT_USER}> {text}", ts=ts)
    inner.update(type="app_mention")
    return event(inner)


def methods(slack: FakeSlack) -> list[str]:
    return [c.method for c in slack.calls]


async def test_update_mode_edits_one_message_at_most_once_a_second_then_finalizes_it(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(WORDS, chunk_delay_s=0.1)
    async with run_gateway(gateway_config(tmp_path, slack, fake_openai.url)) as gw:
        user_msg = message(DM, "tell me a story")
        await gw.post(event(user_msg))
        await slack.wait_for(
            lambda: slack.posted(DM) and "reactions.remove" in methods(slack), timeout=10
        )
    (final,) = slack.posted(DM)
    assert final["text"] == WORDS
    assert final["blocks"][0]["text"]["text"] == WORDS
    assert final["edits"] >= 2  # at least one preview edit, then the final text
    assert len(slack.called("chat.postMessage")) == 1
    updates = [c for c in slack.calls if c.method == "chat.update"]
    previews = [c for c in updates if c.args["text"].endswith(" …")]
    assert previews
    between_previews = itertools.pairwise(updates[:-1])  # the final edit may come sooner
    assert all(b.at - a.at >= 0.9 for a, b in between_previews)
    assert updates[-1].args["blocks"]  # the final replaces the preview's text with blocks
    calls = methods(slack)
    assert calls[0] == "reactions.add"
    assert slack.called("reactions.add")[0]["timestamp"] == user_msg["ts"]
    assert calls.index("reactions.remove") > calls.index("chat.postMessage")
    assert slack.reactions == {(DM, user_msg["ts"]): set()}
    assert slack.problems == []


async def test_preview_edits_stay_within_the_workspace_budget_and_the_final_still_lands(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chat.update is Tier 3 (50+ a minute per workspace): previews edited every second, by a
    few long runs at once, went over it and met 429s. One run against a budget of two."""
    monkeypatch.setattr("channels.slack.live.UPDATE_INTERVAL", 0.1)
    monkeypatch.setattr("channels.slack.live.PREVIEW_EDITS_PER_MINUTE", 2)
    fake_openai.responder = lambda body: Text(WORDS, chunk_delay_s=0.06)
    async with run_gateway(gateway_config(tmp_path, slack, fake_openai.url)) as gw:
        await gw.post(event(message(DM, "tell me a story")))
        await slack.wait_for(lambda: slack.posted(DM) and "reactions.remove" in methods(slack))
    (final,) = slack.posted(DM)
    assert final["text"] == WORDS
    updates = [c for c in slack.calls if c.method == "chat.update"]
    previews = [c for c in updates if c.args["text"].endswith(" …")]
    assert len(previews) == 2
    assert updates[-1].args["blocks"]  # the final reply replaced the preview all the same
    assert slack.problems == []


async def _stream_an_answer(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI, answer: str, *, ask: str
) -> None:
    """A mention answered with `answer` in stream mode, until the final reply replaced it."""
    fake_openai.responder = lambda body: Text(answer, chunk_delay_s=0.08)
    config = gateway_config(tmp_path, slack, fake_openai.url, 'streaming = "stream"\n')
    async with run_gateway(config) as gw:
        await gw.post(mention(ask))
        await slack.wait_for(lambda: slack.called("chat.update"), timeout=10)


async def test_stream_mode_streams_in_the_thread_and_the_final_reply_replaces_it(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    await _stream_an_answer(tmp_path, slack, fake_openai, WORDS, ask="stream please")
    (start,) = slack.called("chat.startStream")
    assert (start["thread_ts"], start["recipient_team_id"]) == (THREAD, TEAM)
    assert start["recipient_user_id"] == "U0USER0001"
    assert slack.called("chat.appendStream")
    assert len(slack.called("chat.stopStream")) == 1
    assert slack.called("chat.postMessage") == []
    (final,) = slack.posted(CHAN)
    assert final["thread_ts"] == THREAD
    assert not final["streaming"]
    assert final["text"] == WORDS
    assert final["blocks"][0]["text"]["text"] == WORDS


async def test_streamed_text_mentions_no_one(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """A person types <!here> (Slack delivers &lt;!here&gt;) and the agent repeats it: the
    final reply escaped it, but the stream showed it as it was, to the whole channel."""
    said = f"You said: <!here> <!channel> and <@U0OTHER01> {WORDS}"
    await _stream_an_answer(
        tmp_path, slack, fake_openai, said, ask="repeat: &lt;!here&gt; &lt;!channel&gt;"
    )
    (start,) = slack.called("chat.startStream")
    streamed = start["markdown_text"] + "".join(
        c["markdown_text"] for c in slack.called("chat.appendStream")
    )
    assert said.startswith(streamed.replace("\u200b", ""))  # the final reply ends it
    assert "word1" in streamed
    for mention_ in ("<!here>", "<!channel>", "<@U0OTHER01>"):
        assert mention_ not in streamed


async def test_a_429_on_a_preview_edit_holds_the_final_reply_back_too(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """Slack asked edits to wait 3 s; the final reply, an edit of the preview too, went at
    once and would be refused again."""
    fake_openai.responder = lambda body: Text(WORDS, chunk_delay_s=0.15)
    slack.fail("chat.update", retry_after=3, after=1)
    async with run_gateway(gateway_config(tmp_path, slack, fake_openai.url)) as gw:
        await gw.post(event(message(DM, "tell me a story")))
        await slack.wait_for(lambda: any(_final(c) for c in slack.calls), timeout=20)
    refused = [c for c in slack.calls if c.method == "chat.update"][1]
    assert refused.args["text"].endswith(" …")  # a preview's edit
    final = next(c for c in slack.calls if _final(c))
    assert final.at - refused.at >= 2.9


async def test_preview_edits_that_show_nothing_new_are_not_sent(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preview shows the first section only: once it is full, every later edit repeated
    the one before, spending the workspace's chat.update budget."""
    monkeypatch.setattr("channels.slack.live.UPDATE_INTERVAL", 0.1)
    monkeypatch.setattr("channels.slack.live.PREVIEW_EDITS_PER_MINUTE", 1000)
    long = WORDS + " " + " ".join(["filler"] * 700)
    fake_openai.responder = lambda body: Text(long, chunk_delay_s=0.01)
    async with run_gateway(gateway_config(tmp_path, slack, fake_openai.url)) as gw:
        await gw.post(event(message(DM, "tell me a story")))
        await slack.wait_for(lambda: any(_final(c) for c in slack.calls), timeout=20)
    previews = [
        c.args["text"]
        for c in slack.calls
        if c.method in ("chat.postMessage", "chat.update") and c.args["text"].endswith(" …")
    ]
    assert len(previews) >= 3
    assert all(a != b for a, b in itertools.pairwise(previews))


def _final(call: Any) -> bool:
    return call.method == "chat.update" and bool(call.args.get("blocks"))


async def test_a_slow_thinking_reaction_never_holds_the_reply_back(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """The reaction's add and remove were awaited before the run went on and before its reply
    went out: each slow call of Slack's added its whole time to the answer."""
    slack.slow.update({"reactions.add": 3.0, "reactions.remove": 3.0})
    config = gateway_config(tmp_path, slack, fake_openai.url, 'streaming = "off"\n')
    async with run_gateway(config) as gw:
        user_msg = message(DM, "quick one")
        asked = time.monotonic()
        await gw.post(event(user_msg))
        await slack.wait_for(lambda: slack.posted(DM))
        answered = time.monotonic() - asked
        await slack.wait_for(lambda: slack.reactions == {(DM, user_msg["ts"]): set()})
    assert answered < 2.5  # it took 6 s (both calls), against about 0.1 s
    calls = methods(slack)
    assert calls.index("reactions.add") < calls.index("reactions.remove")


async def test_assistant_threads_get_a_status_instead_of_a_reaction(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    slack.assistant_threads.add((CHAN, THREAD))
    config = gateway_config(tmp_path, slack, fake_openai.url, 'streaming = "off"\n')
    async with run_gateway(config) as gw:
        await gw.post(mention("status?"))
        await slack.wait_for(lambda: len(slack.statuses) == 2 and slack.posted(CHAN))
    assert slack.statuses == [(CHAN, THREAD, "is thinking…"), (CHAN, THREAD, "")]
    assert slack.called("reactions.add") == []


async def test_a_discarded_run_deletes_its_preview(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    def answer(body: dict[str, Any]) -> Text:
        if "second" in last_user_text(body):
            return Text("answer to both")
        return Text(WORDS + " " + WORDS, chunk_delay_s=0.1)

    fake_openai.responder = answer
    config = gateway_config(tmp_path, slack, fake_openai.url, '[agent]\nqueue_mode = "interrupt"\n')
    async with run_gateway(config) as gw:
        await gw.post(event(message(DM, "first")))
        await slack.wait_for(lambda: slack.called("chat.postMessage"), timeout=10)
        await gw.post(event(message(DM, "second")))
        await slack.wait_for(lambda: any(m["text"] == "answer to both" for m in slack.posted(DM)))
        await asyncio.sleep(0.2)
    assert [m["text"] for m in slack.posted(DM)] == ["answer to both"]
    assert len(slack.called("chat.delete")) == 1
    assert slack.problems == []
