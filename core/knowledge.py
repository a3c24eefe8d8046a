"""The knowledge base: Markdown, text, HTML and PDF files split into sections with keywords,
searched with BM25; the index is stored and reused until the files change."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

__all__ = ["Hit", "KnowledgeBase", "Section", "file_sections", "split_sections", "tokenize"]

log = logging.getLogger(__name__)

SUFFIXES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf")
INDEX_VERSION = 1  # bump when tokenize, keywords or the stored layout change
KEYWORDS = 5  # per section
K1, B = 1.5, 0.75  # BM25 term saturation and length normalization
_WORD = re.compile(r"[a-z0-9]+")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
STOPWORDS = frozenset(
    (
        "a an and are as at be by can do does for from have how i if in is it me my of on or our "
        "so that the this to we what when where which who will with you your el la los las de del "
        "que y en un una por para es son con como cual cuando donde"
    ).split()
)
# common words that say little about a section: never keywords (search still uses them)
_FILLER = frozenset(
    (
        "about after all also any back been before but could did each even every get got had has "
        "here its just like made make many may more most much must need never new no not now off "
        "one only other out over per same should some such than them then there these they those "
        "through too under until up upon usually very was way were while would yes al lo le se su "
        "sus mas muy sin sobre tambien ya hay"
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
    keywords: tuple[str, ...] = ()  # the section's most distinctive terms (tf-idf)


@dataclass(frozen=True, slots=True)
class Hit:
    section: Section
    score: float


class KnowledgeBase:
    def __init__(self, sections: list[Section], *, k1: float = K1, b: float = B) -> None:
        # headings count twice: they say what a section is about
        docs = [Counter(tokenize(s.title) * 2 + tokenize(s.text)) for s in sections]
        self._setup(sections, docs, k1, b)
        self.sections = [
            s if s.keywords else replace(s, keywords=self._keywords(s)) for s in sections
        ]

    def _setup(
        self, sections: list[Section], docs: list[Counter[str]], k1: float, b: float
    ) -> None:
        self.sections = sections
        self._k1, self._b = k1, b
        self._docs = docs
        self._lengths = [sum(d.values()) for d in docs]
        self._avg = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        df: Counter[str] = Counter()
        for d in docs:
            df.update(d.keys())
        n = len(docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def _keywords(self, section: Section) -> tuple[str, ...]:
        """Top tf-idf terms of the heading (twice) and body; the document title is left out,
        since every section of the document shares it."""
        heading = section.title.rpartition(" › ")[2] if " › " in section.title else ""
        tf = Counter(tokenize(heading) * 2 + tokenize(section.text))
        weights = {
            t: f * self._idf[t]
            for t, f in tf.items()
            if len(t) > 2 and not t.isdigit() and t not in _FILLER
        }
        ranked = sorted(weights, key=lambda t: (-weights[t], t))
        return tuple(ranked[:KEYWORDS])

    @classmethod
    def from_dir(cls, root: str | Path) -> KnowledgeBase:
        """Parse every knowledge file under root (no stored index)."""
        base = Path(root)
        return cls([s for path, rel in _files(base) for s in file_sections(path, rel)])

    @classmethod
    def load(cls, root: str | Path, cache_path: str | Path) -> KnowledgeBase:
        """The stored index when the files are unchanged, else a fresh parse that is stored."""
        base, cache = Path(root), Path(cache_path)
        files = _files(base)
        fingerprint = _fingerprint(files)
        stored = cls._restore(cache, fingerprint)
        if stored is not None:
            log.info("knowledge index reused: %d sections from %s", len(stored.sections), cache)
            return stored
        kb = cls([s for path, rel in files for s in file_sections(path, rel)])
        kb._store(cache, fingerprint)
        log.info("knowledge index built: %d files, %d sections", len(files), len(kb.sections))
        return kb

    @classmethod
    def _restore(cls, cache: Path, fingerprint: str) -> KnowledgeBase | None:
        try:
            data = json.loads(cache.read_text(encoding="utf-8"))
            if data.get("version") != INDEX_VERSION or data.get("fingerprint") != fingerprint:
                return None
            rows = data["sections"]
            sections = [
                Section(r["source"], r["title"], r["text"], tuple(r["keywords"])) for r in rows
            ]
            docs = [Counter({str(t): int(f) for t, f in r["terms"].items()}) for r in rows]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("knowledge index %s is unreadable; rebuilding it", cache)
            return None
        kb = cls.__new__(cls)
        kb._setup(sections, docs, K1, B)
        return kb

    def _store(self, cache: Path, fingerprint: str) -> None:
        rows = [
            {
                "source": s.source,
                "title": s.title,
                "text": s.text,
                "keywords": list(s.keywords),
                "terms": dict(d),
            }
            for s, d in zip(self.sections, self._docs, strict=True)
        ]
        data = {"version": INDEX_VERSION, "fingerprint": fingerprint, "sections": rows}
        tmp: str | None = None
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False)
            os.replace(tmp, cache)  # atomic: a concurrent reader sees the old or the new index
        except OSError as exc:
            log.warning("could not store the knowledge index at %s: %s", cache, exc)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def sources(self) -> list[str]:
        """The known sources, in order; the only ones `read` serves."""
        return list(dict.fromkeys(s.source for s in self.sections))

    def sections_of(self, source: str) -> list[Section]:
        return [s for s in self.sections if s.source == source]

    def read(self, source: str, section: str | None = None) -> str:
        """A whole source, or one section of it by full title or heading; KeyError if unknown."""
        parts = self.sections_of(source)
        if not parts:
            raise KeyError(source)
        if section is None:
            return "\n\n".join(f"{s.title}\n{s.text}" for s in parts)
        want = _norm(section)
        for s in parts:
            if want in (_norm(s.title), _norm(s.title.rpartition(" › ")[2])):
                return s.text
        raise KeyError(section)

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


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _files(base: Path) -> list[tuple[Path, str]]:
    if not base.is_dir():
        return []
    return [
        (p, p.relative_to(base).as_posix())
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.suffix.lower() in SUFFIXES
    ]


def _fingerprint(files: list[tuple[Path, str]]) -> str:
    """Names and contents (not mtimes: a touched file or a fresh checkout needs no rebuild)."""
    h = hashlib.sha256(f"v{INDEX_VERSION}".encode())
    for path, rel in files:
        h.update(f"\0{rel}\0{path.stat().st_size}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def file_sections(path: Path, source: str) -> list[Section]:
    """Extract one file's text and split it into sections, by its kind."""
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return pdf_sections(path, source)
    text = path.read_text(encoding="utf-8", errors="replace")
    if suffix in (".html", ".htm"):
        return html_sections(source, text)
    return split_sections(source, text)


Event = tuple[int, str] | str  # a heading (level, title) or a line of body text


def _assemble(source: str, events: Iterable[Event], doc_title: str = "") -> list[Section]:
    """Sections from headings and lines; a leading top heading names the document."""
    doc_title = doc_title or Path(source).stem.replace("-", " ").replace("_", " ").capitalize()
    sections: list[Section] = []
    heading: str | None = None
    lines: list[str] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if body:
            title = f"{doc_title} › {heading}" if heading and heading != doc_title else doc_title
            sections.append(Section(source, title, body))

    for event in events:
        if isinstance(event, str):
            lines.append(event)
            continue
        level, title = event
        if level == 1 and not sections and not "\n".join(lines).strip():
            doc_title, heading, lines = title, None, []
            continue
        flush()
        heading, lines = title, []
    flush()
    return sections


def split_sections(source: str, text: str) -> list[Section]:
    """Split a Markdown document at its headings; the top heading names the document."""
    return _assemble(source, _markdown_events(text))


def _markdown_events(text: str) -> Iterator[Event]:
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = None if in_code else _HEADING.match(line)
        yield line if m is None else (len(m.group(1)), m.group(2))


def html_sections(source: str, html: str) -> list[Section]:
    """Visible text of an HTML page, split at h1–h6; <title> names it when no h1 leads."""
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return _assemble(source, parser.events(), " ".join(parser.title.split()))


class _HTMLText(HTMLParser):
    HIDDEN = frozenset("script style noscript template svg head".split())
    BLOCKS = frozenset(
        "address article aside blockquote br dd div dl dt fieldset figcaption figure footer form "
        "header hr li main nav ol p pre section table tbody thead tfoot tr ul".split()
    )
    HEADINGS: ClassVar[dict[str, int]] = {f"h{n}": n for n in range(1, 7)}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self._events: list[Event] = []
        self._buf: list[str] = []
        self._hidden = 0
        self._in_title = False
        self._pre = 0

    def events(self) -> list[Event]:
        self._break()
        return self._events

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in self.HIDDEN:
            self._hidden += 1
        elif tag in self.BLOCKS or tag in self.HEADINGS:
            self._break()
            if tag == "pre":
                self._pre += 1
            elif tag == "li":
                self._buf.append("- ")
        elif tag in ("td", "th"):
            self._buf.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in self.HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag in self.HEADINGS:
            title = " ".join("".join(self._buf).split())
            self._buf = []
            if title:
                self._events.append((self.HEADINGS[tag], title))
        elif tag in self.BLOCKS:
            self._break()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._hidden:
            self._buf.append(data)

    def _break(self) -> None:
        text = "".join(self._buf)
        self._buf = []
        if self._pre:
            self._events.extend(text.strip("\n").splitlines())
        elif line := " ".join(text.split()):
            self._events.append(line)


def pdf_sections(path: Path, source: str) -> list[Section]:
    """One section per page of text; the PDF's title (or its file name) names the document."""
    try:
        import pypdf  # only for PDFs: importing it costs memory at every start

        reader = pypdf.PdfReader(path)
        title = (reader.metadata.title if reader.metadata else None) or ""
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # a malformed file must not stop the others; pypdf raises many kinds
        log.warning("skipping unreadable PDF %s: %s", source, type(exc).__name__)
        return []
    events: list[Event] = []
    for n, text in enumerate(pages, start=1):
        events.append((2, f"Page {n}"))
        events.extend(text.splitlines())
    return _assemble(source, events, title.strip())
