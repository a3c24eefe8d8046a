"""Webhook notifications → normalized messages, notices to send, and delivery reports.

Small pydantic models read only the fields we use. A bad envelope is BadInput (HTTP 400); one bad
message or status inside a good envelope is skipped with a log line, so the rest still counts.
A session is the customer (`wa_id`, or the business-scoped user id when there is none) on one
business number: `account` = phone_number_id, `conversation` = the customer.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from channels.base import BadInput
from core.models import Attachment, InboundMessage, MessageKind, Sender

__all__ = [
    "CHANNEL",
    "Event",
    "Incoming",
    "MediaRef",
    "StatusReport",
    "Unsupported",
    "parse",
    "parse_json",
]

log = logging.getLogger(__name__)

CHANNEL = "whatsapp"
MEDIA_TYPES = ("image", "audio", "video", "document", "sticker")
WABA = "whatsapp_business_account"  # the object of every notification we read
FLOW_TEXT_MAX = 4000  # characters of a form's answers the agent is shown
IGNORED_TYPES = ("revoke", "system")  # a deleted message, a number change: nothing to answer
_COMMAND = re.compile(r"/([A-Za-z][A-Za-z0-9_]{0,31})(?:\s|$)")


class _M(BaseModel):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


_T = TypeVar("_T", bound=_M)
_Fields = dict[str, Any]  # what every message has, before its type adds the rest


# `Any` where an inner part is read later on its own: pydantic passes it through as is instead
# of copying it, and one bad message or status then costs only itself
class _Change(_M):
    field: str = ""
    value: Any = None


class _Entry(_M):
    changes: list[_Change] = Field(default_factory=list)


class _Envelope(_M):
    object: str = ""
    entry: list[_Entry] = Field(default_factory=list)


class _Metadata(_M):
    phone_number_id: str = Field(min_length=1)


class _Profile(_M):
    name: str | None = None


class _Contact(_M):
    wa_id: str | None = None
    user_id: str | None = None
    profile: _Profile = _Profile()


class _Value(_M):
    metadata: _Metadata
    contacts: list[Any] = Field(default_factory=list)
    messages: list[Any] = Field(default_factory=list)
    statuses: list[Any] = Field(default_factory=list)


class _Context(_M):
    id: str | None = None
    forwarded: bool = False
    frequently_forwarded: bool = False


class _Referral(_M):
    """A click-to-WhatsApp ad or post the person came from."""

    headline: str | None = None
    body: str | None = None
    source_type: str | None = None
    source_url: str | None = None


class _Text(_M):
    body: str = ""


class _Media(_M):
    id: str = Field(min_length=1)
    mime_type: str | None = None
    caption: str | None = None
    filename: str | None = None
    voice: bool = False


class _Location(_M):
    latitude: float
    longitude: float
    name: str | None = None
    address: str | None = None
    url: str | None = None


class _Name(_M):
    formatted_name: str | None = None


class _Phone(_M):
    phone: str | None = None
    wa_id: str | None = None


class _Card(_M):
    name: _Name = _Name()
    phones: list[_Phone] = Field(default_factory=list)


class _Choice(_M):
    id: str = Field(min_length=1)
    title: str = ""


class _Flow(_M):
    name: str | None = None
    body: str | None = None
    response_json: str | None = None


class _Interactive(_M):
    type: str = ""
    button_reply: _Choice | None = None
    list_reply: _Choice | None = None
    nfm_reply: _Flow | None = None  # the answers to a WhatsApp Flow (a form)


class _OrderItem(_M):
    product_retailer_id: str = ""
    quantity: str | None = None
    item_price: str | None = None
    currency: str | None = None


class _Order(_M):
    catalog_id: str | None = None
    text: str | None = None
    product_items: list[_OrderItem] = Field(default_factory=list)


class _Button(_M):
    payload: str | None = None
    text: str = ""


class _Reaction(_M):
    message_id: str | None = None
    emoji: str | None = None


class _Edit(_M):
    original_message_id: str | None = None
    message: dict[str, Any] = Field(default_factory=dict)


class _Message(_M):
    id: str = Field(min_length=1)
    type: str = ""
    sender: str | None = Field(default=None, alias="from")
    from_user_id: str | None = None
    timestamp: str | None = None
    context: _Context | None = None
    referral: _Referral | None = None
    group_id: str | None = None
    text: _Text | None = None
    image: _Media | None = None
    audio: _Media | None = None
    video: _Media | None = None
    document: _Media | None = None
    sticker: _Media | None = None
    location: _Location | None = None
    contacts: list[_Card] | None = None
    interactive: _Interactive | None = None
    button: _Button | None = None
    reaction: _Reaction | None = None
    edit: _Edit | None = None
    order: _Order | None = None


class _StatusError(_M):
    code: int | None = None
    title: str | None = None


class _Status(_M):
    id: str = Field(min_length=1)
    status: str = Field(min_length=1)
    errors: list[_StatusError] = Field(default_factory=list)


# the same notification read whole, in one pass from its bytes: how nearly every one is read
class _WholeValue(_M):
    metadata: _Metadata
    contacts: list[_Contact] = Field(default_factory=list)
    messages: list[_Message] = Field(default_factory=list)
    statuses: list[_Status] = Field(default_factory=list)


class _WholeChange(_M):
    field: str = ""
    value: _WholeValue


class _WholeEntry(_M):
    changes: list[_WholeChange] = Field(default_factory=list)


class _WholeEnvelope(_M):
    object: str = ""
    entry: list[_WholeEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MediaRef:
    """A media id to fetch through the two-step media API."""

    id: str


@dataclass(frozen=True, slots=True)
class Incoming:
    """A message to store; `media` (if any) still has to be downloaded into its attachment."""

    message: InboundMessage
    media: MediaRef | None = None


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A message we cannot read: the customer gets a notice; `message` names the session."""

    message: InboundMessage
    what: str


@dataclass(frozen=True, slots=True)
class StatusReport:
    id: str
    status: str
    error: str | None = None


Event = Incoming | Unsupported | StatusReport


def parse_json(raw: bytes, numbers: frozenset[str], now: float) -> list[Event]:
    """`parse` of the notification's bytes. A well-formed one (nearly all) is validated whole
    in one pass, without building the dicts we would not read; anything else, a bad message
    in it or a change of another kind, is read part by part as `parse` does, so one bad part
    still costs only itself. Not JSON: ValueError."""
    try:  # strict: anything parse would coerce (a number for a string) goes part by part
        envelope = _WholeEnvelope.model_validate_json(raw, strict=True)
    except ValidationError:
        return parse(json.loads(raw), numbers, now)
    if envelope.object != WABA:
        return _not_ours(envelope.object)
    events: list[Event] = []
    for entry in envelope.entry:
        for change in entry.changes:
            value = change.value
            number = value.metadata.phone_number_id
            if change.field == "messages" and _serves(number, numbers):
                events.extend(_events(number, value.contacts, value.messages, value.statuses, now))
    return events


def parse(data: Any, numbers: frozenset[str], now: float) -> list[Event]:
    """Every message and status of every entry and change, for our business numbers only."""
    try:
        envelope = _Envelope.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise BadInput(f"{where}: {err['msg']}") from None
    if envelope.object != WABA:
        return _not_ours(envelope.object)
    events: list[Event] = []
    for entry in envelope.entry:
        for change in entry.changes:
            if change.field == "messages":
                events.extend(_change(change.value, numbers, now))
    return events


def _not_ours(obj: str) -> list[Event]:
    log.info("ignoring a notification for object %r", obj)
    return []


def _change(raw: Any, numbers: frozenset[str], now: float) -> list[Event]:
    try:
        value = _Value.model_validate(raw)
    except ValidationError:
        log.warning("skipping a change without metadata", extra={"channel": CHANNEL})
        return []
    number = value.metadata.phone_number_id
    if not _serves(number, numbers):
        return []
    return _events(
        number,
        [c for c in (_valid(_Contact, item) for item in value.contacts) if c is not None],
        [m for m in (_valid(_Message, item) for item in value.messages) if m is not None],
        [t for t in (_valid(_Status, item) for item in value.statuses) if t is not None],
        now,
    )


def _serves(number: str, numbers: frozenset[str]) -> bool:
    if number in numbers:
        return True
    log.info("ignoring a notification for number %s we do not serve", number)
    return False


def _events(
    number: str,
    contacts: list[_Contact],
    messages: list[_Message],
    statuses: list[_Status],
    now: float,
) -> list[Event]:
    """The events of one change for one of our numbers."""
    names: dict[str, str] = {}
    users: list[str] = []
    for contact in contacts:
        for uid in (contact.wa_id, contact.user_id):
            if uid:
                users.append(uid)
                if contact.profile.name:
                    names[uid] = contact.profile.name
    events: list[Event] = []
    for msg in messages:
        event = _message(msg, number, names, users[0] if users else None, now)
        if event is not None:
            events.append(event)
    for status in statuses:
        err = status.errors[0] if status.errors else None
        detail = f"{err.code}: {err.title or 'error'}" if err else None
        events.append(StatusReport(status.id, status.status, detail))
    return events


def _valid(model: type[_T], item: Any) -> _T | None:
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        log.warning("skipping a malformed %s: %s", model.__name__.strip("_").lower(), exc.title)
        return None


def _message(
    m: _Message, number: str, names: dict[str, str], fallback: str | None, now: float
) -> Event | None:
    user = m.sender or m.from_user_id or fallback
    if not user:
        log.warning("skipping message %s without a sender", m.id, extra={"channel": CHANNEL})
        return None
    if m.group_id:
        log.info("ignoring group message %s", m.id, extra={"channel": CHANNEL})
        return None
    received = now
    if m.timestamp and m.timestamp.isdigit():
        received = min(float(m.timestamp), now)  # the customer's clock, never in our future
    base: _Fields = {
        "channel": CHANNEL,
        "account": number,
        "conversation": user,
        "sender": Sender(id=user, name=names.get(user)),
        "platform_id": m.id,
        "reply_to": m.context.id if m.context else None,
        "quotes": "in reply to" if m.context and m.context.id else None,  # by id only
        "received_at": received,
        "notes": _notes(m),
    }
    return _content(m, base)


def _content(m: _Message, base: _Fields) -> Event | None:
    """The message body by type: text, media, location, contacts, choices, reaction, edit."""
    kind = m.type
    body = getattr(m, kind, None) if kind in MEDIA_TYPES else None
    if kind == "text" and m.text is not None:
        if not m.text.body.strip():
            return None  # nothing to read: no empty turn
        if command := _COMMAND.match(m.text.body.lstrip()):  # /reset, /help, /start
            name = command.group(1).lower()  # phones capitalize: /Reset
            return Incoming(_with(base, text=m.text.body, kind=MessageKind.COMMAND, command=name))
        return Incoming(_with(base, text=m.text.body))
    if isinstance(body, _Media):
        name = body.filename or f"{kind}{_extension(body.mime_type)}"
        note = "voice message" if body.voice else None
        att = Attachment(kind=kind, name=name, mime=body.mime_type, description=note)
        return Incoming(_with(base, text=body.caption or "", attachments=(att,)), MediaRef(body.id))
    if kind == "location" and m.location is not None:
        return Incoming(_location(base, m.location))
    if kind == "contacts" and m.contacts:
        return Incoming(_contacts(base, m.contacts))
    if kind == "interactive" and m.interactive is not None:
        choice = m.interactive.button_reply or m.interactive.list_reply
        if choice is not None:
            return Incoming(_choice(base, choice.id, choice.title))
        if (flow := m.interactive.nfm_reply) is not None:
            answers = (flow.response_json or flow.body or "").strip()[:FLOW_TEXT_MAX]
            return Incoming(_with(base, text=f"[filled in the form {flow.name or ''}: {answers}]"))
    if kind == "order" and m.order is not None:
        return Incoming(_with(base, text=_order_text(m.order)))
    if kind == "request_welcome":  # the person opened the chat for the first time: greet them
        return Incoming(_with(base, text="/start", kind=MessageKind.COMMAND, command="start"))
    if kind == "button" and m.button is not None:
        return Incoming(_choice(base, m.button.payload or m.button.text, m.button.text))
    if kind == "reaction" and m.reaction is not None:
        if not m.reaction.emoji or not m.reaction.message_id:
            return None  # a reaction removed
        text = f"[reacted with {m.reaction.emoji} to {m.reaction.message_id}]"
        return Incoming(_with(base, text=text, reply_to=m.reaction.message_id, quotes="reacted to"))
    if kind == "edit" and m.edit is not None:
        return _edit(m, base, m.edit)
    if kind in IGNORED_TYPES:
        return None
    return Unsupported(_with(base), kind or "unknown")


def _order_text(order: _Order) -> str:
    """A cart sent from the catalog, as the agent reads it: each item, then the note."""
    items = "; ".join(
        f"{i.quantity or '?'} x {i.product_retailer_id or '?'}"
        + (f" at {i.item_price} {i.currency or ''}".rstrip() if i.item_price else "")
        for i in order.product_items
    )
    text = f"[placed an order: {items or 'no items'}]"
    return f"{text}\n{order.text}" if order.text else text


def _notes(m: _Message) -> tuple[str, ...]:
    """What the model should know beyond the body: a forward, or the ad the person came from
    (its headline is what they are asking about)."""
    notes = []
    if m.context is not None and (m.context.forwarded or m.context.frequently_forwarded):
        notes.append("forwarded" + (" many times" if m.context.frequently_forwarded else ""))
    if (ad := m.referral) is not None:
        what = " — ".join(p for p in (ad.headline, ad.body) if p) or ad.source_url or ""
        kind = "ad" if ad.source_type == "ad" else "post"
        notes.append(f"came from the {kind}: {what}" if what else f"came from the {kind}")
    return tuple(notes)


def _with(base: _Fields, **changes: Any) -> InboundMessage:
    """The message: built once, from what every message has and what its type adds."""
    return InboundMessage(**{**base, **changes})


def _location(base: _Fields, loc: _Location) -> InboundMessage:
    where = ", ".join(p for p in (loc.name, loc.address) if p)
    coords = f"{loc.latitude}, {loc.longitude}"
    text = f"[location: {where} ({coords})]" if where else f"[location: {coords}]"
    att = Attachment(kind="location", name=loc.name, url=loc.url, description=coords)
    return _with(base, text=text, attachments=(att,))


def _contacts(base: _Fields, cards: list[_Card]) -> InboundMessage:
    lines, atts = [], []
    for card in cards:
        phones = [p.phone or p.wa_id or "" for p in card.phones]
        phones = [p for p in phones if p]
        name = card.name.formatted_name or "(no name)"
        lines.append(f"[contact: {', '.join([name, *phones])}]")
        atts.append(Attachment(kind="contact", name=name))
    return _with(base, text="\n".join(lines), attachments=tuple(atts))


def _choice(base: _Fields, value: str, title: str) -> InboundMessage:
    return _with(base, kind=MessageKind.BUTTON, button_value=value, text=title or value)


def _edit(m: _Message, base: _Fields, edit: _Edit) -> Event | None:
    inner = _valid(_Message, {**edit.message, "id": m.id})
    event = _content(inner, base) if inner is not None else None
    if isinstance(event, Incoming):
        edited = event.message.model_copy(
            update={
                "kind": MessageKind.EDIT,
                "reply_to": edit.original_message_id,
                "quotes": "the earlier version of",
            }
        )
        return Incoming(edited, event.media)
    return event


def _extension(mime: str | None) -> str:
    sub = (mime or "").split(";")[0].strip().rpartition("/")[2]
    return f".{sub}" if sub.isalnum() and len(sub) <= 8 else ""
