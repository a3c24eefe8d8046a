"""[channels.whatsapp]"""

from __future__ import annotations

from pydantic import SecretStr, field_validator

from channels.config import ChannelSection, required_when_enabled, secret

__all__ = ["WhatsAppSettings"]


class WhatsAppSettings(ChannelSection):
    access_token: SecretStr | None = secret()
    app_secret: SecretStr | None = secret()
    verify_token: SecretStr | None = secret()
    phone_number_id: str | None = secret()
    api_base: str = "https://graph.facebook.com"
    api_version: str = "v21.0"

    _check = field_validator("access_token", "app_secret", "verify_token", "phone_number_id")(
        required_when_enabled
    )
