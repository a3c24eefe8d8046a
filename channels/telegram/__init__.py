"""The Telegram channel (Bot API through python-telegram-bot): webhook or long polling in,
Telegram HTML out."""

from channels.base import ChannelContext
from channels.telegram.adapter import TelegramAdapter
from channels.telegram.admin import set_webhook, webhook_problems
from channels.telegram.settings import TelegramSettings

__all__ = ["TelegramAdapter", "TelegramSettings", "create", "set_webhook", "webhook_problems"]


def create(section: TelegramSettings, ctx: ChannelContext) -> TelegramAdapter:
    """The adapter for an enabled [channels.telegram] section."""
    return TelegramAdapter(section, ctx)
