"""The agent's Markdown as Telegram rich text, printed as Telegram HTML.

Why HTML and not MarkdownV2: in HTML only `&`, `<` and `>` need escaping, everywhere, and
entities are explicit tags, so well-nested output is valid by construction and a chunk can
close its tags and the next reopen them. MarkdownV2 needs 18 characters escaped with rules that
change inside code, pre and link targets, and an ambiguous `___`; one slip in arbitrary model
output and Telegram answers "can't parse entities". HTML's tag set (b, i, s, u, code, pre,
a href, blockquote) covers what the agent writes.

Parsing uses markdown-it (CommonMark + tables and strikethrough, raw HTML off, so every `<`
and `&` the agent writes stays visible text) through `channels.text.parse`, so text nested
deeper than markdown-it reads stays, as plain text. Headings and table headers become bold;
`*em*` italic; `**strong**` bold; `~~s~~` strikethrough; `` `code` `` code; fences pre with
their language; quotes blockquote (never nested: Telegram refuses nested quotes); lists keep
their markers as text; links keep the http(s) targets Telegram links, and any other target is
written out after the link text (a mail address as the address, which Telegram makes tappable).
Telegram allows nothing inside code, and no code or link inside a link, so such formatting is
dropped, never the text.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from channels.telegram.rich import Rich, Stack, Tag
from channels.text import MAX_NESTING, parse

__all__ = ["render"]

_MD = MarkdownIt("commonmark", {"html": False, "maxNesting": MAX_NESTING}).enable(
    ["strikethrough", "table"]
)
_HTTP = re.compile(r"https?://", re.IGNORECASE)
_PATH = re.compile(r"[/?#]")  # ends the host and port
_PORT = re.compile(r"[0-9]+")
# what Telegram allows in a host, lowercased: RFC 3986 characters, %-escapes and any non-ASCII
_HOST = re.compile(r"(?:[a-z0-9._~!$&'()*+,;=-]|%[0-9a-f]{2}|[^\x00-\x7f])+")
_IPV6 = re.compile(r"\[[0-9a-fA-F:.]+\]")
_LANG = re.compile(r"^[A-Za-z][A-Za-z0-9_+#.-]{0,31}$")
_INLINE_TAGS = {"strong": "b", "em": "i", "s": "s"}
_HR = "———"


def render(markdown: str) -> Rich:
    """Markdown → rich text; never fails, whatever the input."""
    builder = _Builder()
    builder.blocks(parse(_MD, markdown))
    return builder.rich


def _linkable(href: str) -> bool:
    """Whether Telegram links `href`: http(s) with a host that has a dot or is an IP address.

    Telegram checks each link (TDLib parse_html -> LinkManager::get_checked_link ->
    check_link_impl, td/telegram/LinkManager.cpp, and parse_url, tdutils/td/utils/HttpUrl.cpp)
    and quietly reads the ones that fail otherwise: http://localhost:3000 or http://intranet/wiki
    got no link at all (the label showed, the address was lost), mailto:a@b.co became the web
    address http://mailto:a@b.co/, and tg://user?id=N a mention that notifies that person
    (any name an injected prompt chose). Other tg:// links act inside Telegram (join a chat,
    use a proxy) behind a label, so they are written out too."""
    scheme = _HTTP.match(href)
    if scheme is None:
        return False
    hostport = _PATH.split(href[scheme.end() :], maxsplit=1)[0]
    sep = max(hostport.rfind(":"), hostport.rfind("]"), hostport.rfind("@"))
    if sep > 0 and hostport[sep] == ":":
        port = hostport[sep + 1 :]
        digits = port.lstrip("0")  # leading zeros are allowed, a port of 0 is not
        if not _PORT.fullmatch(port) or not 0 < len(digits) <= 5 or int(digits) > 65535:
            return False
        hostport = hostport[:sep]
    host = hostport.rpartition("@")[2]
    if _IPV6.fullmatch(host):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return "." in host and host != "." and bool(_HOST.fullmatch(host.lower()))


def _written(href: str) -> str:
    """A target Telegram cannot link, as written out: a mail address without "mailto:"."""
    return href[7:] if href[:7].lower() == "mailto:" else href


@dataclass
class _Link:
    href: str
    kept: bool  # made an entity (else written out after its text)
    label: list[str] = field(default_factory=list)  # the visible text inside it


class _Builder:
    def __init__(self) -> None:
        self.rich = Rich()
        self.block_stack: list[Tag] = []  # blockquote
        self.inline: list[Tag] = []
        self.sep = ""  # whitespace owed before the next visible text
        self.prefix = ""  # a list item's marker, written before its first text
        self.lists: list[str] = []  # markup of each open list
        self.cells = 0
        self.quote_depth = 0
        self.links: list[_Link] = []  # open links, outermost first

    # blocks

    def blocks(self, tokens: Sequence[Token]) -> None:
        for tok in tokens:
            handler = getattr(self, f"_b_{tok.type}", None)
            if handler is not None:
                handler(tok)

    def block(self, sep: str = "\n\n") -> None:
        if self.prefix or not self.rich.spans:
            return
        if len(sep) > len(self.sep):
            self.sep = sep

    def _b_paragraph_open(self, tok: Token) -> None:
        if not tok.hidden:
            self.block()

    def _b_heading_open(self, tok: Token) -> None:
        self.block()
        self.inline.append(Tag("b"))

    def _b_heading_close(self, tok: Token) -> None:
        self._pop("b")

    def _b_blockquote_open(self, tok: Token) -> None:
        self.block()
        if self.quote_depth == 0:
            self.block_stack.append(Tag("blockquote"))
        self.quote_depth += 1

    def _b_blockquote_close(self, tok: Token) -> None:
        self.quote_depth -= 1
        if self.quote_depth == 0:
            self.block_stack.remove(Tag("blockquote"))
        self.block()

    def _b_bullet_list_open(self, tok: Token) -> None:
        self.block("\n" if self.lists else "\n\n")
        self.lists.append(tok.markup)

    _b_ordered_list_open = _b_bullet_list_open

    def _b_bullet_list_close(self, tok: Token) -> None:
        self.lists.pop()
        self.block("\n" if self.lists else "\n\n")

    _b_ordered_list_close = _b_bullet_list_close

    def _b_list_item_open(self, tok: Token) -> None:
        self._flush_marker()
        self.block("\n")
        indent = "  " * (len(self.lists) - 1)
        if tok.info:  # ordered: the number as written
            self.prefix = f"{indent}{tok.info}{tok.markup} "
        else:
            self.prefix = f"{indent}{'•' if len(self.lists) == 1 else '◦'} "

    def _b_list_item_close(self, tok: Token) -> None:
        self._flush_marker()

    def _flush_marker(self) -> None:
        """An item with no text of its own (empty, or straight into a sublist) still shows
        its marker."""
        if self.prefix:
            marker, self.prefix = self.prefix.rstrip(), ""
            self.text(marker)

    def _b_fence(self, tok: Token) -> None:
        self.block()
        words = tok.info.split()
        lang = words[0] if words and _LANG.match(words[0]) else ""  # the rest is metadata
        self.text(tok.content.rstrip("\n"), (Tag("pre", lang),), plain=True)
        self.block()

    _b_code_block = _b_fence

    def _b_hr(self, tok: Token) -> None:
        self.block()
        self.text(_HR)
        self.block()

    def _b_table_open(self, tok: Token) -> None:
        self.block()

    def _b_tr_open(self, tok: Token) -> None:
        self.block("\n")
        self.cells = 0

    def _b_th_open(self, tok: Token) -> None:
        if self.cells:
            self.text(" | ")
        self.cells += 1
        self.inline.append(Tag("b"))

    def _b_th_close(self, tok: Token) -> None:
        self._pop("b")

    def _b_td_open(self, tok: Token) -> None:
        if self.cells:
            self.text(" | ")
        self.cells += 1

    def _b_table_close(self, tok: Token) -> None:
        self.block()

    def _b_inline(self, tok: Token) -> None:
        for child in tok.children or ():
            self.inline_token(child)

    # inline

    def inline_token(self, tok: Token) -> None:
        kind = tok.type
        if kind == "text":
            self.text(tok.content)
        elif kind in ("softbreak", "hardbreak"):
            self.text("\n")
        elif kind == "code_inline":
            in_link = any(t.name == "a" for t in self.inline)
            self.text(tok.content, () if in_link else (Tag("code"),), plain=not in_link)
        elif kind.endswith("_open") and kind[:-5] in _INLINE_TAGS:
            self.inline.append(Tag(_INLINE_TAGS[kind[:-5]]))
        elif kind.endswith("_close") and kind[:-6] in _INLINE_TAGS:
            self._pop(_INLINE_TAGS[kind[:-6]])
        elif kind == "link_open":
            self.link_open(str(tok.attrs.get("href", "")))
        elif kind == "link_close":
            self.link_close()
        elif kind == "image":
            self.link_open(str(tok.attrs.get("src", "")))
            for child in tok.children or ():
                self.inline_token(child)
            self.link_close()
        else:  # html_inline and anything newer: keep what was written
            self.text(tok.content)

    def link_open(self, href: str) -> None:
        kept = _linkable(href) and not any(t.name == "a" for t in self.inline)
        if kept:
            self.inline.append(Tag("a", href))
        self.links.append(_Link(href, kept))

    def link_close(self) -> None:
        link = self.links.pop()
        label = "".join(link.label).strip()
        if link.kept:
            if not label:
                self.text(link.href)
            self._pop("a")
            return
        shown = _written(link.href)
        # an autolink shows its address already: <http://localhost:3000>, <a@b.co>, and
        # markdown-it spells the target in punycode and %-escapes (<http://intranet/ä>)
        if shown and label not in (link.href, shown, _MD.normalizeLinkText(link.href)):
            self.text(f" ({shown})" if label else shown)

    def _pop(self, name: str) -> None:
        for i in range(len(self.inline) - 1, -1, -1):
            if self.inline[i].name == name:
                del self.inline[i]
                return

    def text(self, text: str, extra: Stack = (), *, plain: bool = False) -> None:
        """Add visible text under the open entities (`plain`: no inline formatting inside)."""
        if not text:
            return
        blocks = tuple(self.block_stack)
        stack = blocks + (extra if plain else tuple(self.inline) + extra)
        if self.sep:
            last = self.rich.last_stack()
            keep = 0
            while keep < min(len(last), len(blocks)) and last[keep] == blocks[keep]:
                keep += 1
            self.rich.add(self.sep, blocks[:keep])
            self.sep = ""
        if self.prefix:
            self.rich.add(self.prefix, blocks)
            self.prefix = ""
        self.rich.add(text, stack)
        for link in self.links:
            link.label.append(text)
