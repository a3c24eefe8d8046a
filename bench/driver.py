"""Conversations driven through a running server: each sends a signed webhook, waits for its
answer at the fake platform, then sends the next (closed loop), so throughput and latency are
those of whole answers, not of acknowledgements."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp

from bench.common import Proc, Steal, percentile
from bench.fakes import FakePlatform
from bench.payloads import build, user_id

__all__ = ["Answers", "Drive", "drive"]

_ids = itertools.count(10_000_000)


class Answers:
    """Futures for the next answer of each recipient, resolved by the fake platform."""

    def __init__(self, platform: FakePlatform) -> None:
        self._waiting: dict[str, asyncio.Future[str]] = {}
        platform.on_reply = self._arrived

    def _arrived(self, who: str, text: str) -> None:
        fut = self._waiting.pop(who, None)
        if fut is not None and not fut.done():
            fut.set_result(text)

    def expect(self, who: str) -> asyncio.Future[str]:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[who] = fut
        return fut


@dataclass
class Drive:
    answered: int = 0  # answers received inside the measured window
    errors: int = 0
    timeouts: int = 0
    window_s: float = 0.0
    cpu_s: float = 0.0  # the server's CPU time inside the window
    steal: str = ""  # the host's steal of each core inside the window (Steal.text)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.answered / self.window_s if self.window_s else 0.0

    @property
    def cpu_ms_per_answer(self) -> float:
        return self.cpu_s * 1000 / self.answered if self.answered else float("nan")

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def describe(self) -> str:
        return (
            f"{self.answered} answered in {self.window_s:.1f}s = {self.rate:.0f}/s, "
            f"{self.cpu_ms_per_answer:.2f} ms CPU/answer, p50 {self.p(50):.1f} ms, "
            f"p99 {self.p(99):.1f} ms, {self.errors} errors, {self.timeouts} timeouts"
        ) + (f", {self.steal}" if self.steal else "")


async def drive(
    url: str,
    platform: FakePlatform,
    proc: Proc,
    *,
    channel: str = "whatsapp",
    conversations: int,
    duration_s: float,
    warmup_s: float = 2.0,
    sessions: Iterator[int] | None = None,
    answer_timeout_s: float = 30.0,
) -> Drive:
    """`conversations` closed loops for warmup_s + duration_s. Each loop talks in one
    conversation, or, with `sessions`, takes a fresh conversation number for each message
    (sessions that come and go) until the iterator runs out."""
    answers = Answers(platform)
    out = Drive()
    loop_start = time.perf_counter()
    start, end = loop_start + warmup_s, loop_start + warmup_s + duration_s
    cpu: list[float] = []
    steal: list[Steal] = []

    async def marker() -> None:
        for moment in (start, end):
            await asyncio.sleep(max(0.0, moment - time.perf_counter()))
            cpu.append(proc.cpu_s())
            if not steal:
                steal.append(Steal())

    connector = aiohttp.TCPConnector(limit=max(conversations, 1))
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def talk(slot: int) -> None:
            k = 0
            while time.perf_counter() < end:
                conv = slot if sessions is None else next(sessions, None)
                if conv is None:
                    return
                who = user_id(channel, conv)
                fut = answers.expect(who)
                req = build(channel, next(_ids), conv, f"conversation {conv} message {k}")
                k += 1
                sent = time.perf_counter()
                try:
                    async with http.post(
                        url + req.path, data=req.body, headers=req.headers
                    ) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if not ok:
                    out.errors += 1
                    await asyncio.sleep(0.05)
                    continue
                try:
                    await asyncio.wait_for(fut, answer_timeout_s)
                except TimeoutError:
                    out.timeouts += 1
                    continue
                done = time.perf_counter()
                if start <= done <= end:
                    out.answered += 1
                    out.latencies_ms.append((done - sent) * 1000)

        mark = asyncio.create_task(marker())
        await asyncio.gather(*(talk(i) for i in range(conversations)))
        finished = time.perf_counter()
        if finished < end:  # ran out of sessions: the window ends with the last answer
            mark.cancel()
            cpu.append(proc.cpu_s())
        else:
            await mark
    out.window_s = max(0.0, min(end, finished) - start)
    out.cpu_s = cpu[1] - cpu[0] if len(cpu) >= 2 else float("nan")
    out.steal = steal[0].text() if steal else ""
    return out
