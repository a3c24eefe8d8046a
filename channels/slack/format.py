"""The agent's Markdown as Slack mrkdwn: `*b*`, `_i_`, `~s~`, `<url|text>`, & < > escaped.

Slack has no headings or list syntax in mrkdwn: headings become bold lines and lists keep
their markers as text. Only `&`, `<` and `>` are escaped (everywhere, code included); every
`<` in the output opens a link we wrote ourselves, so a model cannot produce `<!channel>`.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

__all__ = ["escape", "to_mrkdwn"]

_MD = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
_LINK_SCHEMES = ("http://", "https://", "mailto:")
_BULLETS = ("•", "◦", "▪")
_FENCE = "```"
_BROKEN_FENCE = "`\u200b`\u200b`"
_URL_UNSAFE = {"|": "%7C", "<": "%3C", ">": "%3E", " ": "%20", "&": "&amp;"}


def escape(text: str) -> str:
    """Slack's three control characters as entities (never the whole text); a run of three
    backticks is broken with zero-width spaces so only our own fences open code blocks."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace(_FENCE, _BROKEN_FENCE) if _FENCE in text else text


def to_mrkdwn(markdown: str) -> str:
    """Render Markdown as mrkdwn; blocks are separated by one blank line."""
    return _blocks(SyntaxTreeNode(_MD.parse(markdown)).children, depth=0).strip("\n")


def _blocks(
    nodes: list[SyntaxTreeNode], depth: int, sep: str = "\n\n", quoted: bool = False
) -> str:
    return sep.join(text for node in nodes if (text := _block(node, depth, quoted)))


def _block(node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
    kind = node.type
    if kind == "paragraph":
        return _inline_of(node)
    if kind == "heading":
        text = _inline_of(node, bold=True)
        return f"*{text}*" if text.strip() else ""
    if kind in ("fence", "code_block"):
        # inside a quote the lines stay quoted text, so every fence is a line of its own
        return escape(node.content.rstrip("\n")) if quoted else _code(node.content)
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
        lines.append(f"{marker} {first}".rstrip())
        lines.extend(f"{pad}{line}" if line else "" for line in rest)
    return "\n".join(lines)


def _table(node: SyntaxTreeNode) -> str:
    rows: list[str] = []
    for section in node.children:
        for tr in section.children:
            cells = [_inline_of(cell) for cell in tr.children]
            row = " | ".join(cells)
            rows.append(f"*{row}*" if section.type == "thead" and row.strip() else row)
    return "\n".join(rows)


def _inline_of(node: SyntaxTreeNode, *, bold: bool = False) -> str:
    return "".join(_inline(child, bold=bold, italic=False) for child in node.children)


def _inline(node: SyntaxTreeNode, *, bold: bool, italic: bool) -> str:
    kind = node.type
    if kind == "inline":
        return "".join(_inline(c, bold=bold, italic=italic) for c in node.children)
    if kind in ("softbreak", "hardbreak"):
        return "\n"
    if kind == "code_inline":
        return f"`{escape(node.content)}`" if node.content else ""
    if kind in ("link", "image"):
        return _link(node)
    if kind == "strong":
        inner = "".join(_inline(c, bold=True, italic=italic) for c in node.children)
        return inner if bold or not inner.strip() else f"*{inner}*"
    if kind == "em":
        inner = "".join(_inline(c, bold=bold, italic=True) for c in node.children)
        return inner if italic or not inner.strip() else f"_{inner}_"
    if kind == "s":
        inner = "".join(_inline(c, bold=bold, italic=italic) for c in node.children)
        return f"~{inner}~" if inner.strip() else inner
    if node.children:
        return "".join(_inline(c, bold=bold, italic=italic) for c in node.children)
    return escape(node.content)


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
        text = escape(label)
        return f"{text} ({escape(href)})" if href and href != label else text or escape(href)
    url = "".join(_URL_UNSAFE.get(ch, ch) for ch in href)
    if not label or label == href:
        return f"<{url}>"
    return f"<{url}|{escape(label)}>"
