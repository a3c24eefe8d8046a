"""The agent's Markdown as Slack mrkdwn: `*b*`, `_i_`, `~s~`, `<url|text>`, & < > escaped.

Slack has no headings or list syntax in mrkdwn: headings become bold lines and lists keep
their markers as text. Only `&`, `<` and `>` are escaped (everywhere, code included); every
`<` in the output opens a link we wrote ourselves, so a model cannot produce `<!channel>`.

mrkdwn has no escape character either, so a `*`, `_` or `~` of the author's that Slack could
read as a style marker, and every backtick outside code, becomes a look-alike character (as
jsx-slack does); `snake_case` and `2 * 3` keep theirs. Slack reads our own markers only at
word boundaries (as `chunk._marks` does), so a style inside a word is shown unstyled.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import cast

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

from channels.text import MAX_NESTING, parse

__all__ = ["escape", "to_mrkdwn"]

_MD = MarkdownIt("commonmark", {"html": False, "maxNesting": MAX_NESTING}).enable(
    ["strikethrough", "table"]
)
_LINK_SCHEMES = ("http://", "https://", "mailto:")
_BULLETS = ("•", "◦", "▪")
_FENCE = "```"
_BROKEN_FENCE = "`\u200b`\u200b`"
_URL_UNSAFE = {"|": "%7C", "<": "%3C", ">": "%3E", " ": "%20", "&": "&amp;"}
_STYLES = {"strong": "*", "em": "_", "s": "~"}
# asterisk operator, modifier letter low macron, tilde operator, modifier letter grave accent
_LOOKALIKE = {"*": "\u2217", "_": "\u02cd", "~": "\u223c", "`": "\u02cb"}
_MARKER = re.compile(r"[*_~`]")
_BARE_URL = re.compile(r"(?:https?://|mailto:|www\.)\S+", re.IGNORECASE)  # Slack links these


def escape(text: str) -> str:
    """Slack's three control characters as entities (never the whole text); a run of three
    backticks is broken with zero-width spaces so only our own fences open code blocks."""
    text = _entities(text)
    return text.replace(_FENCE, _BROKEN_FENCE) if _FENCE in text else text


def to_mrkdwn(markdown: str) -> str:
    """Render Markdown as mrkdwn; blocks are separated by one blank line."""
    return _blocks(SyntaxTreeNode(parse(_MD, markdown)).children, depth=0).strip("\n")


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _text(text: str) -> str:
    """The author's text, escaped, with every marker Slack could read as formatting swapped
    for its look-alike. A backtick always is: Slack pairs any two on a line as code. An
    address Slack will link keeps its characters, or the link would lead elsewhere."""
    escaped = _entities(text)
    urls = [match.span() for match in _BARE_URL.finditer(escaped)]
    swapped: list[int] = []
    for match in _MARKER.finditer(escaped):
        at, mark = match.start(), match[0]
        if mark != "`" and any(start <= at < end for start, end in urls):
            continue
        # the char before as written (a look-alike can let a marker close); a run of
        # markers is swapped whole rather than half
        before = escaped[at - 1] if at else None
        if swapped and swapped[-1] == at - 1:
            before = _LOOKALIKE[escaped[at - 1]]
        after = escaped[at + 1] if at + 1 < len(escaped) else None
        if mark == "`" or before == _LOOKALIKE[mark] or _may_act(mark, before, after):
            swapped.append(at)
    if not swapped:
        return escaped
    chars = list(escaped)
    for at in swapped:
        chars[at] = _LOOKALIKE[chars[at]]
    return "".join(chars)


def _may_act(mark: str, before: str | None, after: str | None) -> bool:
    """Whether a marker could open or close a style the way Slack (and `chunk._marks`)
    reads them; an unknown neighbour (None, past the end of the text) may be anything."""
    opens = (after is None or not after.isspace()) and (before is None or not before.isalnum())
    closes = (before is None or (before != mark and not before.isspace())) and (
        after is None or not after.isalnum()
    )
    return opens or closes


def _code_span(content: str) -> str:
    """Inline code; a backtick in it would end the span, so it shows as a look-alike."""
    return f"`{_entities(content).replace('`', _LOOKALIKE['`'])}`" if content else ""


def _blocks(
    nodes: list[SyntaxTreeNode], depth: int, sep: str = "\n\n", quoted: bool = False
) -> str:
    return sep.join(text for node in nodes if (text := _block(node, depth, quoted)))


def _block(node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
    kind = node.type
    if kind == "paragraph":
        return _inline_of(node)
    if kind == "heading":
        return _styled(node, "*")
    if kind in ("fence", "code_block"):
        # inside a quote the lines stay quoted text, so every fence is a line of its own
        return _text(node.content.rstrip("\n")) if quoted else _code(node.content)
    if kind == "blockquote":
        inner = _blocks(node.children, depth, quoted=True)
        if not inner.strip():
            return ""
        # a quote marker works at the start of a line only; inside a list it is plain text
        mark = "&gt;" if depth else ">"
        return "\n".join(f"{mark} {line}" if line else mark for line in inner.split("\n"))
    if kind in ("bullet_list", "ordered_list"):
        return _list(node, depth, quoted)
    if kind == "hr":
        return "──────────"
    if kind == "table":
        return _table(node)
    return _blocks(node.children, depth, quoted=quoted)


def _code(content: str) -> str:
    body = content.rstrip("\n")
    if not body.strip():
        return ""
    return f"{_FENCE}\n{escape(body)}\n{_FENCE}"


def _list(node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
    ordered = node.type == "ordered_list"
    start = node.attrs.get("start", 1) if ordered else 1
    number = start if isinstance(start, int) else 1
    lines: list[str] = []
    for i, item in enumerate(node.children):
        marker = f"{number + i}." if ordered else _BULLETS[min(depth, len(_BULLETS) - 1)]
        body = _blocks(item.children, depth + 1, sep="\n", quoted=quoted)
        pad = " " * (len(marker) + 1)
        first, *rest = body.split("\n")
        if first.startswith(_FENCE):
            # a fence opens a code block only at the start of its line (and the chunker only
            # looks for one there), so it goes under the marker, indented like the item
            first, rest = "", [first, *rest]
        lines.append(f"{marker} {first}".rstrip())
        lines.extend(f"{pad}{line}" if line else "" for line in rest)
    return "\n".join(lines)


def _table(node: SyntaxTreeNode) -> str:
    rows: list[str] = []
    for section in node.children:
        for tr in section.children:
            if section.type == "thead":
                rows.append(_header_row(tr))
            else:
                rows.append(" | ".join(_inline_of(cell) for cell in tr.children))
    return "\n".join(rows)


def _header_row(tr: SyntaxTreeNode) -> str:
    """A header row, bold as a whole (a bold cell inside it adds nothing)."""
    style = _Style("*")
    pieces: list[_Piece] = [(style, True)]
    for n, cell in enumerate(tr.children):
        pieces += [" | "] if n else []
        pieces += _pieces(cell.children, frozenset({"*"}))
    pieces.append((style, False))
    return _settle(pieces)  # a blank row hides its markers: they have no text to hold


@dataclass(eq=False)
class _Style:
    """A styled span's marker, shown only where Slack reads it as one (its opener before
    text and not after a letter, its closer after text and not before a letter)."""

    mark: str
    shown: bool = True


_Piece = str | tuple[_Style, bool]  # text as written, or a style's opening/closing marker


def _inline_of(node: SyntaxTreeNode) -> str:
    return _settle(_pieces(node.children, frozenset()))


def _styled(node: SyntaxTreeNode, mark: str) -> str:
    """A block's inline content inside one style (a heading is a bold line)."""
    style = _Style(mark)
    inner = _pieces(node.children, frozenset({mark}))
    return _settle([(style, True), *inner, (style, False)]) if _visible(inner) else ""


def _pieces(nodes: list[SyntaxTreeNode], outer: frozenset[str]) -> list[_Piece]:
    """Inline nodes as pieces; `outer` holds the styles already open, never reopened."""
    out: list[_Piece] = []
    for node in nodes:
        out.extend(_node_pieces(node, outer))
    return out


def _node_pieces(node: SyntaxTreeNode, outer: frozenset[str]) -> list[_Piece]:
    kind = node.type
    if kind in ("softbreak", "hardbreak"):
        return ["\n"]
    if kind == "code_inline":
        return [_code_span(node.content)]
    if kind in ("link", "image"):
        return [_link(node)]
    mark = _STYLES.get(kind)
    if mark is not None:
        inner = _pieces(node.children, outer | {mark})
        if mark in outer or not _visible(inner):
            return inner
        style = _Style(mark)
        return [(style, True), *inner, (style, False)]
    if node.children:
        return _pieces(node.children, outer)
    return [_text(node.content)]


def _visible(pieces: list[_Piece]) -> bool:
    return any(isinstance(p, str) and p.strip() for p in pieces)


def _settle(pieces: list[_Piece]) -> str:
    """The pieces joined, without the markers of styles Slack would not read. Hiding a style
    puts what was on either side of its markers next to each other, so the markers there are
    looked at again: a worklist in text order over a linked list of what is shown, each
    marker looked at a few times (a pass over all of them until nothing changed hid one style
    per pass: `*a*_b_` glued 1,000 times took seconds on the event loop)."""
    live = [i for i, piece in enumerate(pieces) if _shown(piece)]
    left = dict(zip(live, [-1, *live], strict=False))
    right = dict(zip(live, [*live[1:], -1], strict=False))
    markers: dict[int, list[int]] = {}
    for i, piece in enumerate(pieces):
        if isinstance(piece, tuple):
            markers.setdefault(id(piece[0]), []).append(i)
    todo = [i for i in live if isinstance(pieces[i], tuple)]  # in order: already a heap
    queued = set(todo)

    def char(i: int, end: int) -> str:  # a space at either end, as at a line's
        return " " if i < 0 else _shown(pieces[i])[end]

    while todo:
        i = heapq.heappop(todo)
        queued.discard(i)
        style, opens = cast(tuple[_Style, bool], pieces[i])
        if not style.shown or _readable(style, opens, char(left[i], -1), char(right[i], 0)):
            continue
        style.shown = False
        for j in markers[id(style)]:
            before, after = left.pop(j), right.pop(j)
            if before >= 0:
                right[before] = after
            if after >= 0:
                left[after] = before
            for k in (before, after):
                if k >= 0 and isinstance(pieces[k], tuple) and k not in queued:
                    heapq.heappush(todo, k)
                    queued.add(k)
    return "".join(_shown(piece) for piece in pieces)


def _readable(style: _Style, opens: bool, before: str, after: str) -> bool:
    """Whether Slack reads this marker as one, between the characters shown around it."""
    if opens:
        return not after.isspace() and not before.isalnum()
    return before != style.mark and not before.isspace() and not after.isalnum()


def _shown(piece: _Piece) -> str:
    if isinstance(piece, str):
        return piece
    style, _ = piece
    return style.mark if style.shown else ""


def _plain(node: SyntaxTreeNode) -> str:
    """The visible text under a node, without formatting (link labels are plain in Slack)."""
    if node.type in ("softbreak", "hardbreak"):
        return " "
    if node.children:
        return "".join(_plain(c) for c in node.children)
    return node.content


def _link(node: SyntaxTreeNode) -> str:
    href = str(node.attrs.get("href" if node.type == "link" else "src", ""))
    label = _plain(node).strip()
    if not href.lower().startswith(_LINK_SCHEMES):
        text = _text(label)
        return f"{text} ({_text(href)})" if href and href != label else text or _text(href)
    url = "".join(_URL_UNSAFE.get(ch, ch) for ch in href)
    if not label or label == href:
        return f"<{url}>"
    return f"<{url}|{_text(label)}>"
