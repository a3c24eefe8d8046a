"""Markdown to mrkdwn, and chunking under Slack's limits (examples and property tests)."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from channels.slack import format as slack_format
from channels.slack.chunk import BUTTON_TEXT, SECTION_LIMIT, _marks, messages, sections
from channels.slack.format import to_mrkdwn
from channels.text import parse
from tests.fake_slack import mrkdwn_problems
from tests.text_samples import JOINED

_MD = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
_LINK = re.compile(r"<([^<>|]*)\|([^<>]*)>")
_BARE = re.compile(r"<([^<>|]*)>")
# what the renderer shows instead of a marker Slack would read: asterisk operator, modifier
# letter low macron, tilde operator, modifier letter grave accent
_LOOKALIKES = {"\u2217": "*", "\u02cd": "_", "\u223c": "~", "\u02cb": "`"}


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**b**", "*b*"),
        ("*i* and _i_", "_i_ and _i_"),
        ("~~s~~", "~s~"),
        ("[t](https://u.example/x)", "<https://u.example/x|t>"),
        ("<https://auto.example>", "<https://auto.example>"),
        ("# Title\n\ntext", "*Title*\n\ntext"),
        ("## **Bold** title", "*Bold title*"),
        ("a & b < c > d", "a &amp; b &lt; c &gt; d"),
        ("- one\n- two\n  - deep", "• one\n• two\n  ◦ deep"),
        ("3. three\n4. four", "3. three\n4. four"),
        (
            "```python\nif a < b && c:\n    pass\n```",
            "```\nif a &lt; b &amp;&amp; c:\n    pass\n```",
        ),
        ("`x<y`", "`x&lt;y`"),
        ("> quoted\n> more", "> quoted\n> more"),
        ("[t](https://u.example/?a=1&b=2|3)", "<https://u.example/?a=1&amp;b=2%7C3|t>"),
        ("[docs](relative/path)", "docs (relative/path)"),
        ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
        ("<!channel> and <@U123>", "&lt;!channel&gt; and &lt;@U123&gt;"),
    ],
)
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn


def test_a_list_item_opening_with_a_code_block_has_its_fence_on_a_line_of_its_own() -> None:
    """The fence went on the bullet line (`• ```), where neither Slack nor the chunker
    opens a code block."""
    markdown = "- ```\n  x = *ptr * 2\n  ```\n- next item\n\n1. ```\n   y\n   ```"
    assert to_mrkdwn(markdown) == (
        "•\n  ```\n  x = *ptr * 2\n  ```\n• next item\n\n1.\n   ```\n   y\n   ```"
    )


def test_inline_code_holding_a_backtick_stays_one_code_span() -> None:
    """`a`b` ended the span after `a` in Slack; the backtick now shows as a look-alike."""
    out = to_mrkdwn("Run `` a`b `` now, or ``` `` ```.")
    assert out == "Run `a\u02cbb` now, or `\u02cb\u02cb`."
    assert _marks([out]) == [[(4, "`", True), (8, "`", False), (18, "`", True), (21, "`", False)]]


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        (r"\*not bold\* and \_not italic\_", "\u2217not bold\u2217 and \u02cdnot italic\u02cd"),
        (
            r"\~~not struck\~~ and \`not code\`",
            "\u223c\u223cnot struck\u223c\u223c and \u02cbnot code\u02cb",
        ),
        (r"**bold \* star**", "*bold * star*"),
        (r"**a\*.**", "*a\u2217.*"),
        ("snake_case_name, 2 * 3 and a ~ b", "snake_case_name, 2 * 3 and a ~ b"),
        ("the **API**s, foo*bar*baz and ~~pre~~fix", "the APIs, foo\u2217bar\u2217baz and prefix"),
        ("**a***b*", "*a*_b_"),
        ("~~a ~~b~~ c~~", "~a b c~"),
        ("| **h** | x |\n|---|---|\n| 1 | 2 |", "*h | x*\n1 | 2"),
        (
            "see https://example.com/~ann/_x or www.x.org/*y",
            "see https://example.com/~ann/_x or www.x.org/*y",
        ),
    ],
)
def test_escaped_or_intraword_markers_never_show_as_live_or_stray_formatting(
    markdown: str, mrkdwn: str
) -> None:
    """Escaped markers became Slack formatting, and `*API*s` showed its asterisks."""
    assert to_mrkdwn(markdown) == mrkdwn


def _as_slack_shows(mrkdwn: str) -> str:
    """The text Slack shows, by the chunker's own pairing model: paired markers hidden,
    look-alikes read as what they stand for, entities decoded."""
    lines = mrkdwn.split("\n")
    shown = []
    for line, marks in zip(lines, _marks(lines), strict=True):
        hidden = {i for i, _, _ in marks}
        shown.append("".join(ch for i, ch in enumerate(line) if i not in hidden))
    text = "\n".join(shown)
    for lookalike, ch in _LOOKALIKES.items():
        text = text.replace(lookalike, ch)
    return html.unescape(text)


_INLINE = st.lists(
    st.sampled_from(
        [
            *["word", "API", "s", "2", " ", " ", ".", ",", "(", ")", "&", "a_b", "é"],
            *["*", "**", "***", "_", "__", "~", "~~", "`", "``", "`c*d_e`"],
            *[r"\*", r"\_", r"\~", r"\`", r"\**"],
        ]
    ),
    max_size=30,
).map(lambda tokens: "w " + "".join(tokens))


@settings(max_examples=400, deadline=None)
@given(_INLINE)
def test_slack_shows_the_text_markdown_shows_with_no_stray_or_extra_marker(
    markdown: str,
) -> None:
    """Every marker we write pairs up where Slack reads it, and no character of the
    author's (escaped or not) does: what is left is the visible text of the Markdown."""
    out = to_mrkdwn(markdown)
    assert mrkdwn_problems(out) == []
    assert _as_slack_shows(out).strip() == _visible_markdown(markdown).strip()


def _visible_markdown(markdown: str) -> str:
    """As every channel reads it: markdown-it, with a single `*` inside a word kept."""
    rendered = _MD.renderer.render(parse(_MD, markdown), _MD.options, {})
    return html.unescape(re.sub(r"<[^>]+>", "", rendered))


def _visible_mrkdwn(mrkdwn: str) -> str:
    text = _BARE.sub(r"\1", _LINK.sub(r"\2", mrkdwn)).replace("\u200b", "")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def _is_subsequence(needle: str, haystack: str) -> bool:
    it = iter(haystack)
    return all(ch in it for ch in needle)


_TOKENS = st.sampled_from(
    [
        "**",
        "*",
        "_",
        "~~",
        "`",
        "```\n",
        "\n```\n",
        "# ",
        "\n- ",
        "\n1. ",
        "\n> ",
        "\n\n",
        "\n",
        "[t](https://u.example/a&b)",
        "<https://auto.example>",
        "![alt](https://img.example/i.png)",
        "[rel](p q)",
        "<b>",
        "&",
        "<",
        ">",
        "|",
        "\\",
        "<@U1>",
        "<!here>",
        "| a | b |\n|---|---|\n| 1 | 2 |\n",
        "&amp;",
        "&copy;",
        "\n    indented code\n",
        "\n[a]: https://ref.example\n",
        "[a]",
        "\n---\n",
    ]
)
_WORDS = st.text(alphabet="abcXYZ019 .-()[]!#", min_size=1, max_size=12)
MARKDOWN = st.lists(st.one_of(_TOKENS, _WORDS), max_size=40).map("".join)


@pytest.mark.parametrize("unit", ["*a*_b_", "**a**~~b~~"])
def test_hiding_markers_grows_with_the_reply_not_its_square(
    unit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Styles glued together hide one another's markers (`*a*_b_` repeated): one pass over
    all markers per hidden style took 6 s for 6,000 characters, on the event loop."""
    looked_at = [0]
    readable = slack_format._readable

    def counted(*args: Any) -> bool:
        looked_at[0] += 1
        return readable(*args)

    monkeypatch.setattr(slack_format, "_readable", counted)

    def work(n: int) -> int:
        looked_at[0] = 0
        to_mrkdwn(unit * n + "x")
        return looked_at[0]

    assert work(400) < 5 * work(100)  # linear: ~4x, quadratic: 16x


@settings(max_examples=300, deadline=None)
@given(MARKDOWN)
def test_output_has_no_raw_control_characters_and_keeps_the_visible_text(markdown: str) -> None:
    out = to_mrkdwn(markdown)
    assert mrkdwn_problems(out) == []
    assert _is_subsequence(_alnum(_visible_markdown(markdown)), _alnum(_visible_mrkdwn(out)))


LONG = st.lists(
    st.one_of(
        MARKDOWN,
        st.integers(1, 400).map(
            lambda n: "```\n" + "\n".join(f"x = {i} & y" for i in range(n)) + "\n```"
        ),
        st.integers(1, 5000).map(lambda n: "word " * n),
        st.integers(3001, 7000).map(lambda n: "z" * n),
    ),
    max_size=8,
).map("\n\n".join)


@settings(max_examples=60, deadline=None)
@given(LONG)
def test_sections_fit_close_their_code_blocks_and_keep_everything_in_order(markdown: str) -> None:
    out = to_mrkdwn(markdown)
    parts = sections(out)
    for part in parts:
        assert 0 < len(part) <= SECTION_LIMIT
        assert mrkdwn_problems(part) == []
    assert _alnum(_visible_mrkdwn("".join(parts))) == _alnum(_visible_mrkdwn(out))


def test_a_cut_code_block_is_closed_and_reopened() -> None:
    code = "```\n" + "\n".join(f"line {i:04d} <tag>" for i in range(600)) + "\n```"
    parts = sections(to_mrkdwn(code))
    assert len(parts) > 1
    for part in parts:
        assert part.startswith("```\n")
        assert part.endswith("\n```")
    lines = [line for p in parts for line in p.split("\n") if line != "```"]
    assert lines == [f"line {i:04d} &lt;tag&gt;" for i in range(600)]


def test_a_long_line_is_cut_at_spaces_outside_links_and_entities() -> None:
    text = " ".join(["<https://example.com/a|a link with spaces>", "&amp;"] * 400)
    for part in sections(text):
        assert len(part) <= SECTION_LIMIT
        assert mrkdwn_problems(part) == []


def test_messages_stay_under_fifty_blocks_and_always_have_fallback_text() -> None:
    parts = [f"section {i}" for i in range(120)]
    batch = messages(parts, [(f"b{i}", f"v{i}") for i in range(30)])
    assert all(len(m.blocks) <= 50 for m in batch)
    assert all(m.text for m in batch)
    texts = [b["text"]["text"] for m in batch for b in m.blocks if b["type"] == "section"]
    assert texts == parts
    actions = [b for m in batch for b in m.blocks if b["type"] == "actions"]
    assert [len(a["elements"]) for a in actions] == [25, 5]


def test_buttons_are_cut_to_slack_limits() -> None:
    (message,) = messages([], [("L" * 200, "v" * 3000), ("", "only-value")])
    first, second = message.blocks[0]["elements"]
    assert len(first["text"]["text"]) == BUTTON_TEXT
    assert len(first["value"]) == 2000
    assert second["text"]["text"] == "only-value"
    assert message.text  # the labels stand in for the notification text


def test_button_labels_standing_in_for_the_text_ping_no_one() -> None:
    """Buttons alone went out with their raw labels as the message's text, which Slack reads
    as mrkdwn: a label `<!channel> yes` notified the whole channel."""
    (message,) = messages([], [("<!channel> yes", "y"), ("<@U0ADMIN> no", "n")])
    assert message.text == "&lt;!channel&gt; yes · &lt;@U0ADMIN&gt; no"
    assert message.blocks[0]["elements"][0]["text"]["text"] == "<!channel> yes"  # plain text


@pytest.mark.parametrize("cluster", JOINED)
def test_a_long_button_label_is_cut_between_grapheme_clusters(cluster: str) -> None:
    """The label was cut at a code point: half a flag or a family emoji before the "…"."""
    (message,) = messages([], [("x" * (BUTTON_TEXT - 2) + cluster + " and more", "v")])
    assert message.blocks[0]["elements"][0]["text"]["text"] == "x" * (BUTTON_TEXT - 2) + "…"
