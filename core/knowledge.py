"""A small knowledge base: Markdown and text files split into sections, searched with BM25."""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Hit", "KnowledgeBase", "Section", "tokenize"]

SUFFIXES = (".md", ".markdown", ".txt")
_WORD = re.compile(r"[a-z0-9]+")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
STOPWORDS = frozenset(
    (
        "a an and are as at be by can do does for from have how i if in is it me my of on or our "
        "so that the this to we what when where which who will with you your el la los las de del "
        "que y en un una por para es son con como cual cuando donde"
    ).split()
)


def tokenize(text: str) -> list[str]:
    """Lowercase, strip accents, drop stop words, fold simple plurals."""
    folded = unicodedata.normalize("NFKD", text.lower())
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    out = []
    for word in _WORD.findall(folded):
        if word in STOPWORDS:
            continue
        if len(word) > 4 and word.endswith("ies"):
            word = word[:-3] + "y"
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.append(word)
    return out


@dataclass(frozen=True, slots=True)
class Section:
    source: str  # path relative to the knowledge directory
    title: str  # "Document title › Section heading"
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    section: Section
    score: float


class KnowledgeBase:
    def __init__(self, sections: list[Section], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.sections = sections
        self._k1, self._b = k1, b
        # headings count twice: they say what a section is about
        self._docs = [Counter(tokenize(s.title) * 2 + tokenize(s.text)) for s in sections]
        self._lengths = [sum(d.values()) for d in self._docs]
        self._avg = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        df: Counter[str] = Counter()
        for d in self._docs:
            df.update(d.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    @classmethod
    def from_dir(cls, root: str | Path) -> KnowledgeBase:
        base = Path(root)
        sections: list[Section] = []
        if base.is_dir():
            for path in sorted(base.rglob("*")):
                if path.is_file() and path.suffix.lower() in SUFFIXES:
                    text = path.read_text(encoding="utf-8", errors="replace")
                    sections.extend(split_sections(path.relative_to(base).as_posix(), text))
        return cls(sections)

    def search(self, query: str, limit: int = 5) -> list[Hit]:
        terms = tokenize(query)
        if not terms or not self._docs:
            return []
        scored = []
        for i, doc in enumerate(self._docs):
            score = 0.0
            norm = self._k1 * (1 - self._b + self._b * self._lengths[i] / (self._avg or 1))
            for t in terms:
                f = doc.get(t)
                if f:
                    score += self._idf[t] * f * (self._k1 + 1) / (f + norm)
            if score > 0:
                scored.append(Hit(self.sections[i], score))
        scored.sort(key=lambda h: h.score, reverse=True)
        return scored[:limit]


def split_sections(source: str, text: str) -> list[Section]:
    """Split a Markdown document at its headings; the top heading names the document."""
    doc_title = Path(source).stem.replace("-", " ").replace("_", " ").capitalize()
    sections: list[Section] = []
    heading: str | None = None
    lines: list[str] = []
    in_code = False

    def flush() -> None:
        body = "\n".join(lines).strip()
        if body:
            title = f"{doc_title} › {heading}" if heading and heading != doc_title else doc_title
            sections.append(Section(source, title, body))

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = None if in_code else _HEADING.match(line)
        if m is None:
            lines.append(line)
            continue
        level, title = len(m.group(1)), m.group(2)
        if level == 1 and not sections and not "\n".join(lines).strip():
            doc_title, heading, lines = title, None, []
            continue
        flush()
        heading, lines = title, []
    flush()
    return sections
