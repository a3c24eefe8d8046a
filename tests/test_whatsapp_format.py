"""Markdown → WhatsApp text, chunking, and the payloads a reply becomes."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.whatsapp import format as whatsapp_format
from channels.whatsapp.adapter import OUTPUT_RULES
from channels.whatsapp.format import _MD, ZWSP, _plain_units, _Walker, chunk, plain, wlen
from channels.whatsapp.outbound import (
    match_menu,
    menu_from_json,
    menu_to_json,
    plan_reply,
    recipient,
    template,
)
from core.models import Attachment, Button, Reply
from tests.text_samples import JOINED

TraceFunction = Callable[[FrameType, str, object], Any]

TO = recipient("15551234567")


def plan(reply: Reply, interactive: bool = True) -> list[dict[str, Any]]:
    return plan_reply(
        reply, interactive=interactive, prompt="Please choose:", list_button="Options", to=TO
    ).payloads


def test_styles_become_whatsapp_markers() -> None:
    md = "Some **bold**, *italic*, ~~gone~~ and `code`; **bold _both_ more**."
    assert chunk(md) == ["Some *bold*, _italic_, ~gone~ and ```code```; *bold _both_ more*."]


def test_the_styles_the_model_is_told_to_write_are_the_ones_shown() -> None:
    """The output rules once told the model WhatsApp's own `*bold*`, which the converter
    reads as Markdown emphasis and sends as italics."""
    told = OUTPUT_RULES.split("WhatsApp shows ", 1)[1].split(", but", 1)[0]
    assert chunk(told) == ["*bold*, _italic_, ~strikethrough~ and ```code```"]


def test_markers_hug_their_text() -> None:
    assert chunk("**see [docs](https://d.io) now**") == ["*see docs* (https://d.io) *now*"]
    assert chunk("**a `b` c**") == ["*a ```b``` c*"]


def test_headings_are_bold_lines_and_links_plain_urls() -> None:
    md = "# Opening **hours**\n\nSee [our page](https://ex.com/h) or <https://ex.com>."
    assert chunk(md) == ["*Opening hours*\n\nSee our page (https://ex.com/h) or https://ex.com."]


def test_lists_quotes_and_code_blocks_are_kept() -> None:
    md = "Steps:\n\n- one\n- two\n  1. deep\n\n> said\n\n```\nx = 1\ny = 2\n```"
    assert chunk(md) == ["Steps:\n\n- one\n- two\n  1. deep\n\n> said\n\n```x = 1\ny = 2```"]


def test_ordered_lists_keep_their_numbers() -> None:
    assert chunk("3. c\n4. d") == ["3. c\n4. d"]


def test_tables_become_lines() -> None:
    assert chunk("| a | b |\n|---|---|\n| 1 | 2 |") == ["*a* | *b*\n1 | 2"]


def test_plain_is_one_unstyled_line() -> None:
    assert plain("# Hi\n\n**Bold** and\n\n- a\n- b") == "Hi Bold and a b"


PLAIN = [
    "echo: conversation 12 message 3",
    "Sure! We open at 9 on weekdays.\nSee you then.",
    "First paragraph.\n\n\nSecond one, after blank lines.\n",
    "Ünïcode façade, 東京 and emoji 🚲 inside (fine).",
]


def test_plain_replies_skip_the_parser() -> None:
    for text in PLAIN:
        units = _plain_units(text)
        assert units is not None, text
        assert units == _Walker().walk(_MD.parse(text))


_ODD_SPACE = ["\u00a0", "\u2028", "\u3000", "\x0b", "\x0c", "\x85", "\u200b", "\x00"]


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        # mostly what the shortcut takes, with the odd space: it must agree on those
        st.text(st.sampled_from([*"aZé東19 \n\n!-+=.:;>\"'()?,", "🚲", *_ODD_SPACE]), max_size=40),
        # Markdown's characters: it must step aside
        st.text(st.sampled_from([*"aZ1 \n\t\r*_~`[]()<>&#|\\!-+=.", "🚲"]), max_size=40),
    )
)
def test_the_plain_shortcut_agrees_with_the_parser(text: str) -> None:
    units = _plain_units(text)
    assert units is None or units == _Walker().walk(_MD.parse(text))


def test_long_text_is_cut_between_paragraphs_in_order() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 150 for i in range(20)]
    chunks = chunk("\n\n".join(paragraphs))
    assert len(chunks) > 1
    assert all(wlen(c) <= 4096 for c in chunks)
    assert [p.strip() for c in chunks for p in c.split("\n\n")] == [p.strip() for p in paragraphs]


def test_a_long_code_block_is_closed_and_reopened() -> None:
    code = "\n".join(f"line {i:04d} " + "x" * 60 for i in range(200))
    chunks = chunk(f"Intro\n\n```\n{code}\n```\n\nOutro")
    assert len(chunks) >= 4
    for c in chunks:
        assert wlen(c) <= 4096
        assert c.count("```") % 2 == 0
    body = "\n".join(re.findall(r"```(.*?)```", "\n".join(chunks), re.DOTALL))
    assert body == code


def test_a_long_bold_line_is_split_with_styles_closed() -> None:
    chunks = chunk("**" + "strong " * 1500 + "end**", limit=1000)
    assert len(chunks) > 5
    for c in chunks:
        assert c.startswith("*")
        assert c.endswith("*")
        assert wlen(c) <= 1000


@pytest.mark.parametrize("limit", range(12, 40))
def test_a_cut_never_parts_a_literal_marker_from_what_defuses_it(limit: int) -> None:
    """The zero-width space before a defused star went with the character before it, so a
    cut between them began the next chunk "**" with our bold: the star paired again."""
    chunks = chunk("**" + "src/\\*\\*/\\*.py," * 8 + "**", limit)
    defused = rf"{ZWSP}\*{ZWSP}"
    assert sum(len(re.findall(defused, c)) for c in chunks) == 24
    for c in chunks:
        assert wlen(c) <= limit
        assert re.fullmatch(r"\*[^*]+\*", re.sub(defused, "·", c))  # only our bold is live


def test_emoji_count_double() -> None:
    chunks = chunk("😀" * 3000)
    assert [wlen(c) for c in chunks] == [4096, 6000 - 4096]


_WORDS = st.text(alphabet="abcdefghij XYZ", min_size=1, max_size=30)
_BLOCK = st.one_of(
    _WORDS,
    _WORDS.map(lambda w: f"**{w.strip() or 'b'}**"),
    _WORDS.map(lambda w: f"_{w.strip() or 'i'}_ tail"),
    _WORDS.map(lambda w: f"- {w}"),
    _WORDS.map(lambda w: f"# {w}"),
    st.lists(_WORDS, min_size=1, max_size=40).map(lambda ls: "```\n" + "\n".join(ls) + "\n```"),
    st.integers(1, 400).map(lambda n: "word" * n),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_BLOCK, min_size=1, max_size=30), st.sampled_from([60, 300, 4096]))
def test_chunks_fit_keep_fences_closed_and_lose_no_word(blocks: list[str], limit: int) -> None:
    md = "\n\n".join(blocks)
    chunks = chunk(md, limit)
    assert all(0 < wlen(c) <= limit for c in chunks)
    assert all(c.count("```") % 2 == 0 for c in chunks)
    seen = "".join(re.findall(r"[a-jXYZ]", "".join(chunks)))
    assert seen == "".join(re.findall(r"[a-jXYZ]", md.replace("```", "")))


def test_three_short_buttons_are_reply_buttons() -> None:
    times = ("10:00", "12:00", "A long label of 20ch")
    reply = Reply(text="Pick a time", buttons=tuple(Button(label=t, value=t) for t in times))
    (p,) = plan(reply)
    assert p["type"] == "interactive"
    inter = p["interactive"]
    assert inter["type"] == "button"
    assert inter["body"] == {"text": "Pick a time"}


def test_buttons_after_long_text_go_in_a_last_message() -> None:
    buttons = (Button(label="Yes", value="y"), Button(label="No", value="n"))
    payloads = plan(Reply(text="word " * 300, buttons=buttons))
    assert [p["type"] for p in payloads] == ["text", "interactive"]
    assert payloads[1]["interactive"]["body"] == {"text": "Please choose:"}


def test_up_to_ten_rows_are_a_list() -> None:
    buttons = tuple(Button(label=f"Size number {i}", value=f"s{i}") for i in range(6))
    (p,) = plan(Reply(text="Which size?", buttons=buttons))
    inter = p["interactive"]
    assert inter["type"] == "list"
    rows = inter["action"]["sections"][0]["rows"]
    assert [r["id"] for r in rows] == [f"s{i}" for i in range(6)]


def test_too_many_or_too_long_is_a_numbered_text_menu() -> None:
    buttons = tuple(Button(label=f"Option {i}", value=f"o{i}") for i in range(1, 13))
    result = plan_reply(
        Reply(text="Choose:", buttons=buttons),
        interactive=True,
        prompt="Reply with a number:",
        list_button="Options",
        to=TO,
    )
    (p,) = result.payloads
    menu = "\n".join(f"{i}. Option {i}" for i in range(1, 13))
    assert p["text"]["body"] == f"Choose:\n\nReply with a number:\n{menu}"
    assert result.menu is not None
    assert result.menu[1] == ("Option 2", "o2")
    long = (Button(label="A label that is far too long for any row", value="x"),)
    assert plan(Reply(text="t", buttons=long))[0]["type"] == "text"
    dup = (Button(label="Same", value="a"), Button(label="same", value="b"))
    assert plan(Reply(text="t", buttons=dup))[0]["type"] == "text"
    assert plan(Reply(text="t", buttons=(Button(label="Ok", value="ok"),)), False)[0]["type"] == (
        "text"
    )


def test_menu_matching_by_number_or_title() -> None:
    menu = menu_from_json(menu_to_json([("Red", "r"), ("Blue", "b")]))
    assert match_menu("2", menu) == ("Blue", "b")
    assert match_menu(" 1. ", menu) == ("Red", "r")
    assert match_menu("blue", menu) == ("Blue", "b")
    assert match_menu("3", menu) is None
    assert match_menu("I want red", menu) is None
    assert menu_from_json("not json") == []


def test_template_carries_the_reply_as_one_line() -> None:
    reply = Reply(text="# Update\n\nYour order **42** ships\ttoday.\n\n" + "x" * 2000)
    t = template(reply, name="reply_later", language="es", params=["Ana", "{reply}"], fallback="-")
    comp = t["template"]["components"][0]
    ana, text = (p["text"] for p in comp["parameters"])
    assert ana == "Ana"
    assert text.startswith("Update Your order 42 ships today. xxx")
    assert wlen(text) == 1024
    assert text.endswith("…")
    assert t["template"]["language"] == {"code": "es"}
    bare = template(reply, name="hello", language="en_US", params=[], fallback="-")
    assert "components" not in bare["template"]


def test_recipient_by_phone_or_business_scoped_id() -> None:
    assert recipient("155") == {"recipient_type": "individual", "to": "155"}
    assert recipient("US.1") == {"recipient_type": "individual", "recipient": "US.1"}


def test_linked_attachments_are_media_messages() -> None:
    att = (
        Attachment(kind="image", url="https://ex.com/a.png"),
        Attachment(kind="other", name="r.pdf", url="https://ex.com/r.pdf"),
        Attachment(kind="image", path="/tmp/local.png", name="local.png"),
    )
    result = plan_reply(
        Reply(text="Here", attachments=att),
        interactive=True,
        prompt="p",
        list_button="b",
        to=TO,
    )
    kinds = [p["type"] for p in result.payloads]
    assert kinds == ["text", "image", "document"]
    assert result.payloads[2]["document"] == {"link": "https://ex.com/r.pdf", "filename": "r.pdf"}
    assert result.skipped == ["local.png"]


# -- fidelity: what the reply says reaches the person as it was meant ---------------------------


def test_no_chunk_is_blank() -> None:
    """A bold run that filled a chunk, then a space and a long word, once made a chunk of two
    spaces; Graph rejects a blank body and the rest of the reply was never sent."""
    md = "- **" + "a" * 4092 + "** **" + "b" * 5000 + "**\n\nLast paragraph."
    chunks = chunk(md)
    assert all(c.strip() for c in chunks)
    assert "".join(chunks).count("b") == 5000
    assert chunks[-1].endswith("Last paragraph.")


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["", "- ", "> ", "1. "]),
    st.sampled_from(["**", "_", ""]),
    st.integers(1, 2),
    st.integers(-2, 2),
    st.integers(1, 4),
    st.integers(1, 200),
)
def test_a_cut_at_a_space_never_makes_a_blank_chunk(
    lead: str, mark: str, rows: int, off: int, spaces: int, tail: int
) -> None:
    room = 80 - len(lead) - (2 if mark else 0)  # what one row of the first word can hold
    fill = rows * room + off  # the word ends at, or just around, the end of a chunk
    md = f"{lead}{mark}{'a' * fill}{mark}{' ' * spaces}{mark}{'b' * tail}{mark}\n\nend"
    chunks = chunk(md, limit=80)
    assert all(c.strip() and wlen(c) <= 80 for c in chunks)
    text = "".join(chunks)
    assert (text.count("a"), text.count("b"), text.count("end")) == (fill, tail, 1)


def _monospace(chunks: list[str]) -> list[str]:
    """The code each chunk shows in monospace, without the zero-width spaces that break it."""
    return [m.replace(ZWSP, "") for c in chunks for m in re.findall(r"```(.*?)```", c, re.S)]


@pytest.mark.parametrize(
    ("md", "code"),
    [
        ("````markdown\n```python\nprint('hi')\n```\n````", ["```python\nprint('hi')\n```"]),
        ("Type `` ``` `` to open a block", ["```"]),
        ("Run `` a`b `` or `` `x` `` now", ["a`b", "`x`"]),
        ("> ```\n> echo ``hi``\n> ```", ["echo ``hi``"]),
    ],
)
def test_backticks_in_code_cannot_end_the_monospace(md: str, code: list[str]) -> None:
    """Report item 4: six or nine backticks in a row opened and closed the monospace at once."""
    chunks = chunk(md)
    assert _monospace(chunks) == code
    # every run of backticks left is one of our fences: none longer, none touching another
    assert all(len(run) == 3 for c in chunks for run in re.findall("`{2,}", c))


def test_a_long_code_block_with_backticks_is_cut_into_closed_blocks() -> None:
    code = "\n".join(f"``x{i}`` = `{i}`" + "y" * 50 for i in range(300))
    chunks = chunk(f"```\n{code}\n```")
    assert len(chunks) > 2
    assert all(len(run) == 3 for c in chunks for run in re.findall("`{2,}", c))
    assert "\n".join(_monospace(chunks)) == code


@pytest.mark.parametrize(
    ("md", "shown"),
    [
        (r"\*not bold\* and \_not italic\_", "*not bold* and _not italic_"),
        (r"\~\~gone\~\~ and \`\`\`raw\`\`\`", "~~gone~~ and ```raw```"),
    ],
)
def test_escaped_markers_stay_literal(md: str, shown: str) -> None:
    """Report item 6: the person escaped them, WhatsApp made them bold and italic."""
    (text,) = chunk(md)
    assert text.replace(ZWSP, "") == shown
    # each marker has a zero-width space on both sides, so none opens or closes a style
    assert not re.search(rf"(?<!{ZWSP})[*_~`]|[*_~`](?!{ZWSP})", text)


@pytest.mark.parametrize(
    ("md", "styled", "written"),
    [  # a literal marker touching one of ours was left live: it paired or lengthened a fence
        ("Pattern: \\*`.py`\\* matches all", "Pattern: ```.py``` matches all", "**"),
        ("Run `ls`\\` now", "Run ```ls``` now", "`"),
        ("\\``ls` now", "```ls``` now", "`"),
        ("Only **$9.99**\\*", "Only *$9.99*", "*"),
        ("Fields: **Name***, **Email***", "Fields: *Name*, *Email*", "**"),
        ("*it*\\_", "_it_", "_"),
        ("~~old~~\\~", "~old~", "~"),
        ("$1***e***g", "$1*e*g", "**"),  # an empty text between the star and the bold
    ],
)
def test_a_literal_marker_next_to_a_style_stays_literal(md: str, styled: str, written: str) -> None:
    """A marker in the next span, styled otherwise, counted as a line's end: `\\*` after
    **$9.99** was left as is and sent "*$9.99**", a backtick after code made ```ls````."""
    (text,) = chunk(md)
    defused = rf"{ZWSP}([*_~`]){ZWSP}"
    assert "".join(re.findall(defused, text)) == written
    assert re.sub(defused, "", text) == styled  # the markers left are our styles' own
    assert all(len(run) == 3 for run in re.findall("`{2,}", text))


def test_markers_inside_words_and_links_are_left_alone() -> None:
    md = "snake_case, 2 * 3 and https://ex.com/_a_?q=*"
    assert chunk(md) == [md]


@pytest.mark.parametrize(
    ("md", "shown"),
    [
        ("the **API**s are ready", "the APIs are ready"),
        ("un**break**able and re~~do~~ne", "unbreakable and redone"),
        ("**API**: ready, (_see_)", "*API*: ready, (_see_)"),
    ],
)
def test_a_style_inside_a_word_is_dropped_not_shown_as_markers(md: str, shown: str) -> None:
    """WhatsApp reads a marker as a style only at a word's edge."""
    assert chunk(md) == [shown]


@pytest.mark.parametrize(
    "md", ["2*3*4 = 24", "x = a*b + c*d", "un*break*able", "the 5*3*2 rule: 30"]
)
def test_a_single_asterisk_inside_a_word_stays_as_written(md: str) -> None:
    """CommonMark reads the `*`s of 2*3*4 as italics, which WhatsApp cannot show inside a
    word: dropping them sent "234 = 24" (and "x = ab + cd"), a different statement."""
    assert chunk(md) == [md]


def test_a_long_quote_stays_quoted_in_every_chunk() -> None:
    """Report item 7: later chunks began with two spaces instead of "> "."""
    chunks = chunk("> " + " ".join(["quoted"] * 1200))
    assert len(chunks) == 3
    assert all(line.startswith("> quoted") for c in chunks for line in c.split("\n"))


@pytest.mark.parametrize(
    ("md", "shown"),
    [
        (
            "> Example:\n> ```\n> line one\n> line two\n> ```",
            "> Example:\n\n> ```line one```\n> ```line two```",
        ),
        (
            "- item\n\n  ```\n  a = 1\n  b = 2\n  ```",
            "- item\n\n  ```a = 1```\n  ```b = 2```",
        ),
        ("> - ```\n>   x\n>\n>   y\n>   ```", "> - ```x```\n>\n>   ```y```"),
    ],
)
def test_code_in_a_quote_or_list_keeps_the_prefix_on_every_line(md: str, shown: str) -> None:
    assert chunk(md) == [shown]


def test_a_long_quoted_code_block_is_quoted_in_every_chunk() -> None:
    code = "\n".join(f"> line {i} " + "x" * 60 for i in range(200))
    chunks = chunk(f"> ```\n{code}\n> ```")
    assert len(chunks) > 2
    for c in chunks:
        assert wlen(c) <= 4096
        assert all(re.fullmatch(r"> ```line \d+ x{60}```", line) for line in c.split("\n"))


_ACCENT = "e\u0301"


@pytest.mark.parametrize("cluster", JOINED)
def test_hard_cuts_keep_grapheme_clusters_whole(cluster: str) -> None:
    """Report item 8: a run longer than a chunk was cut inside a flag, a family emoji or a
    letter with its mark."""
    chunks = chunk("x" + cluster * (9000 // wlen(cluster)))
    assert len(chunks) > 1
    assert all(wlen(c) <= 4096 for c in chunks)
    assert chunks[0].startswith("x")
    assert chunks[0][1:].replace(cluster, "") == ""
    assert all(c.replace(cluster, "") == "" for c in chunks[1:])


def test_hard_cuts_keep_accents_on_their_letters_in_code_too() -> None:
    chunks = chunk("```\nx" + _ACCENT * 3000 + "\n```", limit=1000)
    assert len(chunks) > 5
    assert "".join(_monospace(chunks)) == "x" + _ACCENT * 3000
    assert not any(c.startswith("```\u0301") for c in chunks)


def _lines_run(markdown: str) -> int:
    """How many lines of channels/whatsapp/format.py chunking `markdown` runs: a count of
    work, the same on every machine (a time is not)."""
    source = whatsapp_format.__file__
    count = 0

    def count_lines(frame: FrameType, event: str, arg: object) -> TraceFunction:
        nonlocal count
        count += event == "line"
        return count_lines

    def trace(frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        return count_lines if frame.f_code.co_filename == source else None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        chunk(markdown, limit=10**6)  # one chunk: only the length of the line varies
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize(
    "build",
    [
        lambda n: "_Allowed values: " + ", ".join(f"`v{i}`" for i in range(n)) + "._",
        lambda n: "*a*" * n,
        lambda n: "*a* http://x_y.z " * n,
        lambda n: "x_ http://a.b/c_d " * n,
    ],
    ids=["italic with code", "adjacent bold", "styles and links", "markers and links"],
)
def test_the_work_on_a_line_grows_with_its_length_not_its_square(
    build: Callable[[int], str],
) -> None:
    """Each styled span once re-read every span sharing its style (and every link of the
    line): 17k chars of one line took seconds, on the event loop."""
    assert _lines_run(build(400)) < 5 * _lines_run(build(100))  # linear: ~4x, quadratic: 16x


def test_a_cluster_longer_than_a_message_keeps_its_place() -> None:
    """A grapheme cluster longer than the room left (zalgo text, 5,000 combining marks) went
    out before the text in front of it, and truncate dropped that text."""
    zalgo = "e" + "\u0301" * 5000
    chunks = chunk("AB" + zalgo + "CD")
    assert "".join(chunks).replace(ZWSP, "") == "AB" + zalgo + "CD"
    assert chunks[0].startswith("AB")
    assert all(wlen(c) <= 4096 for c in chunks)
    assert whatsapp_format._cut("ab\U0001f600", 1) == ["a", "b", "\U0001f600"]
    assert whatsapp_format.truncate("AB" + zalgo, 1024).startswith("AB")


@pytest.mark.parametrize(
    ("source", "shown"),
    [  # the markers around a link were taken as part of it and left live
        ("mail \\*bob@x.com\\* now", "mail *bob@x.com* now"),
        ("see https://x.io/```\n\n```\nprint(1)\n```", None),
    ],
)
def test_markers_next_to_a_link_stay_text(source: str, shown: str | None) -> None:
    (out,) = chunk(source)
    if shown is not None:
        assert out.replace(ZWSP, "") == shown
        assert f"{ZWSP}*{ZWSP}" in out  # defused: WhatsApp shows the stars
    else:  # the stray fence is defused, so the code block keeps its own pair
        assert out.endswith("```print(1)```")
        assert out.count("```") == 2


def test_an_address_with_accents_is_shown_once() -> None:
    """markdown-it writes the link's address in punycode and %-escapes: the autolink was
    shown twice, as typed and as https://xn--caf-dma.fr/%C3%A4."""
    assert chunk("<https://café.fr/ä>") == ["https://café.fr/ä"]
    assert chunk("[the shop](https://café.fr/)") == ["the shop (https://xn--caf-dma.fr/)"]
