"""One contract for every model client: offline, OpenAI-compatible, Anthropic and scripted.

The HTTP clients talk to fake servers that answer like a tool-using model (call the offered tool,
answer from its result, obey tool_choice "none"), so the tests check what each client sends as
much as what it reads. The scripted model is told each answer. Every client also runs the real
AgentLoop with a tool once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from pydantic import BaseModel

from core.agent.loop import AgentEvent, AgentLoop, Limits, TextDelta, ToolStep, Turn
from core.agent.model import ChatMessage, ModelClient, ModelRequest, ModelResponse, ToolSpec
from core.agent.offline import OfflineModel
from core.agent.scripted import ScriptedModel
from core.agent.tools import ToolContext, ToolRegistry
from core.errors import ModelError
from providers.anthropic import AnthropicClient
from providers.openai import OpenAIClient, RetryPolicy
from tests import fake_anthropic, fake_openai
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import Error, FakeOpenAI, Garbage, Step, Text, ToolCalls
from tests.fakes import Deltas

QUESTION = "What are your opening hours?"
HOURS = "We open at 9 on weekdays."
RESULTS = {
    "query": QUESTION,
    "results": [{"source": "hours.md", "section": "Opening hours", "text": HOURS, "score": 1.0}],
}
SEARCH_SPEC = ToolSpec(
    "search_knowledge",
    "Search the knowledge base.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
FAST_RETRY = RetryPolicy(attempts=2, base_delay_s=0.01)


# -- fake servers that answer like a tool-using model --------------------------------------


def _answer(result_json: str) -> Step:
    best = json.loads(result_json)["results"][0]
    return Text(f"{best['text']} (source: {best['source']})")


def _openai_model(body: dict[str, Any]) -> Step:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return _answer(last["content"])
    if body.get("tools") and body.get("tool_choice") != "none":
        name = body["tools"][0]["function"]["name"]
        return ToolCalls([(name, json.dumps({"query": fake_openai.last_user_text(body)}))])
    return Text("Hello! How can I help you today?")


def _anthropic_model(body: dict[str, Any]) -> fake_anthropic.Step:
    last = body["messages"][-1]
    results = [b for b in last["content"] if b["type"] == "tool_result"]
    if results:
        return _answer(results[-1]["content"])
    if body.get("tools") and body["tool_choice"]["type"] != "none":
        name = body["tools"][0]["name"]
        return ToolCalls([(name, json.dumps({"query": fake_anthropic.last_user_text(body)}))])
    return Text("Hello! How can I help you today?")


# -- one harness per client ---------------------------------------------------------------


@dataclass
class Harness:
    """A client under contract, and how to tell it what comes next where it must be told."""

    client: ModelClient
    streams: bool  # pushes text in several pieces
    reports_usage: bool
    openai: FakeOpenAI | None = None
    anthropic: FakeAnthropic | None = None
    scripted: ScriptedModel | None = None
    closers: list[Callable[[], Any]] = field(default_factory=list)

    def expect_text(self, text: str) -> None:
        if self.scripted is not None:
            self.scripted.add({"text": text})

    def expect_call(self, name: str, args: dict[str, Any]) -> None:
        if self.scripted is not None:
            self.scripted.add({"tool_calls": [[name, args]]})

    def fail(self, kind: str) -> None:
        """ "refused": the provider turns the request down; "broken": it answers nonsense."""
        step: Step = Error(400, "refused") if kind == "refused" else Garbage()
        for fake in (self.openai, self.anthropic):
            if fake is not None:
                fake.script(*[step] * (1 + FAST_RETRY.attempts))
        if self.scripted is not None and kind == "refused":
            self.scripted.add({"error": "refused"})  # "broken": the script has run out

    def problems(self) -> list[str]:
        return self.anthropic.problems if self.anthropic is not None else []


CLIENTS = [
    "offline",
    "openai-stream",
    "openai-plain",
    "anthropic-stream",
    "anthropic-plain",
    "scripted",
]
FAILING = [c for c in CLIENTS if c != "offline"]  # the offline model has no way to fail
HTTP = [c for c in CLIENTS if c.startswith(("openai", "anthropic"))]


async def _harness(name: str) -> Harness:
    if name == "offline":
        return Harness(OfflineModel(), streams=True, reports_usage=True)
    if name == "scripted":
        model = ScriptedModel()
        return Harness(model, streams=True, reports_usage=False, scripted=model)
    stream = name.endswith("-stream")
    if name.startswith("openai"):
        openai = FakeOpenAI(responder=_openai_model)
        await openai.start()
        client: ModelClient = OpenAIClient(
            base_url=openai.url, model="m", stream=stream, retry=FAST_RETRY
        )
        return Harness(client, stream, True, openai=openai, closers=[openai.aclose])
    anthropic = FakeAnthropic(responder=_anthropic_model)
    await anthropic.start()
    client = AnthropicClient(
        base_url=anthropic.url, model="m", api_key="test-key", stream=stream, retry=FAST_RETRY
    )
    return Harness(client, stream, True, anthropic=anthropic, closers=[anthropic.aclose])


@pytest_asyncio.fixture(params=CLIENTS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = await _harness(request.param)
    yield h
    await h.client.aclose()
    for close in h.closers:
        await close()


def _request(
    *extra: ChatMessage, tools: tuple[ToolSpec, ...] = (SEARCH_SPEC,), **kw: Any
) -> ModelRequest:
    messages = (ChatMessage("system", "Answer from the knowledge base."), *extra)
    return ModelRequest(messages=messages, tools=tools, **kw)


def _assert_usage(h: Harness, r: ModelResponse) -> None:
    if h.reports_usage:
        assert isinstance(r.input_tokens, int)
        assert isinstance(r.output_tokens, int)
        assert r.input_tokens > 0
        assert r.output_tokens > 0
    else:  # no usage at all, never half of it: the loop then estimates both
        assert (r.input_tokens, r.output_tokens) == (None, None)


# -- the contract -------------------------------------------------------------------------


async def test_text_streams_through_on_delta(harness: Harness) -> None:
    harness.expect_text("Hello! How can I help you today?")
    deltas = Deltas()

    r = await harness.client.complete(_request(ChatMessage("user", "hello"), tools=()), deltas)

    assert r.text.startswith("Hello")
    assert "".join(deltas.seen) == r.text
    assert len(deltas.seen) > 1 if harness.streams else deltas.seen == [r.text]
    assert r.tool_calls == ()
    assert r.finish_reason == "stop"
    _assert_usage(harness, r)
    assert harness.problems() == []


async def test_tool_call_is_complete(harness: Harness) -> None:
    harness.expect_call("search_knowledge", {"query": QUESTION})
    deltas = Deltas()

    r = await harness.client.complete(_request(ChatMessage("user", QUESTION)), deltas)

    (call,) = r.tool_calls
    assert call.id
    assert call.name == "search_knowledge"
    assert json.loads(call.arguments) == {"query": QUESTION}
    assert r.finish_reason == "tool_calls"
    assert r.text == ""
    assert deltas.seen == []
    _assert_usage(harness, r)


async def test_tool_result_fed_back_gives_the_answer(harness: Harness) -> None:
    harness.expect_call("search_knowledge", {"query": QUESTION})
    harness.expect_text(HOURS)
    asked = ChatMessage("user", QUESTION)
    first = await harness.client.complete(_request(asked))
    (call,) = first.tool_calls
    deltas = Deltas()

    r = await harness.client.complete(
        _request(
            asked,
            ChatMessage("assistant", None, first.tool_calls),
            ChatMessage("tool", json.dumps(RESULTS), tool_call_id=call.id, name=call.name),
        ),
        deltas,
    )

    assert HOURS in r.text
    assert "".join(deltas.seen) == r.text
    assert r.tool_calls == ()
    assert r.finish_reason == "stop"
    assert harness.problems() == []


async def test_tool_choice_none_yields_text(harness: Harness) -> None:
    harness.expect_text("I can only answer from the knowledge base.")
    r = await harness.client.complete(_request(ChatMessage("user", QUESTION), tool_choice="none"))
    assert r.tool_calls == ()
    assert r.text
    assert r.finish_reason == "stop"


@pytest.mark.parametrize("harness", HTTP, indirect=True)
async def test_every_call_declares_its_own_tool_set(harness: Harness) -> None:
    """The tools' JSON is encoded once per tool set; every body still carries the set it was
    asked with, whole, and a new set (even a new tuple of the same length) is its own."""
    fake = harness.openai or harness.anthropic
    assert fake is not None
    other = ToolSpec("get_time", "The time now.", {"type": "object", "properties": {}})
    sets = [(SEARCH_SPEC,), (SEARCH_SPEC,), (other,), (SEARCH_SPEC, other), (SEARCH_SPEC,)]
    shown = []
    for tools in sets:
        await harness.client.complete(_request(ChatMessage("user", "hi"), tools=tools))
        body = fake.requests[-1]
        assert body["messages"][-1]["content"] in ("hi", [{"type": "text", "text": "hi"}])
        shown.append([t.get("name") or t["function"]["name"] for t in body["tools"]])
    assert shown == [[t.name for t in tools] for tools in sets]
    assert json.loads(json.dumps(fake.requests[-1]["tools"])) == fake.requests[0]["tools"]


@pytest.mark.parametrize("kind", ["refused", "broken"])
@pytest.mark.parametrize("harness", FAILING, indirect=True)
async def test_failures_are_model_errors(harness: Harness, kind: str) -> None:
    harness.fail(kind)
    with pytest.raises(ModelError):
        await harness.client.complete(_request(ChatMessage("user", QUESTION)))


async def test_aclose_can_be_called_twice(harness: Harness) -> None:
    await harness.client.aclose()
    await harness.client.aclose()


# -- through the real loop ----------------------------------------------------------------


class SearchArgs(BaseModel):
    query: str


class FixedSearch:
    """search_knowledge over one fixed section, so the test does not depend on a corpus."""

    name: ClassVar[str] = "search_knowledge"
    description: ClassVar[str] = "Search the knowledge base."
    args_model: ClassVar[type[BaseModel]] = SearchArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 1.0

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def __call__(self, args: SearchArgs, ctx: ToolContext) -> dict[str, Any]:
        self.queries.append(args.query)
        return RESULTS


async def test_agent_loop_runs_a_tool_with_every_client(harness: Harness) -> None:
    harness.expect_call("search_knowledge", {"query": QUESTION})
    harness.expect_text(HOURS)
    search = FixedSearch()
    loop = AgentLoop(harness.client, ToolRegistry([search]), Limits())
    events: list[AgentEvent] = []

    async def emit(event: AgentEvent) -> None:
        events.append(event)

    turn = Turn(run_id="r1", session="s1", system="Be brief.", history=[], user_texts=[QUESTION])
    out = await loop.run(turn, emit)

    assert out.status == "ok", out.error
    assert out.steps == 2
    assert out.tool_calls == 1
    assert search.queries == [QUESTION]
    steps = [e for e in events if isinstance(e, ToolStep)]
    assert [(s.name, s.ok) for s in steps] == [("search_knowledge", True)]
    assert HOURS in out.text
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == out.text
    assert out.input_tokens > 0
    assert out.output_tokens > 0
    assert harness.problems() == []
