"""Serve an aiohttp app on 127.0.0.1 for a test: the one way the fakes and test servers listen."""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["serve"]


async def serve(app: web.Application, port: int = 0, **runner: Any) -> tuple[web.AppRunner, str]:
    """Start `app` on 127.0.0.1 (`port` 0: any free one); returns its runner, for `cleanup()`,
    and its base URL. `runner` goes to `web.AppRunner` (access_log, shutdown_timeout...)."""
    app_runner = web.AppRunner(app, **runner)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return app_runner, f"http://127.0.0.1:{bound}"
