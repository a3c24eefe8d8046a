"""The Web API calls the adapter makes, with slack_sdk errors translated into ChannelError."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.web.slack_response import SlackResponse

from channels.limiter import KeyedLimiter
from core.errors import ChannelError

__all__ = ["RETRYABLE_ERRORS", "SlackApi", "translate"]

log = logging.getLogger(__name__)

# error codes worth another try; anything else Slack names (not_in_channel, channel_not_found,
# is_archived, invalid_auth, invalid_blocks, …) fails the same way again and is recorded
RETRYABLE_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


def translate(exc: Exception, method: str) -> ChannelError:
    """A slack_sdk or network failure as a ChannelError the outbox can act on."""
    if isinstance(exc, SlackApiError):
        response = exc.response
        if not isinstance(response, AsyncSlackResponse | SlackResponse):  # a body not JSON
            status = int(getattr(response, "status", 0))
            return ChannelError(
                f"{method}: HTTP {status} with a body that is not JSON",
                retryable=True,
                code=f"http_{status}",
            )
        status = response.status_code
        error = str(response.get("error") or f"http_{status}")
        if status == 429:
            retry_after = _seconds(exc.response.headers.get("Retry-After"))
            return ChannelError(
                f"{method}: rate limited", retryable=True, retry_after=retry_after, code=error
            )
        retryable = status >= 500 or error in RETRYABLE_ERRORS
        return ChannelError(f"{method}: {error}", retryable=retryable, code=error)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | SlackClientError):
        return ChannelError(f"{method}: {type(exc).__name__}", retryable=True, code="network")
    return ChannelError(f"{method}: {type(exc).__name__}", retryable=True)


def _seconds(value: Any) -> float | None:
    try:
        return max(float(value), 0.0)
    except (TypeError, ValueError):
        return None


class SlackApi:
    """Our side of the Web API: every call raises ChannelError, postMessage is rate limited
    per channel (about one a second, reference/channels.md §3.3)."""

    def __init__(self, client: AsyncWebClient, *, timeout_s: float = 15.0) -> None:
        self.client = client
        self._timeout = timeout_s
        self._post_limiter = KeyedLimiter(1, 1.0)

    async def _call(self, method: str, call: Awaitable[AsyncSlackResponse]) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self._timeout):
                response = await call
        except (SlackApiError, SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise translate(exc, method) from None
        data = response.data
        return data if isinstance(data, dict) else {}

    async def post(
        self, channel: str, text: str, blocks: list[dict[str, Any]], thread: str | None
    ) -> str:
        """chat.postMessage; returns the new message's ts."""
        async with self._post_limiter.slot(channel):
            data = await self._call(
                "chat.postMessage",
                self.client.chat_postMessage(
                    channel=channel, text=text, blocks=blocks or None, thread_ts=thread
                ),
            )
        return str(data.get("ts", ""))

    async def update(self, channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> None:
        await self._call(
            "chat.update",
            self.client.chat_update(channel=channel, ts=ts, text=text, blocks=blocks),
        )

    async def delete(self, channel: str, ts: str) -> None:
        await self._call("chat.delete", self.client.chat_delete(channel=channel, ts=ts))

    async def react(self, channel: str, ts: str, name: str, *, add: bool) -> None:
        if add:
            call = self.client.reactions_add(channel=channel, timestamp=ts, name=name)
        else:
            call = self.client.reactions_remove(channel=channel, timestamp=ts, name=name)
        await self._call("reactions.add" if add else "reactions.remove", call)

    async def set_status(self, channel: str, thread: str, status: str) -> None:
        await self._call(
            "assistant.threads.setStatus",
            self.client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread, status=status
            ),
        )

    async def start_stream(
        self, channel: str, thread: str, text: str, team: str | None, user: str | None
    ) -> str:
        data = await self._call(
            "chat.startStream",
            self.client.chat_startStream(
                channel=channel,
                thread_ts=thread,
                markdown_text=text,
                recipient_team_id=team,
                recipient_user_id=user,
            ),
        )
        return str(data.get("ts", ""))

    async def append_stream(self, channel: str, ts: str, text: str) -> None:
        await self._call(
            "chat.appendStream",
            self.client.chat_appendStream(channel=channel, ts=ts, markdown_text=text),
        )

    async def stop_stream(self, channel: str, ts: str) -> None:
        await self._call("chat.stopStream", self.client.chat_stopStream(channel=channel, ts=ts))

    async def auth_test(self) -> dict[str, Any]:
        return await self._call("auth.test", self.client.auth_test())

    async def open_connection(self, app_token: str) -> dict[str, Any]:
        """apps.connections.open: a Socket Mode URL, with the app-level token."""
        call = self.client.apps_connections_open(app_token=app_token)
        return await self._call("apps.connections.open", call)
