"""The offline model: answers from the knowledge base through the normal loop, with no network.

It behaves like a tool-calling model: on a new question it calls `search_knowledge`, and once
the results are in it answers from the best passage, citing its source. So `make run` works with
no key, and the offline path exercises the same loop, tools and limits as a real model.

A greeting before a question is not searched for ("hi there, hours?" asks about hours), and
messages collected into one turn ("hours?", "and prices?") are searched one by one and answered
each from its own best passage.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from core.agent.model import (
    ChatMessage,
    DeltaSink,
    ModelRequest,
    ModelResponse,
    ToolCall,
    estimate_messages,
    estimate_tokens,
)
from core.agent.prompt import FROM_LINE
from core.knowledge import tokenize

__all__ = ["OfflineModel"]

SEARCH_TOOL = "search_knowledge"
_USER = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)
_GREETING = re.compile(
    r"^\s*(hi|hello|hey|hola|buenas|good (morning|afternoon|evening)|thanks|thank you|gracias)"
    r"\b[\s!.,?]*(there|team)?[\s!.,?]*$",
    re.IGNORECASE,
)
# a greeting at the start of a message, with what follows it up to the question
_GREETING_START = re.compile(
    r"^\s*(?:hi|hello|hey|hola|buenas|good (?:morning|afternoon|evening))"
    r"(?:[\s,]+(?:there|team|all|everyone))?(?:[\s!.,]+|$)",
    re.IGNORECASE,
)
MAX_SEARCHES = 3  # separate searches for the messages of one turn; more are searched as one
_BLOCK_SPLIT = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+[.)])\s)")
_WORDS = re.compile(r"\S+\s*")

GREETING = (
    "Hello! I'm the assistant for this business. Ask me about opening hours, services, "
    "prices or our policies."
)
NOT_FOUND = (
    "I couldn't find that in my notes. I can help with opening hours, services, prices and "
    "policies; could you ask about one of those?"
)
NO_SEARCH = "I can only answer from the knowledge base, and I can't search it right now."


class OfflineModel:
    def __init__(self, *, delay_s: float = 0.0) -> None:
        self._delay_s = delay_s  # pause between streamed words, so streaming is visible

    async def aclose(self) -> None:
        return None

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        texts, searches = _read_turn(request.messages)
        question = "\n".join(texts)
        asks = _questions(texts)
        can_search = request.tool_choice == "auto" and any(
            t.name == SEARCH_TOOL for t in request.tools
        )
        if searches is None and texts and not asks:
            text = GREETING
        elif searches is None and can_search and question.strip():
            queries = asks if len(asks) <= MAX_SEARCHES else ["\n".join(asks)]
            calls = tuple(
                ToolCall(f"offline_{i}", SEARCH_TOOL, json.dumps({"query": q[:500]}))
                for i, q in enumerate(queries)
            )
            return self._response(request, "", calls, "tool_calls")
        elif searches is None:
            text = NO_SEARCH
        else:
            text = _answers(question, searches)
        if on_delta is not None:
            for word in _WORDS.findall(text):
                await on_delta(word)
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
        return self._response(request, text, (), "stop")

    @staticmethod
    def _response(
        request: ModelRequest, text: str, calls: tuple[ToolCall, ...], finish: str
    ) -> ModelResponse:
        out = estimate_tokens(text) + sum(estimate_tokens(c.arguments) for c in calls)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            input_tokens=estimate_messages(request.messages),
            output_tokens=out,
            finish_reason=finish,
        )


def _read_turn(
    messages: tuple[ChatMessage, ...],
) -> tuple[list[str], list[tuple[str, list[dict[str, Any]]]] | None]:
    """The messages of the current turn, and the searches made for it (each its query and
    results), if any."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user < 0:
        return [], None
    first_user = last_user
    while first_user > 0 and messages[first_user - 1].role == "user":
        first_user -= 1
    texts = []
    for m in messages[first_user : last_user + 1]:
        found = _USER.findall(m.content or "")
        texts.extend(found or [m.content or ""])
    texts = [said for t in texts if (said := FROM_LINE.sub("", t).strip())]  # words, not names
    searches: list[tuple[str, list[dict[str, Any]]]] = []
    for m in messages[last_user + 1 :]:
        if m.role == "tool" and m.name == SEARCH_TOOL:
            try:
                data = json.loads(m.content or "")
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("results"), list):
                query = data.get("query")
                results = [r for r in data["results"] if isinstance(r, dict)]
                searches.append((query if isinstance(query, str) else "", results))
    return texts, (searches or None)


def _questions(texts: list[str]) -> list[str]:
    """What the turn's messages ask, without the greeting that may open them; a message that is
    only a greeting (or thanks) asks nothing."""
    out = []
    for text in texts:
        if _GREETING.match(text):
            continue
        rest = _GREETING_START.sub("", text, count=1).strip()
        if rest and not _GREETING.match(rest):
            out.append(rest)
    return out


def _answers(question: str, searches: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """One answer per search (each from its own best passage), without repeats; only "not
    found" when no search found anything."""
    parts = [_answer(query or question, results) for query, results in searches]
    found = [p for p in dict.fromkeys(parts) if p != NOT_FOUND]
    return "\n\n".join(found) if found else NOT_FOUND


def _answer(question: str, results: list[dict[str, Any]]) -> str:
    if not results:
        return NOT_FOUND
    best = results[0]
    text = str(best.get("text", "")).strip()
    if not text:
        return NOT_FOUND
    passage = text if len(text) <= 400 else _best_block(question, text)
    source = str(best.get("source", "knowledge base"))
    section = str(best.get("section", "")).split(" › ")[-1]
    cite = f"{source} › {section}" if section else source
    return f"{passage}\n\n_Source: {cite}_"


def _best_block(question: str, text: str) -> str:
    terms = set(tokenize(question))
    blocks = [b.strip() for b in _BLOCK_SPLIT.split(text) if b.strip()]
    if not blocks:
        return text[:400]
    scored = [(len(terms & set(tokenize(b))), -i, b) for i, b in enumerate(blocks)]
    _, neg_index, block = max(scored)
    # a list item reads better with its neighbours: take the run of items around it
    index = -neg_index
    if block.lstrip()[:1] in "-*+" or block.lstrip()[:1].isdigit():
        start, end = index, index + 1
        while start > 0 and blocks[start - 1].lstrip()[:1] in "-*+":
            start -= 1
        while end < len(blocks) and blocks[end].lstrip()[:1] in "-*+":
            end += 1
        block = "\n".join(blocks[start:end])
    return block
