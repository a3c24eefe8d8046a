"""WhatsApp on the official Cloud API (Graph API over aiohttp): webhooks, delivery, templates."""

from __future__ import annotations

from channels.base import ChannelContext
from channels.whatsapp.adapter import WhatsAppAdapter
from channels.whatsapp.settings import WhatsAppSettings

__all__ = ["WhatsAppAdapter", "WhatsAppSettings", "create"]


def create(section: WhatsAppSettings, ctx: ChannelContext) -> WhatsAppAdapter:
    """The adapter for an enabled [channels.whatsapp] section."""
    return WhatsAppAdapter(section, ctx)
