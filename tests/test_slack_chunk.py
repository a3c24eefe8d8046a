"""Chunking long mrkdwn into sections: styles, quotes and code blocks stay whole in each one."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.slack.adapter import render
from channels.slack.chunk import SECTION_LIMIT, sections
from channels.slack.format import escape, to_mrkdwn
from core.models import Reply
from tests.fake_slack import mrkdwn_problems
from tests.text_samples import CLUSTERS, JOINED, cluster_bounds

_FENCE_LINE = re.compile(r" *```\S*")
_CODE_WORD = re.compile(r"\bc\d+ =")
# generated words: where (t top level, q quote, l list item) and style (b, i, s, or p plain)
_WORD = re.compile(r"(?<![a-z0-9])[tql][bisp]\d+")
_STYLE_OF = {"b": "*", "i": "_", "s": "~"}


@pytest.mark.parametrize(("markdown", "mark"), [("**", "*"), ("*", "_"), ("~~", "~")])
def test_a_long_styled_span_is_closed_and_reopened_at_each_cut(markdown: str, mark: str) -> None:
    words = " ".join(f"word{i}" for i in range(1000))
    parts = sections(to_mrkdwn(f"{markdown}{words}{markdown}"))
    assert len(parts) > 2
    for part in parts:
        assert len(part) <= SECTION_LIMIT
        assert part.startswith(mark)
        assert part.endswith(mark)
    assert " ".join(part[1:-1] for part in parts) == words


def test_a_span_longer_than_a_section_is_cut_inside_a_word_and_still_closed() -> None:
    parts = sections(to_mrkdwn("before **" + "z" * 7000 + "** after"))
    assert len(parts) > 2
    assert all(len(part) <= SECTION_LIMIT for part in parts)
    assert parts[0].startswith("before *z")
    assert parts[-1].endswith("z* after")
    assert all(re.fullmatch(r"\*z+\*", part) for part in parts[1:-1])
    assert "".join(parts).count("z") == 7000


def test_each_continued_line_of_a_long_quote_starts_with_the_quote_mark() -> None:
    words = " ".join(f"quoted{i}" for i in range(800))
    parts = sections(to_mrkdwn(f"> {words}\n> *and a last line*"))
    assert len(parts) > 2
    lines = [line for part in parts for line in part.split("\n")]
    assert all(line.startswith("> ") for line in lines)
    assert " ".join(line[2:] for line in lines) == f"{words} _and a last line_"


def test_a_long_code_block_in_a_list_item_is_fenced_in_every_section() -> None:
    code = "\n".join(f"   x{i} = {i}x{i} = {i}x{i} = {i}" for i in range(300))
    parts = sections(to_mrkdwn(f"1. Step one:\n\n   ```\n{code}\n   ```\n2. Step two"))
    assert len(parts) > 2
    for part in parts:
        assert len(part) <= SECTION_LIMIT
        assert re.findall(r"^ *```$", part, re.MULTILINE) == ["   ```", "   ```"]
    assert parts[0].startswith("1. Step one:\n   ```\n")
    assert parts[-1].endswith("\n   ```\n2. Step two")
    inside = [line for part in parts for line in _code_lines(part)]
    assert inside == code.split("\n")


@pytest.mark.parametrize("fence", ["```", "```python", "   ```", "   ```js"])
def test_a_cut_code_block_reopens_with_its_own_fence(fence: str) -> None:
    pad = fence[: len(fence) - len(fence.lstrip())]
    code = "\n".join(f"{pad}line {i:04d} &lt;tag&gt;" for i in range(600))
    parts = sections(f"{fence}\n{code}\n{pad}```")
    assert len(parts) > 1
    for part in parts:
        assert part.startswith(f"{fence}\n")
        assert part.endswith(f"\n{pad}```")
    assert [line for part in parts for line in _code_lines(part)] == code.split("\n")


def test_a_list_item_opening_with_a_long_code_block_is_fenced_in_every_section() -> None:
    """With the fence on the bullet line, a section opened a code block it never closed,
    the next item landed inside code, and `*ptr *` in the code was paired as bold."""
    code = [f"  line_{i} = *ptr * 2; // note" for i in range(150)]
    parts = sections(to_mrkdwn("- ```\n" + "\n".join(code) + "\n  ```\n- next item"))
    assert len(parts) > 1
    for part in parts:
        assert len(part) <= SECTION_LIMIT
        assert mrkdwn_problems(part) == []
        assert re.findall(r"^ *```$", part, re.MULTILINE) == ["  ```", "  ```"]
        outside = [line for line in part.split("\n") if line not in _code_lines(part)]
        assert not [line for line in outside if "line_" in line]
    assert [line for part in parts for line in _code_lines(part)] == code
    assert parts[-1].endswith("\n  ```\n• next item")


def test_a_link_longer_than_a_section_becomes_its_label_and_site() -> None:
    """A presigned URL of 3250 chars was cut inside `<url|label>` (raw markup in Slack)."""
    url = "https://files.example.com/r.pdf?X-Amz-Signature=" + "a1b2" * 800
    (message,) = render(Reply(text=f"Download: [the signed report]({url}) now."))
    texts = [block["text"]["text"] for block in message.blocks]
    assert texts == [
        "Download: the signed report (link to files.example.com too long for Slack) now."
    ]


@pytest.mark.parametrize("lead", ["", "word " * 300, "x" * 1000, "> ", "*bold ", "_it ~st "])
def test_a_link_that_does_not_fit_a_section_never_splits(lead: str) -> None:
    """A link starts the next section when the rest of this one cannot hold it, and one
    longer than a whole section (with its quote and styles) is shown unlinked."""
    fits = "<https://a.example/" + "f" * 2900 + "|fits>"
    too_long = "<https://b.example/" + "g" * 2990 + "|too long>"
    text = f"{lead}{fits} {too_long} {fits}{'*' if '*' in lead else ''} end"
    parts = sections(text)
    for part in parts:
        assert len(part) <= SECTION_LIMIT
        assert mrkdwn_problems(part) == []
        assert re.sub(r"<[^<>\n]*>", "", part).count("<") == 0
    joined = "\n".join(parts)
    assert joined.count(fits) == 2
    assert "too long (link to b.example too long for Slack)" in joined


_LINKS = st.builds(
    lambda n, label: f"<https://l.example/{'u' * n}{'|' + label if label else ''}>",
    st.integers(0, 3500),
    st.sampled_from(["", "label", "two words", "&amp; x"]),
)
_LINE_PARTS = st.lists(
    st.one_of(_LINKS, st.sampled_from(["w", "word", "*b", "b*", "_i", "i_", "x" * 900])),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "> "]), _LINE_PARTS), min_size=1, max_size=3))
def test_links_are_never_cut(lines: list[tuple[str, list[str]]]) -> None:
    text = "\n".join(quote + " ".join(parts) for quote, parts in lines)
    links = set(re.findall(r"<[^<>\n]*>", text))
    for part in sections(text):
        assert len(part) <= SECTION_LIMIT
        assert mrkdwn_problems(part) == []
        assert set(re.findall(r"<[^<>\n]*>", part)) <= links
        assert re.sub(r"<[^<>\n]*>", "", part).count("<") == 0


@pytest.mark.parametrize("cluster", JOINED)
def test_a_hard_cut_never_splits_a_grapheme_cluster(cluster: str) -> None:
    text = "x" + cluster * (7000 // len(cluster))
    parts = sections(text)
    assert len(parts) > 1
    assert "".join(parts) == text
    assert all(len(part) <= SECTION_LIMIT for part in parts)
    assert all(part.startswith(cluster) for part in parts[1:])


# what joins the character before it into one cluster: a combining accent, a zero-width
# joiner, a skin tone, an emoji variation selector
_JOINERS = ["\u0301", "\u200d", "\U0001f3fd", "\ufe0f"]


@pytest.mark.parametrize("joiner", _JOINERS)
@pytest.mark.parametrize("char", [">", "<", "&"])
def test_a_cut_never_falls_inside_an_entity_joined_to_what_follows(joiner: str, char: str) -> None:
    """`&gt;` and a combining accent are one cluster: stepping back to its start put the cut
    inside the entity (raw `&gt` in one section, `;` in the next)."""
    entity = escape(char)
    text = "a" * (SECTION_LIMIT - len(entity)) + entity + joiner + "b" * 100
    parts = sections(text)
    assert "".join(parts) == text
    assert all(mrkdwn_problems(part) == [] for part in parts)
    assert parts[1].startswith(entity + joiner)


@pytest.mark.parametrize("joiner", _JOINERS)
def test_a_cut_never_falls_inside_a_link_joined_to_what_follows(joiner: str) -> None:
    """A link filling a whole section and then a joining character: the cut went before
    the link's `>`; it goes after it (the link cannot move to the next section)."""
    link = "<https://example.com/" + "a" * (SECTION_LIMIT - 24) + "|x>"
    parts = sections(f"{link}{joiner} rest")
    assert parts == [link, f"{joiner} rest"]
    assert all(mrkdwn_problems(part) == [] for part in parts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=60), st.integers(8, 40))
def test_hard_cuts_fall_between_grapheme_clusters(clusters: list[str], limit: int) -> None:
    text = "".join(clusters)
    parts = sections(text, limit)
    assert "".join(parts) == text
    assert all(len(part) <= limit for part in parts)
    assert cluster_bounds(parts) <= cluster_bounds(clusters)


def _code_lines(part: str) -> list[str]:
    lines, inside = [], False
    for line in part.split("\n"):
        if _FENCE_LINE.fullmatch(line):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def _words(where: str, style: str, n: int, sep: str) -> str:
    return sep.join(f"{where}{style}{i}" for i in range(n))


def _span(where: str) -> st.SearchStrategy[str]:
    """A styled run of words (some long enough to fill several sections, some on many
    lines), now and then with a span of another style inside."""
    count = st.integers(1, 30) | st.integers(400, 1200)
    sep = st.sampled_from([" ", " ", "\n"])
    plain = st.builds(lambda n, s: _words(where, "p", n, s), count, sep)
    styles = st.sampled_from([("**", "b"), ("_", "i"), ("~~", "s")])
    simple = st.builds(
        lambda m, n, s: f"{m[0]}{_words(where, m[1], n, s)}{m[0]}", styles, count, sep
    )

    def nested(outer: tuple[str, str], inner: tuple[str, str], n: int) -> str:
        body = f"{inner[0]}{_words(where, inner[1], n, ' ')}{inner[0]}"
        return f"{outer[0]}{where}{outer[1]}0 {body} {where}{outer[1]}1{outer[0]}"

    pair = st.tuples(styles, styles).filter(lambda p: p[0] != p[1])
    return plain | simple | st.builds(lambda p, n: nested(p[0], p[1], n), pair, count)


def _paragraph(where: str) -> st.SearchStrategy[str]:
    return st.lists(_span(where), min_size=1, max_size=3).map(" ".join)


_CODE = st.integers(1, 250).map(
    lambda n: [f"c{i} = x_{i} * y ~ z & <w> {'=' * (i % 90)}" for i in range(n)]
)
BLOCKS = st.one_of(
    _paragraph("t"),
    st.integers(1, 30).map(lambda n: "# " + _words("t", "b", n, " ")),
    _paragraph("q").map(lambda text: "> " + text.replace("\n", "\n> ")),
    _CODE.map(lambda lines: "```\n" + "\n".join(lines) + "\n```"),
    st.builds(
        lambda intro, lines, tail: (
            f"1. {intro}\n   ```\n"
            + "".join(f"   {line}\n" for line in lines)
            + f"   ```\n2. {tail}"
        ),
        _paragraph("l"),
        _CODE,
        _paragraph("l"),
    ),
    st.lists(_paragraph("l"), min_size=1, max_size=3).map(
        lambda items: "\n".join(f"- {item.replace(chr(10), ' ')}" for item in items)
    ),
    st.builds(  # a list item that opens with its code block
        lambda lines, tail: (
            "- ```\n" + "".join(f"  {line}\n" for line in lines) + f"  ```\n- {tail}"
        ),
        _CODE,
        _paragraph("l"),
    ),
)
LONG = st.lists(BLOCKS, min_size=1, max_size=4).map("\n\n".join)


def _check_section(part: str) -> None:
    """Within the limit, fences even, every style opened and closed next to its text in the
    section, every word still in its style, its quote, or its code block."""
    assert 0 < len(part) <= SECTION_LIMIT
    assert mrkdwn_problems(part) == []
    code, stack = False, list[str]()
    for line in part.split("\n"):
        if _FENCE_LINE.fullmatch(line):
            code = not code
            continue
        assert code == bool(_CODE_WORD.search(line)), line[:80]
        if code:
            continue
        if re.search(r"(?<![a-z0-9])q[bisp]\d", line):
            assert line.startswith("> "), line[:80]
        for match in re.finditer(rf"[*_~]|{_WORD.pattern}", line):
            token, at = match.group(), match.start()
            if token in "*_~" and stack and stack[-1] == token:
                assert at > 0, line[:80]
                assert not line[at - 1].isspace(), line[:80]
                stack.pop()
            elif token in "*_~":
                assert not line[at + 1 : at + 2].isspace(), line[:80]
                stack.append(token)
            elif token[1] == "p":
                assert not stack, token
            else:
                assert _STYLE_OF[token[1]] in stack, token
    assert not code
    assert not stack


@settings(max_examples=60, deadline=None)
@given(LONG)
def test_every_section_is_whole_and_together_they_keep_everything(markdown: str) -> None:
    out = to_mrkdwn(markdown)
    parts = sections(out)
    for part in parts:
        _check_section(part)
    joined = "\n".join(parts)
    assert _WORD.findall(joined) == _WORD.findall(out)
    assert _CODE_WORD.findall(joined) == _CODE_WORD.findall(out)
    assert "".join(filter(str.isalnum, joined)) == "".join(filter(str.isalnum, out))
