"""Knowledge tools: search the knowledge base, and read a source or one section of it."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.agent.tools import ToolContext
from core.errors import ToolError
from core.knowledge import KnowledgeBase

__all__ = [
    "READ_CHARS",
    "SNIPPET_CHARS",
    "ReadArgs",
    "ReadKnowledge",
    "SearchArgs",
    "SearchKnowledge",
]

SNIPPET_CHARS = 900
READ_CHARS = 4000  # what read_knowledge returns at most; the rest is read section by section


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for.")
    limit: int = Field(default=3, ge=1, le=5, description="How many sections to return.")


class SearchKnowledge:
    """search_knowledge: the best knowledge-base sections for a query, with their sources."""

    name: ClassVar[str] = "search_knowledge"
    description: ClassVar[str] = (
        "Search the business's knowledge base (hours, services, prices, policies, FAQ). "
        "Returns the best matching sections with their source file and section title."
    )
    args_model: ClassVar[type[BaseModel]] = SearchArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0

    def __init__(self, knowledge: KnowledgeBase) -> None:
        self._kb = knowledge

    async def __call__(self, args: SearchArgs, ctx: ToolContext) -> dict[str, Any]:
        hits = self._kb.search(args.query, args.limit)
        return {
            "query": args.query,
            "results": [
                {
                    "source": h.section.source,
                    "section": h.section.title,
                    "keywords": list(h.section.keywords),
                    "text": _snippet(h.section.text),
                    "score": round(h.score, 3),
                }
                for h in hits
            ],
        }


def _snippet(text: str) -> str:
    if len(text) <= SNIPPET_CHARS:
        return text
    cut = text[:SNIPPET_CHARS]
    return cut[: cut.rfind(" ")] + " …"


class ReadArgs(BaseModel):
    source: str = Field(
        min_length=1, max_length=300, description="A source path as search_knowledge gave it."
    )
    section: str | None = Field(
        default=None,
        max_length=300,
        description="A section title or heading of that source; omit it to read the whole source.",
    )


class ReadKnowledge:
    """read_knowledge: a whole knowledge source, or one section of it, served from the index only
    (never the file system, so no path can reach beyond the knowledge base)."""

    name: ClassVar[str] = "read_knowledge"
    description: ClassVar[str] = (
        "Read a knowledge-base source in full, or one section of it, when a search snippet is "
        "not enough. Use the source path and section title that search_knowledge returned."
    )
    args_model: ClassVar[type[BaseModel]] = ReadArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 5.0

    def __init__(self, knowledge: KnowledgeBase, *, max_chars: int = READ_CHARS) -> None:
        self._kb = knowledge
        self._max_chars = max_chars

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
        out: dict[str, Any] = {"source": args.source, "section": args.section, "text": text}
        if len(text) > self._max_chars:
            cut = text[: self._max_chars]
            out["text"] = cut[: cut.rfind(" ")] + " …" if " " in cut else cut
            out["truncated"] = True
        if args.section is None:
            out["sections"] = [{"title": s.title, "keywords": list(s.keywords)} for s in sections]
        return out
