"""End to end over HTTP: the real app on a random port, the web chat API, a fake model server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from channels.web.adapter import QUEUE_SIZE, WebChat, conversation_of
from core.agent.builtin import BUTTON_VALUE_MAX
from core.models import SessionKey
from core.store.admin import console
from core.store.postgres import PostgresStore
from gateway.app import build_app
from gateway.keys import RUNTIME
from gateway.settings import load_settings
from gateway.webchat import LEGACY_LEN, STREAMS, PostGate
from tests.fake_openai import Error, FakeOpenAI, Garbage, Step, Text, ToolCalls, last_user_text

SSE_TIMEOUT = 15.0


class Gateway:
    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self.runner, self.url = runner, url

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(tmp_path: Path, model_url: str | None, extra: str = "") -> Path:
    model = (
        f'[model]\nprovider = "openai"\nbase_url = "{model_url}"\nname = "fake"\nmax_retries = 1\n'
        if model_url
        else '[model]\nprovider = "offline"\n'
    )
    path = tmp_path / "switchboard.toml"
    path.write_text(
        f"[server]\nport = {_free_port()}\nmax_body_bytes = 4096\nshutdown_grace_s = 0.3\n"
        f'[store]\nurl = "sqlite:///{tmp_path}/sb.db"\n{model}{extra}'
    )
    return path


@pytest_asyncio.fixture
async def start_gateway() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start(config: Path) -> Gateway:
        settings = load_settings(config)
        runner = web.AppRunner(build_app(settings), shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", settings.server.port)
        await site.start()
        runners.append(runner)
        return Gateway(runner, f"http://127.0.0.1:{settings.server.port}")

    yield start
    for r in runners:
        await r.cleanup()


async def post(client: httpx.AsyncClient, text: str, cid: str) -> httpx.Response:
    return await client.post("/chat/messages", json={"text": text, "client_id": cid})


@contextlib.asynccontextmanager
async def browser(gw: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A browser that has loaded the page, so it holds a chat session cookie."""
    async with gw.client() as client:
        page = await client.get("/")
        assert page.status_code == 200
        assert "switchboard_chat" in client.cookies
        yield client


async def wait_replies(client: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    """Poll the transcript until it holds `count` assistant messages."""
    async with asyncio.timeout(SSE_TIMEOUT):
        while True:
            data = (await client.get("/chat/history")).json()
            replies = [m for m in data["messages"] if m["role"] == "assistant"]
            if len(replies) >= count:
                return replies
            await asyncio.sleep(0.05)


async def test_offline_answer_streams_over_sse(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    gw: Gateway = await start_gateway(write_config(tmp_path, None))
    async with browser(gw) as client:
        events: list[tuple[str, dict[str, Any]]] = []
        opened = asyncio.Event()
        retry: list[int] = []

        async def listen() -> None:
            async with client.stream("GET", "/chat/events", timeout=None) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                name = ""
                async for line in resp.aiter_lines():
                    if line.startswith(": connected"):
                        opened.set()
                    elif line.startswith("retry: "):  # pages come back spread out
                        retry.append(int(line[7:]))
                    elif line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        events.append((name, json.loads(line[6:])))
                        if name == "message":
                            return

        task = asyncio.create_task(listen())
        await asyncio.wait_for(opened.wait(), 5)
        r = await post(client, "what are your opening hours?", "q1")
        assert r.status_code == 202
        await asyncio.wait_for(task, SSE_TIMEOUT)
    assert len(retry) == 1
    assert 1000 <= retry[0] <= 4000
    kinds = [k for k, _ in events]
    # every tab of the session hears of the message (the sender knows it by its client_id)
    assert events[0] == (
        "user",
        {"id": r.json()["id"], "text": "what are your opening hours?", "client_id": "q1"},
    )
    assert kinds[1] == "typing"
    assert kinds.count("delta") > 3  # streamed word by word
    final = events[-1][1]
    assert "Monday" in final["text"]
    assert "hours.md" in final["text"]
    streamed = "".join(d["text"] for k, d in events if k == "delta")
    assert streamed.strip() == final["text"].strip()


async def test_two_browsers_never_see_each_other(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as a, browser(gw) as b:
        await post(a, "I am Alice", "a1")
        await post(b, "I am Bob", "b1")
        ra, rb = await wait_replies(a, 1), await wait_replies(b, 1)
        await post(a, "who am I?", "a2")
        await wait_replies(a, 2)
        hist_a = (await a.get("/chat/history")).json()["messages"]
        hist_b = (await b.get("/chat/history")).json()["messages"]
    assert ra[0]["text"] == "echo: I am Alice"
    assert rb[0]["text"] == "echo: I am Bob"
    assert all("Bob" not in m["text"] for m in hist_a)
    assert all("Alice" not in m["text"] for m in hist_b)
    for body in fake_openai.requests:
        seen = json.dumps(body["messages"])
        assert not ("Alice" in seen and "Bob" in seen)


async def test_twenty_messages_to_a_slow_model_all_answered_in_order(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.1)
    fake_openai.session_of = lambda body: "one"
    extra = '[agent]\nqueue_mode = "followup"\n'
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url, extra))
    async with browser(gw) as client:
        for i in range(20):
            assert (await post(client, f"message {i}", f"m{i}")).status_code == 202
        replies = await wait_replies(client, 20)
    assert [r["text"] for r in replies] == [f"echo: message {i}" for i in range(20)]
    assert fake_openai.overlaps == 0
    assert fake_openai.max_concurrent == 1


async def test_the_web_channel_overrides_the_agents_queue_mode(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    """[channels.web] queue_mode beats [agent] queue_mode for web chat sessions."""
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.3)
    extra = '[agent]\nqueue_mode = "collect"\n[channels.web]\nqueue_mode = "followup"\n'
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url, extra))
    async with browser(gw) as client:
        for i in range(3):
            assert (await post(client, f"message {i}", f"m{i}")).status_code == 202
            await asyncio.sleep(0.05)
        replies = await wait_replies(client, 3)
    assert [r["text"] for r in replies] == [f"echo: message {i}" for i in range(3)]


async def test_duplicate_post_is_answered_once(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as client:
        first = (await post(client, "hello", "same")).json()
        again = (await post(client, "hello", "same")).json()
        await wait_replies(client, 1)
        await asyncio.sleep(0.3)
        replies = await wait_replies(client, 1)
    assert first["duplicate"] is False
    assert again["duplicate"] is True
    assert again["id"] == first["id"]
    assert len(replies) == 1
    assert len(fake_openai.requests) == 1


async def test_invalid_tool_arguments_are_corrected_on_the_next_step(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        ToolCalls([("search_knowledge", '{"query": 42}')]),
        ToolCalls([("search_knowledge", '{"query": "opening hours"}')]),
    )
    fake_openai.responder = lambda body: Text("We open at 8:00 on weekdays.")
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as client:
        await post(client, "when do you open?", "q")
        replies = await wait_replies(client, 1)
    assert replies[0]["text"] == "We open at 8:00 on weekdays."
    second = fake_openai.requests[1]["messages"][-1]
    assert second["role"] == "tool"
    assert "invalid_arguments" in second["content"]
    assert "query" in second["content"]
    third = fake_openai.requests[2]["messages"][-1]
    assert "Opening hours" in third["content"]


@pytest.mark.parametrize(
    "failure",
    [Error(500), Garbage(), Garbage('{"choices": [null]}'), Garbage('{"choices": "x"}')],
    ids=["http-500", "not-json", "null-choice", "choices-string"],
)
async def test_model_outage_gets_an_apology_and_the_queue_goes_on(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI, failure: Step
) -> None:
    fake_openai.script(failure, failure)  # first try and its one retry
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as client:
        await post(client, "first", "1")
        await wait_replies(client, 1)
        await post(client, "second", "2")
        replies = await wait_replies(client, 2)
    assert "Sorry" in replies[0]["text"]
    assert replies[1]["text"] == "echo: second"


async def test_restart_answers_what_was_stored_but_not_answered(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    config = write_config(tmp_path, fake_openai.url)
    fake_openai.responder = lambda body: Text("too late", delay_s=30)
    gw: Gateway = await start_gateway(config)
    async with browser(gw) as client:
        assert (await post(client, "are you there?", "r1")).status_code == 202
        cookies = client.cookies
    await asyncio.sleep(0.2)
    await gw.runner.cleanup()  # the gateway stops mid-run; the message stays stored
    fake_openai.responder = None
    gw2: Gateway = await start_gateway(config)
    async with httpx.AsyncClient(base_url=gw2.url, cookies=cookies, timeout=10) as again:
        replies = await wait_replies(again, 1)
    assert replies[0]["text"] == "echo: are you there?"


async def test_a_lone_surrogate_is_mended_and_answered(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI
) -> None:
    """Half of a UTF-16 pair is valid JSON but no valid UTF-8: kept as U+FFFD, not a 500."""
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as client:
        body = json.dumps({"text": "broken \ud83d emoji", "client_id": "c1"}).encode()
        headers = {"Content-Type": "application/json"}
        r = await client.post("/chat/messages", content=body, headers=headers)
        assert r.status_code == 202, r.text
        replies = await wait_replies(client, 1)
    assert replies[0]["text"] == "echo: broken \ufffd emoji"


async def test_bad_requests_get_json_errors_never_500(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    gw: Gateway = await start_gateway(write_config(tmp_path, None))
    async with browser(gw) as client:
        cases = [
            (b"x" * 5000, 413),
            (b"{not json", 400),
            (b"\xff\xfe", 400),
            (b"[1, 2]", 400),
            (json.dumps({"text": "hi"}).encode(), 400),
            (json.dumps({"text": "", "client_id": "x"}).encode(), 400),
            (json.dumps({"text": "hi", "client_id": "bad id!"}).encode(), 400),
            (json.dumps({"text": 5, "client_id": "x"}).encode(), 400),
        ]
        for body, status in cases:
            r = await client.post(
                "/chat/messages", content=body, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == status, (body[:20], r.text)
            assert "error" in r.json()
        assert (await client.get("/nope")).status_code == 404
        assert "error" in (await client.get("/nope")).json()
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).status_code == 200
        metrics = await client.get("/metrics")
        assert "switchboard_active_sessions" in metrics.text


async def test_a_button_carries_every_value_the_agent_may_give_it(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """send_buttons takes values up to 256 characters; the page posted them back and got 400."""
    gw: Gateway = await start_gateway(write_config(tmp_path, None))
    async with browser(gw) as client:
        value = "v" * BUTTON_VALUE_MAX
        body = {"text": "Yes", "client_id": "b1", "button": value}
        assert (await client.post("/chat/messages", json=body)).status_code == 202
        body = {"text": "Yes", "client_id": "b2", "button": value + "v"}
        assert (await client.post("/chat/messages", json=body)).status_code == 400


async def test_the_page_and_its_posts_are_guarded_against_other_sites(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """Only the page's own script runs; a post from another origin (a form or a fetch any
    page can make a browser send with the person's cookie) is refused; the public URL
    counts as this origin. The cookie is Secure when the browser came over HTTPS (here: as a
    trusted proxy says), and only then, or it would never come back."""
    config = write_config(tmp_path, None)
    server = '[server]\npublic_url = "https://chat.example"\ntrust_forwarded = true\n'
    config.write_text(config.read_text().replace("[server]\n", server))
    gw: Gateway = await start_gateway(config)
    async with gw.client() as client:
        page = await client.get("/", headers={"X-Forwarded-Proto": "https"})
        cookie = page.headers["set-cookie"].lower()  # framed by another site, it still works
        assert {"secure", "samesite=none", "partitioned", "httponly"} <= set(cookie.split("; "))
        page = await client.get("/")
        cookie = page.headers["set-cookie"].lower()
        assert "secure" not in cookie
        assert "samesite=lax" in cookie
        csp = page.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp
        assert "script-src 'sha256-" in csp
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        body = json.dumps({"text": "hi", "client_id": "c1"}).encode()
        as_json = {"Content-Type": "application/json"}
        proxied = {"X-Forwarded-Proto": "https"}
        for headers, status in [
            ({**as_json, "Origin": "https://evil.example"}, 403),
            ({**as_json, "Origin": "null"}, 403),
            ({"Content-Type": "text/plain", "Origin": "https://evil.example"}, 403),  # a form
            ({"Content-Type": "text/plain"}, 202),  # a script's JSON, typed loosely
            ({**as_json, "Content-Encoding": "gzip"}, 400),  # not gzip: a 400, not a 500
            ({**as_json, "Origin": "https://chat.example"}, 202),
            ({**as_json, "Origin": gw.url}, 202),
            # a plain-http page of the public host (a network attacker's injection) is not
            # ours: it posted into the chat with the person's cookie
            ({**as_json, "Origin": "http://chat.example"}, 403),
            (
                {**as_json, "Origin": gw.url, **proxied},
                403,  # the request came over https: its http twin is another origin
            ),
            ({**as_json, "Origin": gw.url.replace("http://", "https://"), **proxied}, 202),
        ]:
            r = await client.post("/chat/messages", content=body, headers=headers)
            assert (r.status_code, "error" in r.json()) == (status, status != 202), headers
        wrong = await client.get("/chat/messages")
        assert (wrong.status_code, wrong.headers["Allow"]) == (405, "POST")


async def test_the_cookie_is_a_secret_that_no_other_site_can_plant(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """The cookie is the chat's only credential. The conversation id the store, the logs and
    the console show is a digest of it, not the cookie (an operator, or whoever read a log,
    could open the chat). Over HTTPS its name is `__Host-` prefixed, so a page on a sibling
    subdomain cannot plant one it knows and then read what the person writes; a browser that
    still has a cookie from before keeps its conversation over plain HTTP."""
    config = write_config(tmp_path, None)
    server = '[server]\npublic_url = "https://chat.example"\ntrust_forwarded = true\n'
    config.write_text(config.read_text().replace("[server]\n", server))
    gw: Gateway = await start_gateway(config)
    https = {"X-Forwarded-Proto": "https"}

    def cookies(name: str, value: str, secure: bool = True) -> dict[str, str]:
        return {**(https if secure else {}), "Cookie": f"{name}={value}"}

    async def texts(client: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
        r = await client.get("/chat/history", headers=headers)
        return [m["text"] for m in r.json()["messages"]]

    async with gw.client() as client:
        page = await client.get("/", headers=https)
        name, rest = page.headers["set-cookie"].split("=", 1)
        assert name == "__Host-switchboard_chat"
        secret = rest.split(";")[0]
        assert "domain=" not in rest.lower()
        assert "path=/;" in rest.lower()
        planted = "planted-by-a-sibling-site-0001"
        r = await client.post(
            "/chat/messages",
            json={"text": "my card number", "client_id": "c1"},
            headers=cookies("switchboard_chat", planted),
        )
        assert r.status_code == 202
        own = r.headers["set-cookie"].split("=", 1)[1].split(";")[0]
        assert own not in (planted, secret)
        assert await texts(client, cookies("switchboard_chat", planted, secure=False)) == []
        assert await texts(client, cookies("switchboard_chat", planted)) == []
        assert await texts(client, cookies("__Host-switchboard_chat", own)) == ["my card number"]

        runtime = gw.runner.app[RUNTIME]
        keys = [s.key for s in await console(runtime.store).sessions(10)]
        assert keys == [f"default:web:default:{conversation_of(own)}"]
        shown = keys[0].rsplit(":", 1)[1]
        assert own not in keys[0]
        for value in (shown, shown.removeprefix("c.")):  # what the console shows is no key
            assert await texts(client, cookies("switchboard_chat", value, secure=False)) == []

        before = "Legacy0123456789abcdefghijKLMNOP"  # a cookie as they were: the id itself
        assert len(before) == LEGACY_LEN
        msg = WebChat().parse(before, {"text": "from before", "client_id": "old-1"})
        await runtime.manager.submit(msg)
        r = await client.get("/chat/history", headers=cookies("switchboard_chat", before, False))
        assert [m["text"] for m in r.json()["messages"]] == ["from before"]
        assert "set-cookie" not in r.headers
        # over HTTPS only the __Host- cookie is read: one from before, planted by a sibling
        # site, would put the person in a chat its planter reads
        r = await client.get("/chat/history", headers=cookies("switchboard_chat", before, True))
        assert r.json()["messages"] == []
        assert r.headers["set-cookie"].startswith("__Host-switchboard_chat=")
        unknown = "Unknown123456789abcdefghijKLMNOP"  # the same shape, no such conversation
        r = await client.get("/chat/history", headers=cookies("switchboard_chat", unknown, True))
        assert r.json()["messages"] == []
        assert "__Host-" in r.headers["set-cookie"]


async def test_a_chat_is_never_cached_and_its_streams_leave_room_for_the_webhooks(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """A shared cache could serve one visitor's transcript to another (no Cache-Control). Each
    event stream holds a connection as long as the page is open: past the cap a new one gets
    503, so one client opening thousands cannot take the file descriptors every channel's
    webhooks need."""
    config = write_config(tmp_path, None)
    server = '[server]\npublic_url = "https://chat.example"\n'
    config.write_text(config.read_text().replace("[server]\n", server))
    gw: Gateway = await start_gateway(config)
    gw.runner.app[STREAMS].limit = 1
    async with browser(gw) as client:
        assert (await post(client, "hello", "c1")).headers["Cache-Control"] == "no-store"
        history = await client.get("/chat/history")
        assert history.headers["Cache-Control"] == "no-store"
        assert history.headers["Vary"] == "Cookie"
        async with client.stream("GET", "/chat/events", timeout=None) as first:
            assert first.status_code == 200
            assert first.headers["Cache-Control"] == "no-store"  # it may set the cookie
            second = await client.get("/chat/events")
            assert second.status_code == 503
            assert second.headers["Retry-After"] == "30"
            assert (await client.get("/healthz")).status_code == 200
        async with asyncio.timeout(5):
            while gw.runner.app[STREAMS].open:
                await asyncio.sleep(0.01)
        async with client.stream("GET", "/chat/events", timeout=None) as again:
            assert again.status_code == 200


async def test_one_client_address_cannot_take_every_live_stream(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """One client opening streams until the cap cut every other visitor's live replies off:
    an address holds at most its share, and another address still gets a stream."""
    config = write_config(tmp_path, None)
    config.write_text(
        config.read_text().replace("[server]\n", "[server]\ntrust_forwarded = true\n")
    )
    gw: Gateway = await start_gateway(config)
    gw.runner.app[STREAMS].per_client = 1

    def stream_from(client: httpx.AsyncClient, address: str) -> Any:
        forwarded = {"X-Forwarded-For": address}
        return client.stream("GET", "/chat/events", headers=forwarded, timeout=None)

    async with (
        gw.client() as hog,
        gw.client() as visitor,
        stream_from(hog, "203.0.113.7") as first,
    ):
        assert first.status_code == 200
        again = await hog.get("/chat/events", headers={"X-Forwarded-For": "203.0.113.7"})
        assert again.status_code == 503
        assert "your address" in again.json()["error"]
        async with stream_from(visitor, "198.51.100.9") as other:
            assert other.status_code == 200


async def test_one_client_address_cannot_post_without_limit(
    tmp_path: Path, start_gateway: Callable[..., Any]
) -> None:
    """Behind a trusted proxy, each forwarded address has its own allowance; new cookies do
    not reset it; another address is not held back."""
    config = write_config(tmp_path, None, "[channels.web]\nposts_per_minute = 2\n")
    config.write_text(
        config.read_text().replace("[server]\n", "[server]\ntrust_forwarded = true\n")
    )
    gw: Gateway = await start_gateway(config)

    async def post_from(address: str, cid: str) -> httpx.Response:
        async with gw.client() as fresh:  # a new cookie each time
            return await fresh.post(
                "/chat/messages",
                json={"text": "hi", "client_id": cid},
                headers={"X-Forwarded-For": f"198.51.100.9, {address}"},
            )

    codes = [(await post_from("203.0.113.7", f"c{i}")).status_code for i in range(3)]
    assert codes == [202, 202, 429]
    refused = await post_from("203.0.113.7", "c3")
    assert refused.json()["error"].startswith("too many messages")
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert (await post_from("203.0.113.8", "c4")).status_code == 202
    forged = await post_from("not-an-address", "c5")  # what no proxy would forward
    assert (forged.status_code, "error" in forged.json()) == (400, True)
    async with browser(gw) as local:  # no proxy header: this machine itself, not limited
        for i in range(3):
            assert (await post(local, "hi", f"l{i}")).status_code == 202


async def test_the_post_gate_counts_per_address() -> None:
    gate = PostGate(3)
    assert [await gate.retry_after("192.0.2.1") for _ in range(3)] == [None, None, None]
    assert await gate.retry_after("192.0.2.1") == 20.0  # a minute's bucket of 3 leaks one in 20 s
    assert await gate.retry_after("192.0.2.2") is None
    assert [await gate.retry_after("::1") for _ in range(10)] == [None] * 10  # loopback
    assert [await PostGate(0).retry_after("192.0.2.1") for _ in range(10)] == [None] * 10


async def test_a_stalled_page_has_its_stream_ended_so_it_reconnects() -> None:
    """A tab that cannot keep up (its queue is full) must not stay open and silent: its
    stream ends, and the page reconnects and reads the history again."""
    chat = WebChat()
    stalled, other = chat.subscribe("s1"), chat.subscribe("s2")
    key = SessionKey("default", "web", "default", "s1")
    for i in range(QUEUE_SIZE + 1):
        await chat.run_delta(key, "r1", f"w{i} ")
        await asyncio.sleep(0)  # each piece its own event: the page reads none of them
    assert (stalled.qsize(), stalled.get_nowait()) == (1, None)
    await chat.run_delta(key, "r1", "later")
    await asyncio.sleep(0)
    assert stalled.empty()  # no longer fed
    assert other.empty()
    chat.close()
    assert other.get_nowait() is None


async def test_a_burst_of_streamed_text_is_one_event_not_a_stalled_page() -> None:
    """A fast model's thousands of pieces, with no turn of the event loop between them, each
    took a place in the page's queue: a reader keeping up lost its stream after a few."""
    chat = WebChat()
    page = chat.subscribe("s1")
    key = SessionKey("default", "web", "default", "s1")
    for i in range(5 * QUEUE_SIZE):
        await chat.run_delta(key, "r1", f"w{i} ")
    await chat.run_ended(key, "r1", discarded=False)  # after the text, never before it
    frames = [page.get_nowait() for _ in range(page.qsize())]
    assert [f.split("\n")[0] for f in frames] == ["event: delta", "event: done"]
    text = json.loads(frames[0].split("data: ", 1)[1])["text"]
    assert text == "".join(f"w{i} " for i in range(5 * QUEUE_SIZE))
    chat.close()


async def test_open_pages_reload_when_news_from_other_replicas_may_have_been_missed(
    pg_url: str,
) -> None:
    """The connection that hears other replicas' replies was cut (a database outage) and
    came back: a reply sent meanwhile was never shown on an open page, which stayed open on
    keepalives. Now every open stream ends, and its page reconnects and reads the history."""
    store = PostgresStore(pg_url, min_size=1, max_size=2)
    await store.start()
    chat = WebChat(store)
    try:
        await chat.start()
        page = chat.subscribe("s1")
        assert store._listener is not None
        listener = store._listener.get_server_pid()
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute("SELECT pg_terminate_backend($1)", listener)
        finally:
            await conn.close()
        async with asyncio.timeout(10):
            assert await page.get() is None  # the stream ends: the page reloads
    finally:
        await store.aclose()


@pytest.mark.parametrize("command", ["/reset", "/Reset"])  # phones capitalise the first letter
async def test_reset_via_web_chat_clears_the_transcript(
    tmp_path: Path, start_gateway: Callable[..., Any], fake_openai: FakeOpenAI, command: str
) -> None:
    gw: Gateway = await start_gateway(write_config(tmp_path, fake_openai.url))
    async with browser(gw) as client:
        await post(client, "remember zebra", "1")
        await wait_replies(client, 1)
        await post(client, command, "2")
        async with asyncio.timeout(SSE_TIMEOUT):
            while True:
                history = (await client.get("/chat/history")).json()["messages"]
                if any(m["text"].startswith("Okay, let's start over") for m in history):
                    break
                await asyncio.sleep(0.05)
    assert all("zebra" not in m["text"] for m in history)
    assert [m["role"] for m in history] == ["assistant"]
