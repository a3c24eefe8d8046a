"""Text no store can keep, mended at the edge: lone UTF-16 surrogates and NUL characters.

JSON may spell a character outside the Basic Multilingual Plane as a pair of escapes
(`\\ud83d\\ude00` is 😀), and a broken client can send half of a pair. Python decodes that half
to a lone surrogate, a `str` that cannot be encoded as UTF-8: the store, the model's request
and the platform's API would each fail on it, long after the webhook was accepted, and the
rest of its notification would be lost with it. `\\u0000` decodes to a NUL character, which
PostgreSQL refuses in any text column (the message would be stored, then never answered). So
each is replaced by U+FFFD (the replacement character) before anything reads it, and the
message keeps everything else.

The check costs one scan of the body for `\\uD8`-`\\uDF` and `\\u0000` escapes; only a body
that has them is rewritten, and a whole pair is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["mend_json", "mend_strings"]

_ANY = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")
# left to right: an escaped backslash (so `\\ud83d` stays text), a whole pair, what to mend
_ESCAPE = re.compile(
    rb"\\\\"
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\\u0000"
)
_UNSAFE = re.compile("[\x00\ud800-\udfff]")
_REPLACEMENT = b"\\ufffd"


def _mend_escape(m: re.Match[bytes]) -> bytes:
    token = m[0]
    return _REPLACEMENT if len(token) == 6 else token


def mend_json(raw: bytes) -> bytes:
    """JSON text with every lone surrogate escape and `\\u0000` replaced by `\\ufffd`; the same
    object when there is none (nearly always)."""
    if _ANY.search(raw) is None:
        return raw
    return _ESCAPE.sub(_mend_escape, raw)


def mend_strings(value: Any) -> Any:
    """`value` (decoded JSON or a form: dicts, lists, strings, numbers) with every lone
    surrogate and NUL in its strings and keys replaced by U+FFFD (two halves side by side
    become their character); the same object when there is none."""
    return _mended(value) if _unsafe(value) else value


def _unsafe(value: Any) -> bool:
    if isinstance(value, str):
        return _UNSAFE.search(value) is not None
    if isinstance(value, dict):
        return any(_unsafe(k) or _unsafe(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unsafe(v) for v in value)
    return False


def _mended(value: Any) -> Any:
    if isinstance(value, str):
        paired = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return paired.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_mended(k): _mended(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mended(v) for v in value]
    return value
