"""HTTP plumbing shared by every route: JSON errors, body size cap, store outages as 503."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from channels.base import BODY_WITHIN_S, read_body
from channels.mend import mend_json
from core.errors import StoreError
from gateway.keys import METRICS

__all__ = [
    "error_middleware",
    "json_error",
    "page_csp",
    "read_form",
    "read_json",
    "same_origin",
]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_KEPT_HEADERS = ("Allow", "Connection", "Retry-After", "WWW-Authenticate")


def json_error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error is JSON with a reason; nothing a client sends can produce a 500."""
    response = await _handle(request, handler)
    metrics = request.app.get(METRICS)
    if metrics is not None:
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        metrics.http(name, str(response.status)).inc()
    return response


async def _handle(request: web.Request, handler: Handler) -> web.StreamResponse:
    max_body = request.app._client_max_size
    if request.content_length is not None and request.content_length > max_body:
        return json_error(413, f"body larger than {max_body} bytes")
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        response = json_error(exc.status, reason)
        for name in _KEPT_HEADERS:  # e.g. a 405's Allow, a 429's Retry-After
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except ConnectionResetError:  # the client went away before sending its whole body
        return json_error(400, "connection closed before the body was read")
    except RequestPayloadError as exc:  # a Content-Encoding that does not decode, bad chunks
        cause = exc.__cause__
        detail = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
        return json_error(400, f"body could not be read: {detail}")
    except StoreError as exc:
        log.error("store unavailable: %s", exc)
        return json_error(503, "storage unavailable, try again later")
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal error")


async def read_json(request: web.Request) -> Any:
    """The body as JSON, or HTTP 400/413 with a reason."""
    raw = await read_body(request)  # 413 past the app's client_max_size, 408 when too slow
    try:
        return json.loads(mend_json(raw))
    except UnicodeDecodeError:
        raise web.HTTPBadRequest(text="body is not valid UTF-8") from None
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise web.HTTPBadRequest(text="body is nested too deeply") from None


async def read_form(request: web.Request) -> Mapping[str, Any]:
    """The body as a form (urlencoded or multipart), or HTTP 400/413 with a reason."""
    try:
        async with asyncio.timeout(BODY_WITHIN_S):  # as read_body
            return await request.post()  # past client_max_size: aiohttp's own 413
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"body not received within {BODY_WITHIN_S:g} s", headers={"Connection": "close"}
        ) from None
    except (ValueError, LookupError, HttpProcessingError) as exc:
        # a multipart body without its boundary or cut short, a charset nobody knows
        raise web.HTTPBadRequest(text=f"body is not a readable form ({exc})"[:300]) from None


def same_origin(request: web.Request, public_url: str | None) -> bool:
    """Whether a browser's Origin (when it sends one) is this gateway: the Host it was asked
    for, by the request's scheme or https, or its public URL (a proxy in front may pass on a
    Host of its own). The scheme counts: a plain-http page on our host (whatever a network
    attacker injects there) is not ours when the chat is served over https."""
    origin = request.headers.get("Origin")
    if origin is None:  # not sent by every client on same-origin requests
        return True
    theirs = urlsplit(origin)
    scheme, netloc = theirs.scheme.lower(), theirs.netloc.lower()
    if netloc == request.host.lower() and scheme in (request.scheme, "https"):
        return True  # https too: behind a TLS proxy the request itself may read as http
    ours = urlsplit(public_url or "")
    return bool(ours.netloc) and (scheme, netloc) == (ours.scheme.lower(), ours.netloc.lower())


def client_key(address: str | None) -> str:
    """Whom a client address stands for in a rate limit: an IPv6 address's /64 (one
    subscriber's whole network; counting each address let a client rotate past any limit)."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def page_csp(html: str, *, framing: str) -> str:
    """A Content-Security-Policy for a page whose only script and style are inline in it:
    those run, pinned by hash, and nothing else runs or loads. `framing`: frame-ancestors."""
    scripts = " ".join(_hashes(html, "script"))
    styles = " ".join(_hashes(html, "style"))
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; img-src 'self' data:;"
        f" connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors {framing}"
    )


def _hashes(html: str, tag: str) -> list[str]:
    out = []
    for body in re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        out.append(f"'sha256-{digest}'")
    return out or ["'none'"]
