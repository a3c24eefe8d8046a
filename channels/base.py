"""The channel boundary: what every adapter provides to the gateway and the session manager."""

from __future__ import annotations

from typing import Protocol

from core.models import OutboundPart, SessionKey
from core.sessions import LiveOutlet, Outlet

__all__ = ["BadInput", "ChannelAdapter", "LiveOutlet", "Outlet"]


class BadInput(ValueError):
    """A request the adapter cannot accept; the message is safe to show the client (HTTP 400)."""


class ChannelAdapter(Protocol):
    """A channel: its name, the output rules the agent follows there, and delivery.

    Live feedback (typing, streamed text) is the optional LiveOutlet Protocol."""

    name: str
    output_rules: str

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None: ...
