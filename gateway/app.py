"""The aiohttp application: routes, middleware and the runtime's lifecycle."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp_remotes import XForwardedRelaxed
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from channels.base import HttpRoutes, Lifecycle
from channels.web import WebChat
from core.agent.model import ModelClient
from core.errors import StoreError
from core.periodic import every
from core.store import Store
from gateway import admin, webchat
from gateway.channels import build_channels, channel_context
from gateway.http import error_middleware
from gateway.keys import METRICS, RUNTIME, SETTINGS, WEBCHAT
from gateway.metrics import Metrics
from gateway.runtime import Runtime, build_store
from gateway.settings import Settings

__all__ = ["build_app"]

log = logging.getLogger(__name__)


def build_app(
    settings: Settings, *, store: Store | None = None, model: ModelClient | None = None
) -> web.Application:
    """The gateway as an aiohttp app; `store` and `model` replace the configured ones (tests)."""
    # behind a trusted proxy, request.remote, .scheme and .host are what it forwards (the last
    # X-Forwarded-* entry: the one it appended); inside error_middleware, so a malformed
    # header is a JSON 400 like any other
    forwarded = [XForwardedRelaxed().middleware] if settings.server.trust_forwarded else []
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=[error_middleware, *forwarded],
    )
    app[SETTINGS] = settings
    store = store or build_store(settings)
    ctx = channel_context(settings, store)
    channels = build_channels(settings, ctx)
    for adapter in channels.values():
        if isinstance(adapter, HttpRoutes):
            app.add_routes(adapter.routes())
    chat = WebChat(store)
    app[WEBCHAT] = chat
    if settings.channels.web.enabled:
        channels[chat.name] = chat
        webchat.add_routes(app)
    telemetry = Metrics()
    runtime = Runtime.build(settings, channels, store=store, model=model, telemetry=telemetry)
    ctx.bind(runtime.manager.submit, runtime.manager.notify, runtime.manager.session_key)
    app[RUNTIME] = runtime
    background: list[Lifecycle] = [a for a in channels.values() if isinstance(a, Lifecycle)]
    app[METRICS] = telemetry
    telemetry.gauge(
        "switchboard_active_sessions",
        "Sessions with a runner on this replica (holding their lease): work in progress.",
        lambda: runtime.manager.active(),
    )
    telemetry.gauge(
        "switchboard_runs_in_progress",
        "Runs executing now on this replica.",
        lambda: runtime.manager.running(),
    )
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    admin.add_routes(app)  # /admin, only when [admin] token is set

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await runtime.start()
        sample = functools.partial(_sample_queue_depth, runtime.store, telemetry)
        sampler = asyncio.create_task(every(5.0, sample, "queue depth sample", first_after_s=0))
        started: list[Lifecycle] = []
        try:
            for service in background:
                await service.start()
                started.append(service)
            yield
        finally:
            # drain first: replies of the runs finishing in the grace period still go out
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            await runtime.manager.aclose(settings.server.shutdown_grace_s)
            for service in reversed(started):
                await service.aclose()
            await runtime.aclose()

    async def close_streams(app: web.Application) -> None:
        chat.close()

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(close_streams)
    return app


async def _sample_queue_depth(store: Store, metrics: Metrics) -> None:
    """The queue depth gauge, read from the store (it spans replicas)."""
    metrics.queue_depth.set(await store.queue_depth())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[RUNTIME].store.ping()
    except StoreError as exc:
        log.warning("not ready: %s", exc)
        return web.json_response({"status": "unavailable", "store": "unreachable"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
