"""The normalized message model every channel parses into and renders from."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Attachment",
    "Button",
    "InboundMessage",
    "MessageKind",
    "OutboundPart",
    "Reply",
    "Sender",
    "SessionKey",
]


class MessageKind(StrEnum):
    MESSAGE = "message"
    BUTTON = "button"
    COMMAND = "command"
    EDIT = "edit"


class Sender(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str | None = None
    # written as the group or a channel (a Telegram anonymous admin): not one known person, so
    # nothing that person asked for can be bound to them (their button presses carry their
    # real id)
    anonymous: bool = False


class Attachment(BaseModel):
    """A file or structured item sent with a message (or to be sent with a reply)."""

    model_config = ConfigDict(frozen=True)

    kind: str  # image, audio, video, document, sticker, location, contact, other
    name: str | None = None
    mime: str | None = None
    size: int | None = None
    path: str | None = None  # where the gateway stored the bytes, if it downloaded them
    url: str | None = None
    description: str | None = None  # text stand-in for a model that cannot see it


class InboundMessage(BaseModel):
    """One message from a person, as every adapter normalizes it."""

    model_config = ConfigDict(frozen=True)

    channel: str
    account: str = "default"
    conversation: str
    thread: str | None = None
    sender: Sender
    text: str = ""
    attachments: tuple[Attachment, ...] = ()
    platform_id: str = Field(min_length=1)
    kind: MessageKind = MessageKind.MESSAGE
    command: str | None = None  # for kind=command: the name without the slash
    button_value: str | None = None  # for kind=button: the value of the pressed button
    reply_to: str | None = None  # platform id of the quoted message
    # how the message relates to `reply_to` ("in reply to", "reacted to") when the platform
    # names that message by id only: the turn reads its words from the store
    quotes: str | None = None
    # a conversation several people write in (a group chat, a channel's thread): the model is
    # told who wrote each message
    shared: bool = False
    # what the platform says of the message beyond its text, for the model ("in reply to: …",
    # "forwarded from …")
    notes: tuple[str, ...] = ()
    # one post the platform sends as several messages (a Telegram album): its turn waits a
    # moment for the rest, so it is answered once
    part_of: str | None = None
    received_at: float = Field(default_factory=time.time)


class Button(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    value: str


class Reply(BaseModel):
    """What the agent answers: Markdown text, quick-reply buttons, attachments."""

    model_config = ConfigDict(frozen=True)

    text: str = ""
    buttons: tuple[Button, ...] = ()
    attachments: tuple[Attachment, ...] = ()


class OutboundPart(BaseModel):
    """One stored reply part waiting in (or delivered from) the outbox."""

    model_config = ConfigDict(frozen=True)

    id: int
    session: str
    run_id: str | None
    seq: int
    reply: Reply
    attempts: int = 0
    not_before: float | None = None  # unix time: a retry_after (or backoff) a restart keeps


@dataclass(frozen=True, slots=True)
class SessionKey:
    """agent + channel + account + conversation [+ thread]: one isolated conversation.

    Adapters put the platform's conversation identity into `conversation` and `thread`
    (Telegram chat + topic, Slack channel + thread_ts, WhatsApp wa_id per phone number, the web
    chat's browser cookie); this class is the single place those become a key.
    """

    agent: str
    channel: str
    account: str
    conversation: str
    thread: str | None = None
    _text: str = field(init=False, repr=False, compare=False)  # str(key), made once

    def __post_init__(self) -> None:
        parts = [self.agent, self.channel, self.account, self.conversation]
        if self.thread is not None:
            parts.append(self.thread)
        text = ":".join(p if _UNRESERVED(p) else quote(p, safe="") for p in parts)
        object.__setattr__(self, "_text", text)

    @classmethod
    def for_message(cls, agent: str, msg: InboundMessage) -> SessionKey:
        return cls(agent, msg.channel, msg.account, msg.conversation, msg.thread)

    @classmethod
    def parse(cls, text: str) -> SessionKey:
        parts = [unquote(p) if "%" in p else p for p in text.split(":")]
        if len(parts) not in (4, 5):
            raise ValueError(f"not a session key: {text!r}")
        return cls(*parts)

    def __str__(self) -> str:
        return self._text


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch  # what quote(safe="") leaves as is
