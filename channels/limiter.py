"""Send-rate limits in front of a platform: per key (chat, channel, number) and overall."""

from __future__ import annotations

from collections import OrderedDict

from aiolimiter import AsyncLimiter

__all__ = ["KeyedLimiter"]


class KeyedLimiter:
    """`rate` acquisitions per `period` seconds for each key, remembering the busiest
    `max_keys` keys (an idle key's bucket is empty again anyway)."""

    def __init__(self, rate: float, period: float, *, max_keys: int = 10_000) -> None:
        self._rate, self._period, self._max = rate, period, max_keys
        self._limiters: OrderedDict[str, AsyncLimiter] = OrderedDict()

    async def acquire(self, key: str) -> None:
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = AsyncLimiter(self._rate, self._period)
            if len(self._limiters) > self._max:
                self._limiters.popitem(last=False)
        else:
            self._limiters.move_to_end(key)
        await limiter.acquire()
