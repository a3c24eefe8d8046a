"""A model client that sends a call to a second model when the first one fails."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from core.agent.model import DeltaSink, ModelClient, ModelRequest, ModelResponse
from core.errors import ModelError

__all__ = ["FallbackModel"]

log = logging.getLogger(__name__)


class FallbackModel:
    """Tries `primary`, then `fallback` with the same request if the primary raised ModelError
    before pushing any text (after text, a second answer would repeat it, so the error stands).

    After a primary failure the fallback goes first for `cooldown_s`, so the runs that follow do
    not each wait through the primary's retries and timeouts; the primary is still tried if the
    fallback fails, and it goes first again once the cooldown is over."""

    def __init__(
        self,
        primary: ModelClient,
        fallback: ModelClient,
        *,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._primary = primary
        self._fallback = fallback
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._primary_down_until = float("-inf")

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        first, second = ("primary", self._primary), ("fallback", self._fallback)
        if self._clock() < self._primary_down_until:
            first, second = second, first
        pushed = False

        async def sink(text: str) -> None:
            nonlocal pushed
            pushed = True
            if on_delta is not None:
                await on_delta(text)

        # the first model's retries may take half the time left, so the second one has a turn
        hurried = request
        if request.deadline is not None:
            now = time.monotonic()
            hurried = replace(request, deadline=now + max(request.deadline - now, 0.0) / 2)
        try:
            return await self._call(*first, hurried, sink)
        except ModelError as exc:
            if pushed:
                raise
            log.warning("%s model failed (%s); trying the %s model", first[0], exc, second[0])
        return await self._call(*second, request, sink)

    async def _call(
        self, name: str, model: ModelClient, request: ModelRequest, sink: DeltaSink
    ) -> ModelResponse:
        try:
            response = await model.complete(request, sink)
        except ModelError:
            if name == "primary":
                self._primary_down_until = self._clock() + self._cooldown_s
            raise
        if name == "primary":
            self._primary_down_until = float("-inf")
        return response

    async def aclose(self) -> None:
        try:
            await self._primary.aclose()
        finally:
            await self._fallback.aclose()
