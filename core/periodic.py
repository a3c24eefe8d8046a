"""A job run every so often for as long as the gateway runs, whatever one run of it raises."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.errors import StoreError

__all__ = ["every"]

log = logging.getLogger(__name__)


async def every(
    interval_s: float,
    job: Callable[[], Awaitable[object]],
    what: str,
    *,
    first_after_s: float | None = None,
) -> None:
    """Run `job` every `interval_s` (the first time after `first_after_s`, by default one
    interval) until cancelled. A failure must not end the loop (a sweeper that died once
    never resumed another replica's work): a store error is a warning, anything else is
    logged with its traceback, and the next run comes on time. `what` names the job in the
    log ("sweep failed: ...")."""
    await asyncio.sleep(interval_s if first_after_s is None else first_after_s)
    while True:
        try:
            await job()
        except StoreError as exc:
            log.warning("%s failed: %s", what, exc)
        except Exception:
            log.exception("%s failed", what)
        await asyncio.sleep(interval_s)
