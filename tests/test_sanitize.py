"""Reasoning leftovers out of answers, and nothing else: tags an answer quotes stay."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.agent.sanitize import StreamFilter, strip_reasoning


def streamed(text: str, cuts: list[int]) -> str:
    """What a StreamFilter passes on when text arrives cut at `cuts`."""
    f = StreamFilter()
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    return "".join(f.feed(text[a:b]) for a, b in itertools.pairwise(bounds)) + f.flush()


# answers that only talk about reasoning tags: nothing in them is reasoning
KEPT = [
    # report item 1: text after (or before) a tag quoted in code was deleted
    "Wrap the model's notes in `<analysis>` tags, then parse them.\n\nStep 2: send the result.",
    "Close it with `</think>` when done. Then continue.",
    "```xml\n<thinking>draft</thinking>\n<answer>42</answer>\n```",
    "GPT-2 ends documents with `<|endoftext|>`; Qwen uses ``<|im_end|>``.",
    "Example:\n\n~~~\n<think>\nplan\n</think>\n<|im_start|>assistant\n~~~\n\nThat is all.",
    "- a list item with code:\n  ```\n  </thinking> and <reasoning>\n  ```\n- next",
    "> quoted code\n> ```\n> </think><|end|>\n> ```",
    # a tag after the start of the answer is text
    "Answer first. Models wrap notes in <thinking> tags.",  # an unclosed tag mid-answer
    "Use <think>…</think> around the plan, then answer.",
    "Answer.\n\n<reasoning>this is part of the answer</reasoning>\n\nMore.",
    # a close tag after code, or after an opening tag, ends no reasoning
    "Run `make`, then close the block with </think>.",
    "```\ncode\n```\nThen </thinking> ends it.",
    "Use <think>x</think> and </think> again.",
]


@pytest.mark.parametrize("text", KEPT)
@pytest.mark.parametrize("step", [2, 3])
def test_text_that_only_mentions_reasoning_tags_is_kept(text: str, step: int) -> None:
    assert strip_reasoning(text) == text
    assert streamed(text, list(range(0, len(text), step))) == text


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\n  <think>plan</think>\n\nWe open at 8.", "We open at 8."),
        ("<think>a</think><THINKING>b</THINKING>\nWe open at 8.", "We open at 8."),
        # the reasoning's own quoted close tag does not end it
        ("<think>end with `</think>`, then answer</think>We open at 8.", "We open at 8."),
        ("<think>```\n</think>\n```\nstill thinking</think>We open at 8.", "We open at 8."),
        ("<think>a stray ` backtick</think>We open at 8.", "We open at 8."),
        (
            "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>final"
            "<|message|>We open at 8.<|return|>",
            "We open at 8.",
        ),
        ("<think >plan</think >We open at 8.", "We open at 8."),
        ("<seed:think>plan</seed:think>We open at 8.", "We open at 8."),
        ("<reflection>was I right?</reflection>\nWe open at 8.", "We open at 8."),
        ("<start_of_turn>model\nWe open at 8.<end_of_turn>", "We open at 8."),
    ],
)
def test_reasoning_at_the_start_is_removed(raw: str, clean: str) -> None:
    assert strip_reasoning(raw) == clean
    assert streamed(raw, list(range(0, len(raw), 2))) == clean


def test_a_dangling_close_tag_with_a_space_ends_the_reasoning() -> None:
    assert strip_reasoning("plan</think >We open at 8.") == "We open at 8."


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("the user wants hours</think>\n\nWe open at 8.", "We open at 8."),
        ("plan</reasoning>Use `open()` at 8.", "Use `open()` at 8."),
    ],
)
def test_a_close_tag_before_any_code_ends_reasoning_begun_before_the_answer(
    raw: str, clean: str
) -> None:
    assert strip_reasoning(raw) == clean
    # a preview cannot take back what it showed; what follows the tag is the same
    assert streamed(raw, list(range(0, len(raw), 2))).endswith(clean)


def test_each_stream_is_a_new_answer() -> None:
    """The loop uses one filter for every model call of a run; an unclosed block in one call
    once hid everything the next call streamed."""
    f = StreamFilter()
    assert f.feed("<think>no end") + f.flush() == ""
    assert f.feed("We open at 8.") + f.flush() == "We open at 8."


# pieces of answers that exercise every rule, split at random points
_PIECES = st.sampled_from(
    [
        *["<think>", "</think>", "<THINKING>", "</thinking>", "<reasoning>", "</reasoning>"],
        *["<analysis>", "</analysis>", "<|im_end|>", "<|channel|>", "analysis", "final"],
        *["<|message|>", "<|end|>", "<|start|>", "assistant", "<channel|>", "thought"],
        *["`", "``", "```", "~~~", "\n", "\n\n", " ", "a", "b c", "\\", "<", ">", "- ", "> "],
        *["1. ", "    ", "<b>", "<think >", "</think\t>", "<seed:think>", "</seed:think>"],
        *["<reflection>", "</reflection>", "<start_of_turn>", "model", "<end_of_turn>"],
    ]
)
_DANGLING = re.compile(r"</(think|thinking|reasoning|seed:think)[ \t]{0,4}>", re.IGNORECASE)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join), st.lists(st.integers(0, 10_000), max_size=12))
def test_the_stream_shows_what_the_final_answer_shows(text: str, cuts: list[int]) -> None:
    """Only text before a dangling close tag, already shown, cannot be taken back."""
    final, shown = strip_reasoning(text), streamed(text, cuts)
    assert shown.endswith(final)
    if not _DANGLING.search(text):
        assert shown == final


_CODE_TEXT = st.lists(_PIECES.filter(lambda p: "`" not in p and "\n" not in p), max_size=20)


@settings(max_examples=200, deadline=None)
@given(_CODE_TEXT.map("".join).filter(lambda s: s.strip() == s and s))
def test_code_spans_are_never_altered(code: str) -> None:
    text = f"See `{code}` here."
    assert strip_reasoning(text) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(_CODE_TEXT.map("".join), min_size=1, max_size=5))
def test_fenced_code_is_never_altered(lines: list[str]) -> None:
    text = "Intro.\n\n```\n" + "\n".join(lines) + "\n```\n\nOutro."
    assert strip_reasoning(text) == text
