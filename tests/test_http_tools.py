"""HTTP tools from configuration: templating, schema validation, caps, SSRF defences, and the
confirmation button for write tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from core.agent.http_tools import HttpTool, HttpToolSpec, host_allowed
from core.agent.loop import AgentLoop, Limits
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
    ],
)
def test_http_tool_config_problems(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, f'[tools.http.t]\ndescription = "d"\n{section}\n'))
    assert key in [k for k, _ in err.value.problems]


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


def _msg(t: str, pid: str, **kw: Any) -> InboundMessage:
    return InboundMessage(
        channel="test", conversation="c", sender=Sender(id="u"), text=t, platform_id=pid, **kw
    )
