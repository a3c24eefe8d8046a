"""[channels.slack]"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from channels.config import (
    REQUIRED_WHEN_ENABLED,
    ChannelSection,
    http_url,
    present,
    required_when_enabled,
    secret,
)

__all__ = ["SlackSettings"]


class SlackSettings(ChannelSection):
    bot_token: SecretStr | None = secret()
    signing_secret: SecretStr | None = secret()
    mode: Literal["events", "socket"] = "events"
    app_token: SecretStr | None = secret()
    api_base: str = "https://slack.com/api"
    # the bot's user id (U…); when unset it is read from event payloads or one auth.test call
    bot_user_id: str | None = Field(default=None, pattern=r"^[UW][A-Z0-9]{2,}$")
    # in channels: answer mentions only, or every message in threads the bot has joined
    reply_in_threads: Literal["mention", "all"] = "mention"
    # live preview of a reply: none, a message edited about once a second, or Slack's streams
    streaming: Literal["off", "update", "stream"] = "update"
    # "thinking" status while a run lasts (assistant thread status, else a reaction)
    status_messages: bool = True
    status_reaction: str = Field(default="eyes", pattern=r"^[a-z0-9_+'-]{1,100}$")
    # hosts (besides api_base's) that may receive the bot token when downloading shared files
    file_hosts: list[str] = Field(default_factory=lambda: ["files.slack.com"])
    # files are fetched before the event is acknowledged, which Slack wants within 3 s
    download_timeout_s: float = Field(default=1.5, gt=0, le=2.5)

    _check = field_validator("bot_token", "signing_secret")(required_when_enabled)

    @field_validator("app_token")
    @classmethod
    def _app_token(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("mode") == "socket" and info.data.get("enabled") and not present(value):
            raise ValueError(f'{REQUIRED_WHEN_ENABLED} with mode = "socket"')
        return value

    @field_validator("file_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> Any:
        """A comma-separated string too (from SWITCHBOARD__CHANNELS__SLACK__FILE_HOSTS)."""
        if isinstance(value, str):
            return [h.strip() for h in value.split(",") if h.strip()]
        return value

    _api_base = field_validator("api_base")(http_url)
