"""[channels.telegram]"""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, field_validator

from channels.config import ChannelSection, present, required_when_enabled, secret

__all__ = ["TelegramSettings"]


class TelegramSettings(ChannelSection):
    token: SecretStr | None = secret()
    webhook_secret: SecretStr | None = None
    mode: Literal["webhook", "polling"] | None = None  # default: webhook when public_url is set
    api_base: str = "https://api.telegram.org"

    _check = field_validator("token")(required_when_enabled)

    def effective_mode(self, public_url: str | None) -> str:
        return self.mode or ("webhook" if public_url else "polling")

    def problems(self, public_url: str | None) -> list[tuple[str, str]]:
        p: list[tuple[str, str]] = []
        if self.enabled and self.effective_mode(public_url) == "webhook":
            if not present(self.webhook_secret):
                p.append(
                    (
                        "channels.telegram.webhook_secret",
                        "required when the channel is enabled in webhook mode",
                    )
                )
            if public_url is None:
                p.append(("server.public_url", 'required for channels.telegram.mode = "webhook"'))
        return p
