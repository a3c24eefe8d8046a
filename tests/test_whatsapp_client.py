"""The Graph API client: error codes → ChannelError, media two-step, lookups, start-up check."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from channels.whatsapp.client import GraphClient, graph_error
from core.errors import ChannelError
from tests.fake_openai import FakeOpenAI
from tests.fake_whatsapp import TOKEN, Failure, FakeGraph, payload, running_gateway, until


def body(code: int) -> dict[str, object]:
    return {"error": {"message": f"(#{code}) x", "type": "OAuthException", "code": code}}


@pytest.mark.parametrize(
    ("status", "payload", "retryable", "code"),
    [
        (400, body(130429), True, "130429"),
        (400, body(131056), True, "131056"),
        (400, body(131057), True, "131057"),
        (429, body(4), True, "4"),
        (400, body(131026), False, "131026"),
        (400, body(131047), False, "131047"),
        (400, body(100), False, "100"),
        (401, body(190), False, "auth"),
        (401, None, False, "auth"),
        (500, body(131000), True, "131000"),
        (503, None, True, "http_503"),
        (429, "not json", True, "http_429"),
        (400, {"error": "text"}, False, "http_400"),
    ],
)
def test_graph_errors_are_read_from_the_body(
    status: int, payload: object, retryable: bool, code: str
) -> None:
    err = graph_error(status, payload)
    assert (err.retryable, err.code) == (retryable, code)


@pytest_asyncio.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    fake = FakeGraph()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest_asyncio.fixture
async def client(graph: FakeGraph) -> AsyncIterator[GraphClient]:
    c = GraphClient(graph.url, "v21.0", TOKEN, 5.0)
    yield c
    await c.aclose()


async def test_send_returns_the_wamid_and_errors_raise(
    graph: FakeGraph, client: GraphClient
) -> None:
    to = {"to": "155", "type": "text", "text": {"body": "hi"}}
    assert (await client.message_id("1001", to)).startswith("wamid.OUT")
    assert graph.sent[0]["messaging_product"] == "whatsapp"
    graph.fail(Failure(131026))
    with pytest.raises(ChannelError) as info:
        await client.message_id("1001", to)
    assert (info.value.code, info.value.retryable) == ("131026", False)
    with pytest.raises(ChannelError) as info:
        await client.message_id("1001", {**to, "text": {"body": "x" * 4097}})
    assert info.value.code == "100"


async def test_media_lookup_then_download_with_the_token(
    graph: FakeGraph, client: GraphClient
) -> None:
    graph.media["m1"] = (b"abc" * 10, "image/png")
    media = await client.media("m1", "1001")
    assert (media.mime, media.size) == ("image/png", 30)
    assert await client.download(media.url, 100) == b"abc" * 10
    with pytest.raises(ChannelError) as info:
        await client.download(media.url, 10)
    assert info.value.code == "too_large"
    with pytest.raises(ChannelError) as info:
        await client.media("missing", "1001")
    assert info.value.code == "100"


async def test_network_failures_and_a_closed_client_are_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = GraphClient(f"http://127.0.0.1:{port}", "v21.0", TOKEN, 1.0)
    with pytest.raises(ChannelError) as info:
        await client.lookup("1001")
    assert info.value.retryable
    await client.aclose()
    with pytest.raises(ChannelError) as info:
        await client.lookup("1001")
    assert info.value.retryable


async def test_a_bad_token_is_reported_at_start(
    tmp_path: Path, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    graph = FakeGraph(token="a-different-token")
    await graph.start()
    try:
        async with running_gateway(tmp_path, graph, fake_openai.url):
            await until(lambda: "number 1002 lookup failed" in caplog.text)
    finally:
        await graph.aclose()
    assert "WhatsApp access token rejected" in caplog.text
    assert "number 1001 lookup failed" in caplog.text


async def test_numbers_are_looked_up_at_start(
    tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(tmp_path, graph, fake_openai.url):
        await until(lambda: "WhatsApp number 1002 ready" in caplog.text)
    assert "WhatsApp number 1001 ready: +1 555 000 1001" in caplog.text
    assert "WhatsApp number 1002 ready: +1 555 000 1002" in caplog.text


async def test_a_slow_number_lookup_does_not_keep_webhooks_waiting(
    tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """The lookups ran inside start, before the server listened: with the Graph API slow,
    nothing (webhooks, /healthz) was served for timeout_s per number."""
    caplog.set_level(logging.INFO)
    graph.lookup_delay_s = 30.0
    async with running_gateway(tmp_path, graph, fake_openai.url) as gw:
        assert (await gw.client.get("/healthz")).status_code == 200
        assert (await gw.notify(payload("text"))).status_code == 200
        assert "ready" not in caplog.text  # the lookups still wait


async def test_media_is_fetched_only_from_allowed_hosts() -> None:
    from channels.whatsapp.client import GraphClient
    from core.errors import ChannelError

    graph = GraphClient("http://127.0.0.1:9", "v21.0", "wa-token", 1.0, ("lookaside.fbsbx.com",))
    try:
        for url in (
            "https://evil.example/steal",
            "file:///etc/passwd",
            "https://fbsbx.com.evil/x",
            "http://lookaside.fbsbx.com/x",  # the access token would go in the clear
            "ftp://lookaside.fbsbx.com/x",
        ):
            with pytest.raises(ChannelError) as err:
                await graph.download(url, 100)
            assert err.value.code == "host"
        # a URL the parser refuses was a ValueError, a 500 that lost the whole notification
        for url in ("https://[lookaside.fbsbx.com/x", "https://lookaside.fbsbx.com:99999/x"):
            with pytest.raises(ChannelError) as err:
                await graph.download(url, 100)
            assert err.value.code == "bad_response"
    finally:
        await graph.aclose()
