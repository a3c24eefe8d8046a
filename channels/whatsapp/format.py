"""The agent's Markdown as WhatsApp text, in chunks that never break a code block or a style.

WhatsApp styles are `*bold*`, `_italic_`, `~strike~` and ```` ```monospace``` ````; there are no
headings (bold lines) or labelled links ("text (url)"). A style must hug its text and does not
span lines, so each line is rendered on its own, closing and reopening styles around whitespace.
Lengths are counted in UTF-16 code units, never fewer than characters, so a chunk is within the
limit however the platform counts.

What is text must stay text: a marker character the reply shows literally (an escaped `\\*`, a
backtick in code) is kept from pairing with zero-width spaces, and a style WhatsApp cannot show
inside a word (`**API**s`) is dropped rather than shown as stray markers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from channels.text import MAX_NESTING, clusters, parse, shared_styles

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
ZWSP = "\u200b"
_MARK = {"strong": BOLD, "em": ITALIC, "s": STRIKE}
_WORD = re.compile(r"\S+\s*|\s+")
_MD = MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable(["strikethrough", "table"])
# a line markdown-it gives back as it is: it starts with a letter (so it opens no list, quote,
# heading, fence, table or indented code), ends without a space (no hard break), and holds no
# character an inline rule reads (styles, code, links, HTML, entities, escapes, tables)
_INLINE = r"\\`*_\[\]<>&~|#\x00"
_PLAIN_LINE = re.compile(rf"[^\W\d_](?:[^{_INLINE}\t\r\n]*[^{_INLINE}\s])?")
_TICK_RUN = re.compile(r"`{2,}")
_MARKERS = "*_~`"
_MARKER_CHARS = frozenset(_MARKERS)
_NON_SPACE = re.compile(r"\S+")
_DEFUSED = re.compile(f"({ZWSP}[{_MARKERS}]{ZWSP})")  # what `_inert` makes of a marker


def wlen(text: str) -> int:
    """Length in UTF-16 code units (an emoji counts two)."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True, slots=True)
class Span:
    text: str
    marks: tuple[str, ...] = ()  # outermost first


@dataclass(slots=True)
class Unit:
    """One line of text (`spans`) or one code block (`code`), `gap` newlines after the previous.
    `prefix` (quote markers, a list bullet) begins it; `later` begins each further line it
    takes, so a long quote stays quoted ("> ") and a list item indented."""

    gap: int
    prefix: str = ""
    spans: list[Span] = field(default_factory=list)
    code: str | None = None
    later: str = ""


def render_spans(spans: list[Span]) -> str:
    """Spans (as `_shown` makes them) as one line, each style opened and closed next to
    non-space text."""
    out: list[str] = []
    stack: list[str] = []
    pending = ""

    def close(marks: list[str]) -> None:
        if MONO in marks:  # the innermost: the text before it is the code's end
            out[-1] = _pad_end(out[-1])
        out.extend(reversed(marks))

    for span in spans:
        core = span.text.strip()
        if not core:
            pending += span.text
            continue
        lead = span.text[: len(span.text) - len(span.text.lstrip())]
        marks = list(span.marks)
        keep = shared_styles(stack, marks)
        close(stack[keep:])
        del stack[keep:]
        out.append(pending + lead)
        out.extend(marks[keep:])
        stack.extend(marks[keep:])
        out.append(_pad_start(core) if MONO in marks[keep:] else core)
        pending = span.text[len(span.text.rstrip()) :]
    close(stack)
    return "".join(out)


def _shown(spans: list[Span]) -> list[Span]:
    """Spans as WhatsApp must get them: a style that would open or close inside a word
    dropped (it would show as markers), code's backtick runs broken, and marker characters
    in text made inert."""
    # markdown-it leaves an empty text where it took stars for a style (`***e***`): the span
    # beyond it, not the empty one, is what a marker touches
    spans = [s for s in spans if s.text]
    kept = _kept_marks(spans)
    line = "".join(s.text for s in spans)
    links = [] if _MARKER_CHARS.isdisjoint(line) else _links(line)
    out: list[Span] = []
    start = first_link = 0
    for i, span in enumerate(spans):
        end = start + len(span.text)
        if MONO in kept[i]:
            text = _break_ticks(span.text)
        else:
            # a neighbour in a span styled otherwise is across our marker, and the text touches
            # that marker: given as "" (a line's end), `\*` after **$9.99** was left to pair
            before = line[start - 1 : start]
            if i and kept[i - 1] != kept[i]:
                before = _between(kept[i - 1], kept[i])[-1]
            after = line[end : end + 1]
            if i + 1 < len(spans) and kept[i + 1] != kept[i]:
                after = _between(kept[i], kept[i + 1])[0]
            while first_link < len(links) and links[first_link][1] <= start:
                first_link += 1  # links are in order: one ended here ends before every later span
            inside = []
            for a, b in links[first_link:]:
                if a >= end:
                    break
                inside.append((a - start, b - start))
            text = _inert(span.text, before, after, inside)
        out.append(Span(text, kept[i]))
        start = end
    return out


def _between(left: tuple[str, ...], right: tuple[str, ...]) -> str:
    """The markers `render_spans` writes between a span styled `left` and the next, styled
    `right`: the styles only `left` has closed, innermost first, then those `right` opens."""
    keep = shared_styles(left, right)
    return "".join(reversed(left[keep:])) + "".join(right[keep:])


def _kept_marks(spans: list[Span]) -> list[tuple[str, ...]]:
    """Each span's marks less those of a run (the spans in a row styled with one mark) that
    touches a letter or digit outside it, where WhatsApp would not read the marker as a
    style. Each run is read once, so a line of many spans costs no more than its length."""
    dropped: list[set[str]] = [set() for _ in spans]
    for mark in {m for s in spans for m in s.marks}:
        first = 0
        while first < len(spans):
            if mark not in spans[first].marks:
                first += 1
                continue
            last = first
            while last + 1 < len(spans) and mark in spans[last + 1].marks:
                last += 1
            if _inside_word(spans, first, last):
                for i in range(first, last + 1):
                    dropped[i].add(mark)
            first = last + 1
    return [tuple(m for m in s.marks if m not in dropped[i]) for i, s in enumerate(spans)]


def _inside_word(spans: list[Span], first: int, last: int) -> bool:
    """Whether spans[first:last + 1] touch a letter or digit outside them at a side where
    their text does not begin or end with a space."""
    text = "".join(s.text for s in spans[first : last + 1])
    before = spans[first - 1].text[-1:] if first else ""
    after = spans[last + 1].text[:1] if last + 1 < len(spans) else ""
    return (before.isalnum() and not text[:1].isspace()) or (
        after.isalnum() and not text[-1:].isspace()
    )


def _links(line: str) -> list[tuple[int, int]]:
    """Where the words of a line that are links (a URL, an address) begin and end: without
    markers wrapped around them ("*bob@x.com*") or a fence after them ("https://x.io/```"),
    which would pair with others and style the text; a marker ending a URL ("?q=*") is its."""
    spans = []
    for m in _NON_SPACE.finditer(line):
        word = m[0]
        core = word.lstrip(_MARKERS)
        start = m.start() + len(word) - len(core)
        tail = len(core) - len(core.rstrip(_MARKERS))
        if tail and (len(core) < len(word) or "`" in core[-tail:]):
            core = core[:-tail]
        if "://" in core or "@" in core or core.lower().startswith("www."):
            spans.append((start, start + len(core)))
    return spans


def _inert(text: str, before: str, after: str, links: list[tuple[int, int]]) -> str:
    """Text whose `*`, `_`, `~` and backticks cannot open or close a style: each one at a word
    edge gets a zero-width space on both sides. Left as they are: one inside a word or
    between spaces (it pairs with nothing) and links (a zero-width space would break them).
    `before` and `after` are the characters around text ("" for an edge); `links` are in
    order."""
    if _MARKER_CHARS.isdisjoint(text):
        return text
    out = []
    link = 0
    for i, ch in enumerate(text):
        if ch in _MARKER_CHARS:
            while link < len(links) and links[link][1] <= i:
                link += 1
            if link < len(links) and links[link][0] <= i:
                out.append(ch)  # in a link
                continue
            prev = text[i - 1] if i else before
            next_ = text[i + 1] if i + 1 < len(text) else after
            if not (prev.isalnum() and next_.isalnum()) and (prev.strip() or next_.strip()):
                ch = f"{ZWSP}{ch}{ZWSP}"
        out.append(ch)
    return "".join(out)


def _break_ticks(code: str) -> str:
    """Code with a zero-width space inside every run of backticks, so none closes ```."""
    return _TICK_RUN.sub(lambda m: ZWSP.join(m[0]), code) if "``" in code else code


def _pad_start(code: str) -> str:
    return ZWSP + code if code.startswith("`") else code


def _pad_end(code: str) -> str:
    return code + ZWSP if code.endswith("`") else code


def _mono(code: str) -> str:
    """Code (its backticks already broken) in ```monospace```: a backtick at either end is
    kept from lengthening the fence."""
    return f"{MONO}{_pad_end(_pad_start(code))}{MONO}"


def render(unit: Unit) -> str:
    if unit.code is None:
        return unit.prefix + render_spans(_shown(unit.spans))
    if not unit.prefix:
        return _mono(_break_ticks(unit.code))
    return "\n".join(_code_rows(unit, None))


def _code_rows(unit: Unit, limit: int | None) -> list[str]:
    """Code after a quote or list prefix: each line its own monospace after the prefix, since
    a quote marker works only at the start of a line; a row longer than `limit` is cut."""
    rows: list[str] = []
    prefix = unit.prefix
    budget = None
    if limit is not None:
        budget = max(limit - max(wlen(unit.prefix), wlen(unit.later)) - 2 * wlen(MONO) - 2, 1)
    for line in (unit.code or "").split("\n"):
        code = _break_ticks(line)
        if not code.strip():
            if rows:  # a blank line first would leave its bullet alone on a line
                rows.append(unit.later.rstrip())
            continue
        rows.extend(
            (prefix if i == 0 else unit.later) + _mono(piece)
            for i, piece in enumerate([code] if budget is None else _cut(code, budget))
        )
        prefix = unit.later
    return rows


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

    def later(self) -> str:
        """The prefix of a unit's further lines (quote markers stay, a bullet is indented)."""
        return "".join(frame[1] for frame in self.stack)

    def emit(self, unit: Unit) -> None:
        self.units.append(unit)
        self.list_start = False

    def add_lines(self, lines: list[list[Span]], gap: int) -> None:
        for spans in lines:
            if any(s.text.strip() for s in spans):
                self.emit(Unit(gap, self.prefix(), spans, later=self.later()))
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
                    self.emit(Unit(gap, self.prefix(), code=body, later=self.later()))
            elif t.type == "hr":
                self.emit(Unit(gap, self.prefix(), [Span("———")], later=self.later()))
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
            self.emit(Unit(gap, self.prefix(), cells, later=self.later()))
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
            # markdown-it spells an address in punycode and %-escapes: <https://café.fr/ä>
            # is shown once, not beside https://xn--caf-dma.fr/%C3%A4
            typed = (href, _MD.normalizeLinkText(href))
            if href and shown not in typed and href != f"mailto:{shown}":
                lines[-1].append(Span(f" ({href})" if shown else href))
        elif t.type == "image":
            src = str(t.attrs.get("src", ""))
            add(f"{t.content} ({src})" if t.content else src)
    return lines


def to_units(markdown: str) -> list[Unit]:
    units = _plain_units(markdown)
    return units if units is not None else _Walker().walk(parse(_MD, markdown))


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
    """Hard cuts of at most `size` code units, between grapheme clusters (a flag, an accented
    letter or a family emoji stays whole) unless one cluster alone is longer."""
    if wlen(text) <= size:
        return [text]
    out: list[str] = []
    cur: list[str] = []
    n = 0
    for cluster in _clusters(text):
        w = wlen(cluster)
        if w > size:  # what came before it goes first
            if cur:
                out.append("".join(cur))
                cur, n = [], 0
            out.extend(_cut_chars(cluster, size))
            continue
        if n + w > size and cur:
            out.append("".join(cur))
            cur, n = [], 0
        cur.append(cluster)
        n += w
    if cur:
        out.append("".join(cur))
    return out


def _cut_chars(text: str, size: int) -> list[str]:
    """Cuts between code points (never inside a surrogate pair)."""
    out: list[str] = [""]
    for ch in text:
        if wlen(out[-1] + ch) > size and out[-1]:
            out.append("")
        out[-1] += ch
    return out


def _clusters(text: str) -> list[str]:
    """Grapheme clusters (`channels.text`), so no cut parts a marker from what defuses it: a
    marker with a zero-width space on both sides is one, and any other zero-width space this
    module adds is kept with the character before it. Kept only with the one before, a cut
    left "*" after "\u200b" and the next piece began "**" with our bold."""
    out: list[str] = []
    for part in _DEFUSED.split(text):
        if _DEFUSED.fullmatch(part):
            out.append(part)
            continue
        for cluster in clusters(part):
            if cluster == ZWSP and out:
                out[-1] += cluster
            else:
                out.append(cluster)
    return out


def truncate(text: str, limit: int) -> str:
    """`text` within `limit` code units, ending in "…" when it had to be cut."""
    if wlen(text) <= limit:
        return text
    return _cut(text, limit - 1)[0].rstrip() + "…"


def _split_line(unit: Unit, limit: int) -> list[str]:
    budget = limit - max(wlen(unit.prefix), wlen(unit.later))
    groups: list[list[Span]] = [[]]
    used = 0
    for span in _shown(unit.spans):
        overhead = 2 * sum(wlen(m) for m in span.marks) + (2 if MONO in span.marks else 0)
        for word in _WORD.findall(span.text):
            for piece in _cut(word, max(budget - overhead, 1)):
                cost = wlen(piece) + overhead
                if used + cost > budget and groups[-1]:
                    if not piece.strip():  # the cut stands for the space
                        continue
                    groups.append([])
                    used = 0
                groups[-1].append(Span(piece, span.marks))
                used += cost
    return [(unit.prefix if i == 0 else unit.later) + render_spans(g) for i, g in enumerate(groups)]


def _split_code(unit: Unit, limit: int) -> list[str]:
    if unit.prefix:
        return _code_rows(unit, limit)
    budget = limit - 2 * wlen(MONO) - 2
    blocks: list[list[str]] = [[]]
    used = 0
    for line in _break_ticks(unit.code or "").split("\n"):
        for piece in _cut(line, budget) or [""]:
            cost = wlen(piece) + (1 if blocks[-1] else 0)
            if used + cost > budget and blocks[-1]:
                blocks.append([])
                used, cost = 0, wlen(piece)
            blocks[-1].append(piece)
            used += cost
    return [_mono("\n".join(b)) for b in blocks if "".join(b).strip()]


def pack(units: list[Unit], limit: int = MAX_TEXT) -> list[str]:
    """Rendered units packed in order into as few chunks of at most `limit` as fit; a line of
    only whitespace never begins a chunk (a message must show something)."""
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
            elif piece.strip():
                if cur:
                    chunks.append(cur)
                cur, cur_len = piece, size
    if cur:
        chunks.append(cur)
    return chunks


def chunk(markdown: str, limit: int = MAX_TEXT) -> list[str]:
    """Markdown as WhatsApp text chunks of at most `limit`, in order."""
    return pack(to_units(markdown), limit)
