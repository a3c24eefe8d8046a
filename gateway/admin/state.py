"""What the console keeps per app: auth, a change signal for live updates, the secret filter
and the page."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from core.redact import Blanker
from gateway.admin.auth import AdminAuth
from gateway.config_checks import secret_values
from gateway.http import page_csp
from gateway.settings import Settings

__all__ = ["ADMIN", "AdminState", "Changes", "Page", "Redactor"]

REDACTED = "[redacted]"
MIN_SECRET = 6  # shorter values would blank out ordinary words


class Changes:
    """Bumped when the console itself changes something (pause, reply, retry), so the live
    stream tells every open page at once instead of at the next poll."""

    def __init__(self) -> None:
        self.version = 0
        self.closed = False
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    def close(self) -> None:
        self.closed = True
        self.bump()

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


class Redactor:
    """Blanks every configured secret (SecretStr values, HTTP tool headers, the store URL's
    password) out of what the console sends: error texts and tool results can echo them."""

    def __init__(self, settings: Settings) -> None:
        self._blank = Blanker(secret_values(settings), min_len=MIN_SECRET, mark=REDACTED)

    def json(self, data: Any, status: int = 200) -> web.Response:
        text = self._blank(json.dumps(data, ensure_ascii=False, default=str))
        return web.Response(text=text, status=status, content_type="application/json")


@dataclass(frozen=True, slots=True)
class Page:
    """The console page, with a Content-Security-Policy pinning its own inline script and
    style by hash: nothing else runs or loads on it."""

    html: str
    csp: str

    @classmethod
    def load(cls) -> Page:
        html = resources.files("gateway").joinpath("admin_static/admin.html").read_text("utf-8")
        return cls(html, page_csp(html, framing="'none'"))


@dataclass
class AdminState:
    auth: AdminAuth
    redactor: Redactor
    page: Page
    changes: Changes = field(default_factory=Changes)


ADMIN = web.AppKey("admin", AdminState)
