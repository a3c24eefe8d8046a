"""Send-rate limits in front of a platform: per key (chat, channel, number) and overall."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["KeyedLimiter", "Stamp"]


class Stamp:
    """When one acquisition counts from: when it was let through, or, for one taken
    `until_done`, when the call it let through had been sent (`done`), as the platform
    counts it; until then it counts as going out now."""

    __slots__ = ("_clock", "at", "sent")

    def __init__(self, clock: Callable[[], float], *, sent: bool = True) -> None:
        self._clock, self.at, self.sent = clock, clock(), sent

    def done(self) -> None:
        """The call went out now (calls let through together reach the platform one by one,
        over the connection pool: counted from the first, the next window's first calls
        came within a second of the last window's last)."""
        self.at = max(self.at, self._clock())
        self.sent = True


class _Window:
    """A key's latest `rate` acquisitions, and a lock that lines its waiters up."""

    __slots__ = ("lock", "rate", "stamps")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.stamps: list[Stamp] = []
        self.lock = asyncio.Lock()

    def add(self, stamp: Stamp) -> None:
        """Count one; a full window forgets its earliest call sent (one moved later by
        `done` may no longer be the first added; one still going out is never forgotten)."""
        sent = [s for s in self.stamps if s.sent]
        if len(self.stamps) >= self.rate and sent:
            self.stamps.remove(min(sent, key=lambda s: s.at))
        self.stamps.append(stamp)


class KeyedLimiter:
    """At most `rate` acquisitions in any `period` seconds for each key. A sliding window, as
    the platforms count ("20 messages a minute to a group"): a token bucket lets a full burst
    through and then refills, so almost twice the rate passed in the first period and the
    platform answered 429.

    Past `max_keys` keys, those with nothing in their window (and no one waiting) are
    forgotten; a key still counting is never forgotten, or its next sends would burst."""

    def __init__(
        self,
        rate: float,
        period: float,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        whole = max(1, math.ceil(rate))  # 2.5 a second: 3 in 1.2 s; 0.5: 1 in 2 s
        self._rate, self._period, self._clock = whole, period * whole / rate, clock
        self._windows: dict[str, _Window] = {}
        self._max_keys = self._prune_at = max_keys

    async def acquire(self, key: str, *, until_done: bool = False) -> Stamp:
        """Wait until the key has room, then count one (waiters go in the order they came).
        `until_done`: it counts from the returned stamp's `done`, which the caller must call
        once the call has gone out (or failed)."""
        window = self._window(key)
        async with window.lock:  # while it is held, `take` counts nothing for this key
            while (wait := self._wait(window)) > 0:  # noqa: ASYNC110 - a stamp may move later
                await asyncio.sleep(wait)
            stamp = Stamp(self._clock, sent=not until_done)
            window.add(stamp)
            return stamp

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Room for one call, counted from when it went out (the end of the block), as the
        platform counts it: every channel sends through this."""
        stamp = await self.acquire(key, until_done=True)
        try:
            yield
        finally:
            stamp.done()

    async def take(self, key: str) -> float | None:
        """Count one now if the key has room (None); else, without waiting, the seconds until
        it may have room."""
        window = self._window(key)
        wait = self._wait(window)
        if window.lock.locked():  # someone is waiting already: they go first
            wait = max(wait, self._period / self._rate)
        if wait > 0:
            return wait
        window.add(Stamp(self._clock))
        return None

    def _wait(self, window: _Window) -> float:
        """Seconds until the earliest call sent of a full window leaves it (0: room now; a
        window of calls all still going out is looked at again after a period)."""
        if len(window.stamps) < self._rate:
            return 0.0
        sent = [s.at for s in window.stamps if s.sent]
        if not sent:
            return self._period
        return max(0.0, min(sent) + self._period - self._clock())

    def _window(self, key: str) -> _Window:
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self._prune_at:
                self._prune()
            window = self._windows[key] = _Window(self._rate)
        return window

    def _prune(self) -> None:
        """Forget the keys whose window is empty; if most are still counting, look again only
        once there are twice as many (each look reads every key)."""
        since = self._clock() - self._period
        self._windows = {
            key: w
            for key, w in self._windows.items()
            if w.lock.locked() or any(not st.sent or st.at > since for st in w.stamps)
        }
        self._prune_at = max(self._max_keys, 2 * len(self._windows))
