"""Lone UTF-16 surrogates and NUL characters are mended at the edge (channels/mend.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from channels.mend import mend_json, mend_strings


def test_a_lone_half_or_a_nul_becomes_the_replacement_character() -> None:
    halves = (rb'"x \ud83d y"', rb'"\uDE00"', rb'"\ude00\ud83d"', rb'"\ud83d\ud83d\ude00"')
    for raw in (*halves, rb'"a \u0000 b"'):
        mended = json.loads(mend_json(raw))
        mended.encode()  # valid UTF-8 now
        assert "\ufffd" in mended


def test_pairs_and_escaped_backslashes_are_left_as_they_are() -> None:
    clean = (rb'"\ud83d\ude00"', rb'"\uD83D\uDE00 ok"', rb'"\\ud83d"', rb'"plain"', b'"\xc3\xa9"')
    for raw in clean:
        assert mend_json(raw) == raw
    assert mend_json(clean[-1]) is clean[-1]  # nothing to mend: not even copied
    assert json.loads(mend_json(rb'"\\\ud83d"')) == "\\\ufffd"  # a backslash, then a lone half


def test_decoded_values_are_mended_and_returned_as_they_are_when_clean() -> None:
    clean = {"a": ["b", {"c": 1, "d": None}], "é": "ü"}
    assert mend_strings(clean) is clean
    assert mend_strings({"a": ["x\ud83d"], "\udc00": 2}) == {"a": ["x\ufffd"], "\ufffd": 2}
    assert mend_strings(["a\x00b", "\ud83d\ude00"]) == ["a\ufffdb", "\U0001f600"]


@given(st.text(st.characters(exclude_categories=())))
def test_any_text_survives_the_round_trip(text: str) -> None:
    """Whatever json.dumps writes (it escapes every non-ASCII character, lone surrogates
    too), the mended body decodes to text that encodes as UTF-8, the same as the decoded
    value mended, and differs from the text only where a lone half was."""
    escaped = json.dumps(text)
    decoded = json.loads(mend_json(escaped.encode()))
    decoded.encode()
    assert decoded == mend_strings(json.loads(escaped))
    if len(decoded) == len(text):  # no two halves side by side, read as one pair
        assert all(a == b or b == "\ufffd" for a, b in zip(text, decoded, strict=True))
