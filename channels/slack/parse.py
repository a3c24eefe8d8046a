"""Slack payloads (Events API, block_actions, slash commands) as normalized messages.

Plain dict access over the few fields we need: no SDK objects on the hot path. Session
identity (DESIGN §2): a DM is one conversation (the D… channel, no thread); in channels each
thread is a session, a top-level mention starting one (thread = the mention's own ts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from core.models import InboundMessage, MessageKind, Sender

__all__ = ["FileRef", "Incoming", "parse_action", "parse_command", "parse_event", "plain_text"]

CHANNEL = "slack"
# message subtypes a person sends; every other subtype (message_changed, message_deleted,
# channel_join, bot_message, …) is a notification about something else and starts nothing
_PERSON_SUBTYPES = frozenset({"file_share", "thread_broadcast", "me_message"})
_SKIPPED_FILE_MODES = frozenset({"tombstone", "hidden_by_limit", "external"})
_COMMAND = re.compile(r"^/([a-z][a-z0-9_]{0,31})(?:\s|$)")
_MARKUP = re.compile(r"<([^<>|]*)(?:\|([^<>]*))?>")


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file shared with a message, still to be downloaded with the bot token."""

    name: str
    mime: str | None
    size: int | None
    url: str


@dataclass(frozen=True, slots=True)
class Incoming:
    """A normalized message and what is left to do before it is submitted."""

    message: InboundMessage
    files: tuple[FileRef, ...] = ()
    joins_thread: bool = False  # a mention: the bot now takes part in this thread
    needs_joined_thread: bool = False  # a thread reply: only for threads the bot joined


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_event(
    body: dict[str, Any], bot_user_id: str | None, threads: Literal["mention", "all"]
) -> Incoming | None:
    """An event_callback body as a message to submit, or None when it must start nothing."""
    event = body.get("event")
    if not isinstance(event, dict) or event.get("type") not in ("message", "app_mention"):
        return None
    subtype = event.get("subtype")
    if subtype is not None and not isinstance(subtype, str):
        return None
    if (subtype is not None and subtype not in _PERSON_SUBTYPES) or event.get("hidden"):
        return None
    user, channel, ts = _str(event.get("user")), _str(event.get("channel")), _str(event.get("ts"))
    if user is None or channel is None or ts is None:
        return None
    if event.get("bot_id") or event.get("bot_profile") or user == bot_user_id:
        return None  # our own messages and other bots'
    raw = event.get("text")
    text = raw if isinstance(raw, str) else ""
    thread_ts = _str(event.get("thread_ts"))
    joins = needs_joined = False
    if _is_dm(channel, event.get("channel_type")):
        thread = None
    else:
        mention = event["type"] == "app_mention" or (
            bot_user_id is not None and f"<@{bot_user_id}>" in text
        )
        if mention:
            thread, joins = thread_ts or ts, True
        elif threads == "all" and thread_ts is not None and thread_ts != ts:
            thread, needs_joined = thread_ts, True
        else:
            return None
    account = _str(body.get("team_id")) or _str(event.get("team")) or "default"
    message = _message(
        account=account,
        conversation=channel,
        thread=thread,
        sender=Sender(id=user, name=_profile_name(event.get("user_profile"))),
        text=plain_text(text, bot_user_id),
        platform_id=f"{channel}:{ts}",
        shared=thread is not None,  # a channel's thread: anyone in the channel may write
    )
    files = _files(event.get("files"))
    if not message.text.strip() and not files and not joins:  # a bare mention still asks
        return None  # nothing to read (a text-less post, or blocks only): no empty turn
    return Incoming(message, files, joins, needs_joined)


def parse_action(payload: dict[str, Any]) -> Incoming | None:
    """A block_actions click on one of our buttons as a message of kind button."""
    actions = payload.get("actions")
    if payload.get("type") != "block_actions" or not isinstance(actions, list) or not actions:
        return None
    action = actions[0]
    if not isinstance(action, dict) or action.get("type") != "button":
        return None
    user, team = _dict(payload.get("user")), _dict(payload.get("team"))
    container, msg = _dict(payload.get("container")), _dict(payload.get("message"))
    channel = _str(_dict(payload.get("channel")).get("id")) or _str(container.get("channel_id"))
    user_id = _str(user.get("id"))
    message_ts = _str(container.get("message_ts")) or _str(msg.get("ts"))
    if channel is None or user_id is None or message_ts is None:
        return None
    thread_ts = _str(msg.get("thread_ts")) or _str(container.get("thread_ts"))
    thread = None if _is_dm(channel, None) else thread_ts or message_ts
    label = _str(_dict(action.get("text")).get("text")) or ""
    value = action.get("value") if isinstance(action.get("value"), str) else label
    stamp = _str(action.get("action_ts")) or _str(payload.get("trigger_id")) or message_ts
    message = _message(
        account=_str(team.get("id")) or _str(user.get("team_id")) or "default",
        conversation=channel,
        thread=thread,
        sender=Sender(id=user_id, name=_str(user.get("name")) or _str(user.get("username"))),
        text=label,
        platform_id=f"act:{channel}:{stamp}",
        kind=MessageKind.BUTTON,
        button_value=value,
        reply_to=message_ts,  # the message the buttons are on
        shared=thread is not None,
    )
    return Incoming(message)


def parse_command(form: dict[str, Any]) -> Incoming | None:
    """A slash command (`/reset`) as a command message in the channel it was typed in."""
    command, channel = _str(form.get("command")), _str(form.get("channel_id"))
    user, trigger = _str(form.get("user_id")), _str(form.get("trigger_id"))
    if command is None or channel is None or user is None or trigger is None:
        return None
    args = form.get("text") if isinstance(form.get("text"), str) else ""
    message = _message(
        account=_str(form.get("team_id")) or "default",
        conversation=channel,
        thread=None,
        sender=Sender(id=user, name=_str(form.get("user_name"))),
        text=f"{command} {args}".strip(),
        platform_id=f"cmd:{trigger}",
    )
    return Incoming(message)


def plain_text(text: str, bot_user_id: str | None = None) -> str:
    """Slack markup as the text a person sees: our mention dropped, links and mentions
    spelled out, entities decoded."""

    def spell(m: re.Match[str]) -> str:
        target, label = m.group(1), m.group(2)
        if bot_user_id is not None and target == f"@{bot_user_id}":
            return ""
        if target.startswith(("@", "#")):
            return f"{target[0]}{label.lstrip('@#')}" if label else target
        if target.startswith("!"):
            return label or "@" + target[1:].split("^")[0]
        url = target.removeprefix("mailto:")
        return f"{label} ({url})" if label and label != url else url

    spelled = _MARKUP.sub(spell, text)
    return spelled.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").strip()


def _message(**fields: Any) -> InboundMessage:
    text: str = fields["text"]
    kind = fields.pop("kind", MessageKind.MESSAGE)
    command = None
    if kind is MessageKind.MESSAGE and (m := _COMMAND.match(text)):
        kind, command = MessageKind.COMMAND, m.group(1)
    return InboundMessage(channel=CHANNEL, kind=kind, command=command, **fields)


def _is_dm(channel: str, channel_type: Any) -> bool:
    if isinstance(channel_type, str):
        return channel_type == "im"
    return channel.startswith("D")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _profile_name(profile: Any) -> str | None:
    p = _dict(profile)
    return _str(p.get("display_name")) or _str(p.get("real_name"))


def _files(files: Any) -> tuple[FileRef, ...]:
    refs = []
    for f in files if isinstance(files, list) else ():
        if not isinstance(f, dict) or f.get("mode") in _SKIPPED_FILE_MODES:
            continue
        url = _str(f.get("url_private_download")) or _str(f.get("url_private"))
        if url is None:
            continue
        size = f.get("size")
        refs.append(
            FileRef(
                name=_str(f.get("name")) or _str(f.get("title")) or "file",
                mime=_str(f.get("mimetype")),
                size=size if isinstance(size, int) else None,
                url=url,
            )
        )
    return tuple(refs)
