"""Send-rate limits in front of a platform: per key (chat, channel, number) and overall."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

__all__ = ["KeyedLimiter", "Stamp"]


class Stamp:
    """One acquisition taken `until_done`: it counts as going out now until `done` says the
    call it let through has been sent, and from then on from that moment, as the platform
    counts it (calls let through together reach the platform one by one, over the connection
    pool: counted from the first, the next window's first calls came within a second of the
    last window's last)."""

    __slots__ = ("_clock", "_window")

    def __init__(self, clock: Callable[[], float], window: _Window | None) -> None:
        self._clock, self._window = clock, window

    def done(self) -> None:
        """The call went out now (once; a stamp that counted from the start has no more to do)."""
        window, self._window = self._window, None
        if window is not None:
            window.going -= 1
            window.sent.append(self._clock())


class _Window:
    """A key's latest `rate` acquisitions: when each call sent went out, in order (the clock
    only moves on, so a call is added at the end, as let through or as `done`), and how many
    are still going out; and a lock that lines its waiters up. O(1) a call: a list searched
    for its earliest call sent took 7 % of the e2e benchmark's CPU (max_per_second = 10,000)."""

    __slots__ = ("going", "lock", "rate", "sent")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.sent: deque[float] = deque()
        self.going = 0
        self.lock = asyncio.Lock()

    def add(self, at: float, *, going: bool) -> None:
        """Count one; a full window forgets its earliest call sent (one still going out is
        never forgotten)."""
        if len(self.sent) + self.going >= self.rate and self.sent:
            self.sent.popleft()
        if going:
            self.going += 1
        else:
            self.sent.append(at)


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
            window.add(self._clock(), going=until_done)
            return Stamp(self._clock, window if until_done else None)

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
        window.add(self._clock(), going=False)
        return None

    def _wait(self, window: _Window) -> float:
        """Seconds until the earliest call sent of a full window leaves it (0: room now; a
        window of calls all still going out is looked at again after a period)."""
        if len(window.sent) + window.going < self._rate:
            return 0.0
        if not window.sent:
            return self._period
        return max(0.0, window.sent[0] + self._period - self._clock())

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
            if w.lock.locked() or w.going or (w.sent and w.sent[-1] > since)
        }
        self._prune_at = max(self._max_keys, 2 * len(self._windows))
