"""End to end: the real app, signed requests to POST /webhooks/slack, a fake Slack Web API and
a fake model. Every assertion is on what the fake Slack received or what the store holds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import pytest_asyncio

from core.errors import StoreError
from gateway.keys import RUNTIME
from tests.fake_openai import FakeOpenAI, Text, ToolCalls, last_user_text
from tests.fake_slack import (
    BOT_USER,
    FakeSlack,
    SlackGateway,
    event,
    gateway_config,
    message,
    payload,
    run_gateway,
)
from tests.fakes import failing_puts

DM, CHAN = "D0DM000001", "C0CHAN0001"


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest_asyncio.fixture
async def gw(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> AsyncIterator[SlackGateway]:
    async with run_gateway(gateway_config(tmp_path, slack, fake_openai.url)) as gateway:
        yield gateway


def mention(text: str, *, ts: str | None = None, thread: str | None = None) -> dict[str, Any]:
    inner = message(CHAN, f"<@{BOT_USER}> {text}", ts=ts)
    inner.update(type="app_mention")
    inner.pop("channel_type")
    if thread is not None:
        inner["thread_ts"] = thread
    return event(inner)


def texts(posted: list[dict[str, Any]]) -> list[str]:
    return [m["text"] for m in posted]


async def delivery(
    gw: SlackGateway, conversation: str, thread: str | None = None
) -> list[tuple[str, str | None, str | None]]:
    """Once every reply part of the session has left the outbox: (status, delivery, error)."""
    async with asyncio.timeout(10):
        while True:
            entries = await gw.transcript(conversation, thread)
            ids = [int(e.id.removeprefix("out-")) for e in entries if e.role == "assistant"]
            states = [s for i in ids if (s := await gw.store.delivery(i)) is not None]
            if states and all(s[0] != "pending" for s in states):
                return states
            await asyncio.sleep(0.05)


async def test_dm_is_answered_in_the_dm(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    r = await gw.post(event(message(DM, "hello &amp; welcome")))
    assert r.status_code == 200
    posted = await slack.wait_for(lambda: slack.posted(DM))
    assert texts(posted) == ["echo: hello &amp; welcome"]
    assert posted[0]["thread_ts"] is None
    assert slack.problems == []
    assert "[from:" not in json.dumps(fake_openai.requests)  # one person: no need to say who


async def test_mention_in_a_channel_is_answered_in_its_thread(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    await gw.post(mention("what time is it?", ts="1750000100.000200"))
    posted = await slack.wait_for(lambda: slack.posted(CHAN))
    assert posted[0]["thread_ts"] == "1750000100.000200"
    assert posted[0]["text"] == "echo: what time is it?"
    # anyone in the channel may write in the thread: the model is told who wrote
    assert last_user_text(fake_openai.requests[-1]).startswith("[from: id U0USER0001]\n")


async def test_threads_are_isolated_sessions(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    await gw.post(mention("I am Alice", ts="1750000001.000001"))
    await gw.post(mention("I am Bob", ts="1750000002.000001"))
    await gw.post(event(message(DM, "I am Carol")))
    await slack.wait_for(lambda: len(slack.posted(CHAN)) == 2 and slack.posted(DM))
    await gw.post(mention("who am I?", thread="1750000001.000001"))
    await slack.wait_for(lambda: len(slack.posted(CHAN)) == 3)
    threads = {m["text"]: m["thread_ts"] for m in slack.posted(CHAN)}
    assert threads["echo: who am I?"] == "1750000001.000001"
    assert threads["echo: I am Bob"] == "1750000002.000001"
    follow_up = json.dumps(fake_openai.requests[-1]["messages"])
    assert "Alice" in follow_up
    assert "Bob" not in follow_up
    assert "Carol" not in follow_up


async def test_retry_storm_is_answered_once(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    body = event(message(DM, "only once"))
    first = await gw.post(body)
    retries = await asyncio.gather(
        *(
            gw.post(
                body, headers={"X-Slack-Retry-Num": str(n), "X-Slack-Retry-Reason": "http_timeout"}
            )
            for n in (1, 2, 3)
        ),
        gw.post(body),  # the same event_id again, without retry headers
    )
    assert [r.status_code for r in (first, *retries)] == [200] * 5
    await slack.wait_for(lambda: slack.posted(DM))
    await asyncio.sleep(0.3)
    assert texts(slack.posted(DM)) == ["echo: only once"]
    assert len(fake_openai.requests) == 1
    assert [e.role for e in await gw.transcript(DM)] == ["user", "assistant"]
    # what is remembered of a stored event is that it is done, not its finished task
    inbound = gw.runner.app[RUNTIME].manager.outlets["slack"].inbound
    assert list(inbound._seen.values()) == [None, None]  # its event id and its message id
    assert (await gw.post(body)).status_code == 200
    await asyncio.sleep(0.3)
    assert len(fake_openai.requests) == 1


async def test_a_retry_of_an_event_we_never_saw_is_still_answered(
    gw: SlackGateway, slack: FakeSlack
) -> None:
    body = event(message(DM, "first delivery was lost"))
    r = await gw.post(
        body, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "connection_failed"}
    )
    assert r.status_code == 200
    assert texts(await slack.wait_for(lambda: slack.posted(DM))) == [
        "echo: first delivery was lost"
    ]


@pytest.mark.parametrize(
    "tamper",
    ["wrong secret", "stale", "future", "missing", "not a number", "body changed"],
)
async def test_bad_or_stale_signatures_are_refused_and_nothing_is_stored(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI, tamper: str
) -> None:
    body = json.dumps(event(message(DM, "forged"))).encode()
    now = int(time.time())
    if tamper == "wrong secret":
        r = await gw.post(body, secret="not-the-secret")
    elif tamper in ("stale", "future"):
        r = await gw.post(body, ts=now - 301 if tamper == "stale" else now + 310)
    elif tamper == "missing":
        r = await gw.post(body, signed=False)
    elif tamper == "not a number":
        r = await gw.post(
            body,
            signed=False,
            headers={"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
        )
    else:
        from tests.fake_slack import sign

        headers = sign(gw.secret, body)
        r = await gw.post(body.replace(b"forged", b"forgeD"), signed=False, headers=headers)
    assert r.status_code == 401
    assert r.json() == {"error": "invalid request"}
    await asyncio.sleep(0.2)
    assert await gw.transcript(DM) == []
    assert fake_openai.requests == []
    assert slack.calls == []


async def test_url_verification_is_answered_with_the_challenge_and_no_call_to_slack(
    gw: SlackGateway, slack: FakeSlack
) -> None:
    body = payload("url_verification")
    r = await gw.post(body)
    assert r.status_code == 200
    assert r.json() == {"challenge": body["challenge"]}
    assert (await gw.post(body, signed=False)).status_code == 401
    assert slack.calls == []  # no auth.test at start or on the request path


async def test_events_get_503_when_the_store_is_not_keeping_up(
    gw: SlackGateway, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI
) -> None:
    monkeypatch.setattr("channels.slack.inbound.MAX_IN_FLIGHT", 0)
    r = await gw.post(event(message(DM, "later please")))
    assert r.status_code == 503
    await asyncio.sleep(0.2)
    assert await gw.transcript(DM) == []


async def test_an_event_is_stored_before_it_is_acknowledged(
    gw: SlackGateway, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI
) -> None:
    body = event(message(DM, "keep me"))
    failing_puts(monkeypatch, gw.store, 1, "database unavailable")
    assert (await gw.post(body)).status_code == 503  # not stored: Slack must retry
    assert await gw.transcript(DM) == []
    retry = await gw.post(body, headers={"X-Slack-Retry-Num": "1"})
    assert retry.status_code == 200  # the retry is not mistaken for a copy
    assert [e.text for e in await gw.transcript(DM)][:1] == ["keep me"]


async def test_a_retry_that_comes_while_the_first_is_being_stored_waits_for_it(
    gw: SlackGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first delivery is slow to store and then fails; Slack's retry came meanwhile and
    was answered 200 at once, as a copy, so the message was lost."""
    body = event(message(DM, "slow store"))
    original = gw.store.put_inbound

    async def slow_then_failing(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(gw.store, "put_inbound", original)
        await asyncio.sleep(0.5)
        raise StoreError("database unavailable")

    monkeypatch.setattr(gw.store, "put_inbound", slow_then_failing)
    first = asyncio.create_task(gw.post(body))
    await asyncio.sleep(0.1)
    retry = await gw.post(body, headers={"X-Slack-Retry-Num": "1"})
    assert (await first).status_code == 503
    assert retry.status_code == 503  # not a 200 before anything was stored
    again = await gw.post(body, headers={"X-Slack-Retry-Num": "2"})
    assert again.status_code == 200
    assert [e.text for e in await gw.transcript(DM)][:1] == ["slow store"]


async def test_a_click_or_command_that_is_not_stored_gets_a_503_not_a_200(
    gw: SlackGateway, monkeypatch: pytest.MonkeyPatch, slack: FakeSlack
) -> None:
    """Slack retries neither: a 200 before the store failed lost the click for good; a 503
    shows the person it failed, so they can try again."""
    failing_puts(monkeypatch, gw.store, 2, "database or disk is full")
    click = payload("block_actions")
    click["channel"]["id"] = click["container"]["channel_id"] = DM
    command = urlencode(payload("slash_command")).encode()
    assert (await gw.post(urlencode({"payload": json.dumps(click)}).encode())).status_code == 503
    assert (await gw.post(command)).status_code == 503
    assert await gw.transcript(DM) == []
    click["actions"][0]["action_ts"] = "1750000200.000300"  # the person clicks again
    assert (await gw.post(urlencode({"payload": json.dumps(click)}).encode())).status_code == 200
    await slack.wait_for(lambda: slack.posted(DM))
    assert [e.text for e in await gw.transcript(DM)][:1] == ["Yes, book it"]


async def test_a_click_stored_too_late_to_acknowledge_and_made_again_is_acted_on_once(
    gw: SlackGateway, monkeypatch: pytest.MonkeyPatch, slack: FakeSlack
) -> None:
    """The store took longer than Slack's 3 s: the click got a 503 and Slack showed it as
    failed, but it was stored a moment later and answered. The person clicked again (a new
    action_ts, so no dedupe) and "Yes, book it" ran twice."""
    monkeypatch.setattr("channels.slack.inbound.ACK_WITHIN_S", 0.3)
    original, calls = gw.store.put_inbound, [0]

    async def slow_first(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            await asyncio.sleep(0.8)
        return await original(*args, **kwargs)

    monkeypatch.setattr(gw.store, "put_inbound", slow_first)
    click = payload("block_actions")
    click["channel"]["id"] = click["container"]["channel_id"] = DM
    assert (await gw.post(urlencode({"payload": json.dumps(click)}).encode())).status_code == 503
    await asyncio.sleep(0.6)  # meanwhile it was stored, and answered
    click["actions"][0]["action_ts"] = "1750000200.000300"  # the person clicks again
    assert (await gw.post(urlencode({"payload": json.dumps(click)}).encode())).status_code == 200
    await slack.wait_for(lambda: slack.posted(DM))
    await asyncio.sleep(0.5)
    users = [e.text for e in await gw.transcript(DM) if e.role == "user"]
    assert users == ["Yes, book it"]
    assert calls[0] == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b"payload=%7Bnot+json",
        b"payload="
        + quote(json.dumps({"type": "block_actions", "actions": [{"value": "x"}]})).encode(),
        b"payload=" + quote(json.dumps({"type": "block_actions", "actions": "x"})).encode(),
        b"payload=" + quote(json.dumps({"type": "block_actions", "actions": []})).encode(),
        b"payload=" + quote(json.dumps({"type": "view_submission", "view": {}})).encode(),
        b"payload=" + quote(json.dumps({"type": "view_closed", "view": None})).encode(),
        b'{"type": "url_verification", "challenge": 5}',
    ],
)
async def test_malformed_signed_bodies_get_a_4xx_never_a_5xx(gw: SlackGateway, raw: bytes) -> None:
    r = await gw.post(raw)
    assert 400 <= r.status_code < 500


def _callback(event: object, **more: object) -> bytes:
    return json.dumps(
        {"type": "event_callback", "event_id": "Ev1", "event": event, **more}
    ).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"foo": 1}', "type: a string is required"),
        (_callback(None), "event: an object with a type"),
        (_callback("x"), "event: an object with a type"),
        (_callback({"type": "message", "text": "hi"}), "event.channel: a string is required"),
        (_callback({"type": "message", "channel": ["D1"]}), "event.channel: a string is required"),
        (_callback({"type": "message", "channel": "D1", "ts": 1.5}), "event.ts: must be a string"),
        (_callback({"type": "message", "channel": "D1", "files": "f"}), "event.files: a list"),
        (_callback({"type": "message", "channel": "D1", "files": ["f"]}), "event.files: a list"),
        (_callback({"type": "message", "channel": "D1"}, authorizations="x"), "authorizations"),
        (b"nothing=here", "needs payload= (interactivity) or command="),  # was Bolt's 404
        (b"", "needs payload= (interactivity) or command="),
    ],
)
async def test_a_signed_event_that_cannot_be_read_gets_a_400_with_the_reason(
    gw: SlackGateway, raw: bytes, reason: str
) -> None:
    """It got a 200 and was dropped without a word."""
    r = await gw.post(raw)
    assert r.status_code == 400
    assert reason in r.json()["error"]


async def test_events_of_other_kinds_are_still_acknowledged(gw: SlackGateway) -> None:
    assert (await gw.post(b"ssl_check=1&token=t")).status_code == 200  # Slack's check
    for raw in (
        _callback({"type": "app_home_opened", "user": {"id": "U1"}}),
        b'{"type": "app_rate_limited", "minute_rate_limited": 1}',
    ):
        assert (await gw.post(raw)).status_code == 200


async def test_an_event_nested_deeper_than_the_fast_parser_reads_is_still_answered(
    gw: SlackGateway, slack: FakeSlack
) -> None:
    """The body is read by pydantic-core first, which stops at 200 levels; `json` reads the
    rest (Slack's blocks can nest, and nothing about the message is wrong)."""
    body = event(message(DM, "deep"))
    body["event"]["blocks"] = json.loads("[" * 300 + "]" * 300)
    assert (await gw.post(json.dumps(body).encode())).status_code == 200
    posted = await slack.wait_for(lambda: slack.posted(DM))
    assert texts(posted) == ["echo: deep"]


async def test_a_signed_body_that_is_not_utf8_gets_a_400_and_a_forged_one_a_401(
    gw: SlackGateway,
) -> None:
    raw = b'{"type": "event_callback", "event": {"text": "caf\xe9"}}'
    r = await gw.post(raw)
    assert (r.status_code, r.json()) == (400, {"error": "body is not UTF-8"})
    forged = await gw.post(raw, secret="not-the-secret")
    assert (forged.status_code, forged.json()) == (401, {"error": "invalid request"})
    assert await gw.transcript(DM) == []


async def test_bots_edits_and_other_events_never_start_a_run(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    names = [
        "own_message",
        "other_bot_message",
        "message_changed",
        "message_deleted",
        "channel_join",
        "reaction_added",
        "app_rate_limited",
    ]
    for name in names:
        assert (await gw.post(payload(name))).status_code == 200
    await gw.post(event(message(DM, "a person")))
    await slack.wait_for(lambda: slack.posted(DM))
    await asyncio.sleep(0.2)
    assert len(fake_openai.requests) == 1
    assert [e.text for e in await gw.transcript(DM)] == ["a person", "echo: a person"]


async def test_a_mention_that_also_arrives_as_message_is_one_message(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    as_message, as_mention = payload("message_with_mention"), payload("app_mention")
    await asyncio.gather(gw.post(as_message), gw.post(as_mention))
    await slack.wait_for(lambda: slack.posted(CHAN))
    await asyncio.sleep(0.3)
    assert len(slack.posted(CHAN)) == 1
    assert len(fake_openai.requests) == 1
    entries = await gw.transcript(CHAN, "1750000100.000200")
    assert [e.role for e in entries] == ["user", "assistant"]


async def test_ack_is_immediate_while_the_agent_is_busy(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text("slow answer", delay_s=4.0)
    await gw.post(event(message(DM, "first")))
    started = time.monotonic()
    for i in range(5):
        assert (await gw.post(event(message(DM, f"more {i}")))).status_code == 200
    assert time.monotonic() - started < 3.0  # well before the model answers (1.1 s seen loaded)
    await slack.wait_for(lambda: slack.posted(DM), timeout=15)


async def test_ten_thousand_character_reply_is_delivered_within_limits_and_in_order(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    paragraphs = []
    for i in range(12):
        paragraphs.append(f"Step {i}: " + " ".join(f"w{i}_{j} &" for j in range(50)))
        code = "\n".join(f"    value_{i}_{j} = compute({j}) < limit" for j in range(12))
        paragraphs.append(f"```python\n{code}\n```")
    reply = "\n\n".join(paragraphs)
    assert 9_500 <= len(reply) <= 11_000
    fake_openai.responder = lambda body: Text(reply)
    await gw.post(mention("write a lot", ts="1750000100.000200"))
    assert [s[0] for s in await delivery(gw, CHAN, "1750000100.000200")] == ["sent"]
    posted = slack.posted(CHAN)
    assert slack.problems == []
    sections = [b["text"]["text"] for m in posted for b in m["blocks"] if b["type"] == "section"]
    assert all(len(s) <= 3000 for s in sections)
    assert all(m["thread_ts"] == "1750000100.000200" for m in posted)
    body = "\n".join(sections)
    words = [w for w in body.split() if w.startswith(("w", "value_"))]
    expected = [w for w in reply.split() if w.startswith(("w", "value_"))]
    assert words == expected


def click(question: dict[str, Any], button: dict[str, Any], **action: Any) -> bytes:
    """The signed-form body of a press of `button` on the message `question`."""
    body = payload("block_actions")
    body["container"]["message_ts"] = body["message"]["ts"] = question["ts"]
    body["actions"][0].update(action_id=button["action_id"], value=button["value"], **action)
    return urlencode({"payload": json.dumps(body)}).encode()


async def test_button_round_trip(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    buttons = '{"buttons": [{"label": "Yes, book it", "value": "yes"}, {"label": "No"}]}'
    fake_openai.script(ToolCalls([("send_buttons", buttons)]), Text("Shall I book it?"))
    await gw.post(mention("book a table", ts="1750000100.000200"))
    (question,) = await slack.wait_for(lambda: slack.posted(CHAN))
    actions = [b for b in question["blocks"] if b["type"] == "actions"]
    yes = actions[0]["elements"][0]
    assert (yes["text"]["text"], yes["value"]) == ("Yes, book it", "yes")

    r = await gw.post(click(question, yes))
    assert r.status_code == 200
    await slack.wait_for(lambda: len(slack.posted(CHAN)) == 2)
    answer = slack.posted(CHAN)[1]
    assert answer["thread_ts"] == "1750000100.000200"
    assert "pressed the button: Yes, book it" in last_user_text(fake_openai.requests[-1])


async def test_a_button_clicked_twice_is_one_turn(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """Each click is its own block_actions (its own action_ts): the choice was answered twice."""
    buttons = '{"buttons": [{"label": "Yes, book it", "value": "yes"}]}'
    fake_openai.script(ToolCalls([("send_buttons", buttons)]), Text("Shall I book it?"))
    await gw.post(mention("book a table", ts="1750000100.000200"))
    (question,) = await slack.wait_for(lambda: slack.posted(CHAN))
    yes = next(b for b in question["blocks"] if b["type"] == "actions")["elements"][0]
    fake_openai.responder = lambda body: Text("booked", delay_s=0.3)
    for stamp in ("1750000200.000001", "1750000200.400001"):
        r = await gw.post(click(question, yes, action_ts=stamp))
        assert r.status_code == 200
    await slack.wait_for(lambda: len(slack.posted(CHAN)) == 2)
    await asyncio.sleep(0.6)
    assert [m["text"] for m in slack.posted(CHAN)][1:] == ["booked"]
    assert len(fake_openai.requests) == 3


async def test_a_lone_surrogate_is_mended_in_events_and_clicks(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """Half of a UTF-16 pair is valid JSON but no valid UTF-8: kept as U+FFFD, not lost."""
    r = await gw.post(event(message(DM, "broken \ud83d emoji")))
    assert r.status_code == 200
    (reply,) = await slack.wait_for(lambda: slack.posted(DM))
    assert reply["text"] == "echo: broken \ufffd emoji"
    click = payload("block_actions")
    click["actions"][0]["text"]["text"] = "Yes \ud83d"
    r = await gw.post(urlencode({"payload": json.dumps(click)}).encode())
    assert r.status_code == 200
    await slack.wait_for(lambda: len(fake_openai.requests) == 2)
    assert "pressed the button: Yes \ufffd" in last_user_text(fake_openai.requests[-1])


async def test_slash_command_reset_is_answered_by_core(gw: SlackGateway, slack: FakeSlack) -> None:
    form = urlencode(payload("slash_command")).encode()
    r = await gw.post(form)
    assert r.status_code == 200
    (reply,) = await slack.wait_for(lambda: slack.posted(DM))
    assert "start over" in reply["text"]


async def test_a_slash_command_in_a_channel_is_answered_privately_and_stores_nothing(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    """Slack does not say which thread a command was typed in, and in a channel every thread
    is its own session: `/reset` once reset none of them and said so to the whole channel."""
    form = payload("slash_command") | {"channel_id": CHAN, "channel_name": "general"}
    r = await gw.post(urlencode(form).encode())
    assert r.status_code == 200
    assert "Write it in the thread instead" in r.text
    assert "/reset" in r.text
    await asyncio.sleep(0.3)
    assert slack.posted(CHAN) == []
    assert await gw.transcript(CHAN) == []
    assert fake_openai.requests == []


async def test_rate_limited_then_sent_once_after_retry_after(
    gw: SlackGateway, slack: FakeSlack
) -> None:
    slack.fail("chat.postMessage", 429, retry_after=1)
    await gw.post(event(message(DM, "busy workspace")))
    await slack.wait_for(lambda: slack.posted(DM), timeout=10)
    calls = [c for c in slack.calls if c.method == "chat.postMessage"]
    assert len(calls) == 2
    assert calls[1].at - calls[0].at >= 0.95
    assert texts(slack.posted(DM)) == ["echo: busy workspace"]


async def test_server_errors_are_retried(gw: SlackGateway, slack: FakeSlack) -> None:
    slack.fail("chat.postMessage", 500, retry_after=None)
    await gw.post(event(message(DM, "flaky")))
    await slack.wait_for(lambda: slack.posted(DM), timeout=10)
    assert len(slack.called("chat.postMessage")) == 2


async def test_not_in_channel_is_recorded_and_not_retried(
    gw: SlackGateway, slack: FakeSlack
) -> None:
    slack.channel_errors[CHAN] = "not_in_channel"
    await gw.post(mention("hello?", ts="1750000100.000200"))
    (state,) = await delivery(gw, CHAN, "1750000100.000200")
    assert state[0] == "failed"
    assert "not_in_channel" in (state[2] or "")
    await asyncio.sleep(0.3)
    assert len(slack.called("chat.postMessage")) == 1


async def test_shared_file_is_downloaded_with_the_bot_token(
    gw: SlackGateway, slack: FakeSlack, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    body = payload("file_share")
    body["event_id"] = "Ev0FILE_E2E"
    files = body["event"]["files"]
    files[0]["url_private_download"] = slack.add_file(
        "invoice.pdf", b"%PDF-1.7 ok", "application/pdf"
    )
    files.append(
        dict(files[0], name="elsewhere.pdf", url_private_download="https://evil.example/x.pdf")
    )
    await gw.post(body)
    await slack.wait_for(lambda: slack.posted(DM))
    saved = list((tmp_path / "files").rglob("*invoice.pdf"))
    assert [p.read_bytes() for p in saved] == [b"%PDF-1.7 ok"]
    seen = last_user_text(fake_openai.requests[0])
    assert "[attachment document invoice.pdf application/pdf]" in seen
    assert "elsewhere.pdf application/pdf: not downloaded: host not allowed" in seen


async def test_a_reply_in_a_joined_thread_is_answered_when_configured(
    tmp_path: Path, slack: FakeSlack, fake_openai: FakeOpenAI
) -> None:
    config = gateway_config(tmp_path, slack, fake_openai.url, 'reply_in_threads = "all"\n')
    async with run_gateway(config) as gw:
        await gw.post(mention("start", ts="1750000100.000200"))
        await slack.wait_for(lambda: slack.posted(CHAN))
        await gw.post(event(message(CHAN, "no mention here", thread_ts="1750000100.000200")))
        await gw.post(event(message(CHAN, "other thread", thread_ts="1750000999.000200")))
        await slack.wait_for(lambda: len(slack.posted(CHAN)) == 2)
        await asyncio.sleep(0.3)
    assert texts(slack.posted(CHAN)) == ["echo: start", "echo: no mention here"]
