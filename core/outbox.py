"""Delivery of stored reply parts: in order per session, retried, each confirmed part sent once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from core.backoff import backoff
from core.errors import ChannelError, StoreError
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
    """How a reply part is retried. An outage of the platform must not lose a stored reply:
    a failure it may recover from (5xx, network, 429) is retried with backoff, or after the
    platform's retry_after, for `retry_for_s`; only then is the part a dead letter (the admin
    console can send it again). A refusal that will not change (blocked, bad token) is one."""

    retry_for_s: float = 24 * 3600.0
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """`attempt`: the sends tried so far (1 after the first failed)."""
        return backoff(attempt - 1, self.base_delay_s, self.max_delay_s, retry_after)


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
        self._closing = asyncio.Event()

    def close(self) -> None:
        """Shutting down: a part waiting to be retried is left pending for the next start
        (the wait held the exit for all of shutdown_grace_s with no turn running). A send
        under way, and the record of one sent, still finish."""
        self._closing.set()

    async def _wait(self, seconds: float) -> bool:
        """Sleep; False when shutdown came first."""
        if not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)
        return not self._closing.is_set()

    async def deliver_pending(
        self, key: SessionKey, fence: Callable[[], Awaitable[bool]] | None = None
    ) -> None:
        """`fence`: whether this replica still holds the session, asked before a retry and
        before each part after the first (a wait, for a 429's retry_after or for the store to
        record a send, may outlast the lease: another replica holding it now sends the parts
        itself). False stops the delivery; the parts stay pending."""
        for i, part in enumerate(await self._store.outbox_pending(str(key))):
            if i and fence is not None and not await fence():
                log.info("reply parts left to the session's new holder")  # the runner's task
                return  # says which session (core.logcontext)
            if not await self._send(key, part, fence):
                return

    async def _send(
        self, key: SessionKey, part: OutboundPart, fence: Callable[[], Awaitable[bool]] | None
    ) -> bool:
        outlet = self._outlets.get(key.channel)
        if outlet is None:
            await self._store.mark_failed(part.id, "channel not enabled", permanent=True)
            return True
        started = time.monotonic()
        failures = 0  # in this call: the backoff starts over after a restart
        extra = {"session": str(key), "channel": key.channel}
        if part.not_before is not None and (wait := part.not_before - time.time()) > 0:
            # a retry_after (or backoff) given before a restart: still owed
            if not await self._wait(min(wait, self._policy.retry_for_s)):
                log.info("reply part %d left for the next start", part.id, extra=extra)
                return False
            if fence is not None and not await fence():  # the wait may outlast the lease
                log.info("reply part %d left to the session's new holder", part.id, extra=extra)
                return False
        while True:
            if failures and fence is not None and not await fence():
                log.info("reply part %d left to the session's new holder", part.id, extra=extra)
                return False
            try:
                platform_id = await outlet.send(key, part)
            except ChannelError as exc:
                error, retryable, retry_after = str(exc), exc.retryable, exc.retry_after
            except Exception as exc:
                if not failures:
                    log.exception("send failed", extra=extra)
                error, retryable, retry_after = type(exc).__name__, True, None
            else:
                await self._confirm(part.id, platform_id, extra)
                self._telemetry.send(key.channel, "sent")
                return True
            failures += 1
            limited = retry_after is not None
            permanent = not retryable or time.monotonic() - started >= self._policy.retry_for_s
            delay = self._policy.delay(failures, retry_after)
            await self._store.mark_failed(
                part.id, error[:500], permanent=permanent, not_before=time.time() + delay
            )
            self._telemetry.send(
                key.channel, "failed" if permanent else "retry", rate_limited=limited
            )
            if permanent:
                log.error("giving up on reply part %d: %s", part.id, error, extra=extra)
                return True
            if failures == 1 and not limited:
                log.warning("reply part %d not sent, retrying: %s", part.id, error, extra=extra)
            if not await self._wait(delay):
                log.info("reply part %d left for the next start", part.id, extra=extra)
                return False

    async def _confirm(self, part_id: int, platform_id: str | None, extra: dict[str, str]) -> None:
        """Record a part the platform accepted as sent, however long the store takes to come
        back: left pending, it would be sent again and reach the person twice."""
        tries = 0
        while True:
            try:
                await self._store.mark_sent(part_id, platform_id)
                return
            except StoreError as exc:
                tries += 1
                delay = self._policy.delay(tries, None)
                log.warning(
                    "reply part %d was sent but is not recorded yet (%s); retrying in %.1f s",
                    part_id,
                    exc,
                    delay,
                    extra=extra,
                )
            await asyncio.sleep(delay)
