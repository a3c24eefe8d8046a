"""core.periodic.every: a periodic job outlives any one failure of it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from core.errors import StoreError
from core.periodic import every


async def test_a_failing_run_is_logged_and_the_next_comes(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    done = asyncio.Event()

    async def job() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise StoreError("database is locked")
        if len(runs) == 2:
            raise RuntimeError("a bug")
        done.set()

    with caplog.at_level(logging.WARNING, logger="core.periodic"):
        task = asyncio.create_task(every(0.01, job, "tidying", first_after_s=0))
        try:
            async with asyncio.timeout(5):
                await done.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(runs) >= 3
    first, second = caplog.records[:2]
    assert (first.levelno, first.getMessage()) == (
        logging.WARNING,
        "tidying failed: database is locked",
    )
    assert (second.levelno, second.getMessage(), second.exc_info is not None) == (
        logging.ERROR,
        "tidying failed",
        True,
    )


async def test_the_first_run_waits_first_after_s_then_every_interval() -> None:
    loop = asyncio.get_running_loop()
    start, times = loop.time(), []
    second = asyncio.Event()

    async def job() -> None:
        times.append(loop.time() - start)
        if len(times) == 2:
            second.set()

    task = asyncio.create_task(every(1.0, job, "job", first_after_s=0.05))
    try:
        async with asyncio.timeout(5):  # a loaded machine is late, never early
            await second.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 0.05 <= times[0] < 1.0  # not a whole interval first
    assert times[1] - times[0] >= 1.0
