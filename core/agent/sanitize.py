"""Text hygiene at the model boundary: user text in as data, reasoning leftovers out, and an
answer that would show nothing taken for no answer."""

from __future__ import annotations

import re
import unicodedata

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["StreamFilter", "shows_nothing", "strip_reasoning", "wrap_user_text"]

_USER_TAG = re.compile(r"<\s*/?\s*user_message\b[^>]*>", re.IGNORECASE)

_ENTITY = re.compile(r"&#?[0-9A-Za-z]+;")
_HTML = re.compile(r"<!--.*?-->|<[^>\n]*>", re.DOTALL)
_FENCE_LINE = re.compile(r"^[ \t]*(?:`{3,}|~{3,}).*$", re.MULTILINE)
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_MD = MarkdownIt("commonmark", {"maxNesting": 100})  # as the channels read it (channels.text)


def shows_nothing(markdown: str) -> bool:
    """Whether Markdown renders to no visible character (`&nbsp;`, an empty code block, a lone
    rule or HTML comment): every channel would send nothing, so it is no answer. A letter or
    digit outside entities, HTML and fence lines shows at once; only text without one is
    parsed."""
    rest = _FENCE_LINE.sub("", _HTML.sub("", _ENTITY.sub("", markdown)))
    if _LETTER_OR_DIGIT.search(rest):
        return False
    return not any(_shown(ch) for ch in "".join(_texts(_MD.parse(markdown))))


def _texts(tokens: list[Token]) -> list[str]:
    out: list[str] = []
    for token in tokens:
        if token.type in ("text", "code_inline", "fence", "code_block"):
            out.append(token.content)
        if token.children:
            out += _texts(token.children)
    return out


def _shown(ch: str) -> bool:
    return not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc", "Zs")


def wrap_user_text(text: str) -> str:
    """Put what a person typed inside a <user_message> tag, after removing any such tags they
    typed themselves, so the model can tell data from instructions."""
    cleaned, previous = text, None
    while cleaned != previous:  # "<user_</user_message>message>" must not re-form a tag
        previous, cleaned = cleaned, _USER_TAG.sub("", cleaned)
    return f"<user_message>\n{cleaned}\n</user_message>"


def strip_reasoning(text: str) -> str:
    """Remove reasoning-channel leftovers some models leak into the visible answer: reasoning
    blocks and channel headers at its start, reasoning before a dangling close tag, and special
    tokens. Code spans and fenced blocks are never touched: an answer may quote any tag there."""
    scan = _Scanner()
    return scan.push(text, final=True)


class StreamFilter:
    """The same cleaning as `strip_reasoning`, on streamed text, so live previews never show
    what the final reply will not contain. A possible tag, fence or code span is held back until
    it can be decided. The one exception: text already shown before a dangling close tag
    cannot be taken back (the final reply drops it)."""

    def __init__(self) -> None:
        self._scan = _Scanner()

    def feed(self, chunk: str) -> str:
        return self._scan.push(chunk, final=False)

    def flush(self) -> str:
        """What is held back at the end of a stream (nothing, if a reasoning block never
        closed); the next stream is a new answer."""
        rest = self._scan.push("", final=True)
        self._scan = _Scanner()
        return rest


_TAG_NAMES = ("think", "thinking", "reasoning", "analysis", "seed:think", "reflection")
_NAMES = "|".join(map(re.escape, _TAG_NAMES))
_TAG_SPACE = r"[ \t]{0,4}"  # "<think >" too
_OPEN_TAG = re.compile(rf"<({_NAMES}){_TAG_SPACE}>", re.IGNORECASE)
_DANGLING = re.compile(rf"</(?:think|thinking|reasoning|seed:think){_TAG_SPACE}>", re.IGNORECASE)
# a start of a tag that more text could complete
_PARTS = "|".join(re.escape(n[:i]) for n in _TAG_NAMES for i in range(len(n)))
_TAG_START = re.compile(rf"</?(?:{_NAMES}){_TAG_SPACE}|</?(?:{_PARTS})", re.IGNORECASE)
_REASONING_REACH = 24  # the longest end of a reasoning block, and then some
# harmony / gemma-style special tokens and channel headers, e.g. "<|im_end|>",
# "<|start|>assistant<|channel|>final<|message|>", "<start_of_turn>model", and a reasoning
# channel "<|channel|>analysis<|message|>…<|end|>" (it also ends where the next message starts)
_TOKEN = re.compile(
    r"<\|[a-z_]{1,32}\|>|<channel\|>|<\|channel>|<start_of_turn>(?:model\n?)?|<end_of_turn>"
)
_HEADER = re.compile(r"(?:<\|start\|>[a-z_]{0,32})?(?:<\|channel\|>[a-z_]{0,32})?<\|message\|>")
_CHANNEL_OPEN = re.compile(
    r"(?:<\|start\|>[a-z_]{0,32})?<\|channel\|>\s{0,8}(?:analysis|commentary)\s{0,8}<\|message\|>"
)
_CHANNEL_ENDS = (re.compile(re.escape("<|end|>")), re.compile(re.escape("<|start|>")))
_THOUGHT_PREFIX = re.compile(r"(?:thought|thinking)\s*\n(?=\s*<)", re.IGNORECASE)
# a start of the tokens and headers above that more text could complete (too wide only delays)
_TOKEN_START = re.compile(
    r"(?:<\|[a-z_]{1,32}\|>[a-z_]{0,32}\s{0,8}[a-z_]{0,32}\s{0,8}){0,2}<?\|?[a-z_]{0,32}\|?"
    r"|<start_of_turn>[a-z]{0,5}"
)

# a fence may follow quote markers and list bullets; the rest of a backtick fence's line has
# no backtick. _FENCE_START is any line start that more text could still make a fence.
_CONTAINERS = r"[ \t]*(?:>[ \t]?)*[ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+)*"
_FENCE_OPEN = re.compile(rf"{_CONTAINERS}(`{{3,}}|~{{3,}})(.*)")
_FENCE_START = re.compile(rf"{_CONTAINERS}(?:[-*+]|\d{{1,9}}[.)]?)?[`~]{{0,2}}")
_FENCE_CLOSE = re.compile(r"[ \t]*(?:>[ \t]?)*[ \t]*(`{3,}|~{3,})[ \t\r]*")
_CLOSE_START = re.compile(r"[ \t]*(?:>[ \t]?)*[ \t]*(?:`+|~+)?[ \t\r]*")
_SPECIAL = re.compile(r"[`<\\\n]")
_TICKS = re.compile(r"`+")
_SPACE = re.compile(r"\s+")
_WORD_AND_SPACE = re.compile(r"([^\W\d_]+)\s*")
_TICKS_OR_NEWLINE = re.compile(r"`+|\n")
# lines that interrupt a paragraph (and so end a code span)
_BLOCK_START = re.compile(
    r" {0,3}(?:>|#{1,6}(?:\s|$)|[-*+][ \t]+\S|1[.)][ \t]+\S|(?:[-*_][ \t]*){3,}$|=+[ \t]*$)"
)
_BLOCK_START_SO_FAR = re.compile(r"\s*| {0,3}(?:#{1,6}|[-*+_=][-*_= \t]*|1(?:[.)][ \t]*)?)")


def _opening_fence(line: str, complete: bool) -> str | None:
    """The start of a line that opens a fence, up to the fence ("" if it opens none), or None
    while an unfinished line may still open one."""
    m = _FENCE_OPEN.match(line)
    if m is None:
        return None if not complete and _FENCE_START.fullmatch(line) else ""
    if not complete:
        return None
    fence, rest = m.groups()
    return "" if fence[0] == "`" and "`" in rest else line[: m.end(1)]


def _closes(line: str, opening: str) -> bool:
    """Whether a line closes the fence opened by `opening`: a fence of the same character, as
    long or longer, indented at most three columns more (a deeper one is code)."""
    fence = opening[len(opening.rstrip(opening[-1])) :]
    m = _FENCE_CLOSE.fullmatch(line)
    return (
        m is not None
        and m[1][0] == fence[0]
        and len(m[1]) >= len(fence)
        and m.start(1) <= len(opening) - len(fence) + 3
    )


def _may_grow_tag(text: str, at: int) -> bool:
    """Whether the rest of text, from a "<", may still become a tag or token as more arrives."""
    if _TAG_START.fullmatch(text, at):
        return True
    return _TOKEN_START.fullmatch(text, at) is not None


def _may_grow_head(text: str, at: int) -> bool:
    """Whether the rest of text, at the start of an answer, may still become something the
    head drops (a tag, a token or the "thought" line before one)."""
    m = _WORD_AND_SPACE.match(text, at)
    if m is not None and m.end() == len(text):
        low = m[1].lower()
        return "thought".startswith(low) or "thinking".startswith(low)
    return text.startswith("<", at) and _may_grow_tag(text, at)


def _ends_paragraph(line: str, complete: bool) -> bool | None:
    """Whether a line ends the paragraph before it (a blank line, a fence, a quote, list item
    or heading), or None while an unfinished line may still do so."""
    fence = _opening_fence(line, complete)
    if fence is None or (not complete and _BLOCK_START_SO_FAR.fullmatch(line)):
        return None
    return bool(fence) or not line.strip() or bool(_BLOCK_START.match(line))


def _code_span_end(text: str, at: int, ticks: int, final: bool) -> tuple[int | None, int]:
    """Where the code span opened by `ticks` backticks before `at` ends: -1 when they open
    none (no run as long comes before the paragraph ends), None while undecided, together
    with where to look again once more text has come."""
    while True:
        m = _TICKS_OR_NEWLINE.search(text, at)
        if m is None:
            return (-1 if final else None), len(text)
        if m[0] == "\n":
            eol = text.find("\n", m.end())
            line = text[m.end() : eol if eol >= 0 else len(text)]
            ends = _ends_paragraph(line, eol >= 0 or final)
            if ends is None:
                return None, m.start()
            if ends:
                return -1, 0
        elif m.end() == len(text) and not final:  # the run may grow
            return None, m.start()
        elif len(m[0]) == ticks:
            return m.end(), 0
        at = m.end()


class _Scanner:
    """Reads an answer as it arrives and passes on its visible text.

    It knows just enough Markdown to leave code alone: fences (also inside quotes and list
    items) and code spans, which CommonMark ends with the paragraph. It holds back trailing
    whitespace, so the text it passes on is stripped like the final answer."""

    def __init__(self) -> None:
        self._buf = ""
        self._at = 0
        self._out: list[str] = []
        self._space = ""  # trailing whitespace, passed on once more text follows
        self._head = True  # at the start of the answer: whitespace, tokens and blocks so far
        # inside a reasoning block: what ends it
        self._ends: tuple[re.Pattern[str], ...] | None = None
        self._fence: str | None = None
        self._line_start = True
        self._span_seen = 0  # how far past a code span's opening the text has been read
        # no dangling close tag counts once code, an opening tag or a block has been seen
        self._settled = False

    def push(self, text: str, *, final: bool) -> str:
        """Reads `text` and returns the visible text decided so far; `final` ends the answer."""
        self._buf = self._buf[self._at :] + text
        self._at = 0
        while self._at < len(self._buf) and self._step(final):
            pass
        out, self._out = "".join(self._out), []
        return out

    def _step(self, final: bool) -> bool:
        if self._fence is not None:
            return self._code_line(final)
        if self._head and self._ends is None:
            return self._head_item(final)
        if self._line_start:
            return self._line(final)
        return self._text(final)

    def _emit(self, text: str) -> None:
        if self._ends is not None:  # reasoning
            return
        text = self._space + text
        shown = text.rstrip()
        self._space = text[len(shown) :]
        if shown:
            self._out.append(shown)

    def _take(self, size: int) -> None:
        self._emit(self._buf[self._at : self._at + size])
        self._skip(size)

    def _skip(self, size: int) -> None:
        self._at += size

    def _head_item(self, final: bool) -> bool:
        buf, at = self._buf, self._at
        if m := _SPACE.match(buf, at):
            self._skip(m.end() - at)
        elif not final and _may_grow_head(buf, at):
            return False
        elif m := _OPEN_TAG.match(buf, at):
            self._ends = (re.compile(rf"</{re.escape(m[1])}{_TAG_SPACE}>", re.IGNORECASE),)
            self._skip(m.end() - at)
        elif m := _CHANNEL_OPEN.match(buf, at):
            self._ends = _CHANNEL_ENDS
            self._skip(m.end() - at)
        elif m := _HEADER.match(buf, at) or _TOKEN.match(buf, at) or _THOUGHT_PREFIX.match(buf, at):
            self._skip(m.end() - at)
        else:
            self._head = False
        self._line_start = True
        return True

    def _line(self, final: bool) -> bool:
        eol = self._buf.find("\n", self._at)
        line = self._buf[self._at : eol if eol >= 0 else len(self._buf)]
        fence = _opening_fence(line, eol >= 0 or final)
        if fence is None:
            return False
        self._line_start = False
        if fence:
            self._fence, self._settled = fence, True
            self._take(len(line) + (eol >= 0))
            self._line_start = True
        return True

    def _code_line(self, final: bool) -> bool:
        """Code passes as it is; only a closing fence at a line start ends it."""
        eol = self._buf.find("\n", self._at)
        line = self._buf[self._at : eol if eol >= 0 else len(self._buf)]
        if self._line_start and eol < 0 and not final and _CLOSE_START.fullmatch(line):
            return False
        if self._line_start and _closes(line, self._fence or ""):
            self._fence = None
        self._take(len(line) + (eol >= 0))
        self._line_start = eol >= 0
        return True

    def _text(self, final: bool) -> bool:
        m = _SPECIAL.search(self._buf, self._at)
        if m is None or m.start() > self._at:
            self._take((m.start() if m else len(self._buf)) - self._at)
            return True
        char = m[0]
        if char == "\n":
            self._take(1)
            self._line_start = True
            return True
        if char == "\\":  # an escaped character opens nothing
            if self._at + 1 == len(self._buf) and not final:
                return False
            self._take(1 if self._buf[self._at + 1 : self._at + 2] in ("", "\n") else 2)
            return True
        if char == "`":
            return self._code_span(final)
        return self._angle(final)

    def _code_span(self, final: bool) -> bool:
        m = _TICKS.match(self._buf, self._at)
        if m is None or (m.end() == len(self._buf) and not final):
            return False
        start = max(m.end(), self._at + self._span_seen)
        end, again = _code_span_end(self._buf, start, len(m[0]), final)
        if end is None:
            self._span_seen = again - self._at
            return False
        self._span_seen = 0
        if end < 0:  # literal backticks
            self._take(len(m[0]))
        else:
            self._settled = True
            self._take(end - self._at)
        return True

    def _angle(self, final: bool) -> bool:
        buf, at = self._buf, self._at
        if self._ends is not None:
            return self._in_reasoning(final)
        if not final and _may_grow_tag(buf, at):
            return False
        if not self._settled and (m := _DANGLING.match(buf, at)):
            # the reasoning began before the answer did: what came before was reasoning
            self._out, self._space = [], ""
            self._head = self._settled = True
            self._skip(m.end() - at)
        elif m := _OPEN_TAG.match(buf, at):  # not at the start: text about tags, kept as it is
            self._settled = True
            self._take(m.end() - at)
        elif m := _HEADER.match(buf, at) or _TOKEN.match(buf, at):
            self._skip(m.end() - at)
        else:
            self._take(1)
        return True

    def _in_reasoning(self, final: bool) -> bool:
        buf, at = self._buf, self._at
        for end in self._ends or ():
            if m := end.match(buf, at):
                # the next message's "<|start|>" header is read by the head
                self._skip(0 if m[0] == "<|start|>" else m.end() - at)
                self._ends, self._head, self._settled = None, True, True
                return True
        if (
            not final
            and buf[at] == "<"
            and len(buf) - at < _REASONING_REACH
            and ">" not in buf[at:]
        ):
            return False  # an end may be arriving
        self._skip(1)
        return True
