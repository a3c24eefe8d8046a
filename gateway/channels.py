"""Builds the enabled channel adapters from their configuration sections."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from channels.base import ChannelAdapter, ChannelContext
from core.store import Store
from gateway.settings import PLATFORM_CHANNELS, Settings

__all__ = ["available", "build_channels", "channel_context"]

log = logging.getLogger(__name__)


def available(name: str) -> bool:
    """Whether this build ships the adapter of a platform channel (`channels.<name>.create`)."""
    try:
        module = importlib.import_module(f"channels.{name}")
    except ImportError:
        return False
    return callable(getattr(module, "create", None))


def channel_context(settings: Settings, store: Store) -> ChannelContext:
    return ChannelContext(
        store=store,
        files_dir=Path(settings.channels.media_dir),
        max_media_bytes=settings.channels.max_media_bytes,
        public_url=settings.server.public_url,
    )


def build_channels(settings: Settings, ctx: ChannelContext) -> dict[str, ChannelAdapter]:
    """One adapter per enabled platform channel (the web chat is wired by the app itself)."""
    adapters: dict[str, ChannelAdapter] = {}
    for name in PLATFORM_CHANNELS:
        section = getattr(settings.channels, name)
        if not section.enabled:
            continue
        if not available(name):
            log.warning("channels.%s is enabled but not available in this build; skipped", name)
            continue
        module = importlib.import_module(f"channels.{name}")
        adapters[name] = module.create(section, ctx)
    return adapters
