"""Text hygiene at the model boundary: user text in as data, reasoning leftovers out, and an
answer that would show nothing taken for no answer."""

from __future__ import annotations

import re
import unicodedata

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["StreamFilter", "shows_nothing", "strip_reasoning", "wrap_user_text"]

_USER_TAG = re.compile(r"<\s*/?\s*user_message\b[^>]*>", re.IGNORECASE)
_THINK_BLOCK = re.compile(
    r"<(think|thinking|reasoning|analysis)>.*?(</\1>|\Z)", re.IGNORECASE | re.DOTALL
)
# harmony / gemma-style channel markers, e.g. "<|channel|>analysis<|message|>...<|end|>"
_CHANNEL_BLOCK = re.compile(
    r"<\|channel\|>\s*(analysis|commentary)\s*<\|message\|>.*?(<\|end\|>|(?=<\|start\|>)|\Z)",
    re.DOTALL,
)
# the header of the final channel: "<|start|>assistant<|channel|>final<|message|>"
_CHANNEL_HEADER = re.compile(r"(<\|start\|>[a-z_]*)?(<\|channel\|>[a-z_]*)?<\|message\|>")
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>|<channel\|>|<\|channel>")
_THOUGHT_PREFIX = re.compile(r"\A\s*(thought|thinking)\s*\n(?=\s*<)", re.IGNORECASE)


_ENTITY = re.compile(r"&#?[0-9A-Za-z]+;")
_HTML = re.compile(r"<!--.*?-->|<[^>\n]*>", re.DOTALL)
_FENCE_LINE = re.compile(r"^[ \t]*(?:`{3,}|~{3,}).*$", re.MULTILINE)
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_MD = MarkdownIt("commonmark")


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
    """Remove reasoning-channel leftovers some models leak into the visible answer."""
    out = _THINK_BLOCK.sub("", text)
    out = _CHANNEL_BLOCK.sub("", out)
    out = _CHANNEL_HEADER.sub("", out)
    out = _THOUGHT_PREFIX.sub("", out)
    out = _SPECIAL_TOKEN.sub("", out)
    # a dangling close tag means everything before it was reasoning
    m = re.search(r"</(think|thinking|reasoning)>", out, re.IGNORECASE)
    if m:
        out = out[m.end() :]
    return out.strip()


_OPEN_THINK = re.compile(r"<(think|thinking|reasoning|analysis)>", re.IGNORECASE)
_HOLD = 12  # longest partial opening tag worth holding back


class StreamFilter:
    """Drops <think>…</think>-style blocks from streamed text, even when a tag is split across
    chunks, so live previews never show reasoning the final reply will not contain."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside: str | None = None

    def feed(self, chunk: str) -> str:
        self._buf += chunk
        out: list[str] = []
        while True:
            if self._inside is not None:
                close = f"</{self._inside}>"
                end = self._buf.lower().find(close)
                if end < 0:
                    self._buf = self._buf[-(len(close) - 1) :]
                    return "".join(out)
                self._buf, self._inside = self._buf[end + len(close) :], None
                continue
            m = _OPEN_THINK.search(self._buf)
            if m is not None:
                out.append(self._buf[: m.start()])
                self._buf, self._inside = self._buf[m.end() :], m.group(1).lower()
                continue
            lt = self._buf.rfind("<")
            if lt >= 0 and len(self._buf) - lt < _HOLD and ">" not in self._buf[lt:]:
                out.append(self._buf[:lt])
                self._buf = self._buf[lt:]
            else:
                out.append(self._buf)
                self._buf = ""
            return "".join(out)

    def flush(self) -> str:
        """What is held back at the end of a stream (nothing, if a block never closed)."""
        rest, self._buf = ("" if self._inside else self._buf), ""
        return rest
