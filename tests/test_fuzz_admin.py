"""Bad input on the admin API: random credentials are refused, and with the right token random
queries and bodies get a 4xx (or a 2xx for a harmless request), never a 5xx."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import build_app
from gateway.settings import load_settings

TOKEN = "admin-token-for-the-fuzz-run-0123456789"
GETS = ["/admin/api/sessions", "/admin/api/session", "/admin/api/usage", "/admin/api/dead-letters"]
POSTS = [
    "/admin/api/session/pause",
    "/admin/api/session/reply",
    "/admin/api/session/handback",
    "/admin/api/dead-letters/retry",
    "/admin/login",
]
PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)  # what a header may carry
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real app, in a thread of its own, so the sync hypothesis tests can call it."""
    import asyncio

    tmp: Path = tmp_path_factory.mktemp("admin-fuzz")
    config = tmp / "sb.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp}/db"\n[admin]\ntoken = "{TOKEN}"\n')
    app = build_app(load_settings(config))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _client(base: str, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(base_url=base, headers=headers or {}, timeout=10)


@FUZZ
@given(
    path=st.sampled_from(GETS + POSTS),
    auth=st.one_of(
        st.none(),
        st.text(alphabet=PRINTABLE, min_size=1, max_size=60).map(lambda t: f"Bearer {t}"),
        st.text(alphabet=PRINTABLE, min_size=1, max_size=60),
    ),
    cookie=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=";"),
        max_size=80,
    ),
)
def test_wrong_credentials_are_refused(base: str, path: str, auth: str | None, cookie: str) -> None:
    headers = {"Cookie": f"switchboard_admin={cookie}"}
    if auth is not None and auth != f"Bearer {TOKEN}":
        headers["Authorization"] = auth
    if path == "/admin/login":
        return  # the login form is the one route open without credentials (below)
    with _client(base, headers) as c:
        r = c.post(path, json={}) if path in POSTS else c.get(path)
    # refused; past ten wrong Bearer tokens from this address, as too many tries
    assert r.status_code in (401, 429), (path, r.status_code, r.text[:200])


@FUZZ
@given(
    path=st.sampled_from(GETS),
    query=st.dictionaries(st.text(max_size=10), st.text(max_size=30), max_size=4),
)
def test_any_query_with_the_token_is_never_a_5xx(
    base: str, path: str, query: dict[str, str]
) -> None:
    with _client(base, {"Authorization": f"Bearer {TOKEN}"}) as c:
        r = c.get(path, params=query)
    assert r.status_code < 500, (path, query, r.status_code, r.text[:200])


@FUZZ
@given(path=st.sampled_from(POSTS), body=JSON | st.binary(max_size=200))
def test_any_body_with_the_token_is_never_a_5xx(base: str, path: str, body: Any) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with _client(base, headers) as c:
        r = c.post(path, content=raw)
    assert r.status_code < 500, (path, raw[:80], r.status_code, r.text[:200])


def test_the_app_is_still_healthy_after_the_fuzzing(base: str) -> None:
    with _client(base) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
