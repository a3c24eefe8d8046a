"""Cuts between grapheme clusters and the Markdown parse (channels/text.py), which every
channel's formatter uses."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from channels.slack.chunk import sections
from channels.slack.format import to_mrkdwn
from channels.telegram.markdown import render as telegram_render
from channels.text import MAX_NESTING, cluster_cut, clusters, parse
from channels.whatsapp.format import chunk as whatsapp_chunk
from tests.text_samples import CLUSTERS, cluster_bounds


def test_clusters_are_what_a_person_sees_as_one_character() -> None:
    assert list(clusters("".join(CLUSTERS))) == CLUSTERS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=20), st.integers(1, 200))
def test_a_cut_falls_at_the_last_whole_cluster(sample: list[str], end: int) -> None:
    text = "".join(sample)
    end = min(end, len(text))
    bounds = cluster_bounds(sample)
    best = max(b for b in bounds if b <= end)
    assert cluster_cut(text, 0, end) == (best if best > 0 else end)


def test_one_cluster_longer_than_the_room_is_cut_at_the_end() -> None:
    long_cluster = "e" + "\u0301" * 10  # no whole cluster fits: the cut cannot step back
    assert cluster_cut(long_cluster, 0, 5) == 5


# Markdown nested past the parser's limit: markdown-it stops there and once dropped the rest
# of the reply (a list ten deep was the commonmark preset's limit).
_NESTED = {
    "a list ten deep": "".join("  " * i + f"- w{i}\n" for i in range(10)),
    "a list sixty deep": "".join("  " * i + f"- w{i}\n" for i in range(60)),
    "an ordered list sixty deep": "".join("   " * i + f"1. w{i}\n" for i in range(60)),
    "a quote twenty deep": "> " * 20 + "w20\n",
    "a quote two hundred deep": "> " * 200 + "w200\n" + "> " * 3 + "w3\n",
    "quoted lists": "> - " * 80 + "w80\n",
}
_AFTER = "- wsibling\n\nwend, the conclusion."


@pytest.mark.parametrize("markdown", _NESTED.values(), ids=_NESTED)
@pytest.mark.parametrize(
    "render",
    [
        lambda md: "\n".join(sections(to_mrkdwn(md))),
        lambda md: "\n".join(html for _, html in telegram_render(md).chunks()),
        lambda md: "\n".join(whatsapp_chunk(md)),
    ],
    ids=["slack", "telegram", "whatsapp"],
)
def test_no_channel_loses_text_however_deep_the_nesting(
    markdown: str, render: Callable[[str], str]
) -> None:
    md = markdown + _AFTER
    out = render(md)
    assert re.findall(r"\bw\w+", out) == re.findall(r"\bw\w+", md)


_RENDERERS = [
    lambda md: "\n".join(sections(to_mrkdwn(md))).replace("\u2217", "*"),  # Slack's inert *
    lambda md: "\n".join(html for _, html in telegram_render(md).chunks()),
    lambda md: "\n".join(whatsapp_chunk(md)).replace("\u200b", ""),
]


@pytest.mark.parametrize("md", ["2*3*4 = 24", "x = a*b + c*d", "un*break*able", "x*y* z"])
@pytest.mark.parametrize("render", _RENDERERS, ids=["slack", "telegram", "whatsapp"])
def test_a_single_asterisk_inside_a_word_stays_as_written(
    md: str, render: Callable[[str], str]
) -> None:
    """CommonMark reads the `*`s of 2*3*4 as italics: WhatsApp and Slack, which show no style
    inside a word, sent "234 = 24" (and "x = ab + cd"), and Telegram italicised the 3."""
    assert render(md) == md


@pytest.mark.parametrize("render", _RENDERERS, ids=["slack", "telegram", "whatsapp"])
def test_italics_at_word_edges_are_still_italics(render: Callable[[str], str]) -> None:
    out = render("this is *italic*, and *so is this*")
    assert "*italic*" not in out
    assert "italic" in out


def test_what_a_parser_gives_up_on_follows_as_plain_text() -> None:
    """Whatever the limit, the part read keeps its Markdown and the rest its text, as is."""
    md = MarkdownIt("commonmark", {"maxNesting": 4})  # two lists deep
    source = "**intro**\n\n- a\n  - b\n    - c\n- d\n\nlast *words*\nhere"
    tokens = parse(md, source)
    inline = [t for t in tokens if t.type == "inline"]
    assert [t.content for t in inline] == ["**intro**", "a", "- b\n- c\n- d", "last *words*\nhere"]
    assert "strong_open" in [c.type for c in inline[0].children or ()]
    assert "bullet_list_open" in [t.type for t in tokens]
    assert {c.type for t in inline[2:] for c in t.children or ()} == {"text", "softbreak"}


@pytest.mark.parametrize(
    "source",
    [
        "- a\n-\n- \n1.\n> q\n>\n> > \n",  # marker-only lines: empty items, blank quote lines
        "[ref]: https://example.com\n[ref]: https://example.org 'dup'\n\n[ref] text",
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n```\ncode\n```\n    indented\n***\nSetext\n===",
        "> - a\n>   - b\n>\n>   c\n\n<div>\nhtml\n</div>\n\r\nwindows\r\nlines\n",
    ],
)
def test_markdown_read_whole_is_left_as_markdown_it_reads_it(source: str) -> None:
    md = MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable(["table"])
    assert parse(md, source) == md.parse(source)
