"""One-off operations on the bot's Telegram side (for the CLI)."""

from __future__ import annotations

from functools import partial

from channels.telegram.client import TelegramClient
from channels.telegram.settings import TelegramSettings

__all__ = ["WEBHOOK_PATH", "set_webhook", "webhook_problems"]

WEBHOOK_PATH = "/webhooks/telegram"


def webhook_problems(section: TelegramSettings, public_url: str | None) -> list[tuple[str, str]]:
    """What `set-webhook` needs that the configuration lacks, as (key, message)."""
    p: list[tuple[str, str]] = []
    if not section.enabled:
        p.append(("channels.telegram.enabled", "must be true to register its webhook"))
    if section.token is None or not section.token.get_secret_value():
        p.append(("channels.telegram.token", "required to register the webhook"))
    if section.webhook_secret is None or not section.webhook_secret.get_secret_value():
        p.append(("channels.telegram.webhook_secret", "required to register the webhook"))
    if not public_url:
        p.append(("server.public_url", "required to register the webhook"))
    if section.mode == "polling":
        p.append(("channels.telegram.mode", 'is "polling"; a webhook needs "webhook" (or unset)'))
    return p


async def set_webhook(section: TelegramSettings, public_url: str) -> str:
    """Register public_url + /webhooks/telegram with the secret and allowed_updates; returns
    the URL. Raises ChannelError when Telegram refuses."""
    assert section.webhook_secret is not None
    url = public_url.rstrip("/") + WEBHOOK_PATH
    client = TelegramClient(section)
    try:
        await client.call(
            partial(
                client.bot.set_webhook,
                url,
                allowed_updates=section.allowed_updates,
                secret_token=section.webhook_secret.get_secret_value(),
            )
        )
    finally:
        await client.aclose()
    return url
