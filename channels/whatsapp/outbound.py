"""A reply as the Graph API message payloads that carry it, in order (pure, no I/O).

Buttons become interactive reply buttons (≤ 3, titles ≤ 20, unique) or a list message (≤ 10
rows, titles ≤ 24); anything more or longer becomes a numbered text menu appended to the text,
which the adapter remembers so that a typed number or title counts as the choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from channels.whatsapp.format import (
    MAX_TEXT,
    Span,
    Unit,
    pack,
    plain,
    to_units,
    truncate,
    wlen,
)
from core.models import Button, Reply

__all__ = [
    "Menu",
    "Plan",
    "match_menu",
    "menu_from_json",
    "menu_to_json",
    "plan_reply",
    "recipient",
    "template",
]

MAX_BUTTONS, MAX_BUTTON_TITLE, MAX_BUTTON_ID, MAX_BUTTON_BODY = 3, 20, 256, 1024
MAX_ROWS, MAX_ROW_TITLE, MAX_ROW_ID = 10, 24, 200
MAX_PARAM = 1024
MEDIA_KINDS = ("image", "audio", "video", "document", "sticker")
Menu = list[tuple[str, str]]  # (label, value), numbered from 1


@dataclass(frozen=True, slots=True)
class Plan:
    payloads: list[dict[str, Any]]
    menu: Menu | None = None  # a text menu was appended: remember it for the next message
    skipped: list[str] = field(default_factory=list)  # attachments that cannot be sent


def recipient(user: str) -> dict[str, str]:
    """Who to send to: a phone-number wa_id as `to`, a business-scoped user id as `recipient`."""
    if user.isdigit():
        return {"recipient_type": "individual", "to": user}
    return {"recipient_type": "individual", "recipient": user}


def _style(buttons: tuple[Button, ...], interactive: bool) -> str:
    labels = [b.label for b in buttons]
    values = [b.value for b in buttons]
    unique = len({x.casefold() for x in labels}) == len(labels) and len(set(values)) == len(values)
    if interactive and unique and all(values):
        if len(buttons) <= MAX_BUTTONS and all(
            wlen(b.label) <= MAX_BUTTON_TITLE and wlen(b.value) <= MAX_BUTTON_ID for b in buttons
        ):
            return "button"
        if len(buttons) <= MAX_ROWS and all(
            wlen(b.label) <= MAX_ROW_TITLE and wlen(b.value) <= MAX_ROW_ID for b in buttons
        ):
            return "list"
    return "menu"


def plan_reply(
    reply: Reply, *, interactive: bool, prompt: str, list_button: str, to: dict[str, str]
) -> Plan:
    """The messages of one reply: text chunks, then its buttons, then linked media."""
    units = to_units(reply.text)
    style = _style(reply.buttons, interactive) if reply.buttons else None
    menu: Menu | None = None
    if style == "menu":
        menu = [(b.label, b.value) for b in reply.buttons]
        units.append(Unit(2 if units else 1, "", [Span(prompt)]))
        units.extend(Unit(1, "", [Span(f"{n}. {label}")]) for n, (label, _) in enumerate(menu, 1))
    chunks = pack(units, MAX_TEXT)
    tail: dict[str, Any] | None = None
    if style == "button":
        body = chunks.pop() if chunks and wlen(chunks[-1]) <= MAX_BUTTON_BODY else prompt
        rows = [
            {"type": "reply", "reply": {"id": b.value, "title": b.label}} for b in reply.buttons
        ]
        tail = {"type": "button", "body": {"text": body}, "action": {"buttons": rows}}
    elif style == "list":
        body = chunks.pop() if chunks else prompt
        items = [{"id": b.value, "title": b.label} for b in reply.buttons]
        action = {"button": list_button, "sections": [{"rows": items}]}
        tail = {"type": "list", "body": {"text": body}, "action": action}
    payloads: list[dict[str, Any]] = [
        {**to, "type": "text", "text": {"preview_url": False, "body": c}} for c in chunks
    ]
    if tail is not None:
        payloads.append({**to, "type": "interactive", "interactive": tail})
    skipped = []
    for att in reply.attachments:
        if att.url is None:
            skipped.append(att.name or att.kind)
            continue
        kind = att.kind if att.kind in MEDIA_KINDS else "document"
        media: dict[str, Any] = {"link": att.url}
        if kind == "document" and att.name:
            media["filename"] = att.name
        payloads.append({**to, "type": kind, kind: media})
    return Plan(payloads, menu, skipped)


def template(
    reply: Reply, *, name: str, language: str, params: list[str], fallback: str
) -> dict[str, Any]:
    """The approved template message that stands in for a reply outside the 24-hour window.
    "{reply}" in a parameter becomes the reply as one plain line (parameters allow no newlines)."""
    text = plain(reply.text) or fallback
    values = []
    for p in params:
        value = truncate(" ".join(p.replace("{reply}", text).split()), MAX_PARAM)
        values.append(value or fallback)
    body: dict[str, Any] = {"name": name, "language": {"code": language}}
    if values:
        body["components"] = [
            {"type": "body", "parameters": [{"type": "text", "text": v} for v in values]}
        ]
    return {"type": "template", "template": body}


def match_menu(text: str, menu: Menu) -> tuple[str, str] | None:
    """The (label, value) a typed number ("2", "2.") or exact title chooses, if any."""
    typed = text.strip().rstrip(".)").strip()
    if typed.isdigit() and 1 <= int(typed) <= len(menu):
        return menu[int(typed) - 1]
    for label, value in menu:
        if label.casefold().strip() == text.strip().casefold():
            return label, value
    return None


def menu_to_json(menu: Menu) -> str:
    return json.dumps([[label, value] for label, value in menu], ensure_ascii=False)


def menu_from_json(text: str | None) -> Menu:
    try:
        data = json.loads(text) if text else []
        return [(str(label), str(value)) for label, value in data]
    except (ValueError, TypeError):
        return []
