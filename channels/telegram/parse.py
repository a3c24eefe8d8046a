"""Telegram updates → normalized messages, with small pydantic models (no PTB objects on the
webhook path: Update.de_json costs ~200 µs, these models a few µs).

Session keys: conversation = chat id; thread = message_thread_id only for topics (of forums
and private chats); account = the bot id; platform_id = "<update_id>:<message_id>", so a
redelivered update (webhook retry, or getUpdates after a crash) is the same id and is stored
once, and the Telegram message id stays known for replying to it in groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from channels.telegram.media import MediaRef, media_of
from core.agent.prompt import quote_note
from core.models import InboundMessage, MessageKind, Sender

__all__ = ["Identity", "Incoming", "ParseOptions", "Update", "message_id_of", "normalize", "quoted"]

CHANNEL = "telegram"
_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,32})(?:@([A-Za-z0-9_]{3,64}))?(?=\s|$)")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class User(_Model):
    id: int
    is_bot: bool = False
    first_name: str = ""
    last_name: str | None = None
    username: str | None = None


class Chat(_Model):
    id: int
    type: str
    is_forum: bool = False

    @property
    def in_a_group(self) -> bool:
        return self.type in ("group", "supergroup")


class Entity(_Model):
    type: str
    offset: int
    length: int
    user: User | None = None
    url: str | None = None  # of a text_link: words that link somewhere


class Replied(_Model):
    message_id: int
    from_: User | None = Field(default=None, alias="from")
    forum_topic_created: dict[str, object] | None = None
    text: str | None = None
    caption: str | None = None


class Origin(_Model):
    """Where a forwarded message first came from (forward_origin)."""

    type: str
    sender_user: User | None = None
    sender_user_name: str | None = None
    sender_chat: dict[str, object] | None = None
    chat: dict[str, object] | None = None

    @property
    def name(self) -> str:
        if self.sender_user is not None:
            return _sender(self.sender_user).name or "someone"
        chat = self.sender_chat or self.chat or {}
        title = chat.get("title")
        return self.sender_user_name or (title if isinstance(title, str) else "") or "someone"


class Message(_Model):
    message_id: int
    chat: Chat
    from_: User | None = Field(default=None, alias="from")
    message_thread_id: int | None = None
    is_topic_message: bool = False
    text: str | None = None
    caption: str | None = None
    # default_factory: a plain [] default is deep-copied on every validation
    entities: list[Entity] = Field(default_factory=list)
    caption_entities: list[Entity] = Field(default_factory=list)
    reply_to_message: Replied | None = None
    forward_origin: Origin | None = None
    photo: list[dict[str, object]] = Field(default_factory=list)
    voice: dict[str, object] | None = None
    audio: dict[str, object] | None = None
    video: dict[str, object] | None = None
    video_note: dict[str, object] | None = None
    document: dict[str, object] | None = None
    sticker: dict[str, object] | None = None
    location: dict[str, object] | None = None
    venue: dict[str, object] | None = None
    contact: dict[str, object] | None = None
    # content with nothing to download, described to the model in words
    poll: dict[str, Any] | None = None
    dice: dict[str, Any] | None = None
    checklist: dict[str, Any] | None = None
    game: dict[str, Any] | None = None
    story: dict[str, Any] | None = None
    reply_markup: dict[str, object] | None = None
    media_group_id: str | None = None  # the photos of one album, each its own update


class Callback(_Model):
    id: str
    from_: User = Field(alias="from")
    message: Message | None = None
    data: str | None = None


class Update(_Model):
    update_id: int
    message: Message | None = None
    edited_message: Message | None = None
    callback_query: Callback | None = None

    @property
    def typed(self) -> Message | None:
        """The message, or the edit of one."""
        return self.message or self.edited_message

    @property
    def chat_id(self) -> int | None:
        """The chat it is about (of the pressed button's message, for a press)."""
        cb = self.callback_query
        msg = self.typed or (cb.message if cb is not None else None)
        return msg.chat.id if msg is not None else None

    @property
    def in_a_group(self) -> bool:
        """A message or an edit in a group or supergroup."""
        msg = self.typed
        return msg is not None and msg.chat.in_a_group


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the bot is: its id (from the token) and, once known, its @username."""

    bot_id: str
    username: str | None = None


@dataclass(frozen=True, slots=True)
class ParseOptions:
    group_mode: str = "mention"  # or "all"
    edited_messages: str = "ignore"  # or "new"


@dataclass(slots=True)
class Incoming:
    """A message to store, and the files to fetch for it first."""

    message: InboundMessage
    media: list[MediaRef] = field(default_factory=list)


def message_id_of(platform_id: str) -> int | None:
    """The Telegram message id inside a platform_id made by `normalize`."""
    _, _, mid = platform_id.partition(":")
    return int(mid) if mid.isdigit() else None


def quoted(msg: InboundMessage) -> int | None:
    """The message a group answer to `msg` quotes: `msg` itself, unless it is a button press,
    which nobody typed. The live preview and the final reply both go by this, so the preview
    can become the reply."""
    return None if msg.kind is MessageKind.BUTTON else message_id_of(msg.platform_id)


def normalize(
    update: Update, me: Identity, opts: ParseOptions, *, addressed: bool = False
) -> Incoming | None:
    """The update as a message for the agent, or None when it is not for the bot. `addressed`:
    known to be for the bot whatever its text says (the rest of an album whose caption, on its
    first photo only, mentioned the bot)."""
    if update.callback_query is not None:
        return _button(update.update_id, update.callback_query, me)
    msg, kind = update.message, MessageKind.MESSAGE
    if msg is None and update.edited_message is not None and opts.edited_messages == "new":
        msg, kind = update.edited_message, MessageKind.EDIT
    if msg is None or msg.from_ is None or str(msg.from_.id) == me.bot_id:
        return None
    text = msg.text if msg.text is not None else (msg.caption or "")
    entities = msg.entities if msg.text is not None else msg.caption_entities
    text = _with_links(text, entities)
    command, target = None, None
    if kind is MessageKind.MESSAGE and (m := _COMMAND.match(text)):
        command, target = m.group(1).lower(), m.group(2)
        if target is not None and _ours(target, me):
            text = text[: m.end(1)] + text[m.end() :]  # "/help@bot x" → "/help x"
    group = msg.chat.in_a_group
    if (
        group
        and opts.group_mode == "mention"
        and not addressed
        and not _addressed(msg, text, entities, me, target)
    ):
        return None
    if command is not None and not _ours(target, me):
        return None
    if group and me.username:
        text = re.sub(rf"^@{re.escape(me.username)}\b[,:]?\s*", "", text, flags=re.IGNORECASE)
    # most updates are text: only the media fields the update has are read
    media = media_of({name: getattr(msg, name) for name in _MEDIA_FIELDS & msg.model_fields_set})
    replied = msg.reply_to_message
    content = _content(msg)
    if not text and not media and not content:
        return None
    inbound = InboundMessage(
        channel=CHANNEL,
        account=me.bot_id,
        conversation=str(msg.chat.id),
        thread=_thread(msg),
        sender=_sender(msg.from_),
        text=text,
        platform_id=f"{update.update_id}:{msg.message_id}",
        kind=MessageKind.COMMAND if command is not None else kind,
        command=command,
        reply_to=str(replied.message_id) if replied and _real_reply(msg) else None,
        shared=group,
        notes=(*content, *_notes(msg, me)),
        part_of=msg.media_group_id,  # an album: its photos come as separate updates
    )
    return Incoming(inbound, media)


_MEDIA_FIELDS = frozenset(
    "photo voice audio video video_note document sticker location venue contact".split()
)


def _button(update_id: int, cb: Callback, me: Identity) -> Incoming | None:
    msg = cb.message
    if msg is None or cb.data is None:  # inline-mode or game buttons: nothing to answer
        return None
    label = None
    for row in _rows(msg.reply_markup):
        for button in row:
            if isinstance(button, dict) and button.get("callback_data") == cb.data:
                label = str(button.get("text", "")) or None
    inbound = InboundMessage(
        channel=CHANNEL,
        account=me.bot_id,
        conversation=str(msg.chat.id),
        thread=_thread(msg),
        sender=_sender(cb.from_),
        text=label or cb.data,
        platform_id=f"{update_id}:{msg.message_id}",
        kind=MessageKind.BUTTON,
        button_value=cb.data,
        reply_to=str(msg.message_id),  # the message the buttons are on
        shared=msg.chat.in_a_group,
    )
    return Incoming(inbound)


def _rows(markup: dict[str, object] | None) -> list[list[object]]:
    rows = (markup or {}).get("inline_keyboard")
    return [r for r in rows if isinstance(r, list)] if isinstance(rows, list) else []


def _thread(msg: Message) -> str | None:
    """A topic: of a forum supergroup, or of a private chat (Bot API 9.3). In other groups
    message_thread_id names a reply thread, which is no conversation of its own."""
    topics = msg.chat.is_forum or msg.chat.type == "private"
    if topics and msg.is_topic_message and msg.message_thread_id is not None:
        return str(msg.message_thread_id)
    return None


# the stand-ins Telegram sends as `from` for a group's anonymous admins and for channel posts
ANONYMOUS_SENDERS = frozenset({1087968824, 136817688})  # GroupAnonymousBot, Channel_Bot


def _sender(user: User) -> Sender:
    name = " ".join(p for p in (user.first_name, user.last_name) if p) or user.username
    return Sender(id=str(user.id), name=name, anonymous=user.id in ANONYMOUS_SENDERS)


def _content(msg: Message) -> tuple[str, ...]:
    """Polls, dice, checklists, games and stories, in words: in a private chat every message
    is answered, and these used to be dropped without a word."""
    if msg.poll is not None:
        options = [str(o.get("text", "")) for o in _dicts(msg.poll.get("options"))]
        return (f"a poll: {msg.poll.get('question', '')} (options: {' / '.join(options)})",)
    if msg.dice is not None:
        return (f"threw a {msg.dice.get('emoji', '🎲')} and got {msg.dice.get('value', '?')}",)
    if msg.checklist is not None:
        tasks = [str(t.get("text", "")) for t in _dicts(msg.checklist.get("tasks"))]
        return (f"a checklist: {msg.checklist.get('title', '')}: {' / '.join(tasks)}",)
    if msg.game is not None:
        return (f"a game: {msg.game.get('title', '')}",)
    if msg.story is not None:
        return ("shared a story (it cannot be opened here)",)
    return ()


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _notes(msg: Message, me: Identity) -> tuple[str, ...]:
    """What the model should know beyond the text: where a forward came from, what a reply
    answers (the words it refers to, "this one", are in the message replied to)."""
    notes = []
    if msg.forward_origin is not None:
        notes.append(f"forwarded from {msg.forward_origin.name}")
    replied = msg.reply_to_message
    if replied is not None and _real_reply(msg):
        author = replied.from_
        whose = (
            "your message"
            if author is not None and str(author.id) == me.bot_id
            else f"a message of {_sender(author).name or 'someone'}"
            if author is not None
            else "a message"
        )
        notes.append(quote_note(whose, replied.text or replied.caption or ""))
    return tuple(notes)


def _with_links(text: str, entities: list[Entity]) -> str:
    """The text with each text_link's address after its words ("see this (https://…)"): the
    model reads plain text, and the address is what the person meant it to follow. Offsets
    count UTF-16 units."""
    # a link on the first word is left alone: a /command or @mention there is read (and cut)
    # from the text as it came
    links = sorted(
        (e for e in entities if e.type == "text_link" and e.url and e.offset > 0),
        key=lambda e: e.offset,
    )
    if not links:
        return text
    units = text.encode("utf-16-le")
    out, at = [], 0
    for e in links:
        end = (e.offset + e.length) * 2
        if e.offset < at or end > len(units):
            continue  # inside the one before, or out of range: leave it
        out.append(units[at * 2 : end].decode("utf-16-le", "replace"))
        out.append(f" ({e.url})")
        at = e.offset + e.length
    out.append(units[at * 2 :].decode("utf-16-le", "replace"))
    return "".join(out)


def _real_reply(msg: Message) -> bool:
    """In forum topics every message "replies" to the topic's creation; that is no reply."""
    r = msg.reply_to_message
    return r is not None and r.forum_topic_created is None


def _ours(target: str | None, me: Identity) -> bool:
    """Whether a /command@target is for us (unknown username: we cannot tell, so yes)."""
    return target is None or me.username is None or target.lower() == me.username.lower()


def _addressed(
    msg: Message, text: str, entities: list[Entity], me: Identity, command_target: str | None
) -> bool:
    """In a group: a /command (to us or to no bot in particular), a reply to one of our
    messages, or a mention of us."""
    if _COMMAND.match(text) and _ours(command_target, me):
        return True
    r = msg.reply_to_message
    if _real_reply(msg) and r is not None and r.from_ is not None and str(r.from_.id) == me.bot_id:
        return True
    source = msg.text if msg.text is not None else (msg.caption or "")
    units = source.encode("utf-16-le")
    for e in entities:
        if e.type == "text_mention" and e.user is not None and str(e.user.id) == me.bot_id:
            return True
        if e.type == "mention" and me.username:
            word = units[2 * e.offset : 2 * (e.offset + e.length)].decode("utf-16-le", "replace")
            if word.lower() == f"@{me.username.lower()}":
                return True
    return False
