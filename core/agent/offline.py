"""The offline model: answers from the knowledge base through the normal loop, with no network.

It behaves like a tool-calling model: on a new question it calls `search_knowledge`, and once
the results are in it answers from the best passage, citing its source. So `make run` works with
no key, and the offline path exercises the same loop, tools and limits as a real model.
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
from core.knowledge import tokenize

__all__ = ["OfflineModel"]

SEARCH_TOOL = "search_knowledge"
_USER = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)
_GREETING = re.compile(
    r"^\s*(hi|hello|hey|hola|buenas|good (morning|afternoon|evening)|thanks|thank you|gracias)"
    r"\b[\s!.,?]*(there|team)?[\s!.,?]*$",
    re.IGNORECASE,
)
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
        question, results = _read_turn(request.messages)
        can_search = request.tool_choice == "auto" and any(
            t.name == SEARCH_TOOL for t in request.tools
        )
        if results is None and _GREETING.match(question):
            text = GREETING
        elif results is None and can_search and question.strip():
            call = ToolCall("offline_0", SEARCH_TOOL, json.dumps({"query": question[:500]}))
            return self._response(request, "", (call,), "tool_calls")
        elif results is None:
            text = NO_SEARCH
        else:
            text = _answer(question, results)
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


def _read_turn(messages: tuple[ChatMessage, ...]) -> tuple[str, list[dict[str, Any]] | None]:
    """The question of the current turn and the search results given for it, if any."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user < 0:
        return "", None
    first_user = last_user
    while first_user > 0 and messages[first_user - 1].role == "user":
        first_user -= 1
    texts = []
    for m in messages[first_user : last_user + 1]:
        found = _USER.findall(m.content or "")
        texts.extend(found or [m.content or ""])
    question = "\n".join(t.strip() for t in texts if t.strip())
    results: list[dict[str, Any]] | None = None
    for m in messages[last_user + 1 :]:
        if m.role == "tool" and m.name == SEARCH_TOOL:
            try:
                data = json.loads(m.content or "")
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("results"), list):
                results = [r for r in data["results"] if isinstance(r, dict)]
    return question, results


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
