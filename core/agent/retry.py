"""What the HTTP model clients share: one httpx client and the retry rule (backoff with
jitter, Retry-After honoured, never once any text has reached the person: a second try would
say it twice)."""

from __future__ import annotations

import asyncio
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from core.agent.model import DeltaSink, ModelRequest, ModelResponse
from core.errors import ModelError

__all__ = ["HttpModelClient", "RetryPolicy", "with_retries"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3  # retries after the first try
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(float(retry_after), 0.0), self.max_delay_s * 4)
        backoff = min(self.base_delay_s * 2.0**attempt, self.max_delay_s)
        return backoff * (0.5 + random.random() / 2)  # jitter, not crypto


async def with_retries(
    policy: RetryPolicy,
    attempt: Callable[[DeltaSink], Awaitable[ModelResponse]],
    on_delta: DeltaSink | None,
) -> ModelResponse:
    """Run `attempt(sink)` until it succeeds, fails for good, or has pushed text."""
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
            log.info("model call failed (%s); retry %d in %.1fs", exc, tries + 1, delay)
            tries += 1
            await asyncio.sleep(delay)


class HttpModelClient(ABC):
    """What the HTTP model clients share: one httpx client, the retry rule, and a call that
    streams or not. Subclasses build the body and read their provider's answers."""

    def __init__(
        self,
        *,
        base_url: str,
        headers: dict[str, str],
        model: str,
        timeout_s: float,
        stream: bool,
        retry: RetryPolicy | None,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            # as many calls at once as runs at once: the session manager caps those
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
            transport=transport,
        )
        self._model = model
        self._stream = stream
        self._retry = retry or RetryPolicy()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        body = self._body(request)

        async def once(sink: DeltaSink) -> ModelResponse:
            if self._stream:
                return await self._complete_stream(body, sink)
            response = await self._complete_once(body)
            if response.text:
                await sink(response.text)
            return response

        return await with_retries(self._retry, once, on_delta)

    @abstractmethod
    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The provider's request body."""

    @abstractmethod
    async def _complete_once(self, body: dict[str, Any]) -> ModelResponse:
        """One non-streamed call, read into a ModelResponse (errors as ModelError)."""

    @abstractmethod
    async def _complete_stream(self, body: dict[str, Any], sink: DeltaSink) -> ModelResponse:
        """One streamed call, pushing text to `sink` as it arrives."""
