"""The operator console: auth, the read model on both stores, takeover, usage, dead letters.

API tests start the real app on a random port with a fake model, like test_e2e."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from channels.web import conversation_of
from core.errors import ConfigError
from core.models import InboundMessage, Reply, Sender, SessionKey
from core.store import Quota, RunRecord, Store
from core.store.admin import console
from gateway.admin.auth import AdminAuth, LoginThrottle
from gateway.app import build_app
from gateway.http import client_key
from gateway.keys import RUNTIME
from gateway.runtime import Runtime
from gateway.settings import load_settings
from tests.conftest import pg_schema
from tests.fake_openai import Error, FakeOpenAI, Text, ToolCalls, last_user_text
from tests.loopback import serve

TOKEN = "admin-token-0123456789abcdef"
WAIT_S = 15.0
BEARER = {"Authorization": f"Bearer {TOKEN}"}


# ---- harness (also used by test_admin_browser) ----


@dataclass
class Gateway:
    url: str
    app: web.Application

    @property
    def runtime(self) -> Runtime:
        return self.app[RUNTIME]

    def admin(self, **kw: Any) -> httpx.AsyncClient:
        """An API client holding the admin token."""
        return httpx.AsyncClient(base_url=self.url, headers=BEARER, timeout=10, **kw)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10)


def config(
    tmp_path: Path,
    *,
    model_url: str | None,
    store_url: str | None = None,
    admin: bool = True,
    extra: str = "",
) -> Path:
    model = (
        f'[model]\nprovider = "openai"\nbase_url = "{model_url}"\nname = "fake"\nmax_retries = 1\n'
        if model_url
        else '[model]\nprovider = "offline"\n'
    )
    store = store_url or f"sqlite:///{tmp_path}/sb.db"
    path = tmp_path / "switchboard.toml"
    path.write_text(
        "[server]\nport = 0\nmax_body_bytes = 65536\nshutdown_grace_s = 0.3\n"
        f'[store]\nurl = "{store}"\npoll_interval_s = 60\n{model}'
        + (f'[admin]\ntoken = "{TOKEN}"\n' if admin else "")
        + extra
    )
    return path


@contextlib.asynccontextmanager
async def gateway(path: Path) -> AsyncIterator[Gateway]:
    """The real app on 127.0.0.1, on a free port."""
    app = build_app(load_settings(path))
    runner, url = await serve(app, shutdown_timeout=1)
    try:
        yield Gateway(url, app)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def chat_browser(gw: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A web chat browser holding its session cookie."""
    async with gw.client() as client:
        assert (await client.get("/")).status_code == 200
        yield client


def web_key(gw: Gateway, client: httpx.AsyncClient) -> SessionKey:
    cookie = client.cookies["switchboard_chat"]
    return gw.runtime.manager.session_key("web", "default", conversation_of(cookie))


async def say(client: httpx.AsyncClient, text: str) -> None:
    r = await client.post("/chat/messages", json={"text": text, "client_id": f"c{time.time_ns()}"})
    assert r.status_code == 202, r.text


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def replies(client: httpx.AsyncClient) -> list[str]:
    data = (await client.get("/chat/history")).json()
    return [m["text"] for m in data["messages"] if m["role"] == "assistant"]


async def wait_replies(client: httpx.AsyncClient, count: int) -> list[str]:
    async def check() -> list[str] | None:
        got = await replies(client)
        return got if len(got) >= count else None

    result: list[str] = await until(check, f"{count} replies")
    return result


async def admin_session(admin: httpx.AsyncClient, key: SessionKey) -> dict[str, Any]:
    r = await admin.get("/admin/api/session", params={"key": str(key)})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store URL of each kind for the gateway under test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/sb.db"
    else:
        async with pg_schema() as url:
            yield url


# ---- auth ----

API_ROUTES = [
    ("GET", "/admin/events"),
    ("GET", "/admin/api/sessions"),
    ("GET", "/admin/api/session?key=a:b:c:d"),
    ("POST", "/admin/api/session/pause"),
    ("POST", "/admin/api/session/reply"),
    ("POST", "/admin/api/session/handback"),
    ("GET", "/admin/api/usage"),
    ("GET", "/admin/api/dead-letters"),
    ("POST", "/admin/api/dead-letters/retry"),
]


async def test_admin_is_off_without_a_token(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None, admin=False)) as gw, gw.admin() as c:
        for method, path in [("GET", "/admin"), ("POST", "/admin/login"), *API_ROUTES]:
            r = await c.request(method, path, json={})
            assert r.status_code == 404, (method, path)
            assert r.json()["error"]


async def test_api_refuses_without_the_token_or_with_a_wrong_one(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        cookie = AdminAuth(TOKEN).cookie()
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-0123456789abcdef"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": f"Bearer {cookie}"},  # the cookie is not a token
            {"Cookie": f"switchboard_admin={TOKEN}"},  # nor is the token a cookie
        ):
            # wrong tokens count towards the throttle: each on one route, every route once
            routes = API_ROUTES if "Authorization" not in headers else API_ROUTES[:1]
            for method, path in routes:
                r = await c.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (headers, method, path)
                assert r.json() == {"error": "admin token required"}
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
        ok = await c.get("/admin/api/sessions", headers=BEARER)
        assert ok.status_code == 200
        assert ok.headers["Cache-Control"] == "no-store"


async def test_login_sets_an_hmac_cookie_never_the_token(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        page = await c.get("/admin")
        assert page.status_code == 200
        assert 'id="login-form"' in page.text
        assert TOKEN not in page.text
        assert (await c.post("/admin/login", json={"token": "nope"})).status_code == 401
        assert "switchboard_admin" not in c.cookies

        r = await c.post("/admin/login", json={"token": TOKEN})
        assert r.status_code == 200
        set_cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in set_cookie
        assert "SameSite=Strict" in set_cookie
        assert "Path=/admin" in set_cookie
        value = c.cookies["switchboard_admin"]
        assert TOKEN not in value
        assert re.fullmatch(r"\d+\.[0-9a-f]{16}\.[0-9a-f]{64}", value)
        assert (await c.get("/admin/api/sessions")).status_code == 200

        # a cookie-authenticated change must be JSON from this origin
        body = json.dumps({"kind": "outbox", "id": 1})
        plain = await c.post(
            "/admin/api/dead-letters/retry", content=body, headers={"Content-Type": "text/plain"}
        )
        assert plain.status_code == 415
        other = await c.post(
            "/admin/api/dead-letters/retry",
            content=body,
            headers={"Content-Type": "application/json", "Origin": "https://evil.example"},
        )
        assert other.status_code == 403
        same = await c.post(
            "/admin/api/dead-letters/retry",
            content=body,
            headers={"Content-Type": "application/json", "Origin": gw.url},
        )
        assert same.status_code == 404  # authorized; there is just no such dead letter
        for kind, huge in (("outbox", 2**70), ("inbox", 2**63)):  # past SQLite's INTEGER
            big = json.dumps({"kind": kind, "id": huge})
            r = await c.post(
                "/admin/api/dead-letters/retry",
                content=big,
                headers={"Content-Type": "application/json", "Origin": gw.url},
            )
            assert r.status_code == 400, r.text
            assert "id:" in r.json()["error"]

        expires, nonce, mac = value.split(".")
        forged = f"{int(expires) + 3600}.{nonce}.{mac}"
        other_id = f"{expires}.{'0' * 16}.{mac}"
        for bad in (forged, other_id, f"{expires}.{nonce}.{'0' * 64}", "garbage", "1.2", ""):
            async with httpx.AsyncClient(base_url=gw.url, cookies={"switchboard_admin": bad}) as x:
                assert (await x.get("/admin/api/sessions")).status_code == 401

        out = await c.post("/admin/logout", json={})
        assert out.status_code == 200
        assert "switchboard_admin" not in c.cookies
        assert (await c.get("/admin/api/sessions")).status_code == 401

        form = await c.post("/admin/login", data={"token": TOKEN}, follow_redirects=False)
        assert form.status_code == 303
        assert form.headers["Location"] == "/admin"
        assert (await c.get("/admin/api/sessions")).status_code == 200


async def test_signing_out_revokes_the_cookie_and_ends_its_live_stream(
    store_url: str, tmp_path: Path
) -> None:
    """Signing out used to only ask the browser to forget the cookie: a copy of it (another
    tab's devtools, a shared machine, a proxy log) kept working for 12 hours, and an open
    live stream went on. Now the cookie's id is refused on every replica until it expires;
    the operator's other browsers stay signed in."""
    path = config(tmp_path, model_url=None, store_url=store_url)
    async with gateway(path) as gw, gw.client() as c, gw.client() as other:
        assert (await c.post("/admin/login", json={"token": TOKEN})).status_code == 200
        assert (await other.post("/admin/login", json={"token": TOKEN})).status_code == 200
        copied = c.cookies["switchboard_admin"]
        ended = asyncio.Event()

        async def listen() -> None:
            async with c.stream("GET", "/admin/events", timeout=None) as resp:
                assert resp.status_code == 200
                async for _ in resp.aiter_lines():
                    pass
            ended.set()

        task = asyncio.create_task(listen())
        try:
            await asyncio.sleep(0.3)
            assert not ended.is_set()
            out = await c.post("/admin/logout", json={})
            assert out.status_code == 200
            await asyncio.wait_for(ended.wait(), 5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        cookies = {"switchboard_admin": copied}
        async with httpx.AsyncClient(base_url=gw.url, cookies=cookies) as thief:
            assert (await thief.get("/admin/api/sessions")).status_code == 401
            assert (await thief.get("/admin/events")).status_code == 401
        assert (await other.get("/admin/api/sessions")).status_code == 200
    async with gateway(path) as gw, httpx.AsyncClient(base_url=gw.url, cookies=cookies) as thief:
        # a restart (or another replica) remembers it
        assert (await thief.get("/admin/api/sessions")).status_code == 401


async def test_another_sites_form_cannot_sign_the_operator_out(
    store_url: str, tmp_path: Path
) -> None:
    """The sign-out route was outside the origin check: a page elsewhere posting a form to
    /admin/logout cleared the operator's cookie (found by review)."""
    path = config(tmp_path, model_url=None, store_url=store_url)
    async with gateway(path) as gw, gw.client() as c:
        assert (await c.post("/admin/login", json={"token": TOKEN})).status_code == 200
        evil = await c.post("/admin/logout", headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403
        assert "set-cookie" not in evil.headers
        assert (await c.get("/admin/api/sessions")).status_code == 200
        ours = await c.post("/admin/logout", headers={"Origin": gw.url})
        assert ours.status_code == 303


def test_cookies_expire_and_failed_logins_are_throttled() -> None:
    auth = AdminAuth(TOKEN, ttl_s=60)
    cookie = auth.cookie(now=1000.0)
    assert auth.cookie_ok(cookie, now=1059.0)
    assert not auth.cookie_ok(cookie, now=1061.0)
    assert not AdminAuth(TOKEN + "x").cookie_ok(cookie, now=1000.0)  # a new token ends them
    throttle = LoginThrottle(limit=3, window_s=10)
    for _ in range(3):
        assert not throttle.blocked("1.2.3.4", now=0)
        throttle.failed("1.2.3.4", now=0)
    assert throttle.blocked("1.2.3.4", now=5)
    assert not throttle.blocked("5.6.7.8", now=5)
    assert not throttle.blocked("1.2.3.4", now=11)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data; boundary=x", b"--x\r\nbroken"),
        ("multipart/form-data", b"token=abc"),  # no boundary
        ("multipart/form-data; boundary=x", b"garbage without its boundary"),
        ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="t"'),
        ("application/x-www-form-urlencoded; charset=bogus", b"token=abc"),
    ],
)
async def test_a_login_form_that_cannot_be_read_gets_400(
    tmp_path: Path, content_type: str, body: bytes
) -> None:
    """Anyone could make the login answer 500 (and log a traceback) with a broken form."""
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        r = await c.post("/admin/login", content=body, headers={"Content-Type": content_type})
        assert r.status_code == 400
        assert "form" in r.json()["error"]


async def test_too_many_wrong_logins_get_429_but_the_right_token_still_signs_in(
    tmp_path: Path,
) -> None:
    """Behind a proxy every client has the proxy's address: anyone could keep the operator
    locked out with a few wrong tokens a minute (the right one got 429 too). An IPv6 client
    is counted by its /64, or it could rotate addresses past the limit."""
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        for _ in range(10):
            assert (await c.post("/admin/login", json={"token": "guess"})).status_code == 401
        assert (await c.post("/admin/login", json={"token": "guess"})).status_code == 429
        assert (await c.post("/admin/login", json={"token": TOKEN})).status_code == 200
    assert (
        client_key("2001:db8:1:2::1")
        == client_key("2001:db8:1:2:ffff::9")
        != client_key("2001:db8:1:3::1")
    )
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key(None) == "unknown"


async def test_a_proxys_basic_login_is_no_guess_at_the_token(tmp_path: Path) -> None:
    """Behind a proxy with HTTP Basic auth every request carries Authorization: Basic …; the
    console's calls before sign-in counted as wrong tokens and locked the operator out."""
    basic = {"Authorization": "Basic b3BzOnByb3h5LXBhc3N3b3Jk"}
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        for _ in range(12):
            assert (await c.get("/admin/api/sessions", headers=basic)).status_code == 401
        login = await c.post("/admin/login", json={"token": TOKEN}, headers=basic)
        assert login.status_code == 200
        assert (await c.get("/admin/api/sessions", headers=basic)).status_code == 200


async def test_wrong_bearer_tokens_are_throttled_and_https_cookies_are_secure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Bearer header is a guess at the token like the login form: it counts the same.
    Behind a trusted proxy that says the browser came over HTTPS, the cookie is Secure."""
    monkeypatch.setenv("SWITCHBOARD__SERVER__TRUST_FORWARDED", "true")
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        login = await c.post("/admin/login", json={"token": TOKEN})
        assert "secure" not in login.headers["set-cookie"].lower()  # plain HTTP: it must return
        https = {"X-Forwarded-Proto": "https"}
        login = await c.post("/admin/login", json={"token": TOKEN}, headers=https)
        assert "secure" in login.headers["set-cookie"].lower()
        for _ in range(10):
            r = await c.get("/admin/api/sessions", headers={"Authorization": "Bearer guess"})
            assert r.status_code == 401
        r = await c.get("/admin/api/sessions", headers={"Authorization": "Bearer guess"})
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "300"
        assert (await c.post("/admin/login", json={"token": "guess"})).status_code == 429
        r = await c.get("/admin/api/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200


async def test_page_runs_only_its_own_script(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.client() as c:
        r = await c.get("/admin")
    csp = r.headers["Content-Security-Policy"]
    script = re.search(r"<script>(.*?)</script>", r.text, re.DOTALL)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["X-Frame-Options"] == "DENY"
    assert "http://" not in r.text.replace("http://www.w3.org/2000/svg", "")  # no CDN
    assert "https://" not in r.text


def test_admin_token_must_be_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[admin]\ntoken = "short"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert [k for k, _ in err.value.problems] == ["admin.token"]
    path.write_text("")
    env = {"SWITCHBOARD__ADMIN__TOKEN": TOKEN}
    token = load_settings(path, environ=env).admin.token
    assert token is not None
    assert token.get_secret_value() == TOKEN
    assert TOKEN not in repr(load_settings(path, environ=env))


# ---- live sessions, transcripts, takeover ----


async def test_sessions_list_shows_a_run_in_progress(
    tmp_path: Path, fake_openai: FakeOpenAI, store_url: str
) -> None:
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=1.5)
    path = config(tmp_path, model_url=fake_openai.url, store_url=store_url)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        assert (await admin.get("/admin/api/sessions")).json()["sessions"] == []
        await say(browser, "are you open on sundays?")
        key = str(web_key(gw, browser))

        async def working() -> dict[str, Any] | None:
            data = (await admin.get("/admin/api/sessions")).json()
            rows = [s for s in data["sessions"] if s["key"] == key and s["working"]]
            return rows[0] if rows else None

        row = await until(working, "the session to show a run in progress")
        assert row["channel"] == "web"
        assert row["agent"] == "default"
        assert row["customer"] == row["conversation"]  # a browser has no name, only its id
        assert row["pending"] == 1
        assert row["paused"] is False
        assert row["last_activity"] > time.time() - 10
        await wait_replies(browser, 1)

        async def done() -> dict[str, Any] | None:
            data = (await admin.get("/admin/api/sessions")).json()
            s = data["sessions"][0]
            return s if not s["working"] and s["unsent"] == 0 else None

        row = await until(done, "the run to end")
        assert row["pending"] == 0
        assert row["messages"] == 1
        assert row["last_run_status"] == "ok"


async def test_transcript_unfolds_runs_with_tool_calls_and_warnings(
    tmp_path: Path, fake_openai: FakeOpenAI, store_url: str
) -> None:
    fake_openai.script(
        ToolCalls([("search_knowledge", '{"query": "opening hours"}')]),
        Text("We open at 8:00 on weekdays."),
        Text("A full service costs $1,250.00."),  # no tool returned that amount
    )
    path = config(tmp_path, model_url=fake_openai.url, store_url=store_url)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        await say(browser, "when do you open?")
        await wait_replies(browser, 1)
        await say(browser, "how much is a service?")
        await wait_replies(browser, 2)
        data = await admin_session(admin, web_key(gw, browser))
    entries = data["entries"]
    assert [(e["role"], e["status"]) for e in entries] == [
        ("user", "done"),
        ("assistant", "sent"),
        ("user", "done"),
        ("assistant", "sent"),
    ]
    first, second = data["runs"]
    assert entries[1]["run_id"] == first["id"]
    assert entries[0]["run_id"] == first["id"]
    assert first["status"] == "ok"
    assert (first["steps"], first["tool_calls"]) == (2, 1)
    assert (first["input_tokens"], first["output_tokens"]) == (200, 20)
    assert first["credits"] == 1.0
    assert first["latency_s"] > 0
    calls = [c for c in first["detail"]["calls"] if "step" in c]
    assert [c["tool_calls"] for c in calls] == [["search_knowledge"], []]
    assert all(c["seconds"] >= 0 and c["input_tokens"] == 100 for c in calls)
    [tool] = first["detail"]["tools"]
    assert tool["name"] == "search_knowledge"
    assert json.loads(tool["arguments"]) == {"query": "opening hours"}
    assert "Opening hours" in tool["result"]
    assert tool["ok"] is True
    [amount] = second["detail"]["unverified_amounts"]
    assert amount["text"] == "$1,250.00"
    assert data["channel_enabled"] is True


async def test_takeover_pause_reply_and_hand_back(
    tmp_path: Path, fake_openai: FakeOpenAI, store_url: str
) -> None:
    path = config(tmp_path, model_url=fake_openai.url, store_url=store_url)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        await say(browser, "hello")
        await wait_replies(browser, 1)
        key = web_key(gw, browser)
        seen: list[dict[str, Any]] = []
        opened = asyncio.Event()

        async def listen() -> None:
            async with browser.stream("GET", "/chat/events", timeout=None) as resp:
                name = ""
                async for line in resp.aiter_lines():
                    if line.startswith(": connected"):
                        opened.set()
                    elif line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: ") and name == "message":
                        seen.append(json.loads(line[6:]))

        task = asyncio.create_task(listen())
        try:
            await asyncio.wait_for(opened.wait(), 5)
            r = await admin.post("/admin/api/session/pause", json={"key": str(key)})
            assert r.status_code == 200
            row = (await admin_session(admin, key))["session"]
            assert row["paused"] is True
            assert row["handoff"]["reason"] == "taken over by an operator"

            asked = len(fake_openai.requests)
            await say(browser, "are you a bot?")

            async def held() -> bool:
                return bool((await admin_session(admin, key))["session"]["held"] == 1)

            await until(held, "the message to be held")
            await asyncio.sleep(0.3)
            assert len(fake_openai.requests) == asked  # no bot answer while paused
            assert await replies(browser) == ["echo: hello"]

            for text in ("Hi, this is Sam from support.", "Let me check that for you."):
                r = await admin.post(
                    "/admin/api/session/reply", json={"key": str(key), "text": text}
                )
                assert r.status_code == 202
            await until(lambda: _ready(len(seen) >= 2), "the operator's messages")
            assert [m["text"] for m in seen] == [
                "Hi, this is Sam from support.",
                "Let me check that for you.",
            ]
            assert int(seen[0]["id"][4:]) < int(seen[1]["id"][4:])
            assert (await replies(browser))[1:] == [m["text"] for m in seen]
            assert len(fake_openai.requests) == asked

            r = await admin.post("/admin/api/session/handback", json={"key": str(key)})
            assert r.json() == {"paused": False, "released": 1}
            await until(lambda: _ready(len(seen) >= 3), "the held message's answer")
            assert seen[2]["text"] == "echo: are you a bot?"  # delivered after the operator's
            assert len(await replies(browser)) == 4
            data = await admin_session(admin, key)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert data["session"]["paused"] is False
    assert [e["operator"] for e in data["entries"] if e["role"] == "assistant"] == [
        False,
        True,
        True,
        False,
    ]


async def _ready(value: bool) -> bool:
    return value


async def test_agent_handoff_shows_as_paused_with_its_reason(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        ToolCalls([("handoff_to_human", '{"reason": "wants a refund"}')]),
        Text("A colleague will take over here."),
    )
    async with gateway(config(tmp_path, model_url=fake_openai.url)) as gw, gw.admin() as admin:
        async with chat_browser(gw) as browser:
            await say(browser, "I want my money back")
            await wait_replies(browser, 1)
            key = web_key(gw, browser)
        rows = (await admin.get("/admin/api/sessions")).json()["sessions"]
        data = await admin_session(admin, key)
    assert rows[0]["key"] == str(key)
    assert rows[0]["paused"] is True
    assert rows[0]["handoff"]["reason"] == "wants a refund"
    assert rows[0]["handoff"]["run"] == data["runs"][0]["id"]
    assert data["runs"][0]["detail"]["handoff"] == "wants a refund"


# ---- usage and dead letters ----


async def test_usage_per_day_channel_agent_and_quotas(
    tmp_path: Path, fake_openai: FakeOpenAI, store_url: str
) -> None:
    extra = "[quotas]\nuser_daily_credits = 2\n"
    path = config(tmp_path, model_url=fake_openai.url, store_url=store_url, extra=extra)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        await say(browser, "one")
        await wait_replies(browser, 1)
        await say(browser, "two")
        await wait_replies(browser, 2)
        await say(browser, "three")  # past the quota: refused, no run of the model
        await wait_replies(browser, 3)
        sender = conversation_of(browser.cookies["switchboard_chat"])
        data = (await admin.get("/admin/api/usage", params={"days": 7})).json()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert len(data["days"]) == 7
    assert data["days"][-1] == today == data["today"]
    assert data["rows"] == [
        {
            "day": today,
            "agent": "default",
            "channel": "web",
            "messages": 3,
            "runs": 2,
            "input_tokens": 200,
            "output_tokens": 20,
            "credits": 2.0,
        }
    ]
    assert data["quotas"] == [
        {"day": today, "scope": "user", "key": f"web:default:{sender}", "used": 2.0, "limit": 2.0}
    ]
    assert data["limits"] == {"user": 2.0, "channel": 0.0}


async def test_dead_letters_retry_delivers(
    tmp_path: Path, fake_openai: FakeOpenAI, store_url: str
) -> None:
    fake_openai.script(Error(500), Error(500))  # the first run fails (try and one retry)
    path = config(tmp_path, model_url=fake_openai.url, store_url=store_url)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        await say(browser, "is my bike ready?")
        assert "Sorry" in (await wait_replies(browser, 1))[0]
        key = web_key(gw, browser)
        store = gw.runtime.store
        [part] = await store.enqueue_replies(str(key), [Reply(text="Your bike is ready.")])
        await store.mark_failed(part.id, "403 Forbidden: bot was blocked", permanent=True)

        items = (await admin.get("/admin/api/dead-letters")).json()["items"]
        assert {(d["kind"], d["text"]) for d in items} == {
            ("outbox", "Your bike is ready."),
            ("inbox", "is my bike ready?"),
        }
        by_kind = {d["kind"]: d for d in items}
        assert by_kind["outbox"]["error"] == "403 Forbidden: bot was blocked"
        assert by_kind["inbox"]["run_status"] == "model_error"
        assert by_kind["inbox"]["session"] == str(key)

        for kind in ("outbox", "inbox"):
            r = await admin.post(
                "/admin/api/dead-letters/retry", json={"kind": kind, "id": by_kind[kind]["id"]}
            )
            assert r.status_code == 202, r.text
        got = await wait_replies(browser, 3)
        again = await admin.post(
            "/admin/api/dead-letters/retry", json={"kind": "outbox", "id": by_kind["outbox"]["id"]}
        )
        assert again.status_code == 404
        assert (await admin.get("/admin/api/dead-letters")).json()["items"] == []
        assert (await store.delivery(part.id) or ("",))[0] == "sent"
    assert {"Your bike is ready.", "echo: is my bike ready?"} <= set(got)


async def test_no_admin_response_leaks_secrets(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    api_key = "sk-test-SECRET-4242424242"
    tool_secret = "tool-secret-XYZ987654"
    extra = (
        '[tools.http.orders]\ndescription = "Order status."\nmethod = "GET"\n'
        'url = "https://shop.example.com/orders/{id}"\n'
        'parameters = { type = "object", properties = { id = { type = "string" } } }\n'
        f'headers = {{ Authorization = "Bearer {tool_secret}" }}\n'
    )
    path = config(tmp_path, model_url=fake_openai.url, extra=extra)
    text = path.read_text().replace('name = "fake"', f'name = "fake"\napi_key = "{api_key}"')
    path.write_text(text)
    async with gateway(path) as gw, gw.admin() as admin, chat_browser(gw) as browser:
        await say(browser, "hi")
        await wait_replies(browser, 1)
        key = str(web_key(gw, browser))
        store = gw.runtime.store
        [part] = await store.enqueue_replies(key, [Reply(text=f"echoing {tool_secret}")])
        await store.mark_failed(part.id, f"GET https://api/bot{api_key}/send: 401", permanent=True)
        state = (await store.get_session(key)).state
        await store.set_state(key, {**state, "state": {"leaked": api_key}})
        bodies = [
            (await admin.get(p)).text
            for p in (
                "/admin/api/sessions",
                f"/admin/api/session?key={key}",
                "/admin/api/usage",
                "/admin/api/dead-letters",
                "/admin",
            )
        ]
    everything = "\n".join(bodies)
    for secret in (api_key, tool_secret, TOKEN):
        assert secret not in everything
    assert everything.count("[redacted]") >= 4


async def test_events_say_changed_when_a_message_arrives(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.admin() as admin:
        changes: list[dict[str, Any]] = []
        first = asyncio.Event()

        async def listen() -> None:
            async with admin.stream("GET", "/admin/events", timeout=None) as resp:
                assert resp.headers["content-type"].startswith("text/event-stream")
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        changes.append(json.loads(line[6:]))
                        first.set()

        task = asyncio.create_task(listen())
        try:
            await asyncio.wait_for(first.wait(), 5)  # the initial state counts as a change
            before = len(changes)
            async with chat_browser(gw) as browser:
                await say(browser, "what are your opening hours?")
                await until(lambda: _ready(len(changes) > before), "a changed event", 5)
                await wait_replies(browser, 1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_sessions_api_searches_and_pages(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, model_url=None)) as gw, gw.admin() as admin:
        store = gw.runtime.store
        keys = [SessionKey("default", "telegram", "default", str(100 + i)) for i in range(5)]
        for i, k in enumerate(keys):
            await store.put_inbound(str(k), _msg(k, f"question {i}", f"x{i}", f"Name {i}"), 100)
            await asyncio.sleep(0.005)
        r = await admin.get("/admin/api/sessions", params={"limit": 2})
        assert r.status_code == 200
        body = r.json()
        assert [s["conversation"] for s in body["sessions"]] == ["104", "103"]
        assert body["more"] is True
        r = await admin.get("/admin/api/sessions", params={"limit": 2, "offset": 4})
        assert [s["conversation"] for s in r.json()["sessions"]] == ["100"]
        assert r.json()["more"] is False
        r = await admin.get("/admin/api/sessions", params={"q": "  QUESTION 2 "})
        assert [s["customer"] for s in r.json()["sessions"]] == ["Name 2"]
        for n in range(2):
            await store.put_inbound(str(keys[0]), _msg(keys[0], f"more {n}", f"y{n}"), 100)
        params = {"key": str(keys[0]), "limit": 2}
        r = await admin.get("/admin/api/session", params=params)
        assert [e["text"] for e in r.json()["entries"]] == ["more 0", "more 1"]
        assert r.json()["earlier"] is True
        r = await admin.get("/admin/api/session", params={**params, "limit": 3})
        assert [e["text"] for e in r.json()["entries"]] == ["question 0", "more 0", "more 1"]
        assert r.json()["earlier"] is False
        for params in ({"q": "x" * 201}, {"offset": "soon"}):
            r = await admin.get("/admin/api/sessions", params=params)
            assert r.status_code == 400
            assert r.json()["error"].startswith(next(iter(params)) + ":")


async def test_bad_requests_are_json_errors(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    async with gateway(config(tmp_path, model_url=fake_openai.url)) as gw, gw.admin() as admin:
        async with chat_browser(gw) as browser:
            await say(browser, "hi")
            await wait_replies(browser, 1)
            key = str(web_key(gw, browser))
        tg = SessionKey("default", "telegram", "default", "42")
        await gw.runtime.store.put_inbound(
            str(tg),
            InboundMessage(
                channel="telegram", conversation="42", sender=Sender(id="42"), platform_id="1"
            ),
            100,
        )
        cases: list[tuple[str, str, Any, int]] = [
            ("GET", "/admin/api/session?key=nonsense", None, 400),
            ("GET", "/admin/api/session", None, 400),
            ("GET", "/admin/api/session?key=default:web:default:nobody", None, 404),
            ("GET", "/admin/api/sessions?limit=x", None, 400),
            ("POST", "/admin/api/session/pause", [1], 400),
            ("POST", "/admin/api/session/pause", {"key": "default:web:default:nobody"}, 404),
            ("POST", "/admin/api/session/pause", {"key": key, "reason": 7}, 400),
            ("POST", "/admin/api/session/reply", {"key": key, "text": "  "}, 400),
            ("POST", "/admin/api/session/reply", {"key": key, "text": "x" * 4001}, 400),
            ("POST", "/admin/api/session/reply", {"key": str(tg), "text": "hi"}, 409),
            ("POST", "/admin/api/dead-letters/retry", {"kind": "x", "id": 1}, 400),
            ("POST", "/admin/api/dead-letters/retry", {"kind": "inbox", "id": "1"}, 400),
            ("POST", "/admin/api/dead-letters/retry", {"kind": "inbox", "id": 999}, 404),
        ]
        for method, url, body, status in cases:
            r = await admin.request(method, url, json=body)
            assert r.status_code == status, (url, body, r.text)
            assert r.json()["error"]
        bad = await admin.post(
            "/admin/api/session/pause",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        )
        assert bad.status_code == 400


# ---- the read model, on both stores ----

A = SessionKey("default", "web", "default", "conv-a")
B = SessionKey("vip", "telegram", "bot1", "42")


def _msg(key: SessionKey, text: str, pid: str, name: str | None = None) -> InboundMessage:
    return InboundMessage(
        channel=key.channel,
        account=key.account,
        conversation=key.conversation,
        sender=Sender(id="u-" + key.conversation, name=name),
        text=text,
        platform_id=pid,
    )


async def test_retrying_a_dead_letter_retries_the_older_ones_of_its_session_first(
    store: Store,
) -> None:
    """The console lists dead letters newest first: retried one by one from the top, the
    customer read the answers backwards. Retrying one puts its session's older ones back too
    (they go out in order); another session's are left alone."""
    q = console(store)
    first, second = await store.enqueue_replies(str(A), [Reply(text="one"), Reply(text="two")])
    (other,) = await store.enqueue_replies(str(B), [Reply(text="elsewhere")])
    for part in (first, second, other):
        await store.mark_failed(part.id, "401 token", permanent=True)
    assert await q.retry_outbox(second.id) == str(A)
    assert [p.reply.text for p in await store.outbox_pending(str(A))] == ["one", "two"]
    assert await store.outbox_pending(str(B)) == []
    assert await q.retry_outbox(first.id) is None  # already back


async def test_sessions_waiting_for_an_operator_head_the_list_however_old(
    store: Store,
) -> None:
    """The list held the 200 most recently active sessions: behind 10,000 later ones, a paused
    session, and its customer's held messages, could not be found."""
    keys = [SessionKey("default", "web", "default", f"conv-{i}") for i in range(6)]
    for i, k in enumerate(keys):
        await store.put_inbound(str(k), _msg(k, f"m{i}", f"p{i}"), 100)
        await asyncio.sleep(0.01)
    await store.set_state(str(keys[0]), {"handoff": {"reason": "refund", "at": 1.0, "run": None}})
    assert await store.hold_pending(str(keys[1])) == 1
    # a flow variable that says "handoff" is no pause (the word matched anywhere in the state)
    await store.set_state(str(keys[2]), {"step": "handoff", "vars": {"handoff": None}})
    rows = await console(store).sessions(3)
    assert [r.key for r in rows] == [str(keys[1]), str(keys[0]), str(keys[5])]


async def test_sessions_are_searched_by_key_and_messages_and_paged(store: Store) -> None:
    """Past the 200 most recent sessions the console could not find anyone: the page only
    filtered what it had. Now the store searches every session's key (channel, number, chat
    id) and messages (the customer's name and words), and pages through the rest."""
    keys = [SessionKey("default", "whatsapp", "default", f"3491234{i:04d}") for i in range(12)]
    for i, k in enumerate(keys):
        name = {3: "José Núñez", 5: "Иван Петров"}.get(i, f"Customer {i}")
        text = {7: "my 50%_off coupon", 9: 'the "Deluxe" \\ plan'}.get(i, f"hello {i}")
        await store.put_inbound(str(k), _msg(k, text, f"p{i}", name), 100)
        await asyncio.sleep(0.005)
    q = console(store)
    assert [r.key for r in await q.sessions(10, query="34912340003")] == [str(keys[3])]
    assert [r.key for r in await q.sessions(10, query="josé")] == [str(keys[3])]
    assert [r.key for r in await q.sessions(10, query="NÚÑEZ")] == []  # only A-Z fold
    assert [r.key for r in await q.sessions(10, query="Иван")] == [str(keys[5])]
    assert [r.key for r in await q.sessions(10, query="JOSé NÚñez")] == []  # Ú is not A-Z
    assert [r.key for r in await q.sessions(10, query="JOSé Núñez")] == [str(keys[3])]
    assert [r.key for r in await q.sessions(10, query='"deluxe" \\')] == [str(keys[9])]
    assert [r.key for r in await q.sessions(10, query="50%_OFF")] == [str(keys[7])]
    assert await q.sessions(10, query="50%x") == []  # % and _ are text, not wildcards
    assert await q.sessions(10, query="0_1") == []
    assert len(await q.sessions(20, query="WHATSAPP")) == 12
    # the stored JSON's field names, ids and punctuation are not what the customer wrote (they
    # matched every session); a number is found as it is usually pasted
    for noise in ("text", "platform_id", "received_at", "p1", "sender"):
        assert await q.sessions(20, query=noise) == [], noise
    assert [r.key for r in await q.sessions(10, query="+34 912-34 0003")] == [str(keys[3])]
    newest = [r.key for r in await q.sessions(5)]
    assert newest == [str(k) for k in reversed(keys[7:])]
    page2 = [r.key for r in await q.sessions(5, offset=5)]
    assert page2 == [str(k) for k in reversed(keys[2:7])]
    assert [r.key for r in await q.sessions(5, offset=10)] == [str(keys[1]), str(keys[0])]


async def test_console_queries(store: Store) -> None:
    q = console(store)
    start = await q.watermark()
    first = await store.put_inbound(str(A), _msg(A, "hello", "a1", "Ana"), 100)
    assert await q.watermark() != start
    assert await store.acquire_lease(str(A), "me", 30)
    now = time.time()
    run = RunRecord(
        id="run1",
        session=str(A),
        started_at=now,
        ended_at=now + 1,
        inbox_ids=[first.id],
        status="ok",
        steps=2,
        tool_calls=1,
        input_tokens=100,
        output_tokens=10,
        credits=1.0,
        detail={"tools": [{"name": "search_knowledge", "arguments": "{}", "result": "x", "ok": 1}]},
    )
    [sent] = await store.complete_turn("me", run, "hello", [Reply(text="hi Ana")])
    await store.mark_sent(sent.id, "p1")
    mark = await q.watermark()
    await store.put_inbound(str(A), _msg(A, "more", "a2", "Ana"), 100)
    assert await q.watermark() != mark
    failing = await store.put_inbound(str(B), _msg(B, "help", "b1"), 100)
    assert await store.acquire_lease(str(B), "me", 30)
    bad = RunRecord(
        id="run2",
        session=str(B),
        started_at=time.time(),
        ended_at=time.time(),
        inbox_ids=[failing.id],
        status="model_error",
        error="model unreachable",
    )
    await store.complete_turn("me", bad, "help", [Reply(text="Sorry")])
    await store.release_lease(str(B), "me")
    [notice] = await store.enqueue_replies(str(B), [Reply(text="notice")])
    await store.mark_failed(notice.id, "403 blocked", permanent=True)
    await store.set_state(str(B), {"handoff": {"reason": "refund", "at": 1.0, "run": None}})
    day = time.strftime("%Y-%m-%d", time.gmtime())
    await store.reserve_usage(day, 1.0, [Quota("user", "web:default:u-conv-a", 10)])

    b, a = await q.sessions(10)
    assert (a.key, b.key) == (str(A), str(B))
    assert (a.customer, a.pending, a.working, a.last_run_status) == ("Ana", 1, True, "ok")
    assert (b.paused, b.failed, b.working, b.last_run_status) == (True, 1, False, "model_error")
    assert (b.agent, b.channel, b.account, b.customer) == ("vip", "telegram", "bot1", "u-42")
    one = await q.session(str(A))
    assert one is not None
    assert (one.pending, one.messages, one.customer) == (1, 2, "Ana")
    assert await q.session("default:web:default:nobody") is None

    entries = await q.entries(str(A), 50)
    assert [(e.role, e.text, e.status, e.run_id) for e in entries] == [
        ("user", "hello", "done", "run1"),
        ("assistant", "hi Ana", "sent", "run1"),
        ("user", "more", "pending", None),
    ]
    assert entries[0].sender == "Ana"
    [got] = await q.runs(str(A), 10)
    assert got.detail["tools"][0]["name"] == "search_knowledge"
    assert (got.credits, got.input_tokens, got.ended_at) == (1.0, 100, now + 1)

    usage = {(u.agent, u.channel): u for u in await q.usage(time.time() - 86400)}
    web_usage, tg_usage = usage[("default", "web")], usage[("vip", "telegram")]
    assert (web_usage.messages, web_usage.runs, web_usage.input_tokens) == (2, 1, 100)
    assert (web_usage.output_tokens, web_usage.credits, web_usage.day) == (10, 1.0, day)
    assert (tg_usage.messages, tg_usage.runs) == (1, 1)
    assert [(x.scope, x.key, x.used) for x in await q.quotas(day, 10)] == [
        ("user", "web:default:u-conv-a", 1.0)
    ]

    dead = await q.dead_letters(10)
    assert [(d.kind, d.text, d.error) for d in dead] == [
        ("outbox", "notice", "403 blocked"),
        ("inbox", "help", "model unreachable"),
    ]
    assert await q.retry_outbox(notice.id) == str(B)
    assert await q.retry_outbox(notice.id) is None
    assert notice.id in [p.id for p in await store.outbox_pending(str(B))]
    assert await q.retry_inbox(first.id) is None  # its run did not fail
    assert await q.retry_inbox(failing.id) == str(B)
    assert [i.id for i in await store.pending(str(B))] == [failing.id]
    assert await q.dead_letters(10) == []
