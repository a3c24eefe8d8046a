"""Knowledge text in any language and encoding: what tokenize makes of it, how files are read."""

# ruff: noqa: RUF001  # Cyrillic and Greek text on purpose: it looks like Latin, and is not

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from core.knowledge import KnowledgeBase, Section, file_sections, split_sections, tokenize

DOCS = {
    "ru.md": "# Часы работы\n\n## Расписание\nМагазин открыт с понедельника по пятницу.\n",
    "el.md": "# Ωράριο\n\nΤο κατάστημα είναι ανοιχτό καθημερινά.\n",
    "ja.md": "# 営業時間\n\n営業時間は午前9時から午後6時までです。\n\n## 料金\n一日二千円です。\n",
    "zh.md": "# 退货政策\n\n自行车可以在三十天内退货。\n",
    "de.md": "# Adresse\n\nWir sind in der Hauptstraße 5.\n",
    "pl.md": "# Ceny\n\nWypożyczenie roweru kosztuje 40 złotych.\n",
}


# -- tokenize -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Магазин открыт", ["магазин", "открыт"]),
        ("Ёлка", ["елка"]),  # Cyrillic accents fold like Latin ones
        ("ΚΑΤΆΣΤΗΜΑ ανοιχτός", ["καταστημα", "ανοιχτοσ"]),  # final sigma casefolds
        ("Hauptstraße", ["hauptstrasse"]),
        ("złoty Łódź Ærø", ["zloty", "lodz", "aero"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # vowel signs are part of the word
        ("営業時間", ["営業", "業時", "時間"]),  # no spaces: overlapping pairs
        ("午前9時", ["午前", "9", "時"]),
        ("ｶﾞｲﾄﾞ", ["ガイ", "イド"]),  # half-width kana, voiced mark kept
        ("영업시간은", ["영업", "업시", "시간", "간은"]),
    ],
)
def test_tokenize_any_script(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase([s for name, text in DOCS.items() for s in split_sections(name, text)])


@pytest.mark.parametrize(
    ("query", "source"),
    [
        ("Магазин открыт", "ru.md"),
        ("когда открыт магазин?", "ru.md"),
        ("κατάστημα ανοιχτό", "el.md"),
        ("καταστημα ανοιχτο", "el.md"),  # typed without accents
        ("営業時間", "ja.md"),
        ("何時から営業していますか", "ja.md"),  # a question sharing only some pairs
        ("退货", "zh.md"),
        ("料金", "ja.md"),
        ("车", "zh.md"),  # one character: a word of its own, indexed only inside pairs
        ("Hauptstrasse", "de.md"),
        ("zlotych", "pl.md"),
    ],
)
def test_search_in_any_script(kb: KnowledgeBase, query: str, source: str) -> None:
    hits = kb.search(query)
    assert hits
    assert hits[0].section.source == source


def test_keywords_in_a_script_without_spaces(kb: KnowledgeBase) -> None:
    hours, price = (s for s in kb.sections if s.source == "ja.md")
    assert "料金" in price.keywords  # the heading
    assert "午前" in hours.keywords
    assert not {"から", "です", "まで"} & set(hours.keywords + price.keywords)  # particles


def test_passage_of_a_long_section_in_a_script_without_spaces() -> None:
    text = "自行车" * 600 + "押金是五十元。" + "自行车" * 600
    kb = KnowledgeBase([Section("zh.md", "规则", text)])
    start, end = kb.passage(text, "押金", 300)
    assert end - start <= 300
    assert "押金是五十元" in text[start:end]


# -- reading files ------------------------------------------------------------------------


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "hours.md"
    path.write_bytes(codecs.BOM_UTF8 + b"# Shop Hours\n\n## Opening\nWe open at 9am.\n")
    assert [(s.title, s.text) for s in file_sections(path, "hours.md")] == [
        ("Shop Hours › Opening", "We open at 9am.")
    ]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_with_a_bom_are_decoded(tmp_path: Path, encoding: str) -> None:
    text = "# Notes\n\nCafé open daily\n"
    boms = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}
    path = tmp_path / "notes.txt"
    path.write_bytes(boms.get(encoding, b"") + text.encode(encoding))
    assert [(s.title, s.text) for s in file_sections(path, "notes.txt")] == [
        ("Notes", "Café open daily")
    ]


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("Café crème 5 €".encode("cp1252"), "Café crème 5 €"),
        (b"Caf\xe9 \x81", "Café \x81"),  # a byte Windows-1252 leaves undefined: Latin-1
    ],
)
def test_text_that_is_not_utf8_is_read_as_windows_1252(
    tmp_path: Path, raw: bytes, text: str
) -> None:
    path = tmp_path / "menu.md"
    path.write_bytes(b"# Menu\n\n" + raw + b"\n")
    (section,) = file_sections(path, "menu.md")
    assert (section.title, section.text) == ("Menu", text)


def test_binary_files_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "logo.md").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "ok.md").write_text("# Ok\n\nCafé text.\n", encoding="utf-8")
    kb = KnowledgeBase.from_dir(tmp_path)
    assert kb.sources() == ["ok.md"]
    assert "skipping binary file logo.md" in caplog.text
    assert kb.search("cafe")[0].section.source == "ok.md"
