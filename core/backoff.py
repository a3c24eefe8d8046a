"""The one backoff rule of every retry here (model calls, reply delivery): the wait the other
side asked for when it gave one (sooner only earns another refusal), else `base_s` doubled each
attempt up to `max_s`, times a random 50-100 % so that retries of many sessions spread out."""

from __future__ import annotations

import random

__all__ = ["JITTER", "backoff"]

# our own generator: the global one is the test tools' (hypothesis checks it is untouched);
# jitter, not crypto
JITTER = random.Random()


def backoff(attempt: int, base_s: float, max_s: float, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number `attempt` + 1 (`attempt` 0: the first retry)."""
    if retry_after is not None:
        return max(float(retry_after), 0.0)
    return min(base_s * 2.0 ** min(max(attempt, 0), 30), max_s) * (0.5 + JITTER.random() / 2)
