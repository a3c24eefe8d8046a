"""Socket Mode: events and interactivity over a websocket opened with the app-level token,
for workspaces without a public URL. Each envelope is fed to the same normalization as the
webhook route and acknowledged once its message is stored (the SDK runs each envelope's
listener in its own task). One that could not be stored in time is not acknowledged: Slack
sends an event again (its ids are forgotten, so the retry is taken afresh) and shows a click or
a command as failed.

The SDK's client asks for a new connection at once whenever one closes or Slack says
`disconnect`: a Slack that closes every new connection got hundreds of `apps.connections.open`
calls a second (a Tier 1 method). Here a connection that did not last STABLE_S makes the next one
wait, 1 s doubling to RECONNECT_MAX_S; an app token Slack refuses is said once, naming the key,
and retried at that pace rather than with a traceback every few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.mend import mend_strings
from channels.slack.inbound import Inbound

__all__ = ["SocketMode"]

log = logging.getLogger(__name__)
RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 60.0
STABLE_S = 30.0  # a connection that lasted this long was fine: the next one comes at once
REFUSED = frozenset(  # apps.connections.open errors that waiting will not mend
    {
        "invalid_auth",
        "not_authed",
        "not_allowed_token_type",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "missing_scope",
    }
)


class _Client(SocketModeClient):
    """slack-sdk's aiohttp client, reconnecting with a backoff (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delay = 0.0
        self._connected_at: float | None = None
        self._stop = asyncio.Event()
        self._refusal: str | None = None  # the error last said, so it is said once

    async def connect(self) -> None:
        await super().connect()  # type: ignore[no-untyped-call]
        if not self.closed and await self.is_connected():
            self._connected_at = time.monotonic()

    async def issue_new_wss_url(self) -> str:
        """A new connection URL, after the wait a short-lived connection earns; "" once
        closed (the SDK's connect() then stops)."""
        if self._connected_at is not None:
            lived, self._connected_at = time.monotonic() - self._connected_at, None
            if lived >= STABLE_S:
                self._delay = 0.0
            else:
                self._grow()
                log.info("slack socket mode: reconnecting in %.0f s", self._delay)
                await self._wait(self._delay)
        while not self.closed:
            wait = None
            try:
                response = await self.web_client.apps_connections_open(app_token=self.app_token)
                url = str(response["url"])
            except SlackApiError as exc:
                error = str(exc.response.get("error") or exc.response.status_code)
                if error == "ratelimited":  # Tier 1: as long as Slack says
                    wait = _seconds(exc.response.headers.get("Retry-After"), RECONNECT_MAX_S)
                else:
                    self._failed(error)
            except Exception as exc:  # the network, a timeout, a body that is not JSON
                self._failed(type(exc).__name__)
            else:
                if self._refusal is not None:
                    log.info("slack socket mode: apps.connections.open works again")
                self._refusal = None
                return url
            await self._wait(self._delay if wait is None else wait)
        return ""

    def _failed(self, error: str) -> None:
        self._grow()
        if error == self._refusal:
            return
        self._refusal = error
        if error in REFUSED:
            log.error(
                "channels.slack.app_token: Slack refused it (%s): Socket Mode cannot connect; "
                "retrying every %.0f s at most",
                error,
                RECONNECT_MAX_S,
            )
        else:
            log.warning("slack socket mode: apps.connections.open failed (%s); retrying", error)

    def _grow(self) -> None:
        self._delay = min(max(self._delay * 2, RECONNECT_FIRST_S), RECONNECT_MAX_S)

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def close(self) -> None:
        self._stop.set()
        await super().close()  # type: ignore[no-untyped-call]


def _seconds(value: Any, default: float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(seconds, 0.0), 3600.0) if math.isfinite(seconds) else default


class SocketMode:
    def __init__(self, app_token: str, web_client: AsyncWebClient, inbound: Inbound) -> None:
        self._token, self._web, self._inbound = app_token, web_client, inbound
        self._client: SocketModeClient | None = None
        self._connecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect in the background: an unreachable Slack must not hold up the gateway."""
        client = _Client(app_token=self._token, web_client=self._web, logger=log)
        client.socket_mode_request_listeners.append(self._on_request)
        self._client = client
        connect: Callable[[], Coroutine[Any, Any, None]] = client.connect  # untyped in the SDK
        self._connecting = asyncio.create_task(connect(), name="slack socket mode")

    async def _on_request(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        payload: Any = req.payload if isinstance(req.payload, dict) else {}
        task = None
        event = req.type == "events_api" and payload.get("type") == "event_callback"
        if event:  # (clicks and commands are mended inside on_action and on_command)
            task = self._inbound.on_event(mend_strings(payload))
        elif req.type == "interactive":
            task = self._inbound.on_action(payload)
        elif req.type == "slash_commands":
            hint = self._inbound.not_here(payload)
            if hint is not None:  # a reply only the person who typed the command sees
                response = SocketModeResponse(envelope_id=req.envelope_id, payload={"text": hint})
                await client.send_socket_mode_response(response)
                return
            task = self._inbound.on_command(payload)
        if not await self._inbound.stored(task):
            if event:
                self._inbound.forget(payload)
            return
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        close: Callable[[], Coroutine[Any, Any, None]] = client.close  # untyped in the SDK
        await close()
        # close() cancels the client's own tasks without waiting for them
        tasks = [client.message_processor, client.current_session_monitor, client.message_receiver]
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
