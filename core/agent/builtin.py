"""Built-in tools available to every agent."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.agent.tools import ToolContext
from core.knowledge import KnowledgeBase
from core.models import Button

__all__ = ["SearchKnowledge", "SendButtons"]

SNIPPET_CHARS = 900


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


class ButtonArg(BaseModel):
    label: str = Field(min_length=1, max_length=80, description="What the button says.")
    value: str = Field(
        default="", max_length=256, description="What pressing it sends back (default: label)."
    )


class SendButtonsArgs(BaseModel):
    buttons: list[ButtonArg] = Field(min_length=1, max_length=10)


class SendButtons:
    """send_buttons: quick replies shown with the answer; each channel renders them its way."""

    name: ClassVar[str] = "send_buttons"
    description: ClassVar[str] = (
        "Offer the person up to 10 quick-reply buttons with your answer (for example choices "
        "or yes/no). Call it once, then write the answer text as usual."
    )
    args_model: ClassVar[type[BaseModel]] = SendButtonsArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: SendButtonsArgs, ctx: ToolContext) -> dict[str, Any]:
        ctx.buttons[:] = [Button(label=b.label, value=b.value or b.label) for b in args.buttons]
        return {"ok": True, "buttons": [b.label for b in ctx.buttons]}
