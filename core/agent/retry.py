"""The retry rule of model calls: backoff with jitter, Retry-After honoured, and never once any
text has reached the person (a second try would say it twice)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.agent.model import DeltaSink, ModelResponse
from core.backoff import backoff
from core.errors import ModelError

__all__ = ["RetryPolicy", "with_retries"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3  # retries after the first try
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_wait_s: float = 120.0  # a Retry-After longer than this: no retry

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """`attempt`: the retries made so far."""
        return backoff(attempt, self.base_delay_s, self.max_delay_s, retry_after)


async def with_retries(
    policy: RetryPolicy,
    attempt: Callable[[DeltaSink], Awaitable[ModelResponse]],
    on_delta: DeltaSink | None,
    deadline: float | None = None,
) -> ModelResponse:
    """Run `attempt(sink)` until it succeeds, fails for good, has pushed text, or would have
    to wait past `deadline` (time.monotonic()) for its next try."""
    tries = 0
    while True:
        emitted = False

        async def sink(text: str) -> None:
            nonlocal emitted
            emitted = True
            if on_delta is not None:
                await on_delta(text)

        try:
            return await attempt(sink)
        except ModelError as exc:
            if not exc.retryable or emitted or tries >= policy.attempts:
                raise
            delay = policy.delay(tries, exc.retry_after)
            if delay > policy.max_wait_s:
                raise
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise
            log.info("model call failed (%s); retry %d in %.1fs", exc, tries + 1, delay)
            tries += 1
            await asyncio.sleep(delay)
