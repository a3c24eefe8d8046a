"""Socket Mode: events and interactivity over a websocket opened with the app-level token,
for workspaces without a public URL. Each envelope is fed to the same normalization as the
webhook route and acknowledged once its message is stored (the SDK runs each envelope's
listener in its own task). One that could not be stored in time is not acknowledged: Slack
sends an event again (its ids are forgotten, so the retry is taken afresh) and shows a click or
a command as failed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.mend import mend_strings
from channels.slack.inbound import Inbound

__all__ = ["SocketMode"]

log = logging.getLogger(__name__)


class SocketMode:
    def __init__(self, app_token: str, web_client: AsyncWebClient, inbound: Inbound) -> None:
        self._token, self._web, self._inbound = app_token, web_client, inbound
        self._client: SocketModeClient | None = None
        self._connecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect in the background: an unreachable Slack must not hold up the gateway."""
        client = SocketModeClient(app_token=self._token, web_client=self._web, logger=log)
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
