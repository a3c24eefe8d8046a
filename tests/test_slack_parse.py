"""Slack payloads (recorded shapes under tests/payloads/slack/) as normalized messages."""

from __future__ import annotations

import pytest

from channels.slack.parse import parse_action, parse_command, parse_event, plain_text
from core.models import MessageKind, SessionKey
from tests.fake_slack import BOT_USER, TEAM, payload


def _key(body_name: str, threads: str = "mention") -> SessionKey | None:
    incoming = parse_event(payload(body_name), BOT_USER, threads)  # type: ignore[arg-type]
    return None if incoming is None else SessionKey.for_message("default", incoming.message)


def test_dm_is_one_session_per_dm_channel_without_thread() -> None:
    incoming = parse_event(payload("dm_message"), BOT_USER, "mention")
    assert incoming is not None
    msg = incoming.message
    assert (msg.channel, msg.account, msg.conversation, msg.thread) == (
        "slack",
        TEAM,
        "D0DM000001",
        None,
    )
    assert msg.platform_id == "D0DM000001:1750000000.000100"
    assert msg.sender.id == "U0USER0001"
    assert (
        msg.text == "What are your opening hours & prices? See the menu (https://example.com/menu)"
    )
    assert not incoming.joins_thread


def test_top_level_mention_starts_a_thread_on_its_own_ts() -> None:
    incoming = parse_event(payload("app_mention"), BOT_USER, "mention")
    assert incoming is not None
    assert incoming.message.conversation == "C0CHAN0001"
    assert incoming.message.thread == "1750000100.000200"
    assert incoming.message.text == "can you summarise #general for @U0USER0003?"
    assert incoming.joins_thread


def test_mention_in_a_thread_keeps_the_parent_thread() -> None:
    incoming = parse_event(payload("mention_in_thread"), BOT_USER, "mention")
    assert incoming is not None
    assert incoming.message.thread == "1750000100.000200"
    assert incoming.message.platform_id == "C0CHAN0001:1750000300.000400"


def test_the_same_post_as_message_and_app_mention_normalizes_identically() -> None:
    mention = parse_event(payload("app_mention"), BOT_USER, "mention")
    as_message = parse_event(payload("message_with_mention"), BOT_USER, "mention")
    assert mention is not None
    assert as_message is not None
    assert mention.message.platform_id == as_message.message.platform_id
    assert _key("app_mention") == _key("message_with_mention")


def test_thread_reply_without_mention_only_when_configured() -> None:
    assert parse_event(payload("thread_reply"), BOT_USER, "mention") is None
    incoming = parse_event(payload("thread_reply"), BOT_USER, "all")
    assert incoming is not None
    assert incoming.needs_joined_thread
    assert incoming.message.thread == "1750000100.000200"


@pytest.mark.parametrize(
    "name",
    [
        "message_changed",
        "message_deleted",
        "channel_join",
        "own_message",
        "other_bot_message",
        "reaction_added",
    ],
)
def test_events_that_must_never_start_a_run(name: str) -> None:
    assert parse_event(payload(name), BOT_USER, "all") is None


def test_own_message_is_ignored_by_user_id_even_without_bot_id() -> None:
    body = payload("dm_message")
    body["event"]["user"] = BOT_USER
    assert parse_event(body, BOT_USER, "all") is None


@pytest.mark.parametrize(
    "event",
    [
        None,
        "text",
        {"type": "message"},
        {"type": "message", "user": 5, "channel": "D1", "ts": "1.2"},
        {"type": "message", "user": "U1", "channel": ["D1"], "ts": "1.2"},
        {"type": "message", "user": "U1", "channel": "D1", "ts": None},
    ],
)
def test_malformed_events_are_ignored_not_raised(event: object) -> None:
    assert parse_event({"type": "event_callback", "event": event}, BOT_USER, "all") is None


def test_files_are_listed_for_download_and_tombstones_skipped() -> None:
    incoming = parse_event(payload("file_share"), BOT_USER, "mention")
    assert incoming is not None
    assert [f.name for f in incoming.files] == ["invoice.pdf"]
    assert incoming.files[0].url.endswith("/download/invoice.pdf")
    assert incoming.files[0].mime == "application/pdf"
    assert incoming.message.text == "here is the invoice"


def test_block_action_is_a_button_message_in_the_thread_of_the_clicked_message() -> None:
    incoming = parse_action(payload("block_actions"))
    assert incoming is not None
    msg = incoming.message
    assert msg.kind is MessageKind.BUTTON
    assert (msg.button_value, msg.text) == ("yes", "Yes, book it")
    assert (msg.conversation, msg.thread, msg.account) == (
        "C0CHAN0001",
        "1750000100.000200",
        TEAM,
    )
    assert msg.platform_id == "act:C0CHAN0001:1750000501.000300"


def test_block_action_without_actions_is_ignored() -> None:
    body = payload("block_actions")
    body["actions"] = []
    assert parse_action(body) is None
    assert parse_action({"type": "view_submission"}) is None


def test_slash_command_is_a_command_message() -> None:
    incoming = parse_command(payload("slash_command"))
    assert incoming is not None
    assert incoming.message.kind is MessageKind.COMMAND
    assert incoming.message.command == "reset"
    assert incoming.message.conversation == "D0DM000001"


def test_typed_command_after_the_mention_is_a_command() -> None:
    body = payload("app_mention")
    body["event"]["text"] = f"<@{BOT_USER}> /reset"
    incoming = parse_event(body, BOT_USER, "mention")
    assert incoming is not None
    assert (incoming.message.kind, incoming.message.command) == (MessageKind.COMMAND, "reset")


@pytest.mark.parametrize(
    ("markup", "plain"),
    [
        ("a &lt;b&gt; &amp; c", "a <b> & c"),
        ("<https://x.y/a?b=1&amp;c=2>", "https://x.y/a?b=1&c=2"),
        ("mail <mailto:a@b.c|a@b.c>", "mail a@b.c"),
        ("<!here> hi <!subteam^S1|@ops>", "@here hi @ops"),
        (f"<@{BOT_USER}> hi <@U2|bob>", "hi @bob"),
    ],
)
def test_plain_text(markup: str, plain: str) -> None:
    assert plain_text(markup, BOT_USER) == plain


def test_a_post_with_nothing_to_read_starts_no_empty_turn() -> None:
    """Text only in blocks (or none): the model got an empty message and answered it."""
    body = payload("dm_message")
    body["event"]["text"] = ""
    assert parse_event(body, BOT_USER, "mention") is None  # type: ignore[arg-type]
    mention = payload("app_mention")
    mention["event"]["text"] = f"<@{BOT_USER}>"
    assert parse_event(mention, BOT_USER, "mention") is not None  # a bare mention still asks
