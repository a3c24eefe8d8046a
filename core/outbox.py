"""Delivery of stored reply parts: in order per session, retried, each confirmed part sent once."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from core.errors import ChannelError
from core.models import OutboundPart, SessionKey
from core.store.base import Store
from core.telemetry import NullTelemetry, Telemetry

__all__ = ["DeliveryPolicy", "Outbox", "Outlet"]

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """Where a channel delivers reply parts. Returns the platform's message id, if any."""

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None: ...


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    max_attempts: int = 6  # failures (5xx, network)
    max_waits: int = 50  # rate-limit answers with retry_after; a flood must not drop a reply
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(float(retry_after), 0.0)
        backoff = min(self.base_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)
        return backoff * (0.5 + random.random() / 2)  # jitter


class Outbox:
    """Sends what the store holds for a session. The caller serializes calls per session (the
    session's runner does), which is what keeps parts in order."""

    def __init__(
        self,
        store: Store,
        outlets: Mapping[str, Outlet],
        policy: DeliveryPolicy,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._store = store
        self._outlets = outlets
        self._policy = policy
        self._telemetry: Telemetry = telemetry or NullTelemetry()

    async def deliver_pending(self, key: SessionKey) -> None:
        for part in await self._store.outbox_pending(str(key)):
            await self._send(key, part)

    async def _send(self, key: SessionKey, part: OutboundPart) -> None:
        outlet = self._outlets.get(key.channel)
        if outlet is None:
            await self._store.mark_failed(part.id, "channel not enabled", permanent=True)
            return
        attempts = part.attempts
        waits = 0  # retries the platform asked for (retry_after): capped apart from failures
        while True:
            try:
                platform_id = await outlet.send(key, part)
            except ChannelError as exc:
                error, retryable, retry_after = str(exc), exc.retryable, exc.retry_after
                limited = retry_after is not None
            except Exception as exc:
                log.exception("send failed", extra={"session": str(key), "channel": key.channel})
                error, retryable, retry_after = type(exc).__name__, True, None
                limited = False
            else:
                await self._store.mark_sent(part.id, platform_id)
                self._telemetry.send(key.channel, "sent")
                return
            if limited:
                waits += 1
            else:
                attempts += 1
            permanent = (
                not retryable
                or attempts >= self._policy.max_attempts
                or waits >= self._policy.max_waits
            )
            await self._store.mark_failed(part.id, error[:500], permanent=permanent)
            self._telemetry.send(
                key.channel, "failed" if permanent else "retry", rate_limited=limited
            )
            if permanent:
                log.error(
                    "giving up on reply part %d: %s",
                    part.id,
                    error,
                    extra={"session": str(key), "channel": key.channel},
                )
                return
            await asyncio.sleep(self._policy.delay(attempts, retry_after))
