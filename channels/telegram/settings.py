"""[channels.telegram]"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator

from channels.config import (
    REQUIRED_WHEN_ENABLED,
    ChannelSection,
    http_url,
    present,
    required_when_enabled,
    secret,
)

__all__ = ["DEFAULT_UPDATES", "TelegramSettings"]

DEFAULT_UPDATES = ("message", "edited_message", "callback_query")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")  # what setWebhook accepts as secret_token


class TelegramSettings(ChannelSection):
    token: SecretStr | None = secret()
    webhook_secret: SecretStr | None = None
    mode: Literal["webhook", "polling"] | None = None  # default: `effective_mode`
    api_base: str = "https://api.telegram.org"
    # in groups: answer only when mentioned, replied to or addressed by /command; or everything
    group_mode: Literal["mention", "all"] = "mention"
    # an edited message: ignored, or answered like a new message (marked as an edit)
    edited_messages: Literal["ignore", "new"] = "ignore"
    # live preview while the agent writes (drafts in private chats, edited messages elsewhere)
    streaming: bool = True
    # the bot's @username without "@"; when unset it is learnt once from getMe and cached
    bot_username: str | None = Field(default=None, pattern=r"^@?[A-Za-z0-9_]{3,64}$")
    # update kinds Telegram delivers (getUpdates and set-webhook)
    allowed_updates: list[Annotated[str, Field(pattern=r"^[a-z_]{1,64}$")]] = Field(
        default_factory=lambda: list(DEFAULT_UPDATES)
    )
    # long polling: how long one getUpdates call waits for news
    poll_timeout_s: int = Field(default=30, ge=0, le=50)
    # webhook mode: the most a request may spend downloading media before it is stored anyway
    media_timeout_s: float = Field(default=5.0, gt=0, le=60)

    _check = field_validator("token")(required_when_enabled)

    @field_validator("webhook_secret")
    @classmethod
    def _secret_chars(cls, value: SecretStr | None) -> SecretStr | None:
        if present(value) and value is not None and not _SECRET.match(value.get_secret_value()):
            raise ValueError("only A-Z, a-z, 0-9, _ and - are allowed (1 to 256 characters)")
        return value

    _api_base = field_validator("api_base")(http_url)

    @field_validator("bot_username")
    @classmethod
    def _username(cls, value: str | None) -> str | None:
        return value.removeprefix("@") if value else None

    def effective_mode(self, public_url: str | None) -> str:
        """`mode`, or webhook when there is a public URL or a webhook secret to check updates
        by, long polling when there is neither."""
        webhook = public_url or present(self.webhook_secret)
        return self.mode or ("webhook" if webhook else "polling")

    def problems(self, public_url: str | None) -> list[tuple[str, str]]:
        webhook = self.enabled and self.effective_mode(public_url) == "webhook"
        if webhook and not present(self.webhook_secret):
            key = "channels.telegram.webhook_secret"
            return [(key, f"{REQUIRED_WHEN_ENABLED} in webhook mode")]
        return []
