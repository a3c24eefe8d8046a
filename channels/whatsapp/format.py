"""The agent's Markdown as WhatsApp text, in chunks that never break a code block or a style.

WhatsApp styles are `*bold*`, `_italic_`, `~strike~` and ```` ```monospace``` ````; there are no
headings (bold lines) or labelled links ("text (url)"). A style must hug its text and does not
span lines, so each line is rendered on its own, closing and reopening styles around whitespace.
Lengths are counted in UTF-16 code units, never fewer than characters, so a chunk is within the
limit however the platform counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = [
    "MAX_TEXT",
    "Span",
    "Unit",
    "chunk",
    "pack",
    "plain",
    "to_units",
    "truncate",
    "wlen",
]

MAX_TEXT = 4096
BOLD, ITALIC, STRIKE, MONO = "*", "_", "~", "```"
_MARK = {"strong": BOLD, "em": ITALIC, "s": STRIKE}
_WORD = re.compile(r"\S+\s*|\s+")
_MD = MarkdownIt("commonmark").enable(["strikethrough", "table"])
# a line markdown-it gives back as it is: it starts with a letter (so it opens no list, quote,
# heading, fence, table or indented code), ends without a space (no hard break), and holds no
# character an inline rule reads (styles, code, links, HTML, entities, escapes, tables)
_INLINE = r"\\`*_\[\]<>&~|#\x00"
_PLAIN_LINE = re.compile(rf"[^\W\d_](?:[^{_INLINE}\t\r\n]*[^{_INLINE}\s])?")


def wlen(text: str) -> int:
    """Length in UTF-16 code units (an emoji counts two)."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True, slots=True)
class Span:
    text: str
    marks: tuple[str, ...] = ()  # outermost first


@dataclass(slots=True)
class Unit:
    """One line of text (`spans`) or one code block (`code`), `gap` newlines after the previous."""

    gap: int
    prefix: str = ""
    spans: list[Span] = field(default_factory=list)
    code: str | None = None


def render_spans(spans: list[Span]) -> str:
    """Spans as one line, each style opened and closed next to non-space text."""
    out: list[str] = []
    stack: list[str] = []
    pending = ""
    for span in spans:
        core = span.text.strip()
        if not core:
            pending += span.text
            continue
        lead = span.text[: len(span.text) - len(span.text.lstrip())]
        marks = list(span.marks)
        keep = 0
        while keep < min(len(stack), len(marks)) and stack[keep] == marks[keep]:
            keep += 1
        out.extend(reversed(stack[keep:]))
        del stack[keep:]
        out.append(pending + lead)
        out.extend(marks[keep:])
        stack.extend(marks[keep:])
        out.append(core)
        pending = span.text[len(span.text.rstrip()) :]
    out.extend(reversed(stack))
    return "".join(out)


def render(unit: Unit) -> str:
    if unit.code is not None:
        return f"{unit.prefix}{MONO}{unit.code}{MONO}"
    return unit.prefix + render_spans(unit.spans)


class _Walker:
    """Turns markdown-it block tokens into Units, keeping list bullets and quote markers."""

    def __init__(self) -> None:
        self.units: list[Unit] = []
        self.stack: list[list[str]] = []  # per container: [first-line prefix, later prefix]
        self.list_start = False  # a top-level list begins: a blank line before it

    def prefix(self) -> str:
        out = []
        for frame in self.stack:
            out.append(frame[0])
            frame[0] = frame[1]
        return "".join(out)

    def emit(self, unit: Unit) -> None:
        self.units.append(unit)
        self.list_start = False

    def add_lines(self, lines: list[list[Span]], gap: int) -> None:
        for spans in lines:
            if any(s.text.strip() for s in spans):
                self.emit(Unit(gap, self.prefix(), spans))
                gap = 1

    def walk(self, tokens: list[Token]) -> list[Unit]:
        lists: list[list[int]] = []  # per open list: [next number] or [] for bullets
        i = 0
        while i < len(tokens):
            t = tokens[i]
            gap = 1 if (t.hidden and not self.list_start) or not self.units else 2
            if t.type in ("bullet_list_open", "ordered_list_open"):
                self.list_start = self.list_start or not lists
                lists.append([int(t.attrs.get("start", 1) or 1)] if t.tag == "ol" else [])
            elif t.type in ("bullet_list_close", "ordered_list_close"):
                lists.pop()
            elif t.type == "list_item_open":
                number = lists[-1] if lists else []
                bullet = f"{t.info or number[0]}. " if number else "- "
                if number:
                    number[0] += 1
                self.stack.append([bullet, " " * len(bullet)])
            elif t.type == "blockquote_open":
                self.stack.append(["> ", "> "])
            elif t.type in ("list_item_close", "blockquote_close"):
                self.stack.pop()
            elif t.type in ("paragraph_open", "heading_open"):
                base = (BOLD,) if t.type == "heading_open" else ()
                self.add_lines(inline_lines(tokens[i + 1].children or [], base), gap)
                i += 2
            elif t.type in ("fence", "code_block"):
                body = t.content.rstrip("\n")
                if body.strip():
                    self.emit(Unit(gap, self.prefix(), code=body))
            elif t.type == "hr":
                self.emit(Unit(gap, self.prefix(), [Span("———")]))
            elif t.type == "html_block":
                self.add_lines([[Span(line)] for line in t.content.rstrip("\n").split("\n")], gap)
            elif t.type == "tr_open":
                i = self._row(tokens, i)
            i += 1
        return self.units

    def _row(self, tokens: list[Token], i: int) -> int:
        """One table row as a line, cells separated by " | ", header cells bold."""
        gap = 2 if tokens[i - 1].type == "thead_open" and self.units else 1
        cells: list[Span] = []
        while tokens[i].type != "tr_close":
            t = tokens[i]
            if t.type == "inline":
                if cells:
                    cells.append(Span(" | "))
                header = tokens[i - 1].type == "th_open"
                for line in inline_lines(t.children or [], (BOLD,) if header else ()):
                    cells.extend(line)
            i += 1
        if any(c.text.strip() for c in cells):
            self.emit(Unit(gap, self.prefix(), cells))
        return i


def inline_lines(children: list[Token], base: tuple[str, ...]) -> list[list[Span]]:
    """Inline tokens as lines of styled spans (a line break starts a new line)."""
    lines: list[list[Span]] = [[]]
    marks = list(base)
    opened: list[str | None] = []
    link: tuple[str, list[str]] | None = None

    def add(text: str, extra: tuple[str, ...] = ()) -> None:
        lines[-1].append(Span(text, (*marks, *extra)))
        if link is not None:
            link[1].append(text)

    for t in children:
        kind, _, edge = t.type.rpartition("_")
        if t.type == "text" or t.type == "html_inline":
            add(t.content)
        elif t.type in ("softbreak", "hardbreak"):
            lines.append([])
        elif kind in _MARK and edge == "open":
            mark = _MARK[kind]
            opened.append(None if mark in marks else mark)
            if mark not in marks:
                marks.append(mark)
        elif kind in _MARK and edge == "close":
            mark_or_none = opened.pop() if opened else None
            if mark_or_none is not None:
                marks.remove(mark_or_none)
        elif t.type == "code_inline":
            add(t.content, (MONO,))
        elif t.type == "link_open":
            link = (str(t.attrs.get("href", "")), [])
        elif t.type == "link_close" and link is not None:
            href, shown = link[0], "".join(link[1]).strip()
            link = None
            if href and href not in (shown, f"mailto:{shown}"):
                lines[-1].append(Span(f" ({href})" if shown else href))
        elif t.type == "image":
            src = str(t.attrs.get("src", ""))
            add(f"{t.content} ({src})" if t.content else src)
    return lines


def to_units(markdown: str) -> list[Unit]:
    units = _plain_units(markdown)
    return units if units is not None else _Walker().walk(_MD.parse(markdown))


def _plain_units(text: str) -> list[Unit] | None:
    """What markdown-it would make of text with no Markdown in it, without parsing; None when
    any line might hold some (most short replies are plain sentences)."""
    units: list[Unit] = []
    gap = 1
    for line in text.split("\n"):
        if not line:
            gap = 2 if units else 1
        elif _PLAIN_LINE.fullmatch(line) is None:
            return None
        else:
            units.append(Unit(gap, "", [Span(line)]))
            gap = 1
    return units


def plain(markdown: str) -> str:
    """The text without styles, on one line (e.g. for a template parameter)."""
    words = []
    for unit in to_units(markdown):
        words.append(unit.code if unit.code is not None else "".join(s.text for s in unit.spans))
    return " ".join(" ".join(words).split())


def _cut(text: str, size: int) -> list[str]:
    """Hard cuts of at most `size` code units, never inside a surrogate pair."""
    out: list[str] = []
    cur: list[str] = []
    n = 0
    for ch in text:
        w = wlen(ch)
        if n + w > size and cur:
            out.append("".join(cur))
            cur, n = [], 0
        cur.append(ch)
        n += w
    if cur:
        out.append("".join(cur))
    return out


def truncate(text: str, limit: int) -> str:
    """`text` within `limit` code units, ending in "…" when it had to be cut."""
    if wlen(text) <= limit:
        return text
    return _cut(text, limit - 1)[0].rstrip() + "…"


def _split_line(unit: Unit, limit: int) -> list[str]:
    budget = limit - wlen(unit.prefix)
    groups: list[list[Span]] = [[]]
    used = 0
    for span in unit.spans:
        overhead = 2 * sum(wlen(m) for m in span.marks)
        for word in _WORD.findall(span.text):
            for piece in _cut(word, max(budget - overhead, 1)):
                cost = wlen(piece) + overhead
                if used + cost > budget and groups[-1]:
                    groups.append([])
                    used = 0
                groups[-1].append(Span(piece, span.marks))
                used += cost
    indent = " " * len(unit.prefix)
    return [(unit.prefix if i == 0 else indent) + render_spans(g) for i, g in enumerate(groups)]


def _split_code(unit: Unit, limit: int) -> list[str]:
    budget = limit - wlen(unit.prefix) - 2 * wlen(MONO)
    blocks: list[list[str]] = [[]]
    used = 0
    for line in (unit.code or "").split("\n"):
        for piece in _cut(line, budget) or [""]:
            cost = wlen(piece) + (1 if blocks[-1] else 0)
            if used + cost > budget and blocks[-1]:
                blocks.append([])
                used, cost = 0, wlen(piece)
            blocks[-1].append(piece)
            used += cost
    return [render(Unit(1, unit.prefix, code="\n".join(b))) for b in blocks]


def pack(units: list[Unit], limit: int = MAX_TEXT) -> list[str]:
    """Rendered units packed in order into as few chunks of at most `limit` as fit."""
    chunks: list[str] = []
    cur, cur_len = "", 0
    for unit in units:
        text = render(unit)
        pieces = [text]
        if wlen(text) > limit:
            pieces = _split_code(unit, limit) if unit.code is not None else _split_line(unit, limit)
        for n, piece in enumerate(pieces):
            sep = "\n" * (unit.gap if n == 0 else 1)
            size = wlen(piece)
            if cur and cur_len + len(sep) + size <= limit:
                cur, cur_len = cur + sep + piece, cur_len + len(sep) + size
            else:
                if cur:
                    chunks.append(cur)
                cur, cur_len = piece, size
    if cur:
        chunks.append(cur)
    return chunks


def chunk(markdown: str, limit: int = MAX_TEXT) -> list[str]:
    """Markdown as WhatsApp text chunks of at most `limit`, in order."""
    return pack(to_units(markdown), limit)
