"""Parsing recorded, real-shaped WhatsApp notifications (tests/payloads/whatsapp/*.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.base import BadInput
from channels.whatsapp.parse import (
    Event,
    Incoming,
    StatusReport,
    Unsupported,
    parse,
    parse_json,
)
from core.models import MessageKind, SessionKey

PAYLOADS = Path(__file__).parent / "payloads" / "whatsapp"
NUMBERS = frozenset({"1001", "1002"})
NOW = 1_760_000_000.0


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text())
    return data


def events(name: str) -> list[Event]:
    return parse(load(name), NUMBERS, NOW)


def one(name: str) -> Incoming:
    (event,) = events(name)
    assert isinstance(event, Incoming)
    return event


def test_text_is_one_message_per_customer_and_number() -> None:
    msg = one("text").message
    assert msg.text == "Hello, do you deliver on Sundays?"
    assert (msg.channel, msg.account, msg.conversation) == ("whatsapp", "1001", "15551234567")
    assert msg.platform_id == "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzTEXT1"
    assert msg.sender.name == "Ana"
    assert msg.received_at == 1750000000.0
    key = SessionKey.for_message("default", msg)
    assert str(key) == "default:whatsapp:1001:15551234567"


def test_quoted_message_becomes_reply_to() -> None:
    assert one("reply_context").message.reply_to == "wamid.QUOTED1"


@pytest.mark.parametrize(
    ("name", "kind", "media_id", "text", "file_name"),
    [
        ("image", "image", "media-img-1", "my receipt", "image.jpeg"),
        ("audio_voice", "audio", "media-aud-1", "", "audio.ogg"),
        ("video", "video", "media-vid-1", "the noise", "video.mp4"),
        ("document", "document", "media-doc-1", "", "invoice-42.pdf"),
        ("sticker", "sticker", "media-stk-1", "", "sticker.webp"),
    ],
)
def test_media_messages_carry_their_media_id_and_caption(
    name: str, kind: str, media_id: str, text: str, file_name: str
) -> None:
    event = one(name)
    assert event.media is not None
    assert event.media.id == media_id
    assert event.message.text == text
    (att,) = event.message.attachments
    assert (att.kind, att.name, att.path) == (kind, file_name, None)


def test_voice_note_is_described_as_such() -> None:
    (att,) = one("audio_voice").message.attachments
    assert att.mime == "audio/ogg; codecs=opus"
    assert att.description == "voice message"


def test_location_becomes_text_and_an_attachment() -> None:
    msg = one("location").message
    assert msg.text == (
        "[location: Puerta del Sol, Plaza de la Puerta del Sol, Madrid (40.4168, -3.7038)]"
    )
    (att,) = msg.attachments
    assert (att.kind, att.name, att.description) == (
        "location",
        "Puerta del Sol",
        "40.4168, -3.7038",
    )
    assert att.url == "https://maps.example.com/sol"


def test_contacts_become_text_and_attachments() -> None:
    msg = one("contacts").message
    assert msg.text == "[contact: Luis Pérez, +34 600 000 001]"
    (att,) = msg.attachments
    assert (att.kind, att.name) == ("contact", "Luis Pérez")


@pytest.mark.parametrize(
    ("name", "value", "title", "quoted"),
    [
        ("button_reply", "slot-10am", "10:00", "wamid.OUT1"),
        ("list_reply", "size-m", "Medium", "wamid.OUT2"),
        ("template_button", "talk-to-us", "Continue", "wamid.OUT3"),
    ],
)
def test_choices_are_button_presses(name: str, value: str, title: str, quoted: str) -> None:
    msg = one(name).message
    assert msg.kind is MessageKind.BUTTON
    assert (msg.button_value, msg.text, msg.reply_to) == (value, title, quoted)


def test_reaction_is_a_message_and_a_removed_one_is_ignored() -> None:
    msg = one("reaction").message
    assert msg.kind is MessageKind.MESSAGE
    assert msg.text == "[reacted with 👍 to wamid.OUT4]"
    assert msg.reply_to == "wamid.OUT4"
    assert events("reaction_removed") == []


def test_an_order_from_the_catalog_reaches_the_agent_item_by_item() -> None:
    """Orders, form answers and the first opening of a chat got "I can't read that kind of
    message", and their content was thrown away."""
    msg = one("order").message
    assert msg.text == (
        "[placed an order: 2 x helmet-m at 39.5 USD; 1 x lock-u at 25 USD]\nPlease gift-wrap it"
    )
    flow = one("flow_reply").message
    assert flow.text.startswith("[filled in the form flow: {")
    assert '"service": "tune-up"' in flow.text
    welcome = one("request_welcome").message
    assert (welcome.kind, welcome.command) == (MessageKind.COMMAND, "start")


def test_unsupported_is_its_own_event() -> None:
    (event,) = events("unsupported")
    assert isinstance(event, Unsupported)
    assert event.what == "unsupported"
    assert event.message.conversation == "15551234567"


def test_every_message_of_every_entry_and_change() -> None:
    assert [e.message.text for e in events("three_messages") if isinstance(e, Incoming)] == [
        "first",
        "second",
        "third",
    ]
    got = [
        (e.message.account, e.message.text)
        for e in events("multi_entry")
        if isinstance(e, Incoming)
    ]
    assert got == [("1001", "to number one"), ("1002", "to number two")]


def test_numbers_we_do_not_serve_are_ignored() -> None:
    assert events("other_number") == []
    assert parse(load("text"), frozenset({"1002"}), NOW) == []


def test_statuses_carry_the_failure_code() -> None:
    assert events("statuses") == [
        StatusReport("wamid.OUT1", "delivered", None),
        StatusReport("wamid.OUT2", "failed", "131026: Message undeliverable"),
    ]


def test_business_scoped_user_without_wa_id() -> None:
    msg = one("bsuid").message
    assert msg.conversation == "US.13491208655302741918"
    assert msg.sender.name == "Bo"


def test_edit_is_an_edit_of_the_original() -> None:
    msg = one("edit").message
    assert msg.kind is MessageKind.EDIT
    assert msg.text == "Hello, do you deliver on Saturdays?"
    assert msg.reply_to == "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzTEXT1"


def test_future_timestamps_are_clamped_to_now() -> None:
    data = load("text")
    data["entry"][0]["changes"][0]["value"]["messages"][0]["timestamp"] = str(int(NOW) + 999)
    (event,) = parse(data, NUMBERS, NOW)
    assert isinstance(event, Incoming)
    assert event.message.received_at == NOW


@pytest.mark.parametrize(
    "body",
    [
        [],
        "text",
        {"object": "whatsapp_business_account", "entry": "x"},
        {"entry": [{"changes": 1}]},
    ],
)
def test_bad_envelopes_are_bad_input(body: Any) -> None:
    with pytest.raises(BadInput):
        parse(body, NUMBERS, NOW)


def test_one_bad_message_does_not_hide_the_others() -> None:
    data = load("three_messages")
    msgs = data["entry"][0]["changes"][0]["value"]["messages"]
    msgs[1] = {"type": "text", "text": {"body": "no id"}}
    msgs.append({"id": "wamid.X", "type": "location", "location": {"latitude": "far"}})
    texts = [e.message.text for e in parse(data, NUMBERS, NOW) if isinstance(e, Incoming)]
    assert texts == ["first", "third"]


def test_other_objects_and_fields_are_ignored() -> None:
    assert parse({"object": "page", "entry": []}, NUMBERS, NOW) == []
    data = load("text")
    data["entry"][0]["changes"][0]["field"] = "message_template_status_update"
    assert parse(data, NUMBERS, NOW) == []


# parse_json (the route's: one pass over the bytes, else part by part) must be parse exactly


def _both(data: Any) -> tuple[Any, Any]:
    """What parse and parse_json make of the same notification (events, or the error)."""
    out = []
    for read in (lambda: parse(data, NUMBERS, NOW), lambda: parse_json(_bytes(data), NUMBERS, NOW)):
        try:
            out.append(read())
        except BadInput as exc:
            out.append(f"BadInput: {exc}")
    return out[0], out[1]


def _bytes(data: Any) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize("name", sorted(p.stem for p in PAYLOADS.glob("*.json")))
def test_reading_the_bytes_in_one_pass_is_the_same_as_part_by_part(name: str) -> None:
    data = load(name)
    by_parts, whole = _both(data)
    assert whole == by_parts


def test_one_pass_steps_aside_for_anything_unusual() -> None:
    bad_message = load("three_messages")
    bad_message["entry"][0]["changes"][0]["value"]["messages"][1] = {"type": "text"}
    other_field = load("text")
    other_field["entry"][0]["changes"].append({"field": "account_update", "value": {"x": 1}})
    lone_surrogate = load("text")
    lone_surrogate["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"] = "\ud800"
    numeric_id = load("text")
    numeric_id["entry"][0]["changes"][0]["value"]["messages"][0]["from"] = 1.0
    unusual = (bad_message, other_field, lone_surrogate, numeric_id)
    for data in (*unusual, {"object": "page", "entry": []}, [], {"entry": 1}):
        by_parts, whole = _both(data)
        assert whole == by_parts
    assert len(_both(bad_message)[1]) == 2  # the good two still count
    with pytest.raises(ValueError, match="Expecting value"):
        parse_json(b"not json", NUMBERS, NOW)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [path] + [q for k, v in node.items() for q in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [path] + [q for i, v in enumerate(node) for q in _leaves(v, (*path, i))]
    return [path]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(p.stem for p in PAYLOADS.glob("*.json"))),
    pick=st.integers(min_value=0),
    value=_JSON,
)
def test_one_pass_agrees_on_mangled_notifications(name: str, pick: int, value: Any) -> None:
    data: Any = load(name)
    paths = _leaves(data)
    path = paths[pick % len(paths)]
    if not path:
        data = value
    else:
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
    by_parts, whole = _both(data)
    assert whole == by_parts


def test_an_empty_text_starts_no_empty_turn() -> None:
    data = load("text")
    data["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"] = " \n"
    assert events_of(data) == []


def events_of(data: dict[str, Any]) -> list[Event]:
    return parse(data, NUMBERS, NOW)


def test_a_forward_and_the_ad_a_person_came_from_are_told_to_the_agent() -> None:
    data = load("text")
    message = data["entry"][0]["changes"][0]["value"]["messages"][0]
    message["context"] = {"forwarded": True}
    message["referral"] = {
        "source_url": "https://fb.me/xyz",
        "source_type": "ad",
        "headline": "Winter sale",
        "body": "Bikes 20% off",
    }
    (event,) = events_of(data)
    assert isinstance(event, Incoming)
    assert event.message.notes == ("forwarded", "came from the ad: Winter sale — Bikes 20% off")
