"""Who may use the console: the admin token as a Bearer header, or a login cookie holding an
expiry, a random id and an HMAC of both keyed by the token (never the token itself). Signing
out records the cookie's id in the store until it expires, so a copied cookie stops working on
every replica and open live streams end. Every comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import web

from core.store.base import Store
from gateway.http import client_key, json_error, same_origin

__all__ = ["COOKIE", "AdminAuth", "LoginThrottle", "too_many_failures"]

COOKIE = "switchboard_admin"
COOKIE_PATH = "/admin"
COOKIE_TTL_S = 12 * 3600
SIGNED_OUT_NS = "admin_signed_out"  # cookie id -> its expiry (unix seconds)
_CONTEXT = b"switchboard-admin-cookie:"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAuth:
    """`public_url`'s host counts as this origin. `throttle` counts wrong tokens, from the
    login form and as Bearer headers alike, by client address."""

    def __init__(
        self,
        token: str,
        *,
        store: Store | None = None,
        ttl_s: float = COOKIE_TTL_S,
        public_url: str | None = None,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._key = token.encode()
        self._digest = hashlib.sha256(self._key).digest()
        self.store = store  # where signed-out cookies are kept; None: only expiry ends them
        self.ttl_s = ttl_s
        self.public_url = public_url
        self.throttle = throttle or LoginThrottle()

    def token_ok(self, candidate: str) -> bool:
        # digests first: equal lengths, so not even the token's length leaks
        given = hashlib.sha256(candidate.encode()).digest()
        return hmac.compare_digest(given, self._digest)

    def cookie(self, now: float | None = None) -> str:
        expires = int((now if now is not None else time.time()) + self.ttl_s)
        nonce = secrets.token_hex(8)
        return f"{expires}.{nonce}.{self._mac(expires, nonce)}"

    def cookie_ok(self, value: str | None, now: float | None = None) -> bool:
        """Signed by this token and not expired (signing out is checked by `signed_in`)."""
        return self._parse(value, now) is not None

    def _parse(self, value: str | None, now: float | None = None) -> tuple[int, str] | None:
        """(expiry, id) of a genuine, unexpired cookie."""
        parts = (value or "").split(".")
        if len(parts) != 3:
            return None
        expires_text, nonce, mac = parts
        if not expires_text.isdigit() or len(expires_text) > 12 or len(nonce) > 64:
            return None
        expires = int(expires_text)
        mac_ok = hmac.compare_digest(mac.encode(), self._mac(expires, nonce).encode())
        if not mac_ok or expires <= (now if now is not None else time.time()):
            return None
        return expires, nonce

    def _mac(self, expires: int, nonce: str) -> str:
        message = _CONTEXT + f"{expires}.{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    async def signed_in(self, value: str | None) -> bool:
        """A genuine, unexpired cookie that was not signed out (StoreError when the store
        cannot tell)."""
        parsed = self._parse(value)
        if parsed is None:
            return False
        return self.store is None or await self.store.kv_get(SIGNED_OUT_NS, parsed[1]) is None

    async def sign_out(self, value: str | None) -> None:
        """Refuse this cookie from now on, on every replica; forget cookies past expiry."""
        parsed = self._parse(value)
        if parsed is None or self.store is None:
            return
        expires, nonce = parsed
        now = time.time()
        for old, until in (await self.store.kv_items(SIGNED_OUT_NS)).items():
            if not until.isdigit() or int(until) <= now:
                await self.store.kv_delete(SIGNED_OUT_NS, old)
        await self.store.kv_set(SIGNED_OUT_NS, nonce, str(expires))

    async def via(self, request: web.Request) -> str | None:
        """How the request proves it is the operator ("bearer" or "cookie"), or None."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return "bearer" if self.token_ok(value.strip()) else None
        if await self.signed_in(request.cookies.get(COOKIE)):
            return "cookie"
        return None

    def protect(self, handler: Handler) -> Handler:
        """401 without credentials. A cookie-authenticated change must also come from this
        origin as JSON (defence in depth beside SameSite=Strict against cross-site posts)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            # a guess at our token, unlike a proxy's Basic login in front of the console
            scheme = request.headers.get("Authorization", "").partition(" ")[0]
            bearer = scheme.lower() == "bearer"
            client = client_key(request.remote)
            via = await self.via(request)
            if via is None:
                if bearer:  # a guess at the token, as on the login form
                    if self.throttle.blocked(client):
                        return too_many_failures()
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
