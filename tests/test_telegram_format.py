"""Markdown → Telegram HTML → chunks, checked by the fake Bot API's own HTML parser."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from channels.telegram.markdown import render
from channels.telegram.rich import MAX_ENTITIES, MAX_UNITS, Rich, Tag, split, utf16_len
from tests.fake_telegram import HtmlError, parse_html, sent_entities, utf16
from tests.text_samples import CLUSTERS, JOINED, cluster_bounds

TOKENS = [
    *"_*[]()~`>#+-=|{}.!<&\\",
    *"abcxyz019",
    " ",
    "  ",
    "\n",
    "\n\n",
    "    ",
    "é",
    "中文",
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "e\u0301",
    "**",
    "__",
    "~~",
    "```",
    "```py\n",
    "- ",
    "1. ",
    "> ",
    "# ",
    "[a](b)",
    "|a|b|\n|-|-|\n",
    "&amp",
    "<b>",
    "</i>",
    "[l](http://localhost:8080/x)",
    "[l](https://a.io/x)",
    "<m@a.io>",
    "[u](tg://user?id=1)",
]
MARKDOWNISH = st.lists(st.sampled_from(TOKENS), max_size=80).map("".join)
FORMATTED = [  # each one or more entities, as the agent writes them
    "`c` ",
    "**b** ",
    "_i_ ",
    "~~s~~ ",
    "**b _i_ [l](https://a.io) b** ",
    "[l](https://a.io) ",
    "word ",
    "\n",
    "\n\n",
    "> q **b** ~~s~~\n\n",
    "| `a` | **b** |\n",
    "```\nx\n```\n",
]
ENTITY_RICH = st.lists(st.sampled_from(FORMATTED), max_size=200).map("".join)


def coverage(text: str, entities: list[dict[str, object]]) -> list[frozenset[str]]:
    """Per UTF-16 unit, the entities over it (type plus url or language)."""
    cover: list[set[str]] = [set() for _ in range(utf16(text))]
    for e in entities:
        label = f"{e['type']}:{e.get('url', '')}:{e.get('language', '')}"
        for u in range(int(str(e["offset"])), int(str(e["offset"])) + int(str(e["length"]))):
            cover[u].add(label)
    return [frozenset(c) for c in cover]


def _in_code(cover: list[frozenset[str]], unit: int) -> bool:
    return unit < len(cover) and any(label.startswith("pre:") for label in cover[unit])


def check_chunks(rich: Rich, limit: int, max_entities: int = MAX_ENTITIES) -> list[tuple[str, str]]:
    """Every chunk parses, fits, is trimmed (a chunk starting in a code block keeps its first
    line's indentation), keeps its formatting (Telegram drops none of its entities); together
    they are the text."""
    full = rich.text
    full_text, full_entities = parse_html(rich.html())
    assert full_text == full
    links = [e["type"] for e in full_entities if e["type"] in ("text_link", "text_mention")]
    assert links == ["text_link"] * rich.html().count("<a ")  # Telegram keeps every link made
    full_cover = coverage(full, full_entities)
    chunks = rich.chunks(limit, max_entities)
    pos = 0
    for html, plain in chunks:
        text, entities = parse_html(html)
        assert text == plain
        assert sent_entities(entities, max_entities) == sent_entities(entities, 1 << 30)
        assert text
        in_code = any(e["type"] == "pre" and e["offset"] == 0 for e in entities)
        assert text == (text.rstrip() if in_code else text.strip())
        assert utf16(text) <= limit
        while full[pos].isspace():
            line = full[pos:].split("\n", 1)[0]
            at_line = pos == 0 or full[pos - 1] in "\r\n"
            fits = utf16(line) - utf16(line.lstrip()) < limit
            if at_line and line.strip() and fits and _in_code(full_cover, utf16(full[:pos])):
                break  # in code, the indentation of a line with text is kept (if it fits)
            pos += 1
        assert full.startswith(plain, pos)
        start = utf16(full[:pos])
        assert coverage(text, entities) == full_cover[start : start + utf16(text)]
        pos += len(plain)
    assert not full[pos:].strip()
    return chunks


def alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def visible_with_languages(html: str) -> str:
    text, entities = parse_html(html)
    units = text.encode("utf-16-le")
    inserts = sorted((int(e["offset"]), str(e["language"])) for e in entities if e.get("language"))
    out, at = [], 0
    for offset, lang in inserts:
        out += [units[2 * at : 2 * offset].decode("utf-16-le"), lang]
        at = offset
    return "".join([*out, units[2 * at :].decode("utf-16-le")])


@settings(max_examples=400, deadline=None)
@given(MARKDOWNISH, st.sampled_from([12, 40, 120, MAX_UNITS]))
def test_any_markdownish_text_becomes_valid_chunks_that_keep_the_visible_text(
    source: str, limit: int
) -> None:
    check_chunks(render(source), limit)


@settings(max_examples=200, deadline=None)
@given(ENTITY_RICH, st.sampled_from([40, 400, MAX_UNITS]), st.sampled_from([5, 9, MAX_ENTITIES]))
def test_no_chunk_holds_more_entities_than_telegram_keeps(
    source: str, limit: int, max_entities: int
) -> None:
    """At most 5 entities are open at one place (a quote, a link, bold, italic and
    strikethrough), so 5 is the smallest limit every chunk can keep to."""
    check_chunks(render(source), limit, max_entities)


@settings(max_examples=300, deadline=None)
@given(MARKDOWNISH)
def test_rendering_invents_nothing_and_loses_no_letter(source: str) -> None:
    seen = alnum(visible_with_languages(render(source).html()))
    written = alnum(source)
    it = iter(written)
    assert all(ch in it for ch in seen), "letters invented or reordered"
    if "](" not in source and not _lossy_fence(source) and not _lossy_table(source):
        assert seen == written  # only link targets, fence metadata and extra cells vanish


def _lossy_fence(source: str) -> bool:
    """A code fence that is empty, or whose info string is more than a language name."""
    tokens = MarkdownIt("commonmark").parse(source)
    language = re.compile(r"([A-Za-z][A-Za-z0-9_+#.-]*)?")
    return any(
        t.type == "fence" and (not t.content.strip() or not language.fullmatch(t.info.strip()))
        for t in tokens
    )


def _lossy_table(source: str) -> bool:
    """A table row with more cells than the header (GFM drops the extra ones)."""
    lines = source.split("\n")
    for t in MarkdownIt("commonmark").enable("table").parse(source):
        if t.type == "table_open" and t.map:
            rows = [_cells(line) for line in lines[slice(*t.map)]]
            if any(r > rows[0] for r in rows):
                return True
    return False


def _cells(line: str) -> int:
    inner = re.sub(r"^\||(?<!\\)\|$", "", line.strip())
    return len(re.split(r"(?<!\\)\|", inner))


def test_telegram_escaping_only_touches_the_three_characters() -> None:
    html = render("a < b && c > d \"q\" 'r'").html()
    assert html == "a &lt; b &amp;&amp; c &gt; d \"q\" 'r'"
    assert parse_html(html)[0] == "a < b && c > d \"q\" 'r'"


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        ("**b** *i* ~~s~~ `c`", "<b>b</b> <i>i</i> <s>s</s> <code>c</code>"),
        ("# Title", "<b>Title</b>"),
        (
            "[site](https://example.com/?a=1&b=2)",
            '<a href="https://example.com/?a=1&amp;b=2">site</a>',
        ),
        ("[rel](docs/page)", "rel (docs/page)"),
        ("[`code` in link](https://x.org)", '<a href="https://x.org">code in link</a>'),
        (
            "```python\nprint(1 < 2)\n```",
            '<pre><code class="language-python">print(1 &lt; 2)</code></pre>',
        ),
        ("```\nplain\n```", "<pre>plain</pre>"),
        ("> quoted **bold**", "<blockquote>quoted <b>bold</b></blockquote>"),
        ("> outer\n>\n> > inner", "<blockquote>outer\n\ninner</blockquote>"),
        ("- one\n- two\n  1. sub", "• one\n• two\n  1. sub"),
        ("3) three\n4) four", "3) three\n4) four"),
        ("<b>not html</b>", "&lt;b&gt;not html&lt;/b&gt;"),
        ("| h1 | h2 |\n|---|---|\n| a | b |", "<b>h1</b> | <b>h2</b>\na | b"),
        ("line one  \nline two", "line one\nline two"),
        ("***", "———"),
    ],
)
def test_markdown_maps_to_telegram_entities(markdown: str, html: str) -> None:
    assert render(markdown).html() == html
    parse_html(html)


@pytest.mark.parametrize(
    ("markdown", "html"),
    [
        (
            "Open [the dashboard](http://localhost:3000/admin).",
            "Open the dashboard (http://localhost:3000/admin).",
        ),
        (
            "See [the wiki](http://intranet/wiki/Onboarding).",
            "See the wiki (http://intranet/wiki/Onboarding).",
        ),
        (
            "Email <support@example.com> or [write to us](mailto:support@example.com).",
            "Email support@example.com or write to us (support@example.com).",
        ),
        ("Ping [Ana](tg://user?id=123456789)!", "Ping Ana (tg://user?id=123456789)!"),
        ("[Join us](tg://join?invite=AbC)", "Join us (tg://join?invite=AbC)"),
        ("<http://localhost:3000>", "http://localhost:3000"),
        ("[x](https://example.com:0/)", "x (https://example.com:0/)"),
    ],
)
def test_targets_telegram_would_drop_rewrite_or_make_a_mention_are_written_out(
    markdown: str, html: str
) -> None:
    """They were links: Telegram dropped a host with no dot (the address was lost), read
    mailto: as the web address http://mailto:…/, and tg://user?id=N as a mention that
    notifies that person."""
    assert render(markdown).html() == html
    assert parse_html(html)[1] == []


@pytest.mark.parametrize(
    "target",
    ["https://example.com", "http://127.0.0.1:8080/x", "http://[::1]/", "HTTPS://Ex.io:8443/a?b#c"],
)
def test_targets_telegram_accepts_stay_links(target: str) -> None:
    html = render(f"[site]({target})").html()
    assert html == f'<a href="{target}">site</a>'
    assert [e["type"] for e in parse_html(html)[1]] == ["text_link"]


def test_a_code_block_split_across_chunks_is_closed_and_reopened() -> None:
    code = "\n".join(f"line {i:03d} = value" for i in range(40))
    rich = render(f"Intro paragraph.\n\n```js\n{code}\n```\n\nOutro.")
    chunks = check_chunks(rich, 200)
    assert len(chunks) > 3
    inner = [h for h, _ in chunks if "line" in h]
    assert all(h.count('<pre><code class="language-js">') == 1 for h in inner)
    assert all(h.endswith("</code></pre>") or "Outro" in h for h in inner)


@pytest.mark.parametrize("first", ["", "    "])
def test_a_code_block_split_across_chunks_keeps_every_line_as_written(first: str) -> None:
    """A chunk starting inside a code block skipped its first line's indentation (Python
    that no longer ran); and so did a reply opening with an indented code line."""
    lines = [f"    x_{i:03d} = a[{i}] + b" for i in range(120)]
    lines[0] = first + lines[0].lstrip()
    rich = render("```python\n" + "\n".join(lines) + "\n```")
    chunks = check_chunks(rich, 300)
    assert len(chunks) > 5
    shown = [plain for _, plain in chunks]
    assert "\n".join(shown).split("\n") == lines


def test_a_chunk_holds_no_more_entities_than_telegram_keeps() -> None:
    """Telegram keeps a message's first 100 entities and drops the rest without an error:
    a table of 50 rows of code cells was one 927-character chunk with 154 entities, and the
    link after it (the 101st) was lost."""
    rows = "\n".join(f"| `key_{i}` | `{i * 7}` | **on** |" for i in range(50))
    markdown = f"Settings:\n\n| key | value | state |\n|---|---|---|\n{rows}\n\n"
    rich = render(markdown + "Full list in [the docs](https://ex.com/settings).")
    chunks = check_chunks(rich, MAX_UNITS)
    assert len(chunks) == 2
    assert chunks[0][1].endswith(" | on")  # between rows
    links = [e for e in parse_html(chunks[-1][0])[1] if e["type"] == "text_link"]
    assert [e["url"] for e in links] == ["https://ex.com/settings"]


def test_an_entity_limit_cuts_between_lines_first() -> None:
    rich = render("\n".join(f"- `a{i}` and `b{i}`" for i in range(6)))
    chunks = check_chunks(rich, MAX_UNITS, 5)
    assert [plain.count("\n") for _, plain in chunks] == [1, 1, 1]


def test_cuts_prefer_paragraphs_then_lines_then_sentences_then_words() -> None:
    para = "First sentence here. Second one follows."
    assert split(f"{para}\n\n{para}", 50) == [(0, 40), (42, 82)]
    assert split(f"{para}\n{para}", 50) == [(0, 40), (41, 81)]
    assert split("Alpha beta gamma. Delta epsilon zeta eta.", 30) == [(0, 17), (18, 41)]
    assert split("alpha beta gamma delta epsilon", 14) == [(0, 10), (11, 22), (23, 30)]
    assert split("x" * 25, 10) == [(0, 10), (10, 20), (20, 25)]


def test_never_cuts_a_surrogate_pair_or_an_emoji_sequence() -> None:
    family = "👨\u200d👩\u200d👧"
    text = family * 10
    for a, b in split(text, 9):
        assert utf16_len(text[a:b]) <= 9
        assert not text[a:b].startswith("\u200d")
        assert not text[a:b].endswith("\u200d")
    assert "".join(text[a:b] for a, b in split(text, 9)) == text


@pytest.mark.parametrize("cluster", JOINED)
def test_a_hard_cut_never_splits_a_grapheme_cluster(cluster: str) -> None:
    """Flags were split into letters, and Thai or Devanagari vowel signs (which
    `unicodedata.combining` calls 0) started the next message."""
    rich = render("x" + cluster * (9000 // utf16_len(cluster)))
    chunks = check_chunks(rich, MAX_UNITS)
    assert len(chunks) > 1
    assert all(plain.startswith(cluster) for _, plain in chunks[1:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=60), st.integers(14, 40))
def test_hard_cuts_fall_between_grapheme_clusters(clusters: list[str], limit: int) -> None:
    text = "".join(clusters)  # the longest cluster is 14 UTF-16 units: the smallest limit
    ranges = split(text, limit)
    assert "".join(text[a:b] for a, b in ranges) == text
    assert all(utf16_len(text[a:b]) <= limit for a, b in ranges)
    assert {a for a, _ in ranges} | {b for _, b in ranges} <= cluster_bounds(clusters)


def test_utf16_length_counts_astral_characters_twice() -> None:
    assert utf16_len("a😀中") == utf16("a😀中") == 4
    rich = render("😀" * 3000)
    chunks = check_chunks(rich, MAX_UNITS)
    assert [utf16(p) for _, p in chunks] == [4096, 1904]


def test_the_fake_refuses_what_telegram_refuses() -> None:
    for bad in [
        "<x>a</x>",
        "<b>a",
        "<b><i>a</b></i>",
        "a & b",
        "a > b",
        "&nbsp;",
        "<span>a</span>",
    ]:
        with pytest.raises(HtmlError):
            parse_html(bad)
    text, entities = parse_html('<a href="https://a.b/?x=1&amp;y=2">l</a> &#128512;&quot;')
    assert text == 'l 😀"'
    assert entities == [
        {"type": "text_link", "offset": 0, "length": 1, "url": "https://a.b/?x=1&y=2"}
    ]


@pytest.mark.parametrize(
    ("href", "entity"),
    [
        ("http://localhost:3000/admin", None),  # "Wrong HTTP URL": no entity, no error
        ("https://a.b:0/", None),
        ("ftp://a.b/", None),
        ("mailto:a@b.co", {"type": "text_link", "url": "http://mailto:a@b.co/"}),
        ("tg://user?id=42", {"type": "text_mention", "user": {"id": 42, "is_bot": False}}),
        ("HTTPS://Ex.IO", {"type": "text_link", "url": "https://ex.io/"}),
    ],
)
def test_the_fake_checks_links_as_telegram_does(href: str, entity: dict[str, object]) -> None:
    expected = [] if entity is None else [{"offset": 0, "length": 1, **entity}]
    assert parse_html(f'<a href="{href}">l</a>')[1] == expected


def test_the_fake_keeps_the_entities_telegram_keeps() -> None:
    """TDLib cuts bold where italic starts inside it and counts each piece, then sends the
    first 100 entities other than those pieces, then pieces while there is room."""
    _, entities = parse_html("<b>aa <i>bb</i> cc</b>")
    pieces = [(e["type"], e["offset"], e["length"]) for e in sent_entities(entities)]
    assert pieces == [("bold", 0, 3), ("bold", 3, 5), ("italic", 3, 2)]
    _, entities = parse_html("<b>b</b> " + "<code>c</code> " * 100 + '<a href="https://a.io">l</a>')
    assert [e["type"] for e in sent_entities(entities)] == ["code"] * 100


def test_tags_never_mix_code_with_other_entities() -> None:
    rich = render("**bold `code` bold** [x `y`](https://a.org)")
    for _, stack in rich.spans:
        names = [t.name for t in stack]
        if "code" in names:
            assert names[-1] == "code"
            assert "a" not in names
    assert Tag("pre", "py").open() == '<pre><code class="language-py">'


def test_empty_or_blank_markdown_has_no_chunks() -> None:
    assert render("").chunks() == []
    assert render("  \n\n ").chunks() == []
    assert re.fullmatch(r"<i>x</i>", render("_x_").html())
