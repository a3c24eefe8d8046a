"""[channels.whatsapp]"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from channels.config import ChannelSection, http_url, required_when_enabled, secret

__all__ = ["DEFAULT_UNSUPPORTED_REPLY", "WhatsAppSettings"]

DEFAULT_UNSUPPORTED_REPLY = (
    "Sorry, I can't read that kind of message. You can send me text, a photo, a voice note or "
    "other audio, a video, a document, a sticker, a location or a contact."
)


class WhatsAppSettings(ChannelSection):
    access_token: SecretStr | None = secret()
    app_secret: SecretStr | None = secret()
    verify_token: SecretStr | None = secret()
    phone_number_id: str | None = secret()  # the primary business number
    api_base: str = "https://graph.facebook.com"
    api_version: str = Field(default="v21.0", pattern=r"^v\d{1,3}\.\d{1,2}$")  # as "v21.0"

    # more business numbers served by the same app (same token); each has its own sessions
    phone_number_ids: list[str] = Field(default_factory=list)
    # where media may be downloaded from with the access token, besides api_base's host
    media_hosts: list[str] = Field(default_factory=lambda: ["lookaside.fbsbx.com", "*.fbcdn.net"])
    # the approved template sent when the 24-hour customer service window is closed
    template_name: str | None = None
    template_language: str = "en_US"
    # body parameters {{1}}, {{2}}…; "{reply}" is replaced by the reply as one plain line
    template_params: list[str] = Field(default_factory=lambda: ["{reply}"])
    interactive: bool = True  # buttons as reply buttons / list messages (else a text menu)
    list_button: str = Field(default="Options", min_length=1, max_length=20)
    buttons_prompt: str = Field(default="Please choose:", min_length=1, max_length=1024)
    unsupported_reply: str = Field(default=DEFAULT_UNSUPPORTED_REPLY, min_length=1)
    # tuning (small values in tests)
    service_window_hours: float = Field(default=24.0, gt=0, le=24 * 30)
    media_timeout_s: float = Field(default=5.0, gt=0, le=60)  # bound on the webhook answer
    throughput_backoff_s: float = Field(default=2.0, ge=0, le=600)  # 130429 etc., per number
    pair_backoff_s: float = Field(default=6.0, ge=0, le=600)  # 131056, per customer
    max_per_second: float = Field(default=80.0, gt=0, le=10_000)  # per business number
    timeout_s: float = Field(default=10.0, gt=0, le=120)  # Graph API calls

    _api_base = field_validator("api_base")(http_url)
    _check = field_validator("access_token", "app_secret", "verify_token", "phone_number_id")(
        required_when_enabled
    )

    def numbers(self) -> list[str]:
        """Every business number served, the primary first."""
        out = [self.phone_number_id] if self.phone_number_id else []
        return out + [n for n in self.phone_number_ids if n not in out]
