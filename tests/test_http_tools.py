"""HTTP tools from configuration: templating, schema validation, caps, SSRF defences, and the
confirmation button for write tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from core.agent.http_tools import HttpTool, HttpToolSpec, host_allowed
from core.agent.loop import AgentLoop, Limits, Turn
from core.agent.tools import ToolContext, ToolRegistry
from core.errors import ConfigError
from core.models import InboundMessage, MessageKind, Sender, SessionKey
from core.sessions import AgentProfile, DeliveryPolicy, SessionManager
from core.store import Store
from gateway.settings import load_settings
from tests.fakes import RecordingOutlet, ScriptedModel, calls, text
from tests.loopback import serve


class Api:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "body": body,
                "auth": request.headers.get("Authorization"),
            }
        )
        if request.path == "/big":
            return web.Response(text="y" * 10_000)
        if request.path == "/slow":
            await asyncio.sleep(2)
        if request.path == "/hop":
            raise web.HTTPFound(request.query["to"])
        if request.path == "/echo":  # an endpoint that shows the request back
            headers = dict(request.headers)
            return web.json_response({"headers": headers, "raw": str(request.headers)})
        if request.path == "/missing":
            return web.json_response({"error": "no such order"}, status=404)
        return web.json_response({"ok": True, "path": request.path})


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    server = Api()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner, server.url = await serve(app, shutdown_timeout=0.1)
    yield server
    await runner.cleanup()


SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z0-9/ ]+$"},
        "v": {"type": "integer"},
    },
    "required": ["order_id"],
}
CTX = ToolContext(session="s", run_id="r")


def _tool(api: Api, path: str = "/orders/{order_id}", **kw: Any) -> ToolRegistry:
    spec = HttpToolSpec(
        name="order",
        description="order status",
        url=api.url + path,
        parameters=kw.pop("parameters", SCHEMA),
        headers={"Authorization": "Bearer s3cret"},
        allow_hosts=kw.pop("allow_hosts", ("127.0.0.1",)),
        allow_private=kw.pop("allow_private", True),
        **kw,
    )
    return ToolRegistry([HttpTool(spec)])


async def test_get_fills_the_template_and_sends_the_rest_as_query(api: Api) -> None:
    result = await _tool(api).call("order", '{"order_id": "A1/2 B", "v": 3}', CTX)
    assert json.loads(result.content) == {
        "status": 200,
        "body": {"ok": True, "path": "/orders/A1/2 B"},
    }
    assert api.seen[0]["query"] == {"v": "3"}
    assert api.seen[0]["auth"] == "Bearer s3cret"


async def test_a_secret_header_echoed_back_never_reaches_the_model(api: Api) -> None:
    """The result goes to the model, the run record and the history."""
    token = "shoptoken-SECRET-777777777"
    spec = HttpToolSpec(
        name="echo",
        description="echo",
        url=api.url + "/echo",
        parameters={"type": "object", "properties": {}},
        headers={"Authorization": f"Bearer {token}", "X-Key": 'k"ey-with-quote'},
        allow_hosts=("127.0.0.1",),
        allow_private=True,
    )
    result = await ToolRegistry([HttpTool(spec)]).call("echo", "{}", CTX)
    assert result.ok
    assert api.seen[0]["auth"] == f"Bearer {token}"
    assert token not in result.content
    assert "quote" not in result.content
    assert json.loads(result.content)["body"]["headers"]["Authorization"] == "***"


async def test_post_sends_a_json_body(api: Api) -> None:
    registry = _tool(api, "/orders", method="POST", read_only=False)
    await registry.call("order", '{"order_id": "X9", "v": 1}', CTX)
    assert api.seen[0]["method"] == "POST"
    assert json.loads(api.seen[0]["body"]) == {"order_id": "X9", "v": 1}


async def test_schema_violations_are_correctable_errors(api: Api) -> None:
    registry = _tool(api)
    spec = registry.specs()[0]
    assert spec.parameters == SCHEMA
    result = await registry.call("order", '{"order_id": "lower case"}', CTX)
    assert result.error == "invalid_arguments"
    assert "order_id" in json.loads(result.content)["detail"]
    missing = await registry.call("order", '{"v": 1}', CTX)
    assert "order_id" in json.loads(missing.content)["detail"]
    assert api.seen == []


async def test_response_cap_timeout_and_http_errors(api: Api) -> None:
    big = json.loads(
        (
            await _tool(api, "/big", max_response_bytes=1000).call(
                "order", '{"order_id": "A"}', CTX
            )
        ).content
    )
    assert big["truncated"] is True
    assert len(big["body"]) == 1000
    slow = await _tool(api, "/slow", timeout_s=0.3).call("order", '{"order_id": "A"}', CTX)
    assert slow.error in ("failed", "timeout")
    missing = json.loads(
        (await _tool(api, "/missing").call("order", '{"order_id": "A"}', CTX)).content
    )
    assert missing["status"] == 404
    assert missing["error"] == "HTTP 404"


async def test_calls_share_one_certificate_context(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call built its own, reading the whole CA bundle (about 50 ms of CPU)."""
    from core.agent import http_tools

    built: list[object] = []
    real = http_tools.httpx.create_ssl_context

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(None)
        return real(*args, **kwargs)

    monkeypatch.setattr(http_tools.httpx, "create_ssl_context", counting)
    http_tools._tls.cache_clear()
    tool = _tool(api)
    for _ in range(3):
        result = await tool.call("order", '{"order_id": "A"}', CTX)
        assert result.ok
    assert len(built) == 1
    http_tools._tls.cache_clear()


async def test_private_addresses_are_refused_unless_allowed(api: Api) -> None:
    result = await _tool(api, allow_private=False).call("order", '{"order_id": "A"}', CTX)
    assert result.error == "failed"
    assert "not a public address" in json.loads(result.content)["detail"]
    assert api.seen == []


async def test_hosts_off_the_allowlist_and_redirects_there_are_refused(api: Api) -> None:
    off = await _tool(api, allow_hosts=("api.example.com",)).call("order", '{"order_id": "A"}', CTX)
    assert "allowlist" in json.loads(off.content)["detail"]
    port = api.url.rsplit(":", 1)[1]
    hop = _tool(api, "/hop?to=http://localhost:" + port + "/orders/A")
    redirected = await hop.call("order", '{"order_id": "A"}', CTX)
    assert "allowlist" in json.loads(redirected.content)["detail"]
    assert [s["path"] for s in api.seen] == ["/hop"]


def test_host_patterns() -> None:
    assert host_allowed("api.example.com", ("api.example.com",))
    assert host_allowed("eu.api.example.com", ("*.example.com",))
    assert not host_allowed("example.com.evil.net", ("*.example.com",))
    assert not host_allowed("evilexample.com", ("*.example.com",))


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sb.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ('method = "POST"\nurl = "https://a.example/x"', "tools.http.t"),
        ('url = "https://a.example/x"\nconfirm = true', "tools.http.t"),
        ('url = "ftp://a.example/x"', "tools.http.t.url"),
        (
            'url = "https://a.example/x"\nparameters = { type = "nonsense" }',
            "tools.http.t.parameters",
        ),
        ('url = "https://a.example/x"\nallow_hosts = ["b.example"]', "tools.http.t"),
        # each of these passed check, then every call of the tool failed
        ('url = "https://a.example:99999/x"', "tools.http.t.url"),
        ('url = "https://a.example/x"\nheaders = { "X Key" = "v" }', "tools.http.t.headers"),
        ('url = "https://a.example/x"\nheaders = { X-Key = "a\\nb" }', "tools.http.t.headers"),
        ('url = "https://a.example/x"\nheaders = { X-Key = "café" }', "tools.http.t.headers"),
    ],
)
def test_http_tool_config_problems(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, f'[tools.http.t]\ndescription = "d"\n{section}\n'))
    assert key in [k for k, _ in err.value.problems]
    assert "café" not in str(err.value.problems)  # header values are secrets: never echoed


def test_a_header_value_loses_a_secret_files_last_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_TOKEN", "Bearer abc123\n")
    body = '[tools.http.t]\ndescription = "d"\nurl = "https://a.example/x"\n'
    body += 'headers = { Authorization = "${SHOP_TOKEN}" }\n'
    settings = load_settings(_write(tmp_path, body))
    assert settings.tools.http["t"].headers == {"Authorization": "Bearer abc123"}


def test_http_tool_config_loads_and_is_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_TOKEN", "tok")
    s = load_settings(
        _write(
            tmp_path,
            '[agent]\ntools = ["order_status"]\n'
            '[tools.http.order_status]\ndescription = "d"\n'
            'url = "https://shop.example.com/orders/{id}"\n'
            'headers = { Authorization = "Bearer ${SHOP_TOKEN}" }\n',
        )
    )
    spec = s.tools.http["order_status"].spec("order_status")
    assert spec.allow_hosts == ("shop.example.com",)
    assert spec.headers == {"Authorization": "Bearer tok"}
    assert spec.read_only


def test_a_url_placeholder_no_declared_argument_fills_is_a_problem(tmp_path: Path) -> None:
    """Every call of such a tool failed ("missing argument 'nope'")."""
    body = (
        '[tools.http.order_status]\ndescription = "d"\n'
        'url = "https://shop.example.com/orders/{nope}"\n'
        'parameters = { type = "object", properties = { id = { type = "string" } } }\n'
    )
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, body))
    assert err.value.problems == [
        ("tools.http.order_status", "the URL's {nope} is not one of parameters.properties")
    ]


def test_a_placeholder_in_the_host_needs_allow_hosts(tmp_path: Path) -> None:
    """Its default allowlist was the URL with x for the braces: every call was refused."""
    body = (
        '[tools.http.order_status]\ndescription = "d"\n'
        'url = "https://{shop}.example.com/orders/{id}"\n'
        'parameters = { type = "object", properties = { shop = { type = "string" },'
        ' id = { type = "string" } } }\n'
    )
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, body))
    [(key, reason)] = err.value.problems
    assert key == "tools.http.order_status"
    assert "host has a placeholder" in reason
    assert "allow_hosts" in reason
    allowed = load_settings(_write(tmp_path, body + 'allow_hosts = ["*.example.com"]\n'))
    spec = allowed.tools.http["order_status"].spec("order_status")
    assert spec.allow_hosts == ("*.example.com",)


async def test_write_tool_runs_only_after_the_confirm_button(api: Api, store: Store) -> None:
    spec = HttpToolSpec(
        name="cancel_booking",
        description="cancel a booking",
        url=api.url + "/bookings/{order_id}/cancel",
        method="POST",
        parameters=SCHEMA,
        allow_hosts=("127.0.0.1",),
        allow_private=True,
        read_only=False,
        confirm=True,
    )
    model = ScriptedModel()
    model.add(
        calls(("cancel_booking", '{"order_id": "B7"}')),
        text("I will cancel booking B7. Please confirm."),
        text("Done, B7 is cancelled."),
    )
    outlet = RecordingOutlet()
    loop = AgentLoop(model, ToolRegistry([HttpTool(spec)]), Limits())
    manager = SessionManager(
        store,
        {"default": AgentProfile(name="default", instructions="x", loop=loop)},
        {"test": outlet},
        delivery=DeliveryPolicy(base_delay_s=0.01),
    )
    await manager.start()
    try:
        await manager.submit(_msg("cancel my booking B7", "1"))
        await asyncio.wait_for(manager.wait_idle(), 10)
        assert api.seen == []  # not before the person confirms
        (_, part) = outlet.sent[-1]
        labels = [b.label for b in part.reply.buttons]
        assert labels == ["Confirm", "Cancel"]
        confirm = part.reply.buttons[0]
        await manager.submit(
            _msg("Confirm", "2", kind=MessageKind.BUTTON, button_value=confirm.value)
        )
        await asyncio.wait_for(manager.wait_idle(), 10)
        assert [s["path"] for s in api.seen] == ["/bookings/B7/cancel"]
        last = model.requests[-1].messages
        assert last[-1].role == "tool"
        assert '"status": 200' in (last[-1].content or "")
        assert outlet.texts()[-1] == "Done, B7 is cancelled."
        state = (await store.get_session(str(SessionKey("default", "test", "default", "c")))).state
        assert state.get("pending_actions") == {}
    finally:
        await manager.aclose(grace_s=1)


async def test_in_a_group_only_who_asked_may_confirm(api: Api, store: Store) -> None:
    """Any member of a group could press the Confirm button under another member's request
    and run the write tool (the token was all it took)."""
    spec = HttpToolSpec(
        name="cancel_booking",
        description="cancel a booking",
        url=api.url + "/bookings/{order_id}/cancel",
        method="POST",
        parameters=SCHEMA,
        allow_hosts=("127.0.0.1",),
        allow_private=True,
        read_only=False,
        confirm=True,
    )
    model = ScriptedModel()
    model.add(
        calls(("cancel_booking", '{"order_id": "B7"}')),
        text("Alice, please confirm."),
        text("Only Alice can confirm that."),
        text("Done, B7 is cancelled."),
    )
    outlet = RecordingOutlet()
    loop = AgentLoop(model, ToolRegistry([HttpTool(spec)]), Limits())
    manager = SessionManager(
        store,
        {"default": AgentProfile(name="default", instructions="x", loop=loop)},
        {"test": outlet},
        delivery=DeliveryPolicy(base_delay_s=0.01),
    )
    await manager.start()
    try:
        await manager.submit(_msg("cancel my booking B7", "1", sender="alice"))
        await asyncio.wait_for(manager.wait_idle(), 10)
        confirm = outlet.sent[-1][1].reply.buttons[0]
        press = {"kind": MessageKind.BUTTON, "button_value": confirm.value}
        await manager.submit(_msg("Confirm", "2", sender="mallory", **press))
        await asyncio.wait_for(manager.wait_idle(), 10)
        assert api.seen == []
        assert '"not_yours"' in (model.requests[-1].messages[-1].content or "")
        await manager.submit(_msg("Confirm", "3", sender="alice", **press))
        await asyncio.wait_for(manager.wait_idle(), 10)
        assert [s["path"] for s in api.seen] == ["/bookings/B7/cancel"]
        assert outlet.texts()[-1] == "Done, B7 is cancelled."
    finally:
        await manager.aclose(grace_s=1)


async def test_an_action_an_anonymous_admin_asked_for_may_be_confirmed_by_anyone(
    api: Api, store: Store
) -> None:
    """A Telegram group's anonymous admin writes as GroupAnonymousBot and presses buttons as
    themselves: bound to the stand-in id, their own Confirm was always refused."""
    spec = HttpToolSpec(
        name="cancel_booking",
        description="cancel a booking",
        url=api.url + "/bookings/{order_id}/cancel",
        method="POST",
        parameters=SCHEMA,
        allow_hosts=("127.0.0.1",),
        allow_private=True,
        read_only=False,
        confirm=True,
    )
    model = ScriptedModel()
    model.add(calls(("cancel_booking", '{"order_id": "B7"}')), text("Confirm?"), text("Done."))
    outlet = RecordingOutlet()
    manager = SessionManager(
        store,
        {
            "default": AgentProfile(
                name="default",
                instructions="x",
                loop=AgentLoop(model, ToolRegistry([HttpTool(spec)]), Limits()),
            )
        },
        {"test": outlet},
        delivery=DeliveryPolicy(base_delay_s=0.01),
    )
    await manager.start()
    try:
        anonymous = Sender(id="1087968824", name="Group", anonymous=True)
        await manager.submit(
            InboundMessage(
                channel="test",
                conversation="c",
                sender=anonymous,
                text="cancel B7",
                platform_id="1",
            )
        )
        await asyncio.wait_for(manager.wait_idle(), 10)
        confirm = outlet.sent[-1][1].reply.buttons[0]
        press = {"kind": MessageKind.BUTTON, "button_value": confirm.value}
        await manager.submit(_msg("Confirm", "2", sender="424242", **press))
        await asyncio.wait_for(manager.wait_idle(), 10)
        assert [s["path"] for s in api.seen] == ["/bookings/B7/cancel"]
    finally:
        await manager.aclose(grace_s=1)


def _msg(t: str, pid: str, sender: str = "u", **kw: Any) -> InboundMessage:
    return InboundMessage(
        channel="test", conversation="c", sender=Sender(id=sender), text=t, platform_id=pid, **kw
    )


# ---- review findings: path steps, repeated placeholders, credentials on redirects ----


def _mock(
    url: str,
    answer: Any,
    *,
    parameters: dict[str, Any] | None = None,
    cap: int = 65_536,
    hosts: tuple[str, ...] = ("api.example.com",),
) -> tuple[ToolRegistry, list[httpx.Request]]:
    """The tool against an httpx mock transport: `answer(request)` is the endpoint."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        response: httpx.Response = answer(request)
        return response

    spec = HttpToolSpec(
        name="t",
        description="d",
        url=url,
        parameters=parameters or {"type": "object"},
        headers={"Authorization": "Bearer s3cret-token-0123456789"},
        allow_hosts=hosts,
        allow_private=True,  # no DNS: the mock answers
        max_response_bytes=cap,
    )
    return ToolRegistry([HttpTool(spec, transport=httpx.MockTransport(handler))]), seen


async def test_an_argument_cannot_step_out_of_its_path_segment() -> None:
    """`..` survived URL-encoding and httpx resolved it: a cancel tool for
    /api/orders/{order_id}/cancel, given "..", posted to /api/cancel with the secret."""
    registry, seen = _mock(
        "https://api.example.com/api/orders/{order_id}/cancel?ref={ref}",
        lambda r: httpx.Response(200, json={"path": r.url.path}),
    )
    for bad in ("..", ".", ""):
        result = await registry.call("t", json.dumps({"order_id": bad, "ref": "x"}), CTX)
        assert result.error == "failed", bad
        assert "order_id" in json.loads(result.content)["detail"]
    assert seen == []
    ok = await registry.call("t", '{"order_id": "..A", "ref": ".."}', CTX)  # a query value
    assert json.loads(ok.content)["body"] == {"path": "/api/orders/..A/cancel"}
    assert seen[0].url.params["ref"] == ".."


async def test_a_placeholder_may_appear_twice() -> None:
    registry, seen = _mock(
        "https://api.example.com/items/{id}?ref={id}",
        lambda r: httpx.Response(200, json={}),
    )
    result = await registry.call("t", '{"id": "7", "other": 1}', CTX)
    assert result.ok, result.content
    assert seen[0].url.path == "/items/7"
    assert dict(seen[0].url.params) == {"ref": "7", "other": "1"}


@pytest.mark.parametrize(
    ("location", "keeps"),
    [
        ("https://api.example.com/b", True),  # same origin
        ("https://api.example.com:8443/b", False),  # another port: another service
        ("https://other.api.example.com/b", False),
    ],
)
async def test_credentials_follow_a_redirect_only_within_the_origin(
    location: str, keeps: bool
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/a":
            return httpx.Response(302, headers={"Location": location})
        return httpx.Response(200, json={"ok": True})

    registry, seen = _mock("https://api.example.com/a", answer, hosts=("*.example.com",))
    result = await registry.call("t", "{}", CTX)
    assert result.ok, result.content
    assert [r.url.path for r in seen] == ["/a", "/b"]
    assert ("authorization" in seen[1].headers) is keeps


async def test_an_https_tool_refuses_a_redirect_to_plain_http() -> None:
    registry, seen = _mock(
        "https://api.example.com/a",
        lambda r: httpx.Response(301, headers={"Location": "http://api.example.com/b"}),
    )
    result = await registry.call("t", "{}", CTX)
    assert result.error == "failed"
    assert "https to http" in json.loads(result.content)["detail"]
    assert len(seen) == 1


async def test_a_secret_the_cap_would_halve_is_still_blanked() -> None:
    cap = 300
    body = "x" * (cap - 4) + "s3cret-token-0123456789 and more"  # the cap falls in it
    registry, _ = _mock(
        "https://api.example.com/a", lambda r: httpx.Response(200, text=body), cap=cap
    )
    result = json.loads((await registry.call("t", "{}", CTX)).content)
    assert result["truncated"] is True
    assert "s3cr" not in result["body"]
    assert len(result["body"].encode()) <= cap
    # a second copy just past the cap, read in part: blanking the first copy moved that part
    # under the cap
    twice = "s3cret-token-0123456789" + "." * 287 + "s3cret-token-0123456789" * 3
    registry, _ = _mock(
        "https://api.example.com/a", lambda r: httpx.Response(200, text=twice), cap=cap
    )
    result = json.loads((await registry.call("t", "{}", CTX)).content)
    assert "s3cr" not in result["body"]
    assert result["body"].startswith("***")


async def test_nan_and_infinity_never_reach_the_model_as_json() -> None:
    """Python's json reads NaN; the model was shown it back, and set_state stored it."""
    registry, seen = _mock(
        "https://api.example.com/a",
        lambda r: httpx.Response(200, text='{"price": NaN}', headers={"content-type": "json"}),
    )
    refused = await registry.call("t", '{"x": NaN}', CTX)
    assert refused.error == "invalid_arguments"
    assert "NaN" in json.loads(refused.content)["detail"]
    assert seen == []
    result = json.loads((await registry.call("t", '{"x": 1}', CTX)).content)
    assert result["body"] == '{"price": NaN}'  # shown as the text it is

    class Odd:
        name, description, read_only, timeout_s = "odd", "d", True, 5.0
        args_model = HttpTool(HttpToolSpec("x", "d", "https://a.example/")).args_model

        async def __call__(self, args: Any, ctx: ToolContext) -> Any:
            return {"a": float("nan"), "b": [float("inf"), 1.5]}

    odd = await ToolRegistry([Odd()]).call("odd", "{}", CTX)  # type: ignore[list-item]
    assert json.loads(odd.content) == {"a": None, "b": [None, 1.5]}


async def test_two_presses_in_one_turn_are_two_calls_with_their_own_ids(api: Api) -> None:
    """A press by someone else and then the asker's, in one batch: both calls had the id
    confirmed-<token>, which the Anthropic API refuses (after the tool had run)."""
    registry = _tool(api, "/orders/{order_id}/cancel", method="POST", read_only=False)
    model = ScriptedModel()
    model.add(text("Done."))
    pending = {"t0k3n": {"tool": "order", "args": {"order_id": "A1"}, "at": 0, "by": ["alice"]}}
    turn = Turn(
        run_id="r",
        session="s",
        system="x",
        history=[],
        user_texts=["[pressed the button: Confirm]", "[pressed the button: Confirm]"],
        state={"pending_actions": pending},
        confirmations=[("t0k3n", True, "mallory"), ("t0k3n", True, "alice")],
    )

    async def ignore(event: Any) -> None:
        return None

    outcome = await AgentLoop(model, registry, Limits()).run(turn, ignore)
    assert outcome.text == "Done."
    assert [s["path"] for s in api.seen] == ["/orders/A1/cancel"]
    ids = [c.id for m in model.requests[0].messages for c in m.tool_calls]
    assert len(ids) == 2
    assert len(set(ids)) == 2
