"""The knowledge base: Markdown, text, HTML and PDF files split into sections with keywords,
searched with BM25 in any language; the index is stored and reused until the files change."""

from __future__ import annotations

import codecs
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
INDEX_VERSION = 2  # bump when tokenize, keywords or the stored layout change
KEYWORDS = 5  # per section
K1, B = 1.5, 0.75  # BM25 term saturation and length normalization
_ASCII_WORD = re.compile(r"[a-z0-9]+")
# scripts written without spaces between words (Thai, Lao, Myanmar, Khmer, kana, Han, Hangul):
# their runs are indexed as overlapping character pairs, so any word in them can be found
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f]+"
)
_HIRAGANA = re.compile("[\u3040-\u309f]+")
# Latin letters with a stroke, dotless i and ligatures: Unicode gives them no base letter to fold to
_LATIN_LETTERS = str.maketrans(
    {"ł": "l", "đ": "d", "ð": "d", "ø": "o", "\u0131": "i", "æ": "ae", "œ": "oe", "þ": "th"}
)
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
    """Words folded for matching (see `_words`), without stop words, simple plurals folded."""
    out = []
    for word in _words(text):
        if word in STOPWORDS:
            continue
        if len(word) > 4 and word.endswith("ies"):
            word = word[:-3] + "y"
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.append(word)
    return out


def _words(text: str) -> list[str]:
    """The folded words of text, in any script; a run of a script written without spaces is
    cut into its overlapping character pairs (one character alone stays one)."""
    if text.isascii():  # the common case, and its result is the same as the general one
        return _ASCII_WORD.findall(text.lower())
    folded = _fold(text)
    if _UNSPACED.search(folded) is None:
        return folded.split()
    return [part for word in folded.split() for part in _unspaced_pairs(word)]


def _unspaced_pairs(word: str) -> Iterator[str]:
    """The word with each run of an unspaced script replaced by its pairs."""
    start = 0
    for run in _UNSPACED.finditer(word):
        if run.start() > start:
            yield word[start : run.start()]
        chars = run.group()
        yield from (chars[i : i + 2] for i in range(max(1, len(chars) - 1)))
        start = run.end()
    if start < len(word):
        yield word[start:]


def _fold(text: str) -> str:
    """Casefold (ß → ss), fold Latin letters that do not decompose (ł → l), drop accents (people
    type them or not: "cafe" finds "Café"), and turn what is not a letter, digit or mark into
    spaces."""
    decomposed = unicodedata.normalize("NFKD", text.casefold().translate(_LATIN_LETTERS))
    return unicodedata.normalize("NFC", decomposed.translate(_WORD_CHARS))  # kana, Hangul


class _WordChars(dict[int, str | None]):
    """A `str.translate` table filled as characters are first met (so the scan stays in C):
    the accents Latin, Greek and Cyrillic letters take are dropped (the marks other scripts
    spell with, in their own blocks, are kept), anything but a letter, digit or mark is a
    space."""

    ACCENTS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")

    def __missing__(self, code: int) -> str | None:
        ch = chr(code)
        if self.ACCENTS.match(ch):
            out = None
        else:
            out = ch if unicodedata.category(ch)[0] in "LNM" else " "
        self[code] = out
        return out


_WORD_CHARS = _WordChars()


def _is_keyword(term: str) -> bool:
    """Long enough to say something (a pair of an unspaced script is a word), not a number,
    not filler (nor a pair of hiragana, mostly particles and endings: から, です)."""
    long = len(term) > 2 or (len(term) == 2 and _UNSPACED.fullmatch(term) is not None)
    return long and not term.isdigit() and term not in _FILLER and not _HIRAGANA.fullmatch(term)


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
        weights = {t: f * self._idf[t] for t, f in tf.items() if _is_keyword(t)}
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

    def _terms(self, query: str) -> list[str]:
        """The query's terms; a lone character of a script written without spaces (猫, a
        word of its own) stands for the indexed pairs that hold it: text is indexed by pairs
        only, and a one-character word never matched."""
        out: list[str] = []
        for term in tokenize(query):
            if len(term) == 1 and _UNSPACED.fullmatch(term):
                out.extend(t for t in self._idf if len(t) == 2 and term in t)
            else:
                out.append(term)
        return out

    def search(self, query: str, limit: int = 5) -> list[Hit]:
        terms = self._terms(query)
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

    def passage(self, text: str, query: str, width: int) -> tuple[int, int]:
        """Where in text (start, end: at most width characters, cut between words) the query's
        terms weigh most, with the matches in the middle; so a snippet of a long section shows
        the part that matched, not its start."""
        if len(text) <= width:
            return 0, len(text)
        terms = set(self._terms(query))
        pieces = _pieces(text, max(1, width // 8))
        found = [terms.intersection(tokenize(text[start:end])) for start, end in pieces]
        best, window = -1.0, (0, 0)
        for i, (start, _) in enumerate(pieces):  # the earliest of the heaviest windows
            j = i
            while j + 1 < len(pieces) and pieces[j + 1][1] - start <= width:
                j += 1
            weight = sum(self._idf.get(t, 0.0) for t in set().union(*found[i : j + 1]))
            if weight > best:
                best, window = weight, (i, j)
        hits = [k for k in range(window[0], window[1] + 1) if found[k]] or [window[0]]
        lo, hi = _around(pieces, hits[0], hits[-1], width)
        return pieces[lo][0], pieces[hi][1]


def _pieces(text: str, size: int) -> list[tuple[int, int]]:
    """Consecutive spans of text of at most size characters, each cut after a space or line
    break in its second half where there is one (text in a script without spaces is cut
    anywhere)."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            half = start + size // 2
            cut = max(text.rfind(" ", half, end), text.rfind("\n", half, end))
            end = cut + 1 if cut > start else end
        spans.append((start, end))
        start = end
    return spans


def _around(pieces: list[tuple[int, int]], lo: int, hi: int, width: int) -> tuple[int, int]:
    """Pieces lo to hi grown a piece at a time on each side in turn while they fit in width,
    so what they hold ends up in the middle (or as far as the text's edge allows)."""
    grew = True
    while grew:
        grew = False
        if lo > 0 and pieces[hi][1] - pieces[lo - 1][0] <= width:
            lo, grew = lo - 1, True
        if hi + 1 < len(pieces) and pieces[hi + 1][1] - pieces[lo][0] <= width:
            hi, grew = hi + 1, True
    return lo, hi


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
    text = _read_text(path, source)
    if text is None:
        return []
    if suffix in (".html", ".htm"):
        return html_sections(source, text)
    return split_sections(source, text)


def _read_text(path: Path, source: str) -> str | None:
    """A text file's contents in the encodings editors save: UTF-8 (with or without a BOM),
    UTF-16 or UTF-32 with their BOM, else Windows-1252 (Latin-1). None for a binary file (NULs
    without a UTF-16 BOM), which is skipped like a broken PDF rather than indexed as noise."""
    data = path.read_bytes()
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    if b"\0" in data:
        log.warning("skipping binary file %s (NUL bytes; UTF-16 text needs its BOM)", source)
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        log.info("%s is not UTF-8; read as Windows-1252 (Latin-1)", source)
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # one of the five bytes cp1252 leaves undefined
        return data.decode("latin-1")


# longest first: the UTF-32 little-endian BOM starts with the UTF-16 one
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


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
