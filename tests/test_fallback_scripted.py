"""FallbackModel (the second model when the first fails) and the product ScriptedModel."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ValidationError

from core.agent.fallback import FallbackModel
from core.agent.loop import AgentEvent, AgentLoop, Limits, Turn
from core.agent.model import ChatMessage, ModelRequest, ModelResponse, ToolSpec
from core.agent.scripted import ScriptedModel, ScriptStep, load_script
from core.agent.tools import ToolContext, ToolRegistry
from core.errors import ConfigError, ModelError
from providers.anthropic import AnthropicClient
from providers.openai import OpenAIClient, RetryPolicy
from tests.fake_anthropic import Error, FakeAnthropic
from tests.fake_openai import Error as OpenAIError
from tests.fake_openai import FakeOpenAI, Text
from tests.fakes import Deltas

TOOL = ToolSpec("add", "Add.", {"type": "object", "properties": {}})
REQUEST = ModelRequest(messages=(ChatMessage("user", "hi"),), tools=(TOOL,))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Closing(ScriptedModel):
    """A scripted model that records aclose, and can fail it."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.closed = False
        self._fail = fail

    async def aclose(self) -> None:
        self.closed = True
        if self._fail:
            raise RuntimeError("close failed")


# -- FallbackModel ------------------------------------------------------------------------


async def test_primary_answers_and_the_fallback_is_not_asked() -> None:
    primary, fallback = ScriptedModel([{"text": "from primary"}]), ScriptedModel()
    r = await FallbackModel(primary, fallback).complete(REQUEST)
    assert r.text == "from primary"
    assert fallback.requests == []


async def test_primary_failure_before_text_goes_to_the_fallback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary = ScriptedModel([{"error": "overloaded"}])
    fallback = ScriptedModel([{"text": "from the fallback"}])
    deltas = Deltas()

    with caplog.at_level(logging.WARNING, logger="core.agent.fallback"):
        r = await FallbackModel(primary, fallback).complete(REQUEST, deltas)

    assert r.text == "from the fallback"
    assert "".join(deltas.seen) == "from the fallback"
    assert fallback.requests == [REQUEST]  # the same request, unchanged
    assert "primary model failed" in caplog.text
    assert "overloaded" in caplog.text


async def test_primary_failure_after_text_is_raised() -> None:
    primary = ScriptedModel([{"text": "Half an", "error": "stream cut"}])
    fallback = ScriptedModel([{"text": "a second answer would repeat the first"}])
    deltas = Deltas()

    with pytest.raises(ModelError, match="stream cut"):
        await FallbackModel(primary, fallback).complete(REQUEST, deltas)

    assert "".join(deltas.seen) == "Half an"
    assert fallback.requests == []


async def test_both_failing_raises_the_fallback_error() -> None:
    primary = ScriptedModel([{"error": "primary down"}])
    fallback = ScriptedModel([{"error": "fallback down"}])
    with pytest.raises(ModelError, match="fallback down"):
        await FallbackModel(primary, fallback).complete(REQUEST)
    assert len(primary.requests) == len(fallback.requests) == 1


async def test_fallback_goes_first_during_the_cooldown() -> None:
    clock = Clock()
    primary = ScriptedModel([{"error": "down"}, {"text": "primary back"}])
    fallback = ScriptedModel(
        [{"text": "fb 1"}, {"text": "fb 2"}, {"error": "fb down"}, {"text": "fb 3"}]
    )
    model = FallbackModel(primary, fallback, cooldown_s=30, clock=clock)

    assert (await model.complete(REQUEST)).text == "fb 1"  # primary failed: cooldown starts
    clock.now += 10
    assert (await model.complete(REQUEST)).text == "fb 2"  # primary skipped
    assert len(primary.requests) == 1
    clock.now += 10
    assert (await model.complete(REQUEST)).text == "primary back"  # fallback failed: primary
    clock.now += 1
    assert (await model.complete(REQUEST)).text == "fb 3"  # primary answered: no cooldown...
    assert len(primary.requests) == 3  # ...so it went first, failed (script ran out), fell back


async def test_cooldown_ends() -> None:
    clock = Clock()
    primary = ScriptedModel([{"error": "down"}, {"text": "primary again"}])
    fallback = ScriptedModel([{"text": "fb"}])
    model = FallbackModel(primary, fallback, cooldown_s=30, clock=clock)
    await model.complete(REQUEST)
    clock.now += 30.5
    assert (await model.complete(REQUEST)).text == "primary again"
    assert len(fallback.requests) == 1


async def test_aclose_closes_both_even_if_the_first_fails() -> None:
    primary, fallback = Closing(fail=True), Closing()
    with pytest.raises(RuntimeError):
        await FallbackModel(primary, fallback).aclose()
    assert primary.closed
    assert fallback.closed


async def test_loop_falls_back_from_an_overloaded_anthropic_to_openai() -> None:
    anthropic, openai = FakeAnthropic(), FakeOpenAI()
    await anthropic.start()
    await openai.start()
    anthropic.script(*[Error(529, "Overloaded")] * 2)
    openai.script(Text("Answered by the fallback."))
    primary = AnthropicClient(
        base_url=anthropic.url,
        model="claude",
        api_key="test-key",
        retry=RetryPolicy(attempts=1, base_delay_s=0.01),
    )
    fallback = OpenAIClient(base_url=openai.url, model="gpt", retry=RetryPolicy(attempts=0))
    model = FallbackModel(primary, fallback)
    events: list[AgentEvent] = []

    async def emit(event: AgentEvent) -> None:
        events.append(event)

    try:
        out = await AgentLoop(model, ToolRegistry(), Limits()).run(
            Turn(run_id="r", session="s", system="sys", history=[], user_texts=["hi"]), emit
        )
    finally:
        await model.aclose()
        await anthropic.aclose()
        await openai.aclose()
    assert out.status == "ok"
    assert out.text == "Answered by the fallback."
    assert len(anthropic.requests) == 2  # the first try and one retry
    assert len(openai.requests) == 1
    # the run says which model answered (the console showed no sign of the fallback)
    assert [c["model"] for c in out.calls if "step" in c] == ["gpt"]


async def test_a_long_retry_after_goes_to_the_fallback_while_the_run_has_time() -> None:
    """The primary asks for 30 s in a run of 4: waiting it out used to time the run out with
    the fallback never asked (and, the run cancelled, the cooldown never started)."""
    primary, second = FakeOpenAI(), FakeOpenAI()
    await primary.start()
    await second.start()
    primary.script(*[OpenAIError(429, "slow down", retry_after=30)] * 5)
    second.script(Text("Answered by the fallback."), Text("Again the fallback."))
    model = FallbackModel(
        OpenAIClient(base_url=primary.url, model="a", retry=RetryPolicy(attempts=3)),
        OpenAIClient(base_url=second.url, model="b", retry=RetryPolicy(attempts=0)),
    )
    loop = AgentLoop(model, ToolRegistry(), Limits(run_timeout_s=4))

    async def emit(event: AgentEvent) -> None:
        return None

    try:
        outs = [
            await loop.run(
                Turn(run_id=r, session="s", system="sys", history=[], user_texts=["hi"]), emit
            )
            for r in ("r1", "r2")
        ]
    finally:
        await model.aclose()
        await primary.aclose()
        await second.aclose()
    assert [(o.status, o.text) for o in outs] == [
        ("ok", "Answered by the fallback."),
        ("ok", "Again the fallback."),
    ]
    assert len(primary.requests) == 1  # the second run went to the fallback first (cooldown)


# -- ScriptedModel ------------------------------------------------------------------------


async def test_scripted_steps_replay_in_order() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [["add", {"a": 1}], ["lookup", '{"id": 7}']], "input_tokens": 40},
            ScriptStep(text="Done, all good.", output_tokens=5, finish_reason="length"),
        ]
    )
    deltas = Deltas()

    first = await model.complete(REQUEST, deltas)
    second = await model.complete(REQUEST, deltas)

    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("script_1_0", "add", '{"a": 1}'),
        ("script_1_1", "lookup", '{"id": 7}'),
    ]
    assert (first.finish_reason, first.input_tokens, first.output_tokens) == (
        "tool_calls",
        40,
        None,
    )
    assert second == ModelResponse("Done, all good.", (), None, 5, "length")
    assert deltas.seen == ["Done, ", "all ", "good."]
    assert model.requests == [REQUEST, REQUEST]
    assert model.remaining == 0


async def test_scripted_model_fails_loudly_when_the_script_runs_out() -> None:
    model = ScriptedModel([{"text": "only one"}])
    await model.complete(REQUEST)
    with pytest.raises(ModelError, match="no step left for call 2"):
        await model.complete(REQUEST)


@pytest.mark.parametrize(
    "request_",
    [
        ModelRequest(messages=REQUEST.messages, tools=(TOOL,), tool_choice="none"),
        ModelRequest(messages=REQUEST.messages),
    ],
    ids=["tool-choice-none", "no-tools"],
)
async def test_scripted_tool_calls_where_none_are_allowed_fail(request_: ModelRequest) -> None:
    model = ScriptedModel([{"tool_calls": [["add", "{}"]]}])
    with pytest.raises(ModelError, match=r"step 1 calls tools \(add\), but call 1 allows none"):
        await model.complete(request_)


def test_scripted_steps_are_validated() -> None:
    with pytest.raises(ValidationError):
        ScriptedModel([{"txt": "typo"}])
    with pytest.raises(ValidationError):
        ScriptedModel([{"error": "x", "tool_calls": [["add", "{}"]]}])
    with pytest.raises(ValidationError):
        ScriptedModel([{"tool_calls": [["add"]]}])


class AddArgs(BaseModel):
    first: int
    second: int


class Add:
    name: ClassVar[str] = "add"
    description: ClassVar[str] = "Add two integers."
    args_model: ClassVar[type[BaseModel]] = AddArgs
    read_only: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: AddArgs, ctx: ToolContext) -> dict[str, Any]:
        return {"sum": args.first + args.second}


async def test_script_of_a_corrected_call_and_a_nonexistent_tool(tmp_path: Path) -> None:
    """The issue's scenarios, as a JSON script: bad arguments corrected, an unknown tool."""
    script = tmp_path / "script.json"
    steps = [
        {"tool_calls": [["add", '{"first": "one", "second": 2}'], ["subtract", "{}"]]},
        {"tool_calls": [["add", {"first": 1, "second": 2}]]},
        {"text": "1 + 2 = 3", "input_tokens": 300, "output_tokens": 7},
    ]
    script.write_text(json.dumps({"steps": steps}))
    model = ScriptedModel.from_file(script)
    events: list[AgentEvent] = []

    async def emit(event: AgentEvent) -> None:
        events.append(event)

    out = await AgentLoop(model, ToolRegistry([Add()]), Limits()).run(
        Turn(run_id="r", session="s", system="sys", history=[], user_texts=["1+2?"]), emit
    )

    assert out.status == "ok"
    assert out.text == "1 + 2 = 3"
    assert out.tool_calls == 3
    results = [m for m in model.requests[1].messages if m.role == "tool"]
    assert [json.loads(m.content or "")["error"] for m in results] == [
        "invalid_arguments",
        "unknown_tool",
    ]
    assert [m.content for m in model.requests[2].messages if m.role == "tool"][-1] == '{"sum": 3}'
    assert out.calls[2]["input_tokens"] == 300  # the script's usage, not an estimate


def test_load_script_accepts_a_plain_list(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"text": "hi"}]')
    assert load_script(path) == [ScriptStep(text="hi")]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        ("{not json", "is not valid JSON"),
        ("[]", "non-empty list of steps"),
        ('{"steps": [], "extra": 1}', "non-empty list of steps"),
        ('[{"text": "ok"}, {"txt": "typo"}]', "step 2: txt: Extra inputs are not permitted"),
        ('[{"input_tokens": -1}]', "step 1: input_tokens"),
    ],
)
def test_load_script_problems_name_the_key(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_script(path, key="agents.demo.model.script")
    ((key, message),) = info.value.problems
    assert key == "agents.demo.model.script"
    assert problem in message
