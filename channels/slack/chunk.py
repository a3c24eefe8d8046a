"""mrkdwn cut into Block Kit messages under Slack's limits, code blocks closed and reopened.

Limits (reference/channels.md §3.3): section text ≤ 3000, ≤ 50 blocks a message, an actions
block ≤ 25 elements, button text ≤ 75 and value ≤ 2000. Slack has refused block sets well
under the 50 x 3000 ceiling (`msg_blocks_too_long`, unconfirmed), so a message also stays under
MESSAGE_CHARS; longer replies become several messages, sent in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUTTON_TEXT",
    "BUTTON_VALUE",
    "SECTION_LIMIT",
    "SlackMessage",
    "messages",
    "sections",
]

SECTION_LIMIT = 3000
MAX_BLOCKS = 50
MESSAGE_CHARS = 12_000
ACTIONS_LIMIT = 25
BUTTON_TEXT = 75
BUTTON_VALUE = 2000
_FENCE = "```"
_ENTITY = re.compile(r"&[a-z]{0,4}$")


@dataclass(frozen=True)
class SlackMessage:
    """One chat.postMessage worth: the notification `text` and the blocks."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def sections(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Section texts of at most `limit` chars; paragraphs kept whole where they fit, and a
    code block cut in two is closed at the end of one section and reopened in the next."""
    out: list[str] = []
    current = ""
    for piece in _pieces(text, limit):
        joined = f"{current}\n\n{piece}" if current else piece
        if len(joined) <= limit:
            current = joined
            continue
        out.append(current)
        current = piece
    if current:
        out.append(current)
    return out


def messages(texts: list[str], buttons: list[tuple[str, str]]) -> list[SlackMessage]:
    """Sections grouped into messages (≤ 50 blocks, ≤ MESSAGE_CHARS), buttons at the end."""
    groups: list[list[dict[str, Any]]] = []
    blocks: list[dict[str, Any]] = []
    size = 0
    for text in texts:
        if blocks and (len(blocks) >= MAX_BLOCKS or size + len(text) > MESSAGE_CHARS):
            groups.append(blocks)
            blocks, size = [], 0
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
        size += len(text)
    for start in range(0, len(buttons), ACTIONS_LIMIT):
        if len(blocks) >= MAX_BLOCKS:
            groups.append(blocks)
            blocks = []
        elements = [_button(i, *b) for i, b in enumerate(buttons[start : start + ACTIONS_LIMIT])]
        blocks.append({"type": "actions", "elements": elements})
    if blocks:
        groups.append(blocks)
    return [SlackMessage(_fallback(group), group) for group in groups]


def _fallback(blocks: list[dict[str, Any]]) -> str:
    """The notification text: the first section, or the button labels."""
    for block in blocks:
        if block["type"] == "section":
            return str(block["text"]["text"])
    labels = [e["text"]["text"] for b in blocks for e in b.get("elements", ())]
    return " · ".join(labels)


def _button(index: int, label: str, value: str) -> dict[str, Any]:
    text = label.strip() or value.strip() or "…"
    if len(text) > BUTTON_TEXT:
        text = text[: BUTTON_TEXT - 1] + "…"
    return {
        "type": "button",
        "action_id": f"sb_{index}",
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "value": value[:BUTTON_VALUE],
    }


def _pieces(text: str, limit: int) -> list[str]:
    """Paragraphs and code blocks, each cut to fit `limit` on its own."""
    pieces: list[str] = []
    para: list[str] = []
    code: list[str] | None = None
    for line in text.split("\n"):
        if code is not None:
            if line == _FENCE:
                pieces.extend(_code_pieces(code, limit))
                code = None
            else:
                code.append(line)
        elif line == _FENCE:
            pieces.extend(_text_pieces(para, limit))
            para, code = [], []
        elif line.strip():
            para.append(line)
        else:
            pieces.extend(_text_pieces(para, limit))
            para = []
    if code is not None:
        pieces.extend(_code_pieces(code, limit))
    pieces.extend(_text_pieces(para, limit))
    return pieces


def _text_pieces(lines: list[str], limit: int) -> list[str]:
    out: list[str] = []
    current = ""
    for line in lines:
        for part in _cut(line, limit):
            joined = f"{current}\n{part}" if current else part
            if len(joined) > limit:
                out.append(current)
                joined = part
            current = joined
    if current:
        out.append(current)
    return out


def _code_pieces(lines: list[str], limit: int) -> list[str]:
    room = limit - 2 * (len(_FENCE) + 1)
    out: list[list[str]] = []
    current: list[str] = []
    size = 0
    for line in lines:
        for part in _cut(line, room, strip=False):
            if current and size + 1 + len(part) > room:
                out.append(current)
                current, size = [], 0
            size += len(part) + (1 if current else 0)
            current.append(part)
    if current:
        out.append(current)
    return [f"{_FENCE}\n" + "\n".join(body) + f"\n{_FENCE}" for body in out if "".join(body)]


def _cut(line: str, limit: int, *, strip: bool = True) -> list[str]:
    """A line in parts of at most `limit` chars, cut at a space outside links where possible,
    never inside an `&amp;`-style entity; code (strip=False) keeps every space."""
    parts: list[str] = []
    while len(line) > limit:
        at = _cut_point(line, limit)
        head, line = line[:at], line[at:]
        parts.append(head.rstrip() if strip else head)
        line = line.lstrip() if strip else line
    parts.append(line)
    return parts


def _cut_point(line: str, limit: int) -> int:
    head = line[: limit + 1]
    for at in range(len(head) - 1, limit // 2, -1):
        if head[at] == " " and head.rfind("<", 0, at) <= head.rfind(">", 0, at):
            return at
    at = limit
    opened = line.rfind("<", 0, at)
    if opened > line.rfind(">", 0, at) and opened > 0:
        return opened  # keep a link whole when it starts mid-line
    entity = _ENTITY.search(line, 0, at)
    return entity.start() if entity and entity.start() > 0 else at
