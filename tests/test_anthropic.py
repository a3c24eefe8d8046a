"""AnthropicClient against the fake Messages API, streaming and not, and its message mapping."""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from core.agent.model import ChatMessage, ModelRequest, ToolCall
from core.errors import ModelError
from providers.anthropic import NO_RESULT, OMITTED, AnthropicClient, to_anthropic_messages
from providers.openai import RetryPolicy
from tests.fake_anthropic import (
    Cut,
    Error,
    FakeAnthropic,
    Garbage,
    StreamError,
    Text,
    ToolCalls,
)
from tests.fakes import ADD_SPEC, Deltas, count_calls
from tests.fakes import simple_request as _request
from tests.loopback import serve

FAST_RETRY = RetryPolicy(attempts=2, base_delay_s=0.01)
ClientFactory = Callable[..., AnthropicClient]


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    server = FakeAnthropic()
    await server.start()
    yield server
    await server.aclose()


@pytest.fixture(params=[True, False], ids=["stream", "no-stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest_asyncio.fixture
async def make_client(fake: FakeAnthropic) -> AsyncIterator[ClientFactory]:
    made: list[AnthropicClient] = []

    def factory(*, stream: bool, **kw: Any) -> AnthropicClient:
        kw.setdefault("retry", FAST_RETRY)
        kw.setdefault("model", "claude-test")
        kw.setdefault("api_key", fake.api_key)
        client = AnthropicClient(base_url=fake.url, stream=stream, **kw)
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()


# -- answers ------------------------------------------------------------------------------


async def test_plain_text_pushes_deltas_in_order(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    answer = "We open at eight on weekdays and nine on Saturday."
    fake.script(Text(answer))
    deltas = Deltas()

    response = await make_client(stream=stream).complete(_request(), deltas)

    assert response.text == answer
    assert response.tool_calls == ()
    assert response.finish_reason == "stop"
    assert "".join(deltas.seen) == answer
    if stream:
        assert deltas.seen[:2] == ["We ", "open "]
    else:
        assert deltas.seen == [answer]
    assert fake.problems == []


async def test_usage_is_read(fake: FakeAnthropic, make_client: ClientFactory, stream: bool) -> None:
    fake.script(Text("ok"))
    response = await make_client(stream=stream).complete(_request())
    assert (response.input_tokens, response.output_tokens) == (100, 10)


async def test_cached_input_counts_as_input(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.usage = {
        "input_tokens": 20,
        "cache_creation_input_tokens": 10,
        "cache_read_input_tokens": 70,
        "output_tokens": 10,
    }
    fake.script(Text("ok"))
    response = await make_client(stream=stream).complete(_request())
    assert (response.input_tokens, response.output_tokens) == (100, 10)


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("stop", "stop"), ("length", "length"), ("refusal", "content_filter"), ("new", "new")],
)
async def test_stop_reason_becomes_finish_reason(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool, stop_reason: str, finish: str
) -> None:
    fake.script(Text("cut short", finish_reason=stop_reason))  # "stop" -> end_turn, "length"
    response = await make_client(stream=stream).complete(_request())  # -> max_tokens
    assert response.finish_reason == finish
    assert response.text == "cut short"


async def test_two_tool_calls_are_assembled(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    first_args = json.dumps({"first": 12345, "second": 67890})
    second_args = json.dumps({"query": "opening hours on public holidays"})
    fake.script(ToolCalls([("add", first_args), ("search_knowledge", second_args)]))
    deltas = Deltas()

    response = await make_client(stream=stream).complete(_request(tools=(ADD_SPEC,)), deltas)

    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("add", {"first": 12345, "second": 67890}),
        ("search_knowledge", {"query": "opening hours on public holidays"}),
    ]
    ids = [c.id for c in response.tool_calls]
    assert all(i.startswith("toolu_") for i in ids)
    assert len(set(ids)) == 2
    assert response.finish_reason == "tool_calls"
    assert response.text == ""
    assert deltas.seen == []


async def test_tool_calls_with_text(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(ToolCalls([("add", '{"first": 1, "second": 2}')], text="Let me add."))
    deltas = Deltas()
    response = await make_client(stream=stream).complete(_request(tools=(ADD_SPEC,)), deltas)
    assert response.text == "Let me add."
    assert "".join(deltas.seen) == "Let me add."
    assert [c.name for c in response.tool_calls] == ["add"]
    assert json.loads(response.tool_calls[0].arguments) == {"first": 1, "second": 2}


# -- the request --------------------------------------------------------------------------


async def test_request_body_and_headers(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Text("ok"))
    client = make_client(stream=stream, model="claude-x")

    await client.complete(
        _request(tools=(ADD_SPEC,), tool_choice="none", max_tokens=123, temperature=0.7)
    )

    (body,) = fake.requests
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 123
    assert body["temperature"] == 0.7
    assert body["system"] == "be brief"
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert body["tools"] == [
        {"name": "add", "description": "Add two integers.", "input_schema": ADD_SPEC.parameters}
    ]
    assert body["tool_choice"] == {"type": "none"}
    assert body.get("stream", False) is stream
    (headers,) = fake.headers
    assert headers["x-api-key"] == "test-key"
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json"
    assert "authorization" not in headers
    assert fake.problems == []


async def test_tool_choice_auto_and_no_tools(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Text("ok"), Text("ok"))
    client = make_client(stream=stream)
    await client.complete(_request(tools=(ADD_SPEC,), tool_choice="auto"))
    await client.complete(_request(tool_choice="auto"))
    with_tools, without = fake.requests
    assert with_tools["tool_choice"] == {"type": "auto"}
    assert "tools" not in without
    assert "tool_choice" not in without


async def test_temperature_is_clamped_to_the_api_range(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(Text("ok"))
    await make_client(stream=True).complete(_request(temperature=1.6))
    assert fake.requests[0]["temperature"] == 1.0
    assert fake.problems == []


async def test_a_run_with_tool_results_is_valid_for_the_api(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    """The shape the loop sends after two tool calls and a steered message."""
    fake.script(Text("3 and 7"))
    calls = (ToolCall("call_1", "add", '{"first": 1, "second": 2}'), ToolCall("call_2", "add", "{"))
    request = ModelRequest(
        messages=(
            ChatMessage("system", "sys"),
            ChatMessage("user", "earlier question"),
            ChatMessage("assistant", "earlier answer"),
            ChatMessage("user", "add twice"),
            ChatMessage("assistant", "Adding.", calls),
            ChatMessage("tool", '{"sum": 3}', tool_call_id="call_1", name="add"),
            ChatMessage(
                "tool", '{"error": "invalid_arguments"}', tool_call_id="call_2", name="add"
            ),
            ChatMessage("user", "and hurry"),
        ),
        tools=(ADD_SPEC,),
    )

    response = await make_client(stream=stream).complete(request)

    assert response.text == "3 and 7"
    assert fake.problems == []
    messages = fake.requests[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[3]["content"] == [
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"first": 1, "second": 2}},
        {"type": "tool_use", "id": "call_2", "name": "add", "input": {}},  # bad JSON: empty
    ]
    assert messages[4]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": '{"sum": 3}'},
        {
            "type": "tool_result",
            "tool_use_id": "call_2",
            "content": '{"error": "invalid_arguments"}',
        },
        {"type": "text", "text": "and hurry"},
    ]


def test_mapping_fixes_what_the_api_refuses() -> None:
    system, messages = to_anthropic_messages(
        [
            ChatMessage("system", "one"),
            ChatMessage("assistant", "a reply whose question left the history window"),
            ChatMessage("user", "   "),
            ChatMessage("user", "first"),
            ChatMessage("user", "second"),
            ChatMessage("tool", '{"x": 1}', tool_call_id="gone", name="lookup"),
            ChatMessage("assistant", None, (ToolCall("bad.id:1", "lookup", "[1, 2]"),)),
            ChatMessage("system", "two"),
        ]
    )
    assert system == "one\n\ntwo"
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": OMITTED}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a reply whose question left the history window"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "second"},
                {"type": "text", "text": '[result of lookup]\n{"x": 1}'},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "bad_id_1", "name": "lookup", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "bad_id_1",
                    "content": NO_RESULT,
                    "is_error": True,
                }
            ],
        },
    ]


async def test_base_url_with_v1_suffix_is_tolerated(fake: FakeAnthropic) -> None:
    fake.script(Text("ok"))
    client = AnthropicClient(base_url=fake.url + "/v1/", model="m", api_key="test-key")
    try:
        assert (await client.complete(_request())).text == "ok"
    finally:
        await client.aclose()


# -- retries and failures -----------------------------------------------------------------


async def test_wrong_key_is_an_authentication_error_not_retried(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    with pytest.raises(ModelError) as info:
        await make_client(stream=stream, api_key="wrong").complete(_request())
    assert info.value.status == 401
    assert info.value.retryable is False
    assert "authentication_error" in str(info.value)
    assert len(fake.headers) == 1


async def test_429_is_retried_after_retry_after(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Error(429, "slow down", retry_after=0.4), Text("made it"))
    started = time.monotonic()
    response = await make_client(stream=stream).complete(_request())
    assert response.text == "made it"
    assert len(fake.requests) == 2
    assert time.monotonic() - started >= 0.38  # the backoff alone would be ~0.01 s


async def test_529_overloaded_and_500_are_retried(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Error(529, "Overloaded"), Error(500), Text("third time lucky"))
    deltas = Deltas()
    response = await make_client(stream=stream).complete(_request(), deltas)
    assert response.text == "third time lucky"
    assert "".join(deltas.seen) == "third time lucky"
    assert len(fake.requests) == 3


async def test_retries_exhausted_raise_with_the_api_error(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Error(529, "Overloaded"), Error(529, "Overloaded"), Error(529, "Overloaded"))
    with pytest.raises(ModelError) as info:
        await make_client(stream=stream).complete(_request())
    assert info.value.status == 529
    assert info.value.retryable is True
    assert "overloaded_error: Overloaded" in str(info.value)
    assert "request-id req_3" in str(info.value)
    assert len(fake.requests) == 3


async def test_400_is_not_retried(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Error(400, "prompt is too long"), Text("never served"))
    with pytest.raises(ModelError, match="invalid_request_error: prompt is too long") as info:
        await make_client(stream=stream).complete(_request())
    assert info.value.status == 400
    assert info.value.retryable is False
    assert len(fake.requests) == 1


async def test_stream_cut_after_text_is_not_retried(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(Cut("partial answer"), Text("a retry would repeat the text"))
    deltas = Deltas()
    with pytest.raises(ModelError):
        await make_client(stream=True).complete(_request(), deltas)
    assert "".join(deltas.seen) == "partial answer"
    assert len(fake.requests) == 1


async def test_stream_cut_before_any_text_is_retried(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(Cut(""), Text("recovered"))
    response = await make_client(stream=True).complete(_request())
    assert response.text == "recovered"
    assert len(fake.requests) == 2


async def test_overloaded_error_event_before_text_is_retried(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(StreamError("overloaded_error"), Text("recovered"))
    response = await make_client(stream=True).complete(_request())
    assert response.text == "recovered"
    assert len(fake.requests) == 2


async def test_error_event_after_text_is_raised(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(StreamError("overloaded_error", text="Half an"), Text("not reached"))
    deltas = Deltas()
    with pytest.raises(ModelError, match="overloaded_error") as info:
        await make_client(stream=True).complete(_request(), deltas)
    assert info.value.retryable is True
    assert "".join(deltas.seen) == "Half an"
    assert len(fake.requests) == 1


async def test_non_retryable_error_event(fake: FakeAnthropic, make_client: ClientFactory) -> None:
    fake.script(StreamError("invalid_request_error"), Text("not reached"))
    with pytest.raises(ModelError, match="invalid_request_error") as info:
        await make_client(stream=True).complete(_request())
    assert info.value.retryable is False
    assert len(fake.requests) == 1


async def test_garbage_body_raises_model_error(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Garbage(), Garbage(), Garbage(), Text("not reached"))
    with pytest.raises(ModelError) as info:
        await make_client(stream=stream).complete(_request())
    assert info.value.retryable is True
    assert len(fake.requests) == 3


async def test_garbage_once_then_success(
    fake: FakeAnthropic, make_client: ClientFactory, stream: bool
) -> None:
    fake.script(Garbage(), Text("fine now"))
    assert (await make_client(stream=stream).complete(_request())).text == "fine now"
    assert len(fake.requests) == 2


async def test_slow_response_times_out(
    fake: FakeAnthropic,
    make_client: ClientFactory,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.script(*(Text("too slow", delay_s=0.4) for _ in range(3)))
    client = make_client(stream=stream, timeout_s=0.1)
    tries: Counter[str] = Counter()
    count_calls(monkeypatch, client, "_send", tries)
    started = time.monotonic()
    with pytest.raises(ModelError, match="timed out"):
        await client.complete(_request())
    assert time.monotonic() - started < 1.2
    # three tries, counted as the client makes them (on a loaded machine a try may give up
    # before the fake has read its request, or even received it)
    assert tries["_send"] == 3


# -- the stream parser and status handling against hand-made answers ----------------------


class Canned:
    """An HTTP server on 127.0.0.1 that answers each request with the next canned response
    and records the paths it was asked for."""

    def __init__(self) -> None:
        self.answers: deque[web.Response] = deque()
        self.paths: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner, self.url = await serve(app, access_log=None, shutdown_timeout=0.2)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        await request.read()
        return self.answers.popleft()


@pytest_asyncio.fixture
async def canned() -> AsyncIterator[Canned]:
    server = Canned()
    await server.start()
    yield server
    await server.aclose()


def _canned_client(
    canned: Canned,
    *answers: web.Response,
    retry: RetryPolicy | None = None,
    stream: bool = True,
) -> AnthropicClient:
    canned.answers.extend(answers)
    return AnthropicClient(
        model="m",
        stream=stream,
        api_key="k",
        base_url=canned.url,
        retry=retry or RetryPolicy(attempts=0),
    )


def _sse(*events: dict[str, Any]) -> web.Response:
    body = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    return web.Response(body=body, content_type="text/event-stream")


START = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}
STOP = {"type": "message_stop"}


async def test_stream_that_is_not_an_event_stream_fails(canned: Canned) -> None:
    client = _canned_client(canned, web.Response(text="<html>hi</html>"))
    try:
        with pytest.raises(ModelError, match="event stream"):
            await client.complete(_request())
    finally:
        await client.aclose()


async def test_a_stream_answered_whole_is_read(canned: Canned) -> None:
    whole = {
        "content": [{"type": "text", "text": "whole answer"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }
    client = _canned_client(canned, web.json_response(whole))
    try:
        assert (await client.complete(_request())).text == "whole answer"
    finally:
        await client.aclose()


async def test_stream_without_stop_ended_early(canned: Canned) -> None:
    delta = {"type": "text_delta", "text": "hi"}
    client = _canned_client(
        canned, _sse(START, {"type": "content_block_delta", "index": 0, "delta": delta})
    )
    try:
        with pytest.raises(ModelError, match="ended early"):
            await client.complete(_request())
    finally:
        await client.aclose()


async def test_stream_ignores_unknown_events_and_keeps_empty_tool_input(canned: Canned) -> None:
    block = {"type": "tool_use", "id": "toolu_a", "name": "now", "input": {}}
    client = _canned_client(
        canned,
        _sse(
            START,
            {"type": "ping"},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta"}},
            {"type": "some_future_event", "x": 1},
            {"type": "content_block_start", "index": 1, "content_block": block},
            {"type": "content_block_stop", "index": 1},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}},
            STOP,
        ),
    )
    try:
        response = await client.complete(_request())
    finally:
        await client.aclose()
    assert response.tool_calls == (ToolCall("toolu_a", "now", "{}"),)
    assert response.finish_reason == "tool_calls"
    assert (response.input_tokens, response.output_tokens) == (7, 1)


async def test_retry_after_ms_and_x_should_retry(canned: Canned) -> None:
    client = _canned_client(
        canned,
        web.json_response({}, status=500, headers={"x-should-retry": "false"}),
        web.json_response({}, status=429, headers={"retry-after-ms": "250"}),
        web.json_response({"content": [], "usage": {}, "stop_reason": "end_turn"}),
        retry=FAST_RETRY,
        stream=False,
    )
    try:
        with pytest.raises(ModelError) as info:  # the API said not to retry this 500
            await client.complete(_request())
        assert info.value.retryable is False
        started = time.monotonic()
        response = await client.complete(_request())
        assert time.monotonic() - started >= 0.24
    finally:
        await client.aclose()
    assert response.text == ""
    assert response.input_tokens is None  # no usage reported: the loop estimates
    assert canned.paths == ["/v1/messages"] * 3


async def test_malformed_message_body_is_a_model_error(canned: Canned) -> None:
    client = _canned_client(canned, web.json_response({"content": "not a list"}), stream=False)
    try:
        with pytest.raises(ModelError, match="malformed"):
            await client.complete(_request())
    finally:
        await client.aclose()


async def test_stream_stalling_after_text_times_out_without_retry(
    fake: FakeAnthropic, make_client: ClientFactory
) -> None:
    fake.script(Text("first second", chunk_delay_s=0.4), Text("not reached"))
    deltas = Deltas()
    with pytest.raises(ModelError, match="stream timed out"):
        await make_client(stream=True, timeout_s=0.1).complete(_request(), deltas)
    assert deltas.seen == ["first "]
    assert len(fake.requests) == 1


def test_tool_results_open_their_user_turn() -> None:
    _, messages = to_anthropic_messages(
        [
            ChatMessage("user", "go"),
            ChatMessage("assistant", None, (ToolCall("a", "lookup", "{}"),)),
            ChatMessage("tool", "stale", tool_call_id="older", name="lookup"),
            ChatMessage("tool", "fresh", tool_call_id="a", name="lookup"),
        ]
    )
    assert messages[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "fresh"},
        {"type": "text", "text": "[result of lookup]\nstale"},
    ]
