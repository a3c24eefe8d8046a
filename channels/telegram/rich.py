"""Rich text as Telegram sees it: visible text with a stack of entities over each span,
printed as Telegram HTML and cut into messages of at most 4096 UTF-16 code units and 100
entities.

Working on the visible text (not the HTML) is what makes chunking safe: a cut can never fall
inside a tag, an HTML entity or a surrogate pair, and every chunk closes the tags open at its
end and reopens them at the start of the next, so each message is valid on its own.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from channels.text import cluster_cut, shared_styles

__all__ = ["MAX_ENTITIES", "MAX_UNITS", "Rich", "Tag", "utf16_len"]

MAX_UNITS = 4096  # sendMessage / editMessageText text limit, after entity parsing
# entities Telegram keeps of a message; the rest are dropped without an error (TDLib
# td/telegram/MessageEntity.cpp, get_input_message_entities: MAX_USER_ENTITY_COUNT = 100,
# "server-side limit")
MAX_ENTITIES = 100
_SPLITTABLE = frozenset({"b", "i", "u", "s", "spoiler"})  # Telegram cuts these into pieces
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
        return self._html(self._starts(), start, len(self.text) if end is None else end)

    def _starts(self) -> list[int]:
        """Where each span starts in the text."""
        return list(itertools.accumulate((len(text) for text, _ in self.spans[:-1]), initial=0))

    def _html(self, starts: list[int], start: int, end: int) -> str:
        """html() from the span holding `start` on: a reply cut every 100 entities has many
        chunks, and walking from the first span for each made a 100 kB table take seconds."""
        out: list[str] = []
        current: Stack = ()
        for i in range(max(bisect.bisect_right(starts, start) - 1, 0), len(self.spans)):
            text, stack = self.spans[i]
            lo, hi = max(start - starts[i], 0), min(end - starts[i], len(text))
            if lo >= hi:
                if starts[i] + len(text) >= end:
                    break
                continue
            keep = shared_styles(current, stack)
            out.extend(tag.close() for tag in reversed(current[keep:]))
            out.extend(tag.open() for tag in stack[keep:])
            out.append(escape(text[lo:hi], quote=False))
            current = stack
        out.extend(tag.close() for tag in reversed(current))
        return "".join(out)

    def chunks(
        self, limit: int = MAX_UNITS, max_entities: int = MAX_ENTITIES
    ) -> list[tuple[str, str]]:
        """(html, plain text) per message, in order; empty when there is nothing visible."""
        text, starts = self.text, self._starts()
        ranges = split(text, limit, self._verbatim(), self._entities(), max_entities)
        return [(self._html(starts, a, b), text[a:b]) for a, b in ranges]

    def _entities(self) -> list[tuple[int, int]]:
        """(start, end) of each entity Telegram counts, by start. A tag html() opens is one,
        but Telegram cuts bold, italic, underline, strikethrough and spoiler wherever another
        of them starts inside (TDLib split_entities) and counts each piece."""
        out: list[tuple[int, int]] = []
        opened: list[int] = []  # where html() opened each tag of `current`
        pieces: dict[str, int] = {}  # a cut tag → where its piece started
        current: Stack = ()
        pos = 0
        for text, stack in self.spans:
            keep = shared_styles(current, stack)
            out += _whole(current[keep:], opened[keep:], pos)
            opened = opened[:keep] + [pos] * (len(stack) - keep)
            names = {tag.name for tag in stack if tag.name in _SPLITTABLE}
            fresh = bool(names - pieces.keys())  # one starts here: every other piece ends
            for name in [name for name in pieces if fresh or name not in names]:
                out.append((pieces.pop(name), pos))
            for name in names:
                pieces.setdefault(name, pos)
            current = stack
            pos += len(text)
        out += _whole(current, opened, pos)
        out += [(start, pos) for start in pieces.values()]
        return sorted(out)

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


def _whole(tags: Stack, opened: Sequence[int], end: int) -> list[tuple[int, int]]:
    """The entities Telegram does not cut, of `tags` (opened at `opened`) closing at `end`."""
    return [
        (start, end) for tag, start in zip(tags, opened, strict=True) if tag.name not in _SPLITTABLE
    ]


def split(
    text: str,
    limit: int,
    verbatim: Sequence[tuple[int, int]] = (),
    entities: Sequence[tuple[int, int]] = (),
    max_entities: int = MAX_ENTITIES,
) -> list[tuple[int, int]]:
    """Ranges of `text`, each at most `limit` UTF-16 units once trimmed and meeting at most
    `max_entities` of `entities` ((start, end), by start), cut at a paragraph, else a line,
    else a sentence, else a word boundary, else between characters. In `verbatim` ranges
    (code blocks) the next range skips the spaces at a cut inside a line, but never the
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

    budget = _Budget(entities, max_entities, n)
    pos = skip(0, -1)
    while pos < n:
        end = _trim_end(text, pos, n)
        most = budget.end(pos)  # a range from pos ends here at the latest
        if units[end] - units[pos] <= limit and end <= most:
            out.append((pos, end))
            break
        hard = max(bisect.bisect_right(units, units[pos] + limit, pos, n + 1) - 1, pos + 1)
        hard = min(hard, most)
        cut = _best_cut(text, pos, hard)
        if _trim_end(text, pos, cut) == pos:  # only a code line's indentation before the cut
            cut = hard
        if (end := _trim_end(text, pos, cut)) > pos:  # else an indentation wider than a message
            out.append((pos, end))
        pos = skip(cut, pos)
    return out


class _Budget:
    """Where a range must end to meet at most `most` entities, for starts that only move
    forward (a chunk with more lost the rest: a table of 50 rows of code cells had 154, and
    the link after it was the 101st)."""

    def __init__(self, entities: Sequence[tuple[int, int]], most: int, n: int) -> None:
        self._entities, self._most, self._n = entities, most, n
        self._next = 0  # the first entity starting at or after the last start asked about
        self._open: list[int] = []  # ends of the entities before it that run past that start

    def end(self, at: int) -> int:
        """The first entity a range from `at` must leave out starts here (or the text ends)."""
        while self._next < len(self._entities) and self._entities[self._next][0] < at:
            self._open.append(self._entities[self._next][1])
            self._next += 1
        self._open = [end for end in self._open if end > at]
        first_out = self._next + max(self._most - len(self._open), 0)
        if first_out >= len(self._entities):
            return self._n
        return max(self._entities[first_out][0], at + 1)  # more open at `at`: cannot be helped


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
