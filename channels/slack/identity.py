"""Who the bot is (its user id), known without a network call at start.

From config if set, else from the `authorizations` every event carries, else from one
auth.test made in the background the first time it is needed, then cached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slack_bolt.authorization import AuthorizeResult

from channels.slack.client import SlackApi
from core.errors import ChannelError

__all__ = ["BotIdentity"]

log = logging.getLogger(__name__)
RETRY_AFTER_S = 60.0  # after a failed auth.test, the next need may try again this much later


class BotIdentity:
    def __init__(self, api: SlackApi, token: str, user_id: str | None) -> None:
        self._api, self._token = api, token
        self.user_id = user_id
        self.bot_id: str | None = None
        self._lookup: asyncio.Task[None] | None = None
        self._next_try = 0.0

    def learn(self, body: dict[str, Any]) -> None:
        """Take the bot user id from an event's `authorizations`, when not known yet."""
        if self.user_id is not None:
            return
        auths = body.get("authorizations")
        first = auths[0] if isinstance(auths, list) and auths else None
        user = first.get("user_id") if isinstance(first, dict) and first.get("is_bot") else None
        if isinstance(user, str) and user:
            self.user_id = user
        else:
            self.ensure()

    def ensure(self) -> None:
        """Start the background auth.test, unless the id is known or a lookup is under way
        (a failed one may be tried again a minute later)."""
        if self.user_id is not None or (self._lookup is not None and not self._lookup.done()):
            return
        if time.monotonic() >= self._next_try:
            self._next_try = time.monotonic() + RETRY_AFTER_S
            self._lookup = asyncio.create_task(self._auth_test(), name="slack auth.test")

    async def _auth_test(self) -> None:
        try:
            data = await self._api.auth_test()
        except ChannelError as exc:
            log.warning("slack auth.test failed: %s", exc, extra={"channel": "slack"})
            return
        user, bot = data.get("user_id"), data.get("bot_id")
        if self.user_id is None and isinstance(user, str):
            self.user_id = user
        if isinstance(bot, str):
            self.bot_id = bot

    async def authorize(
        self, enterprise_id: str | None, team_id: str | None, user_id: str | None
    ) -> AuthorizeResult:
        """Bolt's `authorize`: our single bot token, no call to Slack on the request path."""
        self.ensure()
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id,
            bot_token=self._token,
            bot_user_id=self.user_id,
            bot_id=self.bot_id,
        )

    async def aclose(self) -> None:
        if self._lookup is not None and not self._lookup.done():
            self._lookup.cancel()
            await asyncio.gather(self._lookup, return_exceptions=True)
