"""Text hygiene at the model boundary: user text in as data, reasoning leftovers out."""

from __future__ import annotations

import re

__all__ = ["strip_reasoning", "wrap_user_text"]

_USER_TAG = re.compile(r"<\s*/?\s*user_message\b[^>]*>", re.IGNORECASE)
_THINK_BLOCK = re.compile(
    r"<(think|thinking|reasoning|analysis)>.*?(</\1>|\Z)", re.IGNORECASE | re.DOTALL
)
# harmony / gemma-style channel markers, e.g. "<|channel|>analysis<|message|>...<|end|>"
_CHANNEL_BLOCK = re.compile(
    r"<\|channel\|>\s*(analysis|commentary)\s*<\|message\|>.*?(<\|end\|>|(?=<\|start\|>)|\Z)",
    re.DOTALL,
)
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>|<channel\|>|<\|channel>")
_THOUGHT_PREFIX = re.compile(r"\A\s*(thought|thinking)\s*\n(?=\s*<)", re.IGNORECASE)


def wrap_user_text(text: str) -> str:
    """Put what a person typed inside a <user_message> tag, after removing any such tags they
    typed themselves, so the model can tell data from instructions."""
    cleaned = _USER_TAG.sub("", text)
    return f"<user_message>\n{cleaned}\n</user_message>"


def strip_reasoning(text: str) -> str:
    """Remove reasoning-channel leftovers some models leak into the visible answer."""
    out = _THINK_BLOCK.sub("", text)
    out = _CHANNEL_BLOCK.sub("", out)
    out = _THOUGHT_PREFIX.sub("", out)
    out = _SPECIAL_TOKEN.sub("", out)
    # a dangling close tag means everything before it was reasoning
    m = re.search(r"</(think|thinking|reasoning)>", out, re.IGNORECASE)
    if m:
        out = out[m.end() :]
    return out.strip()
