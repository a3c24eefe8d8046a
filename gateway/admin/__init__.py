"""The operator console at /admin: live sessions, transcripts with runs unfolded, human
takeover, usage and dead letters. Off (404) unless `[admin] token` is set.

Routes (all but the page and login need the token, as `Authorization: Bearer` or the login
cookie):

| route | purpose |
|---|---|
| `GET /admin` | the console page (a login form until signed in) |
| `POST /admin/login`, `POST /admin/logout` | the HttpOnly login cookie; signing out revokes it |
| `GET /admin/events` | Server-Sent Events: `changed` when sessions or runs change |
| `GET /admin/api/sessions` | live list of sessions |
| `GET /admin/api/session?key=` | one session: state, transcript, runs unfolded |
| `POST /admin/api/session/pause` / `reply` / `handback` | human takeover |
| `GET /admin/api/usage?days=` | messages, runs, tokens, credits per day; quota counters |
| `GET /admin/api/dead-letters`, `POST /admin/api/dead-letters/retry` | failed for good |
"""

from __future__ import annotations

import logging

from aiohttp import web

from core.errors import StoreError
from gateway.admin import api
from gateway.admin.auth import COOKIE, COOKIE_PATH, AdminAuth, too_many_failures
from gateway.admin.events import events
from gateway.admin.state import ADMIN, AdminState, Page, Redactor
from gateway.http import client_key, json_error, read_form, read_json, same_origin
from gateway.keys import RUNTIME, SETTINGS

__all__ = ["add_routes"]

log = logging.getLogger(__name__)

MISSING_CSP = "default-src 'none'"
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def add_routes(app: web.Application) -> None:
    """Mount the console when `[admin] token` is set; without it every /admin URL is a 404."""
    token = app[SETTINGS].admin.token
    if token is None or not token.get_secret_value():
        return
    auth = AdminAuth(
        token.get_secret_value(),
        store=app[RUNTIME].store,
        public_url=app[SETTINGS].server.public_url,
    )
    state = AdminState(auth, Redactor(app[SETTINGS]), _page())
    app[ADMIN] = state
    guard = state.auth.protect
    app.router.add_get("/admin", page)
    app.router.add_post("/admin/login", login)
    app.router.add_post("/admin/logout", logout)
    app.router.add_get("/admin/events", guard(events))
    app.router.add_get("/admin/api/sessions", guard(api.sessions))
    app.router.add_get("/admin/api/session", guard(api.session))
    app.router.add_post("/admin/api/session/pause", guard(api.pause))
    app.router.add_post("/admin/api/session/reply", guard(api.reply))
    app.router.add_post("/admin/api/session/handback", guard(api.hand_back))
    app.router.add_get("/admin/api/usage", guard(api.usage))
    app.router.add_get("/admin/api/dead-letters", guard(api.dead_letters))
    app.router.add_post("/admin/api/dead-letters/retry", guard(api.retry))
    app.on_response_prepare.append(_secure_headers)
    app.on_shutdown.append(_close_streams)


def _page() -> Page:
    try:
        return Page.load()
    except OSError as exc:  # an install without the package data: the API still works
        log.error("admin console page missing: %s", exc)
        return Page(
            "<!doctype html><title>Switchboard admin</title>page missing", "default-src 'none'"
        )


async def page(request: web.Request) -> web.StreamResponse:
    p = request.app[ADMIN].page
    response = web.Response(text=p.html, content_type="text/html")
    response.headers["Content-Security-Policy"] = p.csp
    return response


async def login(request: web.Request) -> web.StreamResponse:
    """The token from the login form (or JSON {"token"}) for the session cookie."""
    state = request.app[ADMIN]
    client = client_key(request.remote)
    as_json = request.content_type == "application/json"
    if as_json:
        body = await read_json(request)
        token = body.get("token") if isinstance(body, dict) else None
    else:
        token = (await read_form(request)).get("token")
    if not isinstance(token, str) or not state.auth.token_ok(token.strip()):
        if state.auth.throttle.blocked(client):
            return too_many_failures()
        state.auth.throttle.failed(client)
        log.warning("admin login refused from %s", client)
        return json_error(401, "wrong admin token")
    response: web.StreamResponse
    if as_json:
        response = web.json_response({"ok": True})
    else:  # a plain HTML form post (no script): back to the console
        response = web.Response(status=303, headers={"Location": "/admin"})
    state.auth.set_cookie(response, request)
    log.info("admin login from %s", client)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """Revoke the cookie (a copy of it stops working too, on every replica) and clear it.
    Another site's page cannot: its form post signed the operator out."""
    state = request.app[ADMIN]
    if not same_origin(request, state.auth.public_url):
        return json_error(403, "cross-origin request refused")
    response: web.StreamResponse
    try:
        await state.auth.sign_out(request.cookies.get(COOKIE))
    except StoreError as exc:
        log.warning("admin sign-out not recorded: %s", exc)
        response = json_error(503, "signed out in this browser, but the store could not record it")
    else:
        if request.content_type == "application/json":
            response = web.json_response({"ok": True})
        else:
            response = web.Response(status=303, headers={"Location": "/admin"})
        state.changes.bump()  # open live streams check their cookie now
    response.del_cookie(COOKIE, path=COOKIE_PATH)
    return response


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path == "/admin" or request.path.startswith("/admin/"):
        response.headers.update(_HEADERS)
        response.headers.setdefault("Cache-Control", "no-store")


async def _close_streams(app: web.Application) -> None:
    app[ADMIN].changes.close()
