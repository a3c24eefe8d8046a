"""Text helpers every channel's formatter shares.

Where text may be cut: between grapheme clusters, what a person sees as one character (a
flag, a family emoji, a letter with its accents, a Thai syllable's vowel sign). A cut inside
one shows broken symbols on both sides. The clusters are Unicode's extended grapheme clusters
(UAX #29), from the `regex` module's `\\X`.

How the agent's Markdown is read: with markdown-it, none of its text ever lost. markdown-it
stops reading blocks nested deeper than its `maxNesting` and silently drops the rest of the
input (the commonmark preset's 20 levels are ten nested lists, each list and its item taking
one), so `parse` checks every line that holds text was read into some block and keeps what
was not as plain text. And a single `*` inside a word stays a `*`: CommonMark reads the `*`s of
2*3*4 or a*b + c*d as italics, which every channel then showed as "234" or "ab + cd" (WhatsApp
and Slack show no style inside a word and dropped the markers; Telegram italicised the 3).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

if TYPE_CHECKING:
    import regex

__all__ = ["MAX_NESTING", "cluster_cut", "clusters", "link", "parse", "shared_styles"]

# markdown-it's default preset: 49 nested lists or 99 nested quotes, far below Python's
# recursion limit (markdown-it and the Slack renderer recurse once or twice a level)
MAX_NESTING = 100
_NEWLINE = re.compile(r"\r\n?|\n")  # markdown-it's line breaks
# a line of container markers alone (an empty list item, a blank quoted line): no text
_MARKERS_ONLY = re.compile(r"[ \t]*(?:(?:>|(?:[-+*]|\d{1,9}[.)])(?=[ \t]|$))[ \t]*)*")
_CONTAINERS = frozenset(
    {"blockquote_open", "bullet_list_open", "ordered_list_open", "list_item_open"}
)


def link(label: str, url: str) -> str:
    """A Markdown link that shows `label` as it is and goes to `url` (a file's name comes from
    whoever named it: unescaped, "x](tg://…) [y" made a link of its own)."""
    shown = re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", " ".join(label.split()))
    target = "".join(f"%{ord(c):02X}" if c in "<> \n\r\t" else c for c in url)
    return f"[{shown}](<{target}>)"


@functools.cache
def _cluster() -> regex.Pattern[str]:
    """`\\X`, compiled at the first cut that needs it: the `regex` module is 1.7 MB of memory
    that a gateway whose replies are cut between words never needs."""
    import regex

    return regex.compile(r"\X")


def clusters(text: str) -> Iterator[str]:
    """The grapheme clusters of `text`, in order."""
    for match in _cluster().finditer(text):
        yield match[0]


def cluster_cut(text: str, start: int, end: int) -> int:
    """The last cut in `text[start:end]`, after `start` and at or before `end`, that keeps
    every cluster whole; `end` itself when one cluster runs past it from `start`."""
    cut = start
    for match in _cluster().finditer(text, start):
        if match.end() > end:
            break
        cut = match.end()
    return cut if cut > start else end


def shared_styles(a: Sequence[object], b: Sequence[object]) -> int:
    """How many styles two stacks (outermost first) share from the outside: those stay open
    from one span to the next, the rest close and open."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def parse(md: MarkdownIt, markdown: str) -> list[Token]:
    """markdown-it's block tokens for `markdown`, with every line of text in them: from the
    first line no block read (markdown-it gave up there), the text follows as plain
    paragraphs, each line stripped of its indent."""
    lines = _NEWLINE.split(markdown)
    end, source = len(lines), markdown
    while True:  # the part before a lost line is read again, so it ends where it did
        env: dict[str, Any] = {}
        tokens = md.parse(source, env)
        lost = _first_lost(lines[:end], tokens, env)
        if lost is None:
            for token in tokens:
                if token.type == "inline" and token.children:
                    token.children = _stars_in_words(token.children)
            return tokens + _paragraphs(lines[end:])
        end, source = lost, "\n".join(lines[:lost])


def _stars_in_words(children: list[Token]) -> list[Token]:
    """Italics opened by a single `*` that start or end inside a word, back to their `*`s."""
    out = list(children)
    for i, tok in enumerate(out):
        if tok.type != "em_open" or tok.markup != "*":
            continue
        close = _closing(out, i)
        if close is None:
            continue
        before = out[i - 1].content[-1:] if i and out[i - 1].type == "text" else ""
        after = out[close + 1] if close + 1 < len(out) else None
        after_char = after.content[:1] if after is not None and after.type == "text" else ""
        if before.isalnum() or after_char.isalnum():
            out[i] = Token("text", "", 0, content="*")
            out[close] = Token("text", "", 0, content="*")
    return out


def _closing(children: list[Token], at: int) -> int | None:
    depth = 0
    for j in range(at, len(children)):
        if children[j].type == "em_open":
            depth += 1
        elif children[j].type == "em_close":
            depth -= 1
            if depth == 0:
                return j
    return None


def _first_lost(lines: list[str], tokens: list[Token], env: dict[str, Any]) -> int | None:
    """The first line holding text that no block token (nor link reference definition) covers."""
    read = [False] * (len(lines) + 1)
    maps = [t.map for t in tokens if t.map and t.type not in _CONTAINERS]
    refs = [*env.get("references", {}).values(), *env.get("duplicate_refs", ())]
    for start, stop in [*maps, *(ref["map"] for ref in refs)]:
        read[start:stop] = [True] * (stop - start)
    for n, line in enumerate(lines):
        if not read[n] and not _MARKERS_ONLY.fullmatch(line):
            return n
    return None


def _paragraphs(lines: list[str]) -> list[Token]:
    """Lines as plain-text paragraphs, split at blank lines (nothing in them is markup)."""
    tokens: list[Token] = []
    para: list[str] = []
    for line in [*lines, ""]:
        if text := line.strip(" \t"):
            para.append(text)
            continue
        if not para:
            continue
        children: list[Token] = []
        for text in para:
            if children:
                children.append(Token("softbreak", "br", 0))
            children.append(Token("text", "", 0, content=text))
        content = "\n".join(para)
        tokens += [
            Token("paragraph_open", "p", 1, block=True),
            Token("inline", "", 0, content=content, children=children, block=True, level=1),
            Token("paragraph_close", "p", -1, block=True),
        ]
        para = []
    return tokens
