"""mrkdwn cut into Block Kit messages under Slack's limits, each section valid on its own.

A cut inside a paragraph closes what is open there and reopens it in the next section, as the
Telegram and WhatsApp chunkers do: the code block (same fence, same indent in a list item),
the `*`/`_`/`~` styles and inline code, and a quote's `>` on the continued line. Styles are
read off the mrkdwn the way Slack pairs them (an opener before text, not after a letter; a
closer after text), so a lone `*` in the text stays text. A code fence is read only where it
starts a line, as `format.to_mrkdwn` writes it. A cut never falls inside a link (Slack would
show the markup) nor, when it has to fall inside a word, inside a grapheme cluster.

Limits (reference/channels.md §3.3): section text ≤ 3000, ≤ 50 blocks a message, an actions
block ≤ 25 elements, button text ≤ 75 and value ≤ 2000. Slack has refused block sets well
under the 50 x 3000 ceiling (`msg_blocks_too_long`, unconfirmed), so a message also stays under
MESSAGE_CHARS; longer replies become several messages, sent in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from channels.slack.format import escape
from channels.text import cluster_cut

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
_FENCE_LINE = re.compile(r" *```[\w+#.-]*")  # an opening fence, indented in a list item
_QUOTE = re.compile(r"(?:>(?: |$))*")
_TOKEN = re.compile(r"`[^`\n]+`|<[^<>\n]*>|[*_~]")  # inline code, a link, a style marker
_LINK = re.compile(r"<([^<>|\n]*)(?:\|([^<>\n]*))?>")  # its address, and its label if any
_ENTITY = re.compile(r"&[a-z]{0,4}$")
_WHOLE_ENTITY = re.compile(r"&[a-z]{2,4};")

_Mark = tuple[int, str, bool]  # where in the line, the marker, whether it opens


@dataclass(frozen=True)
class SlackMessage:
    """One chat.postMessage worth: the notification `text` and the blocks."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def sections(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Section texts of at most `limit` chars, each one valid mrkdwn on its own: paragraphs
    kept whole where they fit, and at a cut inside one the code block and the styles open
    there are closed and reopened in the next section, and a quote's `>` goes on with it."""
    out: list[str] = []
    current = ""
    for paragraph in _paragraphs(text):
        first, *rest = _pack(_rows(paragraph, limit), limit)
        joined = f"{current}\n\n{first}" if current else first
        if current and len(joined) > limit:
            out.append(current)
            joined = first
        if not rest:
            current = joined
            continue
        out.append(joined)
        out.extend(rest[:-1])
        current = rest[-1]
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
    return escape(" · ".join(labels))  # plain text in a button, mrkdwn here: `<!channel>` pinged


def _button(index: int, label: str, value: str) -> dict[str, Any]:
    text = label.strip() or value.strip() or "…"
    if len(text) > BUTTON_TEXT:  # cut between grapheme clusters: a flag stays whole
        text = text[: cluster_cut(text, 0, BUTTON_TEXT - 1)].rstrip() + "…"
    return {
        "type": "button",
        "action_id": f"sb_{index}",
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "value": value[:BUTTON_VALUE],
    }


@dataclass
class _Code:
    """A fenced code block: its opening fence (indented in a list item), lines and closing fence."""

    opener: str
    lines: list[str] = field(default_factory=list)
    closer: str = ""


def _paragraphs(text: str) -> list[list[list[str] | _Code]]:
    """The text split at blank lines outside code: per paragraph, its runs of text lines and
    its code blocks, in order."""
    paragraphs: list[list[list[str] | _Code]] = [[]]
    code: _Code | None = None
    for line in text.split("\n"):
        para = paragraphs[-1]
        if code is not None:
            if line.strip() == _FENCE:
                code.closer, code = line, None
            else:
                code.lines.append(line)
        elif _FENCE_LINE.fullmatch(line):
            code = _Code(line)
            para.append(code)
        elif not line.strip():
            if para:
                paragraphs.append([])
        elif para and isinstance(para[-1], list):
            para[-1].append(line)
        else:
            para.append([line])
    return [para for para in paragraphs if para]


@dataclass(frozen=True, slots=True)
class _Row:
    """A line, or a part of a cut one: `text` where it goes on from the row before; where it
    starts a section `head` goes in at `at` (the code block's opening fence, the quote's `>`,
    the styles open); `tail` closes what is still open after it where a section ends."""

    text: str
    head: str = ""
    at: int = 0
    tail: str = ""
    alone: bool = False  # the rest of a cut line: it always starts a section

    def opening(self) -> str:
        return self.text[: self.at] + self.head + self.text[self.at :]


def _pack(rows: list[_Row], limit: int) -> list[str]:
    """Rows, one a line, in as few parts of at most `limit` chars as fit, each closed."""
    parts: list[str] = []
    current, tail = "", ""
    for row in rows:
        fits = len(current) + 1 + len(row.text) + len(row.tail) <= limit
        if current and not row.alone and fits:
            current = f"{current}\n{row.text}"
        else:
            if current:
                parts.append(current + tail)
            current = row.opening()
        tail = row.tail
    if current:
        parts.append(current + tail)
    return parts


def _rows(paragraph: list[list[str] | _Code], limit: int) -> list[_Row]:
    rows: list[_Row] = []
    for item in paragraph:
        rows.extend(_code_rows(item, limit) if isinstance(item, _Code) else _text_rows(item, limit))
    return rows


def _code_rows(code: _Code, limit: int) -> list[_Row]:
    """Each code line a row that reopens the block (same fence, same indent) in a new section
    and closes it at the end of one; a line too long for a section is cut."""
    pad = code.opener[: len(code.opener) - len(code.opener.lstrip(" "))]
    head, tail = f"{code.opener}\n", f"\n{code.closer or pad + _FENCE}"
    room = max(limit - len(head) - len(tail) - len(pad), 1)
    rows: list[_Row] = []
    for line in code.lines:
        indent = pad if line.startswith(pad) else ""
        body = line[len(indent) :]
        parts = [body] if len(body) <= room else _cut(body, room)
        rows.extend(_Row(indent + part, head, 0, tail, alone=n > 0) for n, part in enumerate(parts))
    if not rows:
        return [_Row(head + tail[1:])]
    rows[0] = _Row(head + rows[0].text, "", 0, tail, rows[0].alone)
    last = rows[-1]
    rows[-1] = _Row(last.text + tail, last.head, 0, "", last.alone)
    return rows


def _text_rows(lines: list[str], limit: int) -> list[_Row]:
    rows: list[_Row] = []
    stack: list[str] = []
    lines, marks = _fit_links(lines, limit)
    for line, line_marks in zip(lines, marks, strict=True):
        rows.extend(_line_rows(line, line_marks, stack, limit))
    return rows


def _fit_links(lines: list[str], limit: int) -> tuple[list[str], list[list[_Mark]]]:
    """The lines, with their style markers, once every link is short enough to start a row
    of its own, so that no cut falls inside one. A longer link could never be sent whole (a
    section holds `limit`), so it is shown as its label and its site, and the styles are
    read again."""
    while True:
        marks = _marks(lines)
        fitted: list[str] = []
        opened = 0
        for line, line_marks in zip(lines, marks, strict=True):
            fitted.append(_fit_line(line, _room(line, line_marks, opened, limit)))
            opened += sum(1 if opens else -1 for *_, opens in line_marks)
        if fitted == lines:
            return lines, marks
        lines = fitted


def _fit_line(line: str, room: int) -> str:
    return _LINK.sub(lambda link: _unlinked(link) if len(link[0]) > room else link[0], line)


def _unlinked(link: re.Match[str]) -> str:
    """A link too long for a section as plain text: its label (already escaped, its
    markers defused by `format`) and the site it points to, never a cut address."""
    try:
        site = urlsplit(link[1]).hostname or ""
    except ValueError:  # an address urlsplit cannot read, such as a bad IPv6 host
        site = ""
    site = "".join(ch for ch in site if ch.isalnum() or ch in ".-")
    note = f"link to {site} too long for Slack" if site else "link too long for Slack"
    label = (link[2] or "").strip()
    return f"{label} ({note})" if label else f"({note})"


def _marks(lines: list[str]) -> list[list[_Mark]]:
    """Per line, the style markers that pair up the way Slack reads them (an opener before
    text and not after a letter, a closer after text), and inline code as a pair of
    backticks; any other `*`, `_` or `~` is plain text, and so is anything inside a link."""
    found: list[list[_Mark]] = [[] for _ in lines]
    stack: list[tuple[int, int, str]] = []  # unclosed openers: line, index, marker
    for n, line in enumerate(lines):
        body = len(_quote(line))
        for match in _TOKEN.finditer(line, body):
            token, i = match.group(), match.start()
            if token[0] == "`":
                found[n] += [(i, "`", True), (match.end() - 1, "`", False)]
                continue
            if token[0] == "<":
                continue
            before = line[i - 1] if i > body else " "
            after = line[i + 1 : i + 2] or " "
            closes = before != token and not before.isspace() and not after.isalnum()
            if closes and token in (m for *_, m in stack):
                while stack[-1][2] != token:
                    stack.pop()  # an opener never closed is text
                opened_line, opened_at, _ = stack.pop()
                found[opened_line].append((opened_at, token, True))
                found[n].append((i, token, False))
            elif not after.isspace() and not before.isalnum():
                stack.append((n, i, token))
    for marks in found:
        marks.sort()
    return found


def _line_rows(line: str, marks: list[_Mark], stack: list[str], limit: int) -> list[_Row]:
    """A text line as rows within `limit`, cut at spaces where it is too long. `stack` holds
    the styles open at its start and is left holding those open at its end."""
    quote = _quote(line)
    lead = len(line) - len(line[len(quote) :].lstrip(" "))
    room = _room(line, marks, len(stack), limit)
    rows: list[_Row] = []
    start, k = len(quote), 0
    while True:
        end = len(line) if len(line) - start <= room else _cut_point(line, start, room, marks)
        opened = "".join(stack)
        while k < len(marks) and marks[k][0] < end:
            _, mark, opens = marks[k]
            if opens:
                stack.append(mark)
            else:
                stack.pop()
            k += 1
        closed = "".join(reversed(stack))
        text = line[start:end].rstrip() if end < len(line) else line[start:end]
        if rows:
            rows.append(_Row(quote + text, opened, len(quote), closed, alone=True))
        else:
            rows.append(_Row(quote + text, opened, lead, closed))
        start = end
        while start < len(line) and line[start].isspace():
            start += 1
        if start == len(line):
            return rows


def _room(line: str, marks: list[_Mark], opened: int, limit: int) -> int:
    """The most a row of `line` may hold: the limit less its quote marks and the markers
    of the styles (`opened` of them open at its start) that a cut closes and reopens."""
    depth = level = opened
    for _, _, opens in marks:
        level += 1 if opens else -1
        depth = max(depth, level)
    return max(limit - len(_quote(line)) - 2 * depth, 1)


def _quote(line: str) -> str:
    """The quote marks a line starts with ("> ", "> > ", or ">" alone)."""
    match = _QUOTE.match(line)
    return match.group() if match else ""


def _cut(line: str, limit: int) -> list[str]:
    """A code line in parts of at most `limit` chars, every space kept."""
    parts: list[str] = []
    while len(line) > limit:
        at = _cut_point(line, 0, limit)
        parts.append(line[:at])
        line = line[at:]
    parts.append(line)
    return parts


def _cut_point(line: str, start: int, room: int, marks: list[_Mark] | None = None) -> int:
    """Where to cut `line[start:]` to keep at most `room` chars: at a space outside links in
    the second half, else before a link that starts mid-line, else never inside an
    `&amp;`-style entity nor a grapheme cluster (markup first: a cluster can begin with a
    link's `>` or an entity's `;`); never just after a style opens or just before one closes.
    A link at `start` fits in `room` (`_fit_links` sees to it)."""
    end = start + room
    for at in range(end, start + room // 2, -1):
        if line[at] == " " and line.rfind("<", start, at) <= line.rfind(">", start, at):
            return at
    at = end
    opened = line.rfind("<", start, end)
    entity = _ENTITY.search(line, start, end)
    if opened > line.rfind(">", start, end) and opened > start:
        at = opened  # keep a link whole when it starts mid-line
    elif entity and entity.start() > start:
        at = entity.start()
    else:
        at = _outside_markup(line, start, cluster_cut(line, start, end), end)
    opening = {i for i, _, opens in marks or () if opens}
    closing = {i for i, _, opens in marks or () if not opens}
    while at - 1 > start and at - 1 in opening:
        at -= 1
    while at in closing:
        at += 1  # the closer stands in for the one the cut would add
    return at


def _outside_markup(line: str, start: int, at: int, end: int) -> int:
    """`at`, a cut between grapheme clusters, moved out of the link or entity it falls in
    (as when `&gt;` and a combining accent make one cluster): back to where that starts, or
    when it starts the row, on past its end, cutting the cluster instead."""
    opened = line.rfind("<", start, at)
    if opened > line.rfind(">", start, at):
        closed = line.find(">", at)
        if opened > start:
            return opened
        return closed + 1 if 0 <= closed < end else at
    entity = _ENTITY.search(line, start, at)
    if entity is None:
        return at
    if entity.start() > start:
        return entity.start()
    whole = _WHOLE_ENTITY.match(line, entity.start())
    return whole.end() if whole and whole.end() <= end else at
