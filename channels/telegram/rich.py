"""Rich text as Telegram sees it: visible text with a stack of entities over each span,
printed as Telegram HTML and cut into messages of at most 4096 UTF-16 code units.

Working on the visible text (not the HTML) is what makes chunking safe: a cut can never fall
inside a tag, an HTML entity or a surrogate pair, and every chunk closes the tags open at its
end and reopens them at the start of the next, so each message is valid on its own.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from channels.text import cluster_cut

__all__ = ["MAX_UNITS", "Rich", "Tag", "utf16_len"]

MAX_UNITS = 4096  # sendMessage / editMessageText text limit, after entity parsing
_SENTENCE = re.compile(r"[.!?…。](?=\s)")
_WS = re.compile(r"\s")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, which is how Telegram counts."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


@dataclass(frozen=True, slots=True)
class Tag:
    """One entity: b, i, s, u, spoiler, code, pre (attr = language), a (attr = href), blockquote."""

    name: str
    attr: str = ""

    def open(self) -> str:
        if self.name == "a":
            return f'<a href="{escape(self.attr, quote=True)}">'
        if self.name == "pre" and self.attr:
            return f'<pre><code class="language-{self.attr}">'
        if self.name == "spoiler":
            return "<tg-spoiler>"
        return f"<{self.name}>"

    def close(self) -> str:
        if self.name == "pre" and self.attr:
            return "</code></pre>"
        if self.name == "spoiler":
            return "</tg-spoiler>"
        return f"</{self.name}>"


Stack = tuple[Tag, ...]


@dataclass
class Rich:
    """Visible text in spans, each with the entities around it (outermost first)."""

    spans: list[tuple[str, Stack]] = field(default_factory=list)

    def add(self, text: str, stack: Stack) -> None:
        if not text:
            return
        if self.spans and self.spans[-1][1] == stack:
            self.spans[-1] = (self.spans[-1][0] + text, stack)
        else:
            self.spans.append((text, stack))

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)

    def last_stack(self) -> Stack:
        return self.spans[-1][1] if self.spans else ()

    def html(self, start: int = 0, end: int | None = None) -> str:
        """Telegram HTML for the visible characters [start, end)."""
        end = len(self.text) if end is None else end
        out: list[str] = []
        current: Stack = ()
        pos = 0
        for text, stack in self.spans:
            lo, hi = max(start - pos, 0), min(end - pos, len(text))
            pos += len(text)
            if lo >= hi:
                if pos >= end:
                    break
                continue
            keep = _common(current, stack)
            out.extend(tag.close() for tag in reversed(current[keep:]))
            out.extend(tag.open() for tag in stack[keep:])
            out.append(escape(text[lo:hi], quote=False))
            current = stack
        out.extend(tag.close() for tag in reversed(current))
        return "".join(out)

    def chunks(self, limit: int = MAX_UNITS) -> list[tuple[str, str]]:
        """(html, plain text) per message, in order; empty when there is nothing visible."""
        text = self.text
        return [(self.html(a, b), text[a:b]) for a, b in split(text, limit, self._verbatim())]

    def _verbatim(self) -> list[tuple[int, int]]:
        """The ranges inside code blocks, where a line's leading spaces are part of it."""
        out: list[tuple[int, int]] = []
        pos = 0
        for text, stack in self.spans:
            if any(tag.name == "pre" for tag in stack):
                if out and out[-1][1] == pos:
                    out[-1] = (out[-1][0], pos + len(text))
                else:
                    out.append((pos, pos + len(text)))
            pos += len(text)
        return out


def _common(a: Stack, b: Stack) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def split(text: str, limit: int, verbatim: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Ranges of `text`, each at most `limit` UTF-16 units once trimmed, cut at a paragraph,
    else a line, else a sentence, else a word boundary, else between characters. In `verbatim`
    ranges (code blocks) the next range skips the spaces at a cut inside a line, but never the
    indentation of a line that starts it."""
    units = [0]
    for ch in text:
        units.append(units[-1] + (2 if ord(ch) > 0xFFFF else 1))
    n, out = len(text), []
    starts = [a for a, _ in verbatim]

    def in_code(at: int) -> bool:
        i = bisect.bisect_right(starts, at) - 1
        return i >= 0 and verbatim[i][0] <= at < verbatim[i][1]

    def skip(at: int, floor: int) -> int:
        """The start of the next range: past the blanks at the cut, but in code a line with
        text starts with its indentation (a cut inside that indentation goes back to it)."""
        line = text.rfind("\n", 0, at) + 1
        if in_code(at) and line > floor and not text[line:at].strip():
            at = line
        while at < n and text[at].isspace():
            if (at == 0 or text[at - 1] in "\r\n") and in_code(at) and _has_text(text, at):
                break
            at += 1
        return at

    pos = skip(0, -1)
    while pos < n:
        end = _trim_end(text, pos, n)
        if units[end] - units[pos] <= limit:
            out.append((pos, end))
            break
        hard = max(bisect.bisect_right(units, units[pos] + limit, pos, n + 1) - 1, pos + 1)
        cut = _best_cut(text, pos, hard)
        if _trim_end(text, pos, cut) == pos:  # only a code line's indentation before the cut
            cut = hard
        if (end := _trim_end(text, pos, cut)) > pos:  # else an indentation wider than a message
            out.append((pos, end))
        pos = skip(cut, pos)
    return out


def _best_cut(text: str, pos: int, hard: int) -> int:
    floor = pos + (hard - pos) // 3  # a boundary too near the start makes a needlessly short chunk
    for lo in (floor, pos + 1):
        window = text[lo:hard]
        for finder in (_last_paragraph, _last_line, _last_sentence, _last_space):
            at = finder(window)
            if at > 0:
                return lo + at
    return cluster_cut(text, pos, hard)


def _last_paragraph(window: str) -> int:
    return window.rfind("\n\n")


def _last_line(window: str) -> int:
    return window.rfind("\n")


def _last_sentence(window: str) -> int:
    found = [m.end() for m in _SENTENCE.finditer(window)]
    return found[-1] if found else -1


def _last_space(window: str) -> int:
    found = [m.start() for m in _WS.finditer(window)]
    return found[-1] if found else -1


def _has_text(text: str, line: int) -> bool:
    end = text.find("\n", line)
    return bool(text[line : len(text) if end < 0 else end].strip())


def _trim_end(text: str, pos: int, end: int) -> int:
    while end > pos and text[end - 1].isspace():
        end -= 1
    return end
