"""Knowledge files (Markdown, text, HTML, PDF), keywords, the stored index, read and its tool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import core.knowledge
from core.agent.knowledge_tools import ReadKnowledge, SearchKnowledge
from core.agent.tools import ResultTiers, ToolContext, ToolRegistry
from core.knowledge import KnowledgeBase, Section, file_sections, html_sections

CTX = ToolContext(session="s", run_id="r")
KNOWLEDGE_ROOT = Path(__file__).resolve().parent.parent / "config" / "knowledge"

PAGE = """<!doctype html>
<html><head><title>Bike  Guide</title><style>h2 { color: red }</style>
<script>var hidden = "do not index";</script></head>
<body>
<nav><a href="/">Home</a></nav>
<h2>Storage</h2>
<p>Keep bikes <b>indoors</b> &amp; dry.</p>
<ul><li>Hang them up</li><li>Cover the saddle</li></ul>
<h3>Winter</h3>
<pre>chain: wax
  tyres: 2.5 bar</pre>
<noscript>Enable JavaScript</noscript>
<table><tr><td>Tyre</td><td>€12</td></tr></table>
</body></html>
"""


def make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A minimal valid PDF: one Helvetica text line per entry, a page per list."""
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (" ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages))).encode(), len(pages)),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, lines in enumerate(pages):
        ops = [
            "BT",
            "/F1 12 Tf",
            "14 TL",
            "72 720 Td",
            *(f"({line}) Tj T*" for line in lines),
            "ET",
        ]
        stream = "\n".join(ops).encode()
        objs.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i)
        )
        objs.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    info = b""
    if title:
        objs.append(b"<< /Title (%s) >>" % title.encode())
        info = b" /Info %d 0 R" % len(objs)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for num, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (num, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\n" % (len(objs) + 1, info)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


# -- extraction ---------------------------------------------------------------------------


def test_html_visible_text_split_at_headings() -> None:
    sections = html_sections("guide.html", PAGE)
    assert [s.title for s in sections] == [
        "Bike Guide",
        "Bike Guide › Storage",
        "Bike Guide › Winter",
    ]
    assert sections[0].text == "Home"
    assert sections[1].text == "Keep bikes indoors & dry.\n- Hang them up\n- Cover the saddle"
    assert sections[2].text.splitlines() == ["chain: wax", "  tyres: 2.5 bar", "Tyre €12"]
    everything = " ".join(s.text for s in sections)
    for hidden in ("do not index", "color", "Enable JavaScript"):
        assert hidden not in everything


def test_html_h1_names_the_document_over_title() -> None:
    sections = html_sections("x.html", "<title>Tab</title><h1>Real</h1><p>a</p><h2>B</h2><p>b</p>")
    assert [s.title for s in sections] == ["Real", "Real › B"]
    untitled = html_sections("shop-notes.htm", "<p>plain</p>")
    assert untitled == [Section("shop-notes.htm", "Shop notes", "plain")]


def test_text_and_markdown_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("Plain notes.\n\n## Sub\nMore.\n")
    assert [(s.title, s.text) for s in file_sections(tmp_path / "notes.txt", "notes.txt")] == [
        ("Notes", "Plain notes."),
        ("Notes › Sub", "More."),
    ]


def test_pdf_pages_become_sections(tmp_path: Path) -> None:
    pdf = tmp_path / "guide.pdf"
    pdf.write_bytes(
        make_pdf([["Rental rules", "Bring your ID."], [], ["Returns by six."]], "Shop Guide")
    )
    sections = file_sections(pdf, "docs/guide.pdf")
    assert [(s.source, s.title) for s in sections] == [
        ("docs/guide.pdf", "Shop Guide › Page 1"),
        ("docs/guide.pdf", "Shop Guide › Page 3"),  # a page without text gives no section
    ]
    assert sections[0].text == "Rental rules\nBring your ID."
    untitled = tmp_path / "price-list.pdf"
    untitled.write_bytes(make_pdf([["Flat fix 15"]]))
    assert [s.title for s in file_sections(untitled, "price-list.pdf")] == ["Price list › Page 1"]


def test_broken_pdf_is_skipped_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf")
    (tmp_path / "ok.md").write_text("# Ok\n\nFine text.\n")
    kb = KnowledgeBase.from_dir(tmp_path)
    assert [s.source for s in kb.sections] == ["ok.md"]
    assert "skipping unreadable PDF broken.pdf" in caplog.text


def test_every_kind_is_searchable(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text(PAGE)
    (tmp_path / "manual.pdf").write_bytes(make_pdf([["Derailleur adjustment guide"]]))
    (tmp_path / "a.md").write_text("# A\n\nSaddle heights.\n")
    kb = KnowledgeBase.from_dir(tmp_path)
    assert kb.search("derailleur")[0].section.source == "manual.pdf"
    assert kb.search("indoors")[0].section.title == "Bike Guide › Storage"
    assert kb.sources() == ["a.md", "manual.pdf", "page.html"]


# -- keywords -----------------------------------------------------------------------------


def test_keywords_are_the_distinctive_terms() -> None:
    kb = KnowledgeBase(
        [
            Section(
                "a.md", "Shop › Brakes", "Brake pads wear; brake cables stretch. We check pads."
            ),
            Section("a.md", "Shop › Tyres", "Tyre pressure matters. Tyre tubes and tyre levers."),
            Section("a.md", "Shop › Hours", "We open at nine and close at six, per day."),
        ]
    )
    brakes, tyres, hours = (s.keywords for s in kb.sections)
    assert brakes[:2] == ("brake", "pad")
    assert tyres[0] == "tyre"
    assert "shop" not in brakes + tyres + hours  # the document title is shared by all
    assert "per" not in hours  # filler words are never keywords
    assert all(len(k) <= 5 for k in (brakes, tyres, hours))


def test_given_keywords_are_kept() -> None:
    kb = KnowledgeBase([Section("a.md", "A", "text here", ("mine",))])
    assert kb.sections[0].keywords == ("mine",)


def test_shipped_knowledge_has_keywords() -> None:
    kb = KnowledgeBase.from_dir(KNOWLEDGE_ROOT)
    deposits = next(s for s in kb.sections if s.title.endswith("Deposits"))
    assert "deposit" in deposits.keywords
    assert all(s.keywords for s in kb.sections)


# -- the stored index ---------------------------------------------------------------------


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources parsed; a stored index that is reused parses none."""
    seen: list[str] = []
    real = core.knowledge.file_sections

    def counting(path: Path, source: str) -> list[Section]:
        seen.append(source)
        return real(path, source)

    monkeypatch.setattr(core.knowledge, "file_sections", counting)
    return seen


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    (root / "sub").mkdir(parents=True)
    (root / "hours.md").write_text("# Hours\n\nOpen daily from nine.\n")
    (root / "sub" / "page.html").write_text(PAGE)
    return root


def test_index_is_stored_and_reused_when_nothing_changed(
    docs: Path, tmp_path: Path, parses: list[str]
) -> None:
    cache = tmp_path / "data" / "knowledge-index.json"
    first = KnowledgeBase.load(docs, cache)
    assert sorted(parses) == ["hours.md", "sub/page.html"]
    assert cache.is_file()
    stored = json.loads(cache.read_text())
    assert [r["title"] for r in stored["sections"]] == [s.title for s in first.sections]
    assert stored["sections"][0]["keywords"] == list(first.sections[0].keywords)

    parses.clear()
    again = KnowledgeBase.load(docs, cache)
    assert parses == []
    assert again.sections == first.sections
    for query in ("open nine", "saddle cover", "winter chain"):
        assert again.search(query) == first.search(query)


def test_rewriting_the_same_content_does_not_rebuild(
    docs: Path, tmp_path: Path, parses: list[str]
) -> None:
    cache = tmp_path / "index.json"
    KnowledgeBase.load(docs, cache)
    parses.clear()
    path = docs / "hours.md"
    path.write_text(path.read_text())
    os.utime(path, (1, 1))
    KnowledgeBase.load(docs, cache)
    assert parses == []


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_index_is_rebuilt_when_files_change(
    docs: Path, tmp_path: Path, parses: list[str], change: str
) -> None:
    cache = tmp_path / "index.json"
    KnowledgeBase.load(docs, cache)
    parses.clear()
    if change == "edit":
        (docs / "hours.md").write_text("# Hours\n\nOpen daily from ten.\n")
    elif change == "add":
        (docs / "new.txt").write_text("Gift cards are sold at the till.\n")
    else:
        (docs / "sub" / "page.html").unlink()
    kb = KnowledgeBase.load(docs, cache)
    assert parses, "the change was not noticed"
    if change == "edit":
        assert "ten" in kb.read("hours.md")
    elif change == "add":
        assert kb.search("gift cards")[0].section.source == "new.txt"
    else:
        assert kb.sources() == ["hours.md"]
    parses.clear()
    assert KnowledgeBase.load(docs, cache).sections == kb.sections
    assert parses == []


@pytest.mark.parametrize(
    "stored",
    ["not json", '{"version": 0, "fingerprint": "x", "sections": []}', '{"version": 1}', "[]"],
)
def test_a_bad_or_old_index_is_rebuilt(
    docs: Path, tmp_path: Path, parses: list[str], stored: str
) -> None:
    cache = tmp_path / "index.json"
    cache.write_text(stored)
    kb = KnowledgeBase.load(docs, cache)
    assert sorted(parses) == ["hours.md", "sub/page.html"]
    assert kb.search("nine")[0].section.source == "hours.md"
    assert json.loads(cache.read_text())["version"] == core.knowledge.INDEX_VERSION


def test_an_index_from_the_previous_tokenizer_is_rebuilt(
    docs: Path, tmp_path: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (docs / "ja.md").write_text("# 営業時間\n\n毎日営業しています。\n", encoding="utf-8")
    cache = tmp_path / "index.json"
    current = core.knowledge.INDEX_VERSION
    monkeypatch.setattr(core.knowledge, "INDEX_VERSION", 1)  # the [a-z0-9] tokenizer's index
    KnowledgeBase.load(docs, cache)
    monkeypatch.setattr(core.knowledge, "INDEX_VERSION", current)
    parses.clear()
    kb = KnowledgeBase.load(docs, cache)
    assert sorted(parses) == ["hours.md", "ja.md", "sub/page.html"]
    assert kb.search("毎日")[0].section.source == "ja.md"


def test_unwritable_cache_still_serves(
    docs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    kb = KnowledgeBase.load(docs, blocker / "index.json")  # its folder cannot be created
    assert kb.search("nine")
    assert "could not store the knowledge index" in caplog.text


def test_load_of_a_missing_dir_is_empty(tmp_path: Path) -> None:
    kb = KnowledgeBase.load(tmp_path / "missing", tmp_path / "index.json")
    assert kb.sections == []
    assert kb.search("anything") == []


# -- read ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase.from_dir(KNOWLEDGE_ROOT)


def test_read_a_whole_source(kb: KnowledgeBase) -> None:
    text = kb.read("services-and-prices.md")
    assert text.startswith("Services and prices\nAll prices are in US dollars")
    assert "Services and prices › Deposits\nEvery rental needs a refundable deposit" in text


@pytest.mark.parametrize(
    "section", ["Deposits", "deposits", "Services and prices › Deposits", "  DEPOSITS "]
)
def test_read_one_section(kb: KnowledgeBase, section: str) -> None:
    assert kb.read("services-and-prices.md", section).startswith("Every rental needs a refundable")


def test_read_unknown_source_or_section(kb: KnowledgeBase) -> None:
    with pytest.raises(KeyError):
        kb.read("nope.md")
    with pytest.raises(KeyError):
        kb.read("hours.md", "Deposits")


# -- the tools ----------------------------------------------------------------------------


async def test_read_knowledge_tool(kb: KnowledgeBase) -> None:
    registry = ToolRegistry([ReadKnowledge(kb)])
    result = await registry.call("read_knowledge", '{"source": "hours.md"}', CTX)
    data = json.loads(result.content)
    assert result.ok is True
    assert data["source"] == "hours.md"
    assert data["section"] is None
    assert "Monday" in data["text"]
    assert data["sections"][0]["title"] == "Opening hours"
    assert all(s["keywords"] for s in data["sections"])

    one = await registry.call(
        "read_knowledge", '{"source": "policies.md", "section": "Privacy"}', CTX
    )
    data = json.loads(one.content)
    assert data["text"].startswith("We only collect what we need")
    assert "sections" not in data


@pytest.mark.parametrize("source", ["missing.md", "../switchboard.example.toml", "/etc/passwd"])
async def test_read_knowledge_only_serves_indexed_sources(kb: KnowledgeBase, source: str) -> None:
    result = await ToolRegistry([ReadKnowledge(kb)]).call(
        "read_knowledge", json.dumps({"source": source}), CTX
    )
    assert result.ok is False
    detail = json.loads(result.content)["detail"]
    assert detail.startswith(f"There is no knowledge source {source!r}. Sources: about.md, faq.md")
    assert "services-and-prices.md" in detail


async def test_read_knowledge_unknown_section_lists_the_sections(kb: KnowledgeBase) -> None:
    result = await ToolRegistry([ReadKnowledge(kb)]).call(
        "read_knowledge", '{"source": "hours.md", "section": "Parking"}', CTX
    )
    detail = json.loads(result.content)["detail"]
    assert detail == (
        "hours.md has no section 'Parking'. Sections: Opening hours; Opening hours › Holiday "
        "hours; Opening hours › Workshop drop-off times."
    )


async def test_read_knowledge_caps_the_whole_result() -> None:
    kb = KnowledgeBase([Section("long.md", "Long", "word " * 2000)])
    result = await ToolRegistry([ReadKnowledge(kb, max_chars=500)]).call(
        "read_knowledge", '{"source": "long.md"}', CTX
    )
    assert len(result.content) <= 500
    data = json.loads(result.content)
    assert data["text"].startswith("Long\nword word")  # the source's text: its title, its body
    assert data["text"].endswith("word …")
    assert data["next_offset"] == len(data["text"]) - 1  # past " …" is the next word


def _long_text(kind: str) -> str:
    if kind == "words":
        return " ".join(f"w{n}" for n in range(3000))
    if kind == "lines":  # every line break and quote takes two characters as JSON
        return "\n".join(f'"{n}"' for n in range(3000))
    return "".join(chr(0x4E00 + n % 500) for n in range(9000))  # no spaces to cut at


@pytest.mark.parametrize("kind", ["words", "lines", "cjk"])
async def test_read_knowledge_pages_through_a_long_section_inline(kind: str) -> None:
    text = _long_text(kind)
    kb = KnowledgeBase([Section("handbook.txt", "Handbook", text)])
    registry = ToolRegistry([ReadKnowledge(kb)])  # the default tiers: inline up to 4,000
    pages: list[str] = []
    offset: int | None = 0
    while offset is not None:
        args = {"source": "handbook.txt", "section": "Handbook", "offset": offset}
        result = await registry.call("read_knowledge", json.dumps(args), CTX)
        assert len(result.content) <= ResultTiers().inline_chars
        data = json.loads(result.content)  # inline: the page itself, not a data card
        assert data["offset"] == offset
        assert len(pages) < 20
        offset = data.get("next_offset")
        pages.append(data["text"].removesuffix(" …") if offset is not None else data["text"])
    assert len(pages) > 2
    if kind == "cjk":
        assert "".join(pages) == text  # cut anywhere, nothing lost
    else:
        assert " ".join(pages).split() == text.split()  # cut between words, nothing lost


async def test_read_knowledge_of_a_source_with_many_sections_fits_inline() -> None:
    sections = [Section("book.pdf", f"Book › Page {n}", f"Page {n} text.") for n in range(300)]
    kb = KnowledgeBase(sections)
    result = await ToolRegistry([ReadKnowledge(kb)]).call(
        "read_knowledge", '{"source": "book.pdf"}', CTX
    )
    assert len(result.content) <= ResultTiers().inline_chars
    data = json.loads(result.content)
    assert data["sections"][0]["title"] == "Book › Page 0"
    assert data["more_sections"] == 300 - len(data["sections"])
    assert data["text"].startswith("Book › Page 0\nPage 0 text.")
    assert "next_offset" in data
    later = await ToolRegistry([ReadKnowledge(kb)]).call(
        "read_knowledge", json.dumps({"source": "book.pdf", "offset": data["next_offset"]}), CTX
    )
    assert "sections" not in json.loads(later.content)  # the outline comes with the first page


async def test_read_knowledge_offset_past_the_end(kb: KnowledgeBase) -> None:
    result = await ToolRegistry([ReadKnowledge(kb)]).call(
        "read_knowledge", '{"source": "hours.md", "section": "Holiday hours", "offset": 5000}', CTX
    )
    assert result.error == "failed"
    assert "offset 5000 is past the end" in json.loads(result.content)["detail"]


async def test_search_knowledge_lives_here_too(kb: KnowledgeBase) -> None:
    result = await ToolRegistry([SearchKnowledge(kb)]).call(
        "search_knowledge", '{"query": "deposit e-bike", "limit": 5}', CTX
    )
    data = json.loads(result.content)
    assert 1 <= len(data["results"]) <= 5
    assert set(data["results"][0]) == {"source", "section", "keywords", "text", "score"}
    assert data["results"][0]["section"] == "Services and prices › Deposits"
