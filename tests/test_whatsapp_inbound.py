"""WhatsApp end to end, inbound: the real routes with signed notifications, a fake Graph API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from channels.whatsapp.settings import DEFAULT_UNSUPPORTED_REPLY
from core.models import SessionKey
from core.policies import HELP_REPLY, RESET_REPLY
from tests.fake_openai import FakeOpenAI, Text, last_user_text
from tests.fake_whatsapp import (
    VERIFY_TOKEN,
    FakeGraph,
    Gateway,
    payload,
    running_gateway,
    sign,
    text_message,
    until,
)

USER = "15551234567"


def session(user: str = USER, number: str = "1001") -> str:
    return str(SessionKey("default", "whatsapp", number, user))


@pytest_asyncio.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    fake = FakeGraph()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest_asyncio.fixture
async def gw(tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path, graph, fake_openai.url) as gateway:
        yield gateway


async def test_handshake_echoes_the_challenge_only_for_the_right_token(gw: Gateway) -> None:
    ok = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1158201444"}
    r = await gw.client.get("/webhooks/whatsapp", params=ok)
    assert r.status_code == 200
    assert r.text == "1158201444"
    assert r.headers["content-type"].startswith("text/plain")
    for bad in ({**ok, "hub.verify_token": "wrong"}, {**ok, "hub.mode": "unsubscribe"}, {}):
        assert (await gw.client.get("/webhooks/whatsapp", params=bad)).status_code == 403
    for challenge in (None, "", "<script>", "x" * 300):
        params = {k: v for k, v in ok.items() if k != "hub.challenge"}
        if challenge is not None:
            params["hub.challenge"] = challenge
        r = await gw.client.get("/webhooks/whatsapp", params=params)
        assert r.status_code == 400
        assert "hub.challenge" in r.json()["error"]


async def test_bad_or_missing_signature_is_refused_and_nothing_stored(
    gw: Gateway, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused, and said once: each forged request logged a warning (Telegram and Slack log
    none), so anyone could flood the log."""
    data = text_message("hello")
    assert (await gw.notify(data, signature=None)).status_code == 401
    assert (await gw.notify(data, signature=sign(b"{}"))).status_code == 403
    assert (await gw.notify(data, signature="sha1=abc")).status_code == 403
    signed = sign(b'{"object": "whatsapp_business_account"}', secret="another app")
    assert (await gw.notify(data, signature=signed)).status_code == 403
    raw = b'{"entry": [] }'  # signed, then the body changed
    assert (await gw.notify(None, raw=raw + b" ", signature=sign(raw))).status_code == 403
    assert await gw.store.last_inbound_at(session()) is None
    assert await gw.store.pending(session()) == []
    assert fake_openai.requests == []
    assert gw.graph.sent == []
    said = [r for r in caplog.records if "bad signature" in r.getMessage()]
    assert len(said) == 1


async def test_malformed_json_is_400_and_unknown_numbers_are_ignored(gw: Gateway) -> None:
    r = await gw.notify(None, raw=b"{not json")
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]
    assert (await gw.notify({"object": "whatsapp_business_account", "entry": 3})).status_code == 400
    r = await gw.notify(payload("other_number"))
    assert r.status_code == 200
    assert await gw.store.last_inbound_at(session(number="9999")) is None


async def test_text_is_read_with_typing_then_answered(gw: Gateway) -> None:
    r = await gw.notify(text_message("hello there", mid="wamid.HELLO"))
    assert r.status_code == 200
    await until(lambda: gw.graph.texts(USER))
    (sent,) = gw.graph.sent
    assert sent["text"]["body"] == "echo: hello there"
    assert (sent["to"], sent["_number"], sent["recipient_type"]) == (USER, "1001", "individual")
    await until(lambda: gw.graph.reads)
    assert gw.graph.reads[0] == {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": "wamid.HELLO",
        "typing_indicator": {"type": "text"},
    }


async def test_typing_is_shown_again_while_the_run_is_silent_and_not_after_the_reply(
    gw: Gateway, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The indicator lapses after 25 s; a run busy with tools or a slow model streams no text,
    and the indicator used to be shown again only when text came."""
    monkeypatch.setattr("channels.whatsapp.adapter.TYPING_REFRESH_S", 0.1)
    fake_openai.responder = lambda body: Text("done thinking", delay_s=0.55)
    await gw.notify(text_message("hello there", mid="wamid.SLOW"))
    await until(lambda: gw.graph.texts(USER))
    shown = len(gw.graph.reads)
    assert shown >= 4
    assert {r["message_id"] for r in gw.graph.reads} == {"wamid.SLOW"}
    await asyncio.sleep(0.3)
    assert len(gw.graph.reads) == shown  # the reply ended it


async def test_the_agent_reads_what_a_reply_quotes(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    """WhatsApp quotes by id only (context.id): "what about this one?" had no referent."""
    fake_openai.script(Text("Option A: red. Option B: blue."), Text("Blue it is."))
    await gw.notify(text_message("which colours?", mid="wamid.Q1"))
    await until(lambda: gw.graph.texts(USER))
    sent_id = gw.graph.sent[0]["_id"]
    reply = text_message("what about this one?", mid="wamid.Q2")
    reply["entry"][0]["changes"][0]["value"]["messages"][0]["context"] = {"id": sent_id}
    await gw.notify(reply)
    await until(lambda: len(gw.graph.texts(USER)) == 2)
    seen = last_user_text(fake_openai.requests[-1])
    assert (
        seen == "[in reply to your message: «Option A: red. Option B: blue.»]\nwhat about this one?"
    )
    fake_openai.responder = lambda body: Text("noted")
    reaction = payload("reaction")
    reaction["entry"][0]["changes"][0]["value"]["messages"][0]["reaction"]["message_id"] = sent_id
    await gw.notify(reaction)
    await until(lambda: len(gw.graph.texts(USER)) == 3)
    seen = last_user_text(fake_openai.requests[-1])
    assert seen.startswith("[reacted to your message: «Option A: red. Option B: blue.»]\n")


MEDIA = {
    "media-img-1": (b"\xff\xd8jpeg-bytes", "image/jpeg"),
    "media-aud-1": (b"OggS-voice", "audio/ogg; codecs=opus"),
    "media-vid-1": (b"mp4-bytes", "video/mp4"),
    "media-doc-1": (b"%PDF-1.4 invoice", "application/pdf"),
    "media-stk-1": (b"RIFF-webp", "image/webp"),
}
EXPECTED = {
    "text": "Hello, do you deliver on Sundays?",
    "image": "my receipt\n[attachment image image.jpeg image/jpeg]",
    "audio_voice": "[attachment audio audio.ogg audio/ogg; codecs=opus: voice message]",
    "video": "the noise\n[attachment video video.mp4 video/mp4]",
    "document": "[attachment document invoice-42.pdf application/pdf]",
    "sticker": "[attachment sticker sticker.webp image/webp]",
    "location": "[location: Puerta del Sol, Plaza de la Puerta del Sol, Madrid (40.4168, -3.7038)]",
    "contacts": "[contact: Luis Pérez, +34 600 000 001]",
    # the model reads the value too: flows use values as ids (slots, sizes, orders)
    "button_reply": "[pressed the button: 10:00 (value: slot-10am)]",
    "list_reply": "[pressed the button: Medium (value: size-m)]",
    "template_button": "[pressed the button: Continue (value: talk-to-us)]",
    "reaction": "[reacted with 👍 to wamid.OUT4]",
    "edit": "[edited an earlier message] Hello, do you deliver on Saturdays?",
}


async def test_every_message_type_reaches_the_agent(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    gw.graph.media.update(MEDIA)
    users = {name: f"1555000{i:04d}" for i, name in enumerate(EXPECTED)}
    for name, user in users.items():
        assert (await gw.notify(payload(name, user=user))).status_code == 200
    await until(lambda: all(gw.graph.texts(u) for u in users.values()))
    seen = "\n\n".join(last_user_text(body) for body in fake_openai.requests)
    for name, text in EXPECTED.items():
        assert text in seen, name
        assert gw.graph.texts(users[name])[0].startswith("echo: "), name
    files = sorted(p.read_bytes() for p in gw.files.rglob("*") if p.is_file())
    assert files == sorted(data for data, _ in MEDIA.values())


async def test_a_button_tapped_twice_is_one_turn(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    """Each tap is its own message (its own wamid) replying to the same buttons."""
    taps = [payload("button_reply"), payload("button_reply")]
    taps[1]["entry"][0]["changes"][0]["value"]["messages"][0]["id"] += ".again"
    for tap in taps:
        assert (await gw.notify(tap)).status_code == 200
    await until(lambda: gw.graph.texts(USER))
    await asyncio.sleep(0.5)
    assert gw.graph.texts(USER) == ["echo: [pressed the button: 10:00 (value: slot-10am)]"]
    assert len(fake_openai.requests) == 1


async def test_business_scoped_users_are_answered_by_user_id(gw: Gateway) -> None:
    await gw.notify(payload("bsuid"))
    await until(lambda: gw.graph.to("US.13491208655302741918"))
    (sent,) = gw.graph.sent
    assert sent["recipient"] == "US.13491208655302741918"
    assert "to" not in sent


async def test_media_over_the_size_cap_is_stored_without_its_file(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    gw.graph.media["media-img-1"] = (b"x" * 5000, "image/jpeg")  # the cap is 4096
    gw.graph.announced_size = 100  # the lookup understates it: the stream is checked too
    await gw.notify(payload("image"))
    await until(lambda: gw.graph.texts(USER))
    assert "not downloaded (too large)" in last_user_text(fake_openai.requests[0])
    assert not gw.files.exists() or not any(p.is_file() for p in gw.files.rglob("*"))


async def test_slow_media_does_not_hold_the_webhook(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    gw.graph.media.update(MEDIA)
    gw.graph.media_delay_s = 3.0  # media_timeout_s is 1.0
    started = time.monotonic()
    assert (await gw.notify(payload("document"))).status_code == 200
    assert time.monotonic() - started < 2.0
    await until(lambda: gw.graph.texts(USER))
    assert "not downloaded (took too long)" in last_user_text(fake_openai.requests[0])


async def test_a_text_right_after_a_photo_is_not_answered_before_it(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    """The photo's notification was stored only once its file had downloaded, so the text
    sent after it was stored, and answered without the photo, first."""
    gw.graph.media.update(MEDIA)
    gw.graph.media_delay_s = 0.6  # within media_timeout_s
    photo = asyncio.create_task(gw.notify(payload("image")))
    await asyncio.sleep(0.2)
    text = text_message("what is in this photo?", user=USER, mid="wamid.after-the-photo")
    assert (await gw.notify(text)).status_code == 200
    assert (await photo).status_code == 200
    await until(lambda: "photo?" in "".join(last_user_text(b) for b in fake_openai.requests))
    assert "[attachment image" in last_user_text(fake_openai.requests[0])


async def test_three_messages_in_one_payload(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    assert (await gw.notify(payload("three_messages"))).status_code == 200
    await until(lambda: "third" in "".join(gw.graph.texts(USER)))
    asked = "\n".join(last_user_text(b) for b in fake_openai.requests)
    assert [w for w in ("first", "second", "third") if w in asked] == ["first", "second", "third"]


async def test_a_lone_surrogate_or_nul_is_mended_and_the_rest_of_the_notification_kept(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    """Half of a UTF-16 pair (valid JSON, no valid UTF-8) once made a 500 on every delivery:
    the messages after it were never stored. A NUL is refused by PostgreSQL's text columns."""
    data = payload("three_messages")
    value = data["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["profile"]["name"] = "Ana \ud83d"
    value["messages"][1]["text"]["body"] = "second \ud83d broken"
    value["messages"][2]["text"]["body"] = "third \x00 nul"
    assert (await gw.notify(data)).status_code == 200
    await until(lambda: "third" in "".join(gw.graph.texts(USER)))
    asked = "\n".join(last_user_text(b) for b in fake_openai.requests)
    assert "second \ufffd broken" in asked
    assert "third \ufffd nul" in asked
    assert [w for w in ("first", "second", "third") if w in asked] == ["first", "second", "third"]


async def test_entries_for_two_numbers_are_two_sessions(gw: Gateway) -> None:
    await gw.notify(payload("multi_entry"))
    await until(lambda: len(gw.graph.sent) == 2)
    by_number = {m["_number"]: m["text"]["body"] for m in gw.graph.sent}
    assert by_number == {"1001": "echo: to number one", "1002": "echo: to number two"}
    assert await gw.store.last_inbound_at(session(number="1002")) is not None


async def test_duplicate_delivery_is_answered_once(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    data = text_message("only once", mid="wamid.DUP")
    assert (await gw.notify(data)).status_code == 200
    assert (await gw.notify(data)).status_code == 200
    await until(lambda: gw.graph.texts(USER))
    assert (await gw.notify(data)).status_code == 200
    await asyncio.sleep(0.3)
    assert gw.graph.texts(USER) == ["echo: only once"]
    assert len(fake_openai.requests) == 1


async def test_reset_and_help_are_commands_and_reset_forgets_the_history(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    await gw.notify(text_message("my code is BANANA", mid="wamid.C1"))
    await until(lambda: len(gw.graph.texts(USER)) == 1)
    await gw.notify(text_message("/Help", mid="wamid.C2"))  # as a phone capitalizes it
    await until(lambda: len(gw.graph.texts(USER)) == 2)
    await gw.notify(text_message("/reset", mid="wamid.C3"))
    await until(lambda: len(gw.graph.texts(USER)) == 3)
    await gw.notify(text_message("what was my code?", mid="wamid.C4"))
    await until(lambda: len(gw.graph.texts(USER)) == 4)
    assert gw.graph.texts(USER)[1:3] == [HELP_REPLY, RESET_REPLY]
    assert len(fake_openai.requests) == 2  # the commands are answered without the model
    assert "BANANA" not in json.dumps(fake_openai.requests[1])


async def test_unsupported_gets_a_polite_notice_and_no_run(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    data = payload("unsupported")
    assert (await gw.notify(data)).status_code == 200
    await until(lambda: gw.graph.texts(USER))
    assert (await gw.notify(data)).status_code == 200  # a redelivery is not answered again
    await asyncio.sleep(0.3)
    assert gw.graph.texts(USER) == [DEFAULT_UNSUPPORTED_REPLY]
    assert fake_openai.requests == []


async def test_copies_of_an_unsupported_message_at_once_get_one_notice(gw: Gateway) -> None:
    """Meta redelivers while a slow acknowledgement is still on its way: each copy checked the
    "told already" flag before any had set it, and the customer got one apology per copy."""
    data = payload("unsupported")
    answers = await asyncio.gather(*(gw.notify(data) for _ in range(8)))
    assert {a.status_code for a in answers} == {200}
    await until(lambda: gw.graph.texts(USER))
    await asyncio.sleep(0.3)
    assert gw.graph.texts(USER) == [DEFAULT_UNSUPPORTED_REPLY]


async def test_a_blocked_sender_gets_no_notice_for_an_unsupported_message(
    tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI
) -> None:
    blocked = "15550019001"
    async with running_gateway(
        tmp_path, graph, fake_openai.url, f'block_from = ["{blocked}"]\n'
    ) as gw:
        for user in (blocked, USER):
            assert (await gw.notify(payload("unsupported", user=user))).status_code == 200
        await until(lambda: gw.graph.texts(USER))
        await asyncio.sleep(0.3)
        assert gw.graph.texts(blocked) == []
        assert gw.graph.texts(USER) == [DEFAULT_UNSUPPORTED_REPLY]


async def test_removed_reaction_is_ignored(gw: Gateway, fake_openai: FakeOpenAI) -> None:
    assert (await gw.notify(payload("reaction_removed"))).status_code == 200
    await asyncio.sleep(0.2)
    assert fake_openai.requests == []
    assert await gw.store.last_inbound_at(session()) is None


async def test_a_stranger_the_allowlist_refuses_is_told_once_that_it_is_private(
    tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI
) -> None:
    """The notice was judged outside the 24-hour window (the refused message is not stored,
    and the window was marked open only for stored ones): silence, a dead letter and ERROR
    lines, where Telegram and Slack tell the stranger."""
    stranger = "15550000002"
    extra = f'access = "allowlist"\nallow_from = ["{USER}"]\n'
    async with running_gateway(tmp_path, graph, fake_openai.url, extra) as gw:
        for i in range(2):
            note = text_message(f"hello {i}", user=stranger, mid=f"wamid.S{i}")
            assert (await gw.notify(note)).status_code == 200
        await until(lambda: gw.graph.texts(stranger))
        await asyncio.sleep(0.3)
        assert gw.graph.texts(stranger) == ["Sorry, this assistant is private."]
        assert fake_openai.requests == []
