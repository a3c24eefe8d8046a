"""OpenAIClient against the fake OpenAI-compatible server, streaming and not."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from core.agent.model import ChatMessage, ModelRequest, ModelResponse, ToolCall
from core.errors import ModelError
from providers.openai import OpenAIClient, RetryPolicy, _ToolCallAssembler
from providers.sse import ServerSentEvent, SSEDecoder, SSEError
from tests.fake_openai import Cut, Error, FakeOpenAI, Garbage, Text, ToolCalls
from tests.fakes import ADD_SPEC, Deltas, count_calls
from tests.fakes import simple_request as _request
from tests.loopback import serve

FAST_RETRY = RetryPolicy(attempts=2, base_delay_s=0.01)

ClientFactory = Callable[..., OpenAIClient]


@pytest.fixture(params=[True, False], ids=["stream", "no-stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest_asyncio.fixture
async def make_client(fake_openai: FakeOpenAI) -> AsyncIterator[ClientFactory]:
    made: list[OpenAIClient] = []

    def factory(*, stream: bool, **kw: Any) -> OpenAIClient:
        kw.setdefault("retry", FAST_RETRY)
        kw.setdefault("model", "test-model")
        client = OpenAIClient(base_url=fake_openai.url, stream=stream, **kw)
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()


# -- answers ------------------------------------------------------------------------------


async def test_plain_text_pushes_deltas_in_order(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    answer = "We open at eight on weekdays and nine on Saturday."
    fake_openai.script(Text(answer))
    deltas = Deltas()

    response = await make_client(stream=stream).complete(_request(), deltas)

    assert response.text == answer
    assert response.tool_calls == ()
    assert response.finish_reason == "stop"
    assert "".join(deltas.seen) == answer
    if stream:
        assert len(deltas.seen) > 1  # pieces arrive as they stream
        assert deltas.seen[0] == "We "
    else:
        assert deltas.seen == [answer]  # a non-streaming client pushes the text once


async def test_usage_is_read(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("ok"))
    response = await make_client(stream=stream).complete(_request())
    assert (response.input_tokens, response.output_tokens) == (100, 10)


async def test_finish_reason_length_is_reported(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("cut short", finish_reason="length"))
    response = await make_client(stream=stream).complete(_request())
    assert response.finish_reason == "length"
    assert response.text == "cut short"


async def test_two_tool_calls_are_assembled(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    first_args = json.dumps({"first": 12345, "second": 67890})
    second_args = json.dumps({"query": "opening hours on public holidays"})
    # both longer than the 7-character pieces the fake streams arguments in
    assert len(first_args) > 14
    assert len(second_args) > 14
    fake_openai.script(ToolCalls([("add", first_args), ("search_knowledge", second_args)]))
    deltas = Deltas()

    response = await make_client(stream=stream).complete(_request(tools=(ADD_SPEC,)), deltas)

    assert [(c.name, c.arguments) for c in response.tool_calls] == [
        ("add", first_args),
        ("search_knowledge", second_args),
    ]
    ids = [c.id for c in response.tool_calls]
    assert all(ids)
    assert len(set(ids)) == 2
    assert response.finish_reason == "tool_calls"
    assert response.text == ""
    assert deltas.seen == []


async def test_tool_calls_with_text(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(ToolCalls([("add", '{"first": 1, "second": 2}')], text="Let me add."))
    deltas = Deltas()
    response = await make_client(stream=stream).complete(_request(tools=(ADD_SPEC,)), deltas)
    assert response.text == "Let me add."
    assert "".join(deltas.seen) == "Let me add."
    assert [c.name for c in response.tool_calls] == ["add"]
    assert json.loads(response.tool_calls[0].arguments) == {"first": 1, "second": 2}


# -- request body -------------------------------------------------------------------------


async def test_request_body(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("ok"))
    client = make_client(stream=stream, model="my-model-7b")

    await client.complete(
        _request(tools=(ADD_SPEC,), tool_choice="none", max_tokens=123, temperature=0.7)
    )

    (body,) = fake_openai.requests
    assert body["model"] == "my-model-7b"
    assert body["max_tokens"] == 123
    assert body["temperature"] == 0.7
    assert body["tool_choice"] == "none"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": ADD_SPEC.parameters,
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    if stream:
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert not body.get("stream")
        assert "stream_options" not in body


async def test_request_without_tools_has_no_tool_fields(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("ok"))
    await make_client(stream=stream).complete(_request(tool_choice="auto"))
    (body,) = fake_openai.requests
    assert "tools" not in body
    assert "tool_choice" not in body


async def test_tool_choice_auto_is_sent(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("ok"))
    await make_client(stream=stream).complete(_request(tools=(ADD_SPEC,), tool_choice="auto"))
    assert fake_openai.requests[0]["tool_choice"] == "auto"


async def test_history_messages_are_serialized(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("3"))
    call = ToolCall("call_9", "add", '{"first": 1, "second": 2}')
    request = ModelRequest(
        messages=(
            ChatMessage("system", "sys"),
            ChatMessage("user", "add 1 and 2"),
            ChatMessage("assistant", None, (call,)),
            ChatMessage("tool", '{"sum": 3}', tool_call_id="call_9", name="add"),
        ),
        tools=(ADD_SPEC,),
    )

    await make_client(stream=stream).complete(request)

    messages = fake_openai.requests[0]["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "add", "arguments": '{"first": 1, "second": 2}'},
            }
        ],
    }
    assert messages[3] == {"role": "tool", "content": '{"sum": 3}', "tool_call_id": "call_9"}
    assert "tool_call_id" not in messages[1]


async def test_authorization_header_when_api_key_given(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Text("ok"), Text("ok"))
    await make_client(stream=stream, api_key="sk-test-123").complete(_request())
    await make_client(stream=stream).complete(_request())

    with_key, without_key = fake_openai.headers
    assert with_key["authorization"] == "Bearer sk-test-123"
    assert "authorization" not in without_key


async def test_an_error_that_echoes_the_api_key_never_carries_it(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    """A provider's 401 may quote the key it was given; the error text ends in run records."""
    key = "sk-SECRETMODELKEY-4242424242"
    fake_openai.script(Error(401, f"Incorrect API key provided: {key}"))
    with pytest.raises(ModelError) as caught:
        await make_client(stream=stream, api_key=key).complete(_request())
    assert key not in str(caught.value)
    assert "Incorrect API key provided: ***" in str(caught.value)
    assert caught.value.status == 401


# -- retries and failures -----------------------------------------------------------------


async def test_429_is_retried_after_retry_after(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Error(429, "slow down", retry_after=0.4), Text("made it"))
    started = time.monotonic()

    response = await make_client(stream=stream).complete(_request())

    elapsed = time.monotonic() - started
    assert response.text == "made it"
    assert len(fake_openai.requests) == 2
    # the backoff alone would wait at most base_delay_s (0.01 s); Retry-After asks for 0.4 s
    assert elapsed >= 0.38


async def test_a_long_retry_after_is_waited_out_in_full_or_not_at_all(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    """A Retry-After over 32 s was cut to 32 s: the retry came early and met another 429."""
    assert RetryPolicy().delay(0, 40.0) == 40.0
    fake_openai.script(Error(429, "slow down", retry_after=40.0))
    client = make_client(stream=stream)
    request = dataclasses.replace(_request(), deadline=time.monotonic() + 30)
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        await client.complete(request)
    assert info.value.status == 429
    assert time.monotonic() - started < 5  # given up at once: the wait outlasts the run
    assert len(fake_openai.requests) == 1
    # with no deadline, a wait past max_wait_s is not waited either: the call fails at once
    fake_openai.script(Error(429, "come back later", retry_after=600.0))
    started = time.monotonic()
    with pytest.raises(ModelError):
        await client.complete(_request())
    assert time.monotonic() - started < 5
    assert len(fake_openai.requests) == 2


async def test_500_is_retried_then_succeeds(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Error(500), Error(503), Text("third time lucky"))
    deltas = Deltas()

    response = await make_client(stream=stream).complete(_request(), deltas)

    assert response.text == "third time lucky"
    assert "".join(deltas.seen) == "third time lucky"
    assert len(fake_openai.requests) == 3


async def test_400_is_not_retried(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Error(400, "bad request body"), Text("never served"))

    with pytest.raises(ModelError) as info:
        await make_client(stream=stream).complete(_request())

    assert info.value.status == 400
    assert info.value.retryable is False
    assert "400" in str(info.value)
    assert len(fake_openai.requests) == 1


async def test_retries_exhausted_raise_model_error(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Error(500), Error(500), Error(502), Text("too late"))

    with pytest.raises(ModelError) as info:
        await make_client(stream=stream).complete(_request())

    assert info.value.status == 502
    assert info.value.retryable is True
    assert len(fake_openai.requests) == 3  # the first try plus attempts=2 retries


async def test_no_retries_when_attempts_is_zero(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Error(503), Text("not reached"))
    client = make_client(stream=stream, retry=RetryPolicy(attempts=0))
    with pytest.raises(ModelError):
        await client.complete(_request())
    assert len(fake_openai.requests) == 1


async def test_stream_cut_after_text_is_not_retried(
    fake_openai: FakeOpenAI, make_client: ClientFactory
) -> None:
    fake_openai.script(Cut("partial answer"), Text("a retry would repeat the text"))
    deltas = Deltas()

    with pytest.raises(ModelError):
        await make_client(stream=True).complete(_request(), deltas)

    assert deltas.seen == ["partial answer"]
    assert len(fake_openai.requests) == 1


async def test_stream_cut_before_any_text_is_retried(
    fake_openai: FakeOpenAI, make_client: ClientFactory
) -> None:
    fake_openai.script(Cut(""), Text("recovered"))
    deltas = Deltas()

    response = await make_client(stream=True).complete(_request(), deltas)

    assert response.text == "recovered"
    assert "".join(deltas.seen) == "recovered"
    assert len(fake_openai.requests) == 2


async def test_garbage_body_raises_model_error(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Garbage(), Garbage(), Garbage(), Text("not reached"))

    with pytest.raises(ModelError) as info:
        await make_client(stream=stream).complete(_request())

    assert info.value.retryable is True
    assert len(fake_openai.requests) == 3


async def test_garbage_once_then_success(
    fake_openai: FakeOpenAI, make_client: ClientFactory, stream: bool
) -> None:
    fake_openai.script(Garbage(), Text("fine now"))
    response = await make_client(stream=stream).complete(_request())
    assert response.text == "fine now"
    assert len(fake_openai.requests) == 2


async def test_slow_response_times_out(
    fake_openai: FakeOpenAI,
    make_client: ClientFactory,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_openai.script(*(Text("too slow", delay_s=0.4) for _ in range(3)))
    client = make_client(stream=stream, timeout_s=0.1)
    tries: Counter[str] = Counter()
    count_calls(monkeypatch, client, "_send", tries)
    started = time.monotonic()

    with pytest.raises(ModelError) as info:
        await client.complete(_request())

    assert "timed out" in str(info.value)
    assert time.monotonic() - started < 1.2  # three 0.1 s tries, not three 0.4 s answers
    # a timeout is retryable: three tries, counted as the client makes them (on a loaded
    # machine a try may give up before the fake has read its request, or even received it)
    assert tries["_send"] == 3


async def test_stream_stalling_after_text_times_out_without_retry(
    fake_openai: FakeOpenAI, make_client: ClientFactory
) -> None:
    fake_openai.script(Text("first second", chunk_delay_s=0.4), Text("not reached"))
    deltas = Deltas()

    with pytest.raises(ModelError):
        await make_client(stream=True, timeout_s=0.1).complete(_request(), deltas)

    assert deltas.seen == ["first "]
    assert len(fake_openai.requests) == 1


# -- the stream parser against hand-made answers -----------------------------------------


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Canned:
    """An HTTP server on 127.0.0.1 that answers each request with the next canned response
    and records the paths it was asked for (with their headers, keys lowercased)."""

    def __init__(self) -> None:
        self.answers: deque[web.Response | Handler] = deque()
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
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
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        await request.read()
        answer = self.answers.popleft()
        return answer if isinstance(answer, web.StreamResponse) else await answer(request)


@pytest_asyncio.fixture
async def canned() -> AsyncIterator[Canned]:
    server = Canned()
    await server.start()
    yield server
    await server.aclose()


async def _complete(
    canned: Canned,
    *answers: web.Response,
    retry: RetryPolicy | None = None,
    deltas: Deltas | None = None,
) -> ModelResponse:
    """A streaming client's answer to one request, the server answering `answers` in turn."""
    canned.answers.extend(answers)
    client = OpenAIClient(
        base_url=canned.url + "/v1",
        model="m",
        stream=True,
        retry=retry or RetryPolicy(attempts=0),
    )
    try:
        return await client.complete(_request(), deltas)
    finally:
        await client.aclose()


async def _failure(
    canned: Canned, *answers: web.Response, match: str, retry: RetryPolicy | None = None
) -> ModelError:
    """The ModelError (its text matching `match`) a streaming client raises for `answers`."""
    with pytest.raises(ModelError, match=match) as info:
        await _complete(canned, *answers, retry=retry)
    return info.value


def _sse(*chunks: dict[str, Any], done: bool = True) -> web.Response:
    out = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
    body = out + (b"data: [DONE]\n\n" if done else b"")
    return web.Response(body=body, content_type="text/event-stream")


async def test_stream_that_is_not_an_event_stream_fails(canned: Canned) -> None:
    await _failure(canned, web.Response(text="<html>hi</html>"), match="event stream")
    assert canned.paths == ["/v1/chat/completions"]


async def test_a_server_that_does_not_stream_is_read_whole(canned: Canned) -> None:
    """Asked to stream, some servers answer with one JSON completion: a usable answer, which
    got an apology."""
    whole = {
        "choices": [{"message": {"content": "whole answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    deltas = Deltas()
    response = await _complete(canned, web.json_response(whole), deltas=deltas)
    assert (response.text, response.input_tokens) == ("whole answer", 5)
    assert deltas.seen == ["whole answer"]
    await _failure(canned, web.json_response({"choices": []}), match="malformed")


async def test_stream_without_finish_or_usage_ended_early(canned: Canned) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]}
    await _failure(canned, _sse(chunk), match="ended early")


async def test_stream_error_chunk_is_not_retryable(canned: Canned) -> None:
    answer = _sse({"error": {"message": "context length exceeded"}})
    error = await _failure(canned, answer, match="context length exceeded", retry=FAST_RETRY)
    assert error.retryable is False
    assert len(canned.paths) == 1


async def test_a_passing_stream_error_is_tried_again(canned: Canned) -> None:
    """{"error": {"message": "overloaded"}} as the first event was never tried again."""
    busy = _sse({"error": {"message": "Overloaded", "type": "server_error"}}, done=False)
    chunk = {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}
    response = await _complete(canned, busy, _sse(chunk), retry=FAST_RETRY)
    assert response.text == "fine"
    assert len(canned.paths) == 2


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [None]},
        {"choices": [{"index": 0, "delta": "hello"}]},
        {"choices": {"index": 0}},
        {"choices": [{"index": 0, "delta": {"content": 5}}]},
    ],
    ids=["null-choice", "string-delta", "choices-object", "number-content"],
)
async def test_a_chunk_in_an_unexpected_shape_is_a_retryable_model_error(
    canned: Canned, chunk: dict[str, Any]
) -> None:
    assert (await _failure(canned, _sse(chunk), match="unexpected shape")).retryable is True


async def test_odd_but_readable_shapes_are_read(canned: Canned) -> None:
    """Content as a list of text parts, usage that is not an object, arguments sent as an
    object rather than a JSON string: each is what some OpenAI-compatible server sends."""
    call = {"index": 0, "id": "c1", "function": {"name": "lookup", "arguments": {"q": "x"}}}
    answer = _sse(
        {"choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "Hi"}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}], "usage": [1, 2]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    response = await _complete(canned, answer)
    assert response.text == "Hi"
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("lookup", {"q": "x"})
    ]
    assert response.input_tokens is None


async def test_a_tool_name_sent_in_pieces_or_again_with_every_delta_is_read_whole(
    canned: Canned,
) -> None:
    """OpenAI sends the name once; some compatible servers split it ("cu", "rrent_time"):
    the first piece alone was called, an unknown tool. Others repeat it whole each time."""

    def call(index: int, name: str, args: str, **extra: str) -> dict[str, Any]:
        delta = {"index": index, **extra, "function": {"name": name, "arguments": args}}
        return {"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}

    answer = _sse(
        call(0, "cu", "", id="c1"),
        call(0, "rrent_time", '{"tz":'),
        call(0, "", '"UTC"}'),
        call(1, "lookup", '{"q":', id="c2"),
        call(1, "lookup", '"x"}'),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    response = await _complete(canned, answer)
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("current_time", {"tz": "UTC"}),
        ("lookup", {"q": "x"}),
    ]


async def test_stream_with_index_reusing_provider(canned: Canned) -> None:
    """A provider that sends every complete call at index 0, each with its own id."""
    answer = _sse(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "x", "arguments": "{}"}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "b",
                                "function": {"name": "y", "arguments": '{"q": 1}'},
                            }
                        ]
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        },
    )
    response = await _complete(canned, answer)
    assert response.tool_calls == (ToolCall("a", "x", "{}"), ToolCall("b", "y", '{"q": 1}'))
    assert response.input_tokens is None  # no usage chunk


async def test_stream_in_crlf_with_comments_and_multiline_data(canned: Canned) -> None:
    """What a proxy may do to the stream: CRLF line ends, keep-alive comments, a chunk's JSON
    split over two data lines."""
    body = (
        b": keep-alive\r\n\r\n"
        b'data: {"choices": [{"index": 0,\r\n'
        b'data: "delta": {"content": "Hi"}, "finish_reason": "stop"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    answer = web.Response(body=body, content_type="text/event-stream")
    deltas = Deltas()
    response = await _complete(canned, answer, deltas=deltas)
    assert (response.text, response.finish_reason) == ("Hi", "stop")
    assert deltas.seen == ["Hi"]


async def test_long_stream_outlives_the_timeout_while_each_piece_is_in_time(
    fake_openai: FakeOpenAI, make_client: ClientFactory
) -> None:
    """timeout_s bounds each wait for the server, not the whole answer."""
    answer = "one two three four five six"
    fake_openai.script(Text(answer, chunk_delay_s=0.1))
    started = time.monotonic()
    response = await make_client(stream=True, timeout_s=0.3).complete(_request())
    assert time.monotonic() - started > 0.5
    assert response.text == answer
    assert len(fake_openai.requests) == 1


def _keeping_alive(content_type: str, beat: bytes) -> Handler:
    """An answer that only ever sends keep-alive bytes (a queued model at a router)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        for _ in range(100):
            await response.write(beat)
            await asyncio.sleep(0.05)
        return response

    return handle


@pytest.mark.parametrize(
    ("stream", "content_type", "beat"),
    [
        (True, "text/event-stream", b": keep-alive\n\n"),
        (True, "text/event-stream", b'event: ping\ndata: {"type": "ping"}\n\n'),
        (False, "application/json", b" "),
    ],
    ids=["comments", "ping events", "whitespace"],
)
async def test_keep_alive_bytes_alone_time_out_the_call(
    canned: Canned, stream: bool, content_type: str, beat: bytes
) -> None:
    """A server saying nothing but keep-alives held the call until the run's timeout: the
    fallback model never got its turn."""
    canned.answers.append(_keeping_alive(content_type, beat))
    client = OpenAIClient(
        base_url=canned.url + "/v1",
        model="m",
        stream=stream,
        timeout_s=0.3,
        retry=RetryPolicy(attempts=0),
    )
    started = time.monotonic()
    try:
        with pytest.raises(ModelError, match="timed out"):
            await client.complete(_request())
    finally:
        await client.aclose()
    assert time.monotonic() - started < 3  # the server would go on for 5 s


async def test_refused_connection_is_a_retryable_model_error(stream: bool) -> None:
    with socket.socket() as sock:  # a port on which nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = OpenAIClient(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="m",
        stream=stream,
        retry=RetryPolicy(attempts=0),
    )
    try:
        with pytest.raises(ModelError, match=r"failed: Client\w*Error") as info:
            await client.complete(_request())
    finally:
        await client.aclose()
    assert info.value.retryable is True
    assert info.value.status is None


@pytest.mark.parametrize("credentials", ["", "me:s%40cret@"])
async def test_proxy_named_by_the_environment_is_used(
    canned: Canned, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, credentials: str
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", canned.url.replace("://", f"://{credentials}"))
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    canned.answers.append(web.json_response({"choices": [{"message": {"content": "ok"}}]}))
    fake_openai.script(Text("direct"))
    proxied = OpenAIClient(base_url="http://model.invalid/v1", model="m", stream=False)
    spared = OpenAIClient(base_url=fake_openai.url, model="m", stream=False)
    try:
        assert (await proxied.complete(_request())).text == "ok"  # the proxy answered
        assert (await spared.complete(_request())).text == "direct"
    finally:
        await proxied.aclose()
        await spared.aclose()
    assert canned.paths == ["/v1/chat/completions"]
    assert len(fake_openai.requests) == 1
    assert "proxy-authorization" not in fake_openai.headers[0]
    (headers,) = canned.headers
    assert headers["host"] == "model.invalid"
    if credentials:
        assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"me:s@cret").decode()
    else:
        assert "proxy-authorization" not in headers


# -- the client's lifecycle ---------------------------------------------------------------


def test_client_is_built_outside_a_running_loop() -> None:
    client = OpenAIClient(base_url="http://127.0.0.1:9/v1", model="m")
    asyncio.run(client.aclose())  # nothing was opened: nothing to close


async def test_aclose_is_safe_twice_and_ends_use(
    fake_openai: FakeOpenAI, make_client: ClientFactory
) -> None:
    fake_openai.script(Text("ok"))
    client = make_client(stream=False)
    assert (await client.complete(_request())).text == "ok"
    await client.aclose()
    await client.aclose()
    with pytest.raises(RuntimeError):
        await client.complete(_request())
    assert len(fake_openai.requests) == 1


# -- the server-sent events decoder ---------------------------------------------------------


def _decode(stream: bytes, *, bytewise: bool) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    if not bytewise:
        return decoder.feed(stream)
    return [e for i in range(len(stream)) for e in decoder.feed(stream[i : i + 1])]


@pytest.mark.parametrize("bytewise", [False, True], ids=["one-chunk", "byte-by-byte"])
def test_sse_decoder_follows_the_spec(bytewise: bool) -> None:
    stream = (
        "\ufeffdata: first\n\n"  # a BOM opening the stream is dropped
        "event: delta\r\ndata: a\r\ndata:  b\r\ndata\r\n\r\n"  # CRLF; only one space goes
        ": a comment\nid: 7\nretry: 10\nfoo: bar\ndata:x\n\n"  # comment, unused fields
        "event: lonely\n\n"  # no data: not dispatched, and its type is forgotten
        "data: €uro\rdata: cr\r\r"  # CR alone ends lines too; UTF-8 split when bytewise
        "data: unfinished\n"  # no blank line before the end: never dispatched
    ).encode()
    assert _decode(stream, bytewise=bytewise) == [
        ServerSentEvent("message", "first"),
        ServerSentEvent("delta", "a\n b\n"),
        ServerSentEvent("message", "x"),
        ServerSentEvent("message", "€uro\ncr"),
    ]


def test_sse_decoder_keeps_crlf_split_over_chunks_as_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\r") == []
    assert decoder.feed(b"\n") == []  # the CRLF's second half: not a blank line
    assert decoder.feed(b"\r") == [ServerSentEvent("message", "one")]
    assert decoder.feed(b"\ndata: two\n\n") == [ServerSentEvent("message", "two")]


def test_sse_decoder_refuses_an_endless_event() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    assert decoder.feed(b"data: " + b"x" * 40 + b"\n") == []
    with pytest.raises(SSEError):
        decoder.feed(b"data: " + b"y" * 40)  # still no line end, past the bound


# -- RetryPolicy and _ToolCallAssembler ---------------------------------------------------


def test_retry_policy_delay() -> None:
    policy = RetryPolicy(attempts=3, base_delay_s=0.5, max_delay_s=8.0)
    assert policy.delay(0, 2.5) == 2.5
    assert policy.delay(5, 0.0) == 0.0
    assert policy.delay(0, 1000.0) == 1000.0  # as asked (with_retries gives up past max_wait_s)
    for _ in range(50):
        assert 0.25 <= policy.delay(0, None) <= 0.5
        assert 1.0 <= policy.delay(2, None) <= 2.0
        assert 4.0 <= policy.delay(10, None) <= 8.0  # backoff capped at max_delay_s


def test_merge_index_zero_reused_with_different_ids() -> None:
    asm = _ToolCallAssembler()
    asm.feed([{"index": 0, "id": "a", "function": {"name": "x", "arguments": '{"n": 1}'}}])
    asm.feed([{"index": 0, "id": "b", "function": {"name": "y", "arguments": '{"n": 2}'}}])
    asm.feed([{"index": 0, "id": "c", "function": {"name": "z", "arguments": "{}"}}])
    assert asm.calls == {
        0: {"id": "a", "name": "x", "arguments": '{"n": 1}'},
        1: {"id": "b", "name": "y", "arguments": '{"n": 2}'},
        2: {"id": "c", "name": "z", "arguments": "{}"},
    }


def test_merge_index_zero_same_id_repeated_stays_one_call() -> None:
    asm = _ToolCallAssembler()
    asm.feed([{"index": 0, "id": "a", "function": {"name": "x"}}])
    asm.feed([{"index": 0, "id": "a", "function": {"arguments": '{"n"'}}])
    asm.feed([{"index": 0, "function": {"arguments": ": 1}"}}])
    assert asm.calls == {0: {"id": "a", "name": "x", "arguments": '{"n": 1}'}}


def test_merge_index_zero_reused_with_argument_pieces() -> None:
    asm = _ToolCallAssembler()
    for delta in [
        {"index": 0, "id": "a", "function": {"name": "x", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"n": 1}'}},
        {"index": 0, "id": "b", "function": {"name": "y", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"n": 2}'}},
    ]:
        asm.feed([delta])
    assert asm.calls == {
        0: {"id": "a", "name": "x", "arguments": '{"n": 1}'},
        1: {"id": "b", "name": "y", "arguments": '{"n": 2}'},
    }


def test_merge_deltas_without_index() -> None:
    asm = _ToolCallAssembler()
    for delta in [
        {"id": "a", "function": {"name": "add", "arguments": ""}},
        {"function": {"arguments": '{"first"'}},
        {"function": {"arguments": ": 1}"}},
        {"id": "b", "function": {"name": "sub", "arguments": "{"}},
        {"function": {"arguments": "}"}},
    ]:
        asm.feed([delta])
    assert asm.calls == {
        0: {"id": "a", "name": "add", "arguments": '{"first": 1}'},
        1: {"id": "b", "name": "sub", "arguments": "{}"},
    }


def test_merge_ignores_non_dict_deltas_and_keeps_a_repeated_name_once() -> None:
    asm = _ToolCallAssembler()
    asm.feed(
        [
            "junk",
            None,
            {"index": 0, "id": "a", "function": {"name": "add", "arguments": "{"}},
            {"index": 0, "function": {"name": "add", "arguments": "}"}},
        ],
    )
    assert asm.calls == {0: {"id": "a", "name": "add", "arguments": "{}"}}


def test_merge_parallel_calls_interleaved_by_index() -> None:
    asm = _ToolCallAssembler()
    asm.feed(
        [
            {"index": 0, "id": "a", "function": {"name": "x", "arguments": ""}},
            {"index": 1, "id": "b", "function": {"name": "y", "arguments": ""}},
            {"index": 1, "function": {"arguments": '{"b"'}},
            {"index": 0, "function": {"arguments": '{"a"'}},
            {"index": 0, "function": {"arguments": ": 0}"}},
            {"index": 1, "function": {"arguments": ": 1}"}},
        ],
    )
    assert asm.calls == {
        0: {"id": "a", "name": "x", "arguments": '{"a": 0}'},
        1: {"id": "b", "name": "y", "arguments": '{"b": 1}'},
    }


def test_only_an_error_events_code_or_type_says_it_passes() -> None:
    from providers.openai import _passing

    assert _passing({"message": "Overloaded", "type": "server_error"})
    assert _passing({"message": "upstream", "code": 502})
    assert _passing({"message": "slow down", "code": "rate_limit_exceeded"})
    # words in the message decide nothing: these will not go away by asking again
    assert not _passing({"message": "max_tokens must be <= 512", "type": "invalid_request_error"})
    assert not _passing({"message": "parameter timeout must be integer", "code": 400})
    assert not _passing("overloaded")
