"""[channels.slack]"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import SecretStr, ValidationInfo, field_validator

from channels.config import ChannelSection, required_when_enabled, secret

__all__ = ["SlackSettings"]


class SlackSettings(ChannelSection):
    bot_token: SecretStr | None = secret()
    signing_secret: SecretStr | None = secret()
    mode: Literal["events", "socket"] = "events"
    app_token: SecretStr | None = secret()
    api_base: str = "https://slack.com/api"

    _check = field_validator("bot_token", "signing_secret")(required_when_enabled)

    @field_validator("app_token")
    @classmethod
    def _app_token(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("mode") == "socket":
            return required_when_enabled(value, info)
        return value
