"""Who may use the console: the admin token as a Bearer header, or a login cookie holding an
HMAC of the token (never the token itself), with an expiry. Every comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.http import json_error, same_origin

__all__ = ["COOKIE", "AdminAuth", "LoginThrottle", "too_many_failures"]

COOKIE = "switchboard_admin"
COOKIE_PATH = "/admin"
COOKIE_TTL_S = 12 * 3600
_CONTEXT = b"switchboard-admin-cookie:"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAuth:
    """`public_url`'s host counts as this origin. `throttle` counts wrong tokens, from the
    login form and as Bearer headers alike, by client address."""

    def __init__(
        self,
        token: str,
        *,
        ttl_s: float = COOKIE_TTL_S,
        public_url: str | None = None,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._key = token.encode()
        self._digest = hashlib.sha256(self._key).digest()
        self.ttl_s = ttl_s
        self.public_url = public_url
        self.throttle = throttle or LoginThrottle()

    def token_ok(self, candidate: str) -> bool:
        # digests first: equal lengths, so not even the token's length leaks
        given = hashlib.sha256(candidate.encode()).digest()
        return hmac.compare_digest(given, self._digest)

    def cookie(self, now: float | None = None) -> str:
        expires = int((now if now is not None else time.time()) + self.ttl_s)
        return f"{expires}.{self._mac(expires)}"

    def cookie_ok(self, value: str | None, now: float | None = None) -> bool:
        if not value:
            return False
        expires_text, _, mac = value.partition(".")
        if not expires_text.isdigit() or len(expires_text) > 12:
            return False
        expires = int(expires_text)
        mac_ok = hmac.compare_digest(mac.encode(), self._mac(expires).encode())
        return mac_ok and expires > (now if now is not None else time.time())

    def _mac(self, expires: int) -> str:
        return hmac.new(self._key, _CONTEXT + str(expires).encode(), hashlib.sha256).hexdigest()

    def via(self, request: web.Request) -> str | None:
        """How the request proves it is the operator ("bearer" or "cookie"), or None."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return "bearer" if self.token_ok(value.strip()) else None
        if self.cookie_ok(request.cookies.get(COOKIE)):
            return "cookie"
        return None

    def protect(self, handler: Handler) -> Handler:
        """401 without credentials. A cookie-authenticated change must also come from this
        origin as JSON (defence in depth beside SameSite=Strict against cross-site posts)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            bearer = "Authorization" in request.headers
            client = request.remote or "unknown"
            if bearer and self.throttle.blocked(client):
                return too_many_failures()
            via = self.via(request)
            if via is None:
                if bearer:  # a guess at the token, as on the login form
                    self.throttle.failed(client)
                response = json_error(401, "admin token required")
                response.headers["WWW-Authenticate"] = 'Bearer realm="switchboard-admin"'
                return response
            if via == "cookie" and request.method not in ("GET", "HEAD"):
                if not same_origin(request, self.public_url):
                    return json_error(403, "cross-origin request refused")
                if request.content_type != "application/json":
                    return json_error(415, "send JSON (Content-Type: application/json)")
            return await handler(request)

        return guarded

    def set_cookie(self, response: web.StreamResponse, request: web.Request) -> None:
        response.set_cookie(
            COOKIE,
            self.cookie(),
            max_age=int(self.ttl_s),
            path=COOKIE_PATH,
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )


def too_many_failures() -> web.Response:
    response = json_error(429, "too many wrong admin tokens; try again in a few minutes")
    response.headers["Retry-After"] = "300"
    return response


class LoginThrottle:
    """At most `limit` failed logins per client address per window: the token cannot be
    guessed over HTTP at any useful rate."""

    def __init__(self, limit: int = 10, window_s: float = 300.0) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = {}

    def blocked(self, client: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        seen = self._failures.get(client)
        if seen is None:
            return False
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        if not seen:
            del self._failures[client]
            return False
        return len(seen) >= self.limit

    def failed(self, client: str, now: float | None = None) -> None:
        if len(self._failures) > 10_000:  # a flood of addresses: forget the oldest
            self._failures.pop(next(iter(self._failures)))
        self._failures.setdefault(client, deque()).append(time.monotonic() if now is None else now)
