"""Knowledge tools: search the knowledge base, and read a source or one section of it."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.agent.tools import ResultTiers, ToolContext
from core.errors import ToolError
from core.knowledge import Hit, KnowledgeBase, Section

__all__ = [
    "READ_CHARS",
    "SNIPPET_CHARS",
    "ReadArgs",
    "ReadKnowledge",
    "SearchArgs",
    "SearchKnowledge",
]

SNIPPET_CHARS = 900  # per search result, at most: the passage around the best match
RESULT_OVERHEAD = 400  # a result's source, section, keywords, score and JSON, in characters
# the most a read_knowledge result (JSON) takes: it fits inline, so no data card and no
# read_result call stand between the agent and the text; next_offset pages through the rest
READ_CHARS = ResultTiers().inline_chars


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for.")
    limit: int = Field(default=3, ge=1, le=5, description="How many sections to return.")


class SearchKnowledge:
    """search_knowledge: the best knowledge-base sections for a query, with their sources."""

    name: ClassVar[str] = "search_knowledge"
    description: ClassVar[str] = (
        "Search the business's knowledge base (hours, services, prices, policies, FAQ). "
        "Returns the best matching sections with their source file, section title and the "
        "passage that matched; a passage past the start of its section comes with its offset."
    )
    args_model: ClassVar[type[BaseModel]] = SearchArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0

    def __init__(self, knowledge: KnowledgeBase) -> None:
        self._kb = knowledge

    async def __call__(self, args: SearchArgs, ctx: ToolContext) -> dict[str, Any]:
        hits = self._kb.search(args.query, args.limit)
        # five results of 900 characters came back as a data card (past the inline size),
        # costing a read_result call: more results, shorter passages
        width = min(SNIPPET_CHARS, READ_CHARS // max(1, len(hits)) - RESULT_OVERHEAD)
        return {
            "query": args.query,
            "results": [self._result(h, args.query, width) for h in hits],
        }

    def _result(self, hit: Hit, query: str, width: int) -> dict[str, Any]:
        text = hit.section.text
        start, end = self._kb.passage(text, query, width)
        snippet = text[start:end].strip()
        start = text.index(snippet, start) if snippet else start  # where the words begin
        out: dict[str, Any] = {
            "source": hit.section.source,
            "section": hit.section.title,
            "keywords": list(hit.section.keywords),
            "text": ("… " if start else "") + snippet + (" …" if end < len(text) else ""),
            "score": round(hit.score, 3),
        }
        if start:
            out["offset"] = start  # read_knowledge(source, section, offset) reads on from here
        return out


class ReadArgs(BaseModel):
    source: str = Field(
        min_length=1, max_length=300, description="A source path as search_knowledge gave it."
    )
    section: str | None = Field(
        default=None,
        max_length=300,
        description="A section title or heading of that source; omit it to read the whole source.",
    )
    offset: int = Field(
        default=0,
        ge=0,
        description="Where to start reading, in characters: a search result's offset (with its "
        "section) or the next_offset of the previous read.",
    )


class ReadKnowledge:
    """read_knowledge: a whole knowledge source, or one section of it, a page at a time, served
    from the index only (never the file system, so no path can reach beyond the knowledge
    base)."""

    name: ClassVar[str] = "read_knowledge"
    description: ClassVar[str] = (
        "Read a knowledge-base source in full, or one section of it, when a search snippet is "
        "not enough. Use the source path and section title that search_knowledge returned. "
        "Long text comes a page at a time: call again with offset = next_offset to read on."
    )
    args_model: ClassVar[type[BaseModel]] = ReadArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0

    def __init__(self, knowledge: KnowledgeBase, *, max_chars: int = READ_CHARS) -> None:
        self._kb = knowledge
        self._max_chars = max_chars  # of the whole result, as JSON

    async def __call__(self, args: ReadArgs, ctx: ToolContext) -> dict[str, Any]:
        sections = self._kb.sections_of(args.source)
        if not sections:
            known = ", ".join(self._kb.sources()) or "none"
            raise ToolError(f"There is no knowledge source {args.source!r}. Sources: {known}.")
        titles = [s.title for s in sections]
        try:
            text = self._kb.read(args.source, args.section)
        except KeyError:
            raise ToolError(
                f"{args.source} has no section {args.section!r}. Sections: {'; '.join(titles)}."
            ) from None
        if args.offset and args.offset >= len(text):
            raise ToolError(f"offset {args.offset} is past the end ({len(text)} characters).")
        out: dict[str, Any] = {
            "source": args.source,
            "section": args.section,
            "offset": args.offset,
            "text": "",
        }
        if args.section is None and args.offset == 0:
            out["sections"], left_out = self._outline(sections)
            if left_out:
                out["more_sections"] = left_out
        # what is left once the rest, a next_offset and the " …" that marks a cut are counted;
        # never so little that paging would crawl
        room = self._max_chars - _json_len(out) - len(f', "next_offset": {len(text)}') - 2
        out["text"], next_offset = _page(text, args.offset, max(room, 100))
        if next_offset is not None:
            out["next_offset"] = next_offset
        return out

    def _outline(self, sections: list[Section]) -> tuple[list[dict[str, Any]], int]:
        """The source's sections with their keywords, as many as fit in half a result (a
        long PDF has hundreds of pages), and how many were left out."""
        outline: list[dict[str, Any]] = []
        used = 0
        for s in sections:
            entry = {"title": s.title, "keywords": list(s.keywords)}
            used += _json_len(entry) + 2
            if used > self._max_chars // 2:
                break
            outline.append(entry)
        return outline, len(sections) - len(outline)


def _page(text: str, start: int, room: int) -> tuple[str, int | None]:
    """The text from start that takes at most room characters as JSON, cut between words where
    it can be, marked " …" when cut; and where the rest starts (None when nothing is left)."""
    end, used = start, 0
    while end < len(text):
        used += _json_char_len(text[end])
        if used > room:
            break
        end += 1
    if end >= len(text):
        return text[start:], None
    cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
    if cut > start + (end - start) // 2:  # else a script without spaces: cut anywhere
        end = cut
    rest = len(text) - len(text[end:].lstrip())
    return text[start:end].rstrip() + " …", rest


def _json_char_len(ch: str) -> int:
    """How many characters ch takes in JSON (as the tool registry writes it: non-ASCII kept)."""
    if ch >= " " and ch not in '"\\':
        return 1
    return 2 if ch in '"\\\n\r\t\b\f' else 6


def _json_len(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))
