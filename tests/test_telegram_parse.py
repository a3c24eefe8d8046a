"""Recorded, real-shaped updates → normalized messages (or nothing, when not for the bot)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from channels.telegram.client import bot_id_of
from channels.telegram.media import media_of
from channels.telegram.parse import (
    Entity,
    Identity,
    ParseOptions,
    Update,
    _with_links,
    message_id_of,
    normalize,
)
from core.models import MessageKind, SessionKey

PAYLOADS = Path(__file__).parent / "payloads" / "telegram"
ME = Identity("123456789", "switchboard_test_bot")
MENTION = ParseOptions()


def load(name: str) -> Update:
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text(encoding="utf-8"))
    return Update.model_validate(data)


def parse(name: str, me: Identity = ME, opts: ParseOptions = MENTION) -> Any:
    incoming = normalize(load(name), me, opts)
    return None if incoming is None else incoming.message


def test_every_recorded_payload_parses() -> None:
    names = sorted(p.stem for p in PAYLOADS.glob("*.json"))
    assert len(names) >= 20
    for name in names:
        normalize(load(name), ME, MENTION)
        normalize(load(name), Identity("123456789"), ParseOptions("all", "new"))


def test_private_text() -> None:
    msg = parse("private_text")
    assert (msg.channel, msg.account, msg.conversation, msg.thread) == (
        "telegram",
        "123456789",
        "111111",
        None,
    )
    assert msg.sender.id == "111111"
    assert msg.sender.name == "Ana Lima"
    assert msg.text == "What are your opening hours?"
    assert msg.kind is MessageKind.MESSAGE
    assert msg.platform_id == "900000101:42"
    assert message_id_of(msg.platform_id) == 42


def test_an_anonymous_admin_is_marked_anonymous() -> None:
    """They write as GroupAnonymousBot: not one known person (their presses carry their own
    id), so an action they ask for cannot be bound to them."""
    data: dict[str, Any] = json.loads((PAYLOADS / "group_mention.json").read_text())
    data["message"]["from"] = {"id": 1087968824, "is_bot": True, "first_name": "Group"}
    data["message"]["sender_chat"] = dict(data["message"]["chat"])
    incoming = normalize(Update.model_validate(data), ME, MENTION)
    assert incoming is not None
    assert incoming.message.sender.anonymous
    assert not parse("private_text").sender.anonymous


def test_start_command_keeps_its_payload() -> None:
    msg = parse("private_start")
    assert msg.kind is MessageKind.COMMAND
    assert msg.command == "start"
    assert msg.text == "/start ref_42"


@pytest.mark.parametrize(
    ("name", "answered"),
    [
        ("group_mention", True),
        ("group_plain", False),
        ("group_mention_other", False),
        ("group_reply_to_bot", True),
        ("group_reply_to_person", False),
        ("group_command_ours", True),
        ("group_command_other", False),
        ("group_command_bare", True),
        ("group_photo_caption_mention", True),
        ("emoji_before_mention", True),
        ("new_members_service", False),
    ],
)
def test_groups_answer_only_when_addressed(name: str, answered: bool) -> None:
    assert (parse(name) is not None) is answered
    everything = parse(name, opts=ParseOptions(group_mode="all"))
    if name not in ("group_command_other", "new_members_service"):
        assert everything is not None


def test_a_mention_is_taken_off_the_front_and_a_command_loses_its_bot_name() -> None:
    assert parse("group_mention").text == "¿cuánto cuesta? 💶"
    msg = parse("group_command_ours")
    assert (msg.kind, msg.command, msg.text) == (MessageKind.COMMAND, "help", "/help")


def test_group_replies_keep_what_they_quote() -> None:
    msg = parse("group_reply_to_bot")
    assert msg.reply_to == "6990"
    assert msg.conversation == "-1001234567890"


def test_forum_topics_are_threads_and_other_threads_are_not() -> None:
    topic = parse("forum_topic_mention")
    assert (topic.conversation, topic.thread) == ("-1009876543210", "7")
    assert topic.reply_to is None  # the topic's creation is not a quoted message
    assert parse("forum_general").thread is None
    reply_thread = parse("group_thread_reply_not_topic")
    assert reply_thread.thread is None
    keys = {SessionKey.for_message("default", m) for m in (topic, parse("forum_general"))}
    assert len(keys) == 2


def test_a_private_chat_topic_is_a_thread_of_its_own() -> None:
    """Bot API 9.3: private chats have topics too; the answer goes to the topic it came from."""
    topic = parse("private_topic")
    assert (topic.conversation, topic.thread) == ("111111", "12")
    assert topic.reply_to is None  # the topic's creation is not a quoted message
    plain = parse("private_text")
    assert plain.thread is None
    assert SessionKey.for_message("default", topic) != SessionKey.for_message("default", plain)


def test_an_unknown_username_still_answers_replies_and_bare_commands() -> None:
    me = Identity("123456789")
    assert parse("group_reply_to_bot", me) is not None
    assert parse("group_command_bare", me) is not None
    assert parse("group_mention", me) is None  # cannot tell it is us yet


def test_button_press_carries_label_and_value() -> None:
    msg = parse("callback_query")
    assert msg.kind is MessageKind.BUTTON
    assert msg.button_value == "book:yes"
    assert msg.text == "Yes, book it"
    assert msg.conversation == "111111"
    assert msg.platform_id == "900000114:50"
    assert parse("callback_inline") is None


def test_photo_with_caption_describes_the_largest_size() -> None:
    incoming = normalize(load("photo_caption"), ME, MENTION)
    assert incoming is not None
    assert incoming.message.text == "Is this the right part?"
    [ref] = incoming.media
    assert ref.kind == "image"
    assert ref.file_id == "AgACAgQAAxkBAAIBlarge"
    assert ref.size == 98123
    assert ref.description == "a photo (1280x960)"


@pytest.mark.parametrize(
    ("name", "kind", "description", "downloadable"),
    [
        ("voice", "audio", "a voice note (7 s)", True),
        ("document", "document", 'a document "invoice-2025.pdf"', True),
        ("sticker", "sticker", "a sticker 👍", True),
        ("location", "location", "a location (38.722252, -9.139337)", False),
    ],
)
def test_other_media_are_described(
    name: str, kind: str, description: str, downloadable: bool
) -> None:
    incoming = normalize(load(name), ME, MENTION)
    assert incoming is not None
    [ref] = incoming.media
    assert (ref.kind, ref.description) == (kind, description)
    assert (ref.file_id is not None) is downloadable


def test_edited_messages_follow_the_setting() -> None:
    assert parse("edited_message") is None
    msg = parse("edited_message", opts=ParseOptions(edited_messages="new"))
    assert msg.kind is MessageKind.EDIT
    assert msg.text == "What are your opening hours on Sunday?"
    assert msg.platform_id != parse("private_text").platform_id


@pytest.mark.parametrize("name", ["channel_post", "my_chat_member"])
def test_other_update_kinds_are_ignored(name: str) -> None:
    assert parse(name) is None


def test_the_bot_id_is_the_token_prefix_and_never_the_secret() -> None:
    assert bot_id_of("123456789:AAHsecret") == "123456789"
    odd = bot_id_of("not-a-token")
    assert "not-a-token" not in odd
    assert odd == bot_id_of("not-a-token")


def test_media_of_survives_odd_shapes() -> None:
    assert media_of({"photo": ["x", 3], "voice": "nope", "document": {}}) == []
    [ref] = media_of({"audio": {"file_id": "a", "duration": 200, "title": "Song"}})
    assert ref.description == 'an audio file "Song" (3:20)'


def test_parsing_is_fast_enough_for_the_webhook_path() -> None:
    raw = (PAYLOADS / "group_mention.json").read_text(encoding="utf-8")
    start = time.perf_counter()
    for _ in range(2000):
        normalize(Update.model_validate_json(raw), ME, MENTION)
    per_update = (time.perf_counter() - start) / 2000
    assert per_update < 200e-6  # Update.de_json alone costs about this much


def test_the_model_reads_link_addresses_forwards_and_what_a_reply_answers() -> None:
    text = "read 👉 this and that"  # the emoji is two UTF-16 units: offsets count units
    update = Update.model_validate(
        {
            "update_id": 1,
            "message": {
                "message_id": 5,
                "chat": {"id": 111111, "type": "private"},
                "from": {"id": 111111, "first_name": "Ana"},
                "text": text,
                "entities": [
                    {"type": "text_link", "offset": 8, "length": 4, "url": "https://x.test/991"},
                    {"type": "bold", "offset": 13, "length": 3},
                ],
                "forward_origin": {"type": "hidden_user", "sender_user_name": "Luis P."},
                "reply_to_message": {
                    "message_id": 4,
                    "from": {"id": 123456789, "is_bot": True, "first_name": "Bot"},
                    "text": "Option B: " + "b" * 400,
                },
            },
        }
    )
    incoming = normalize(update, ME, MENTION)
    assert incoming is not None
    msg = incoming.message
    assert msg.text == "read 👉 this (https://x.test/991) and that"
    assert msg.notes[0] == "forwarded from Luis P."
    assert msg.notes[1].startswith("in reply to your message: «Option B: bbb")
    assert msg.notes[1].endswith("…»")
    assert len(msg.notes[1]) < 360
    person = parse("group_reply_to_person")
    assert person is None or all("your message" not in n for n in person.notes)


def _private(**content: Any) -> Any:
    message = {
        "message_id": 9,
        "chat": {"id": 111111, "type": "private"},
        "from": {"id": 111111, "first_name": "Ana"},
        **content,
    }
    incoming = normalize(Update.model_validate({"update_id": 2, "message": message}), ME, MENTION)
    return None if incoming is None else incoming.message


def test_polls_dice_checklists_games_stories_and_places_reach_the_agent_in_words() -> None:
    """In a private chat every message is answered; these were dropped without a word."""
    poll = {"question": "Lunch?", "options": [{"text": "Pizza"}, {"text": "Sushi"}]}
    assert _private(poll=poll).notes == ("a poll: Lunch? (options: Pizza / Sushi)",)
    assert _private(dice={"emoji": "🎯", "value": 6}).notes == ("threw a 🎯 and got 6",)
    checklist = {"title": "Trip", "tasks": [{"id": 1, "text": "tickets"}]}
    assert _private(checklist=checklist).notes == ("a checklist: Trip: tickets",)
    assert _private(game={"title": "Tetris"}).notes == ("a game: Tetris",)
    assert _private(story={"chat": {"id": 5}, "id": 3}).notes[0].startswith("shared a story")
    place = {
        "location": {"latitude": 40.4, "longitude": -3.7},
        "venue": {"location": {}, "title": "Sol", "address": "Plaza de Sol"},
    }
    media = normalize(
        Update.model_validate(
            {
                "update_id": 3,
                "message": {
                    "message_id": 9,
                    "chat": {"id": 111111, "type": "private"},
                    "from": {"id": 111111, "first_name": "Ana"},
                    **place,
                },
            }
        ),
        ME,
        MENTION,
    )
    assert media is not None
    assert [m.description for m in media.media] == ["a place: Sol, Plaza de Sol (40.4, -3.7)"]
    # service messages still start nothing
    assert _private(forum_topic_created={"name": "Invoices", "icon_color": 1}) is None
    assert _private(pinned_message={"message_id": 1, "chat": {"id": 1, "type": "private"}}) is None


def test_links_on_a_command_or_a_nested_link_are_left_alone() -> None:
    def linked(text: str, *links: tuple[int, int, str]) -> str:
        entities = [Entity(type="text_link", offset=o, length=n, url=u) for o, n, u in links]
        return _with_links(text, entities)

    assert linked("/help@other_bot x", (0, 5, "https://x.test")) == "/help@other_bot x"
    assert linked("abc def", (0, 7, "u1"), (4, 3, "u2")) == "abc def (u2)"  # not the first word
    assert linked("x abc def", (2, 7, "u1"), (6, 3, "u2")) == "x abc def (u1)"
