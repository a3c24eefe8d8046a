"""The Bolt app behind the route for interactivity and slash commands (events take the short
path in inbound.py). It makes no network call at start or on the request path: `authorize`
answers from our own bot identity.

A click or a command is acknowledged only once its message is stored (Bolt's
process_before_response: the listener runs before the response is sent). When the store
fails or is too slow, the answer is a 503, which Slack shows the person as a failed click or
command, so they can try again; Slack retries neither, and a 200 would have lost it."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Protocol

from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.identity import BotIdentity

__all__ = ["Sink", "build_bolt"]

_ANY = re.compile(".*")


class Sink(Protocol):
    """Where the listeners hand what they normalized (the adapter's inbound side)."""

    def on_action(self, payload: dict[str, Any]) -> asyncio.Task[bool] | None: ...

    def on_command(self, form: dict[str, Any]) -> asyncio.Task[bool] | None: ...

    def not_here(self, form: dict[str, Any]) -> str | None: ...

    async def stored(self, task: asyncio.Task[bool] | None) -> bool: ...


def build_bolt(
    signing_secret: str, api_base: str, identity: BotIdentity, inbound: Sink
) -> AsyncApp:
    """An AsyncApp whose listeners hand the payload to `inbound`, then acknowledge once it is
    stored (or answer 503)."""

    async def authorize(
        enterprise_id: str | None, team_id: str | None, user_id: str | None
    ) -> AuthorizeResult:
        # a plain function: Bolt passes arguments by the parameter names it finds
        return await identity.authorize(enterprise_id, team_id, user_id)

    app = AsyncApp(
        name="switchboard",
        signing_secret=signing_secret,
        authorize=authorize,
        # without a token Bolt never calls auth.test itself; listeners make no Web API calls
        client=AsyncWebClient(base_url=api_base + "/"),
        process_before_response=True,
    )

    async def acked_once_stored(
        ack: AsyncAck, task: asyncio.Task[bool] | None
    ) -> BoltResponse | None:
        if not await inbound.stored(task):
            return BoltResponse(status=503, body={"error": "not stored, try again"})
        await ack()
        return None

    @app.action(_ANY)
    async def on_action(ack: AsyncAck, body: dict[str, Any]) -> BoltResponse | None:
        return await acked_once_stored(ack, inbound.on_action(body))

    @app.command(_ANY)
    async def on_command(ack: AsyncAck, body: dict[str, Any]) -> BoltResponse | None:
        hint = inbound.not_here(body)
        if hint is not None:  # a reply only the person who typed the command sees
            await ack(hint)
            return None
        return await acked_once_stored(ack, inbound.on_command(body))

    return app
