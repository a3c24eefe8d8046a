"""GET /admin/events: Server-Sent Events telling open console pages that something changed.

The stream carries no data, only "changed": the page refetches what it shows. Changes are found
by polling a cheap store watermark about once a second (so runs committed by other replicas
show up too), plus this replica's runner counts and the console's own actions. A stream opened
with the login cookie ends once that cookie is signed out or expires."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from aiohttp import web

from core.errors import StoreError
from core.store.admin import console
from gateway.admin.auth import COOKIE
from gateway.admin.state import ADMIN
from gateway.keys import RUNTIME

__all__ = ["events"]

log = logging.getLogger(__name__)

POLL_S = 1.0
KEEPALIVE_S = 15.0


async def events(request: web.Request) -> web.StreamResponse:
    state = request.app[ADMIN]
    runtime = request.app[RUNTIME]
    q = console(runtime.store)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    last: Any = None
    quiet_since = time.monotonic()
    # a stream the cookie opened (a proxy's Basic header beside it included) ends with it
    cookie = request.cookies.get(COOKIE) if await state.auth.via(request) == "cookie" else None
    try:
        await response.write(b"retry: 2000\n: connected\n\n")
        while not state.changes.closed:
            try:
                if cookie is not None and not await state.auth.signed_in(cookie):
                    break
                mark = (
                    await q.watermark(),
                    runtime.manager.active(),
                    runtime.manager.running(),
                    state.changes.version,
                )
            except StoreError as exc:
                log.warning("admin events: %s", exc)
                mark = last
            if mark != last:
                frame = {"at": time.time(), "running": runtime.manager.running()}
                await response.write(f"event: changed\ndata: {json.dumps(frame)}\n\n".encode())
                last, quiet_since = mark, time.monotonic()
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                await response.write(b": keepalive\n\n")
                quiet_since = time.monotonic()
            await state.changes.wait(POLL_S)
    except ConnectionResetError:
        pass
    finally:
        with contextlib.suppress(Exception):
            await response.write_eof()
    return response
