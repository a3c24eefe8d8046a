"""HTTP plumbing shared by every route: JSON errors, body size cap, store outages as 503."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from channels.mend import mend_json
from core.errors import StoreError
from gateway.keys import METRICS

__all__ = ["error_middleware", "json_error", "read_json"]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        return json_error(exc.status, reason)
    except ConnectionResetError:  # the client went away before sending its whole body
        return json_error(400, "connection closed before the body was read")
    except StoreError as exc:
        log.error("store unavailable: %s", exc)
        return json_error(503, "storage unavailable, try again later")
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal error")


async def read_json(request: web.Request) -> Any:
    """The body as JSON, or HTTP 400/413 with a reason."""
    raw = await request.read()  # raises 413 past the app's client_max_size
    try:
        return json.loads(mend_json(raw))
    except UnicodeDecodeError:
        raise web.HTTPBadRequest(text="body is not valid UTF-8") from None
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise web.HTTPBadRequest(text="body is nested too deeply") from None
