"""Concurrency: N conversations x 3 messages with a model that takes 2 s per call. Every message
must be answered, each conversation's answers in the order its messages were sent, and the
whole must finish close to the ideal for the configured cap on concurrent runs:

    ideal = max(messages x delay, ceil(N x messages / cap) x delay)

(queue_mode = "followup": one run per message, so the count of runs is known). Peak RSS is the
gateway's high-water mark (VmHWM). The default is 2,000 conversations with a cap of 200;
`--full` is the issue's 10,000 (cap 1,000, the same ideal of 60 s).

    python -m bench.concurrency --conversations 2000 --cap 200
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import RESULTS, Result, pin_self
from bench.fakes import FakeModel, FakePlatform
from bench.gateway import GatewayOptions, run_gateway, start_baseline
from bench.payloads import build, user_id

__all__ = ["Options", "main", "run"]


@dataclass
class Options:
    conversations: int = 2000
    messages: int = 3
    delay_s: float = 2.0
    cap: int = 200
    senders: int = 64  # webhooks in flight at once
    store: str = "sqlite"
    timeout_s: float = 600.0


async def run(opts: Options) -> Result:
    pin_self()
    result = Result("concurrency")
    n, m = opts.conversations, opts.messages
    ideal = max(m * opts.delay_s, math.ceil(n * m / opts.cap) * opts.delay_s)
    result.notes.append(
        f"concurrency: {n:,} conversations x {m} messages, model {opts.delay_s:g} s per call, "
        f"max_concurrent_runs = {opts.cap}, queue_mode = followup, {opts.store}; each "
        f"conversation's messages sent in order, {opts.senders} webhooks in flight; "
        f"ideal {ideal:g} s"
    )
    model, platform = FakeModel(delay_s=opts.delay_s), FakePlatform()
    await model.start()
    await platform.start()
    try:
        async with start_baseline("aiohttp") as (_, bare):
            await asyncio.sleep(1.0)
            bare_rss = bare.rss_mb()
        gw_opts = GatewayOptions(
            channels=("whatsapp",),
            store=opts.store,
            model_url=model.base_url,
            platform_url=platform.url,
            max_concurrent_runs=opts.cap,
            queue_mode="followup",
            max_pending=max(100, m),
        )
        async with run_gateway(gw_opts) as gw:
            idle_rss = gw.proc.rss_mb()
            platform.reset()
            total = n * m
            done = asyncio.Event()
            last = [0.0]

            def arrived(who: str, text: str) -> None:
                last[0] = time.perf_counter()
                if platform.answered >= total:
                    done.set()

            platform.on_reply = arrived
            peak = [idle_rss]

            async def sample() -> None:
                while True:
                    peak[0] = max(peak[0], gw.proc.rss_mb())
                    await asyncio.sleep(0.5)

            sampler = asyncio.create_task(sample())
            errors = 0
            queue: asyncio.Queue[int] = asyncio.Queue()
            for c in range(n):
                queue.put_nowait(c)
            connector = aiohttp.TCPConnector(limit=opts.senders)
            t0, cpu0 = time.perf_counter(), gw.proc.cpu_s()
            async with aiohttp.ClientSession(connector=connector) as http:

                async def sender() -> None:
                    nonlocal errors
                    while not queue.empty():
                        c = queue.get_nowait()
                        for k in range(m):
                            req = build("whatsapp", 50_000_000 + c * m + k, c, f"c{c} m{k}")
                            for _ in range(5):
                                async with http.post(
                                    gw.url + req.path, data=req.body, headers=req.headers
                                ) as resp:
                                    await resp.read()
                                    if resp.status == 200:
                                        break
                                    errors += 1
                                await asyncio.sleep(0.2)

                await asyncio.gather(*(sender() for _ in range(opts.senders)))
                ingested = time.perf_counter() - t0
                try:
                    await asyncio.wait_for(done.wait(), opts.timeout_s)
                except TimeoutError:
                    result.notes.append(f"WARNING concurrency: timed out after {opts.timeout_s}s")
            elapsed = (last[0] or time.perf_counter()) - t0
            cpu_s = gw.proc.cpu_s() - cpu0
            sampler.cancel()
            peak_rss = max(peak[0], gw.proc.peak_rss_mb())
            answered = platform.answered
            in_order = sum(
                1
                for c in range(n)
                if platform.replies.get(user_id("whatsapp", c), [])
                == [f"echo: c{c} m{k}" for k in range(m)]
            )
            max_model = model.max_active
    finally:
        await model.aclose()
        await platform.aclose()
    row = result.add(
        "all answered",
        "answered",
        answered,
        "msgs",
        baseline=total,
        baseline_name="sent",
        target="all",
    )
    row.met = answered == total
    row = result.add(
        "order kept",
        "conversations in order",
        in_order,
        "convs",
        baseline=n,
        baseline_name="conversations",
        target="all",
    )
    row.met = in_order == n
    row = result.add(
        f"{n:,} x {m}, cap {opts.cap}",
        "completion time",
        elapsed,
        "s",
        baseline=ideal,
        baseline_name="ideal for the cap",
        target="≤ 1.2x ideal",
    )
    row.met = answered == total and elapsed <= 1.2 * ideal
    row = result.add(
        f"{n:,} x {m}, cap {opts.cap}",
        "peak RSS",
        peak_rss,
        "MB",
        baseline=bare_rss,
        baseline_name="bare aiohttp idle",
        target="≤ 500 MB",
    )
    row.met = peak_rss <= 500
    result.notes.append(
        f"concurrency: all {total:,} webhooks acknowledged after {ingested:.1f} s ({errors} "
        f"retried); {answered:,} answers, last at {elapsed:.1f} s; most model calls at once "
        f"{max_model}; gateway RSS idle {idle_rss:.0f} MB, peak {peak_rss:.0f} MB; gateway CPU "
        f"{cpu_s:.1f} s ({1000 * cpu_s / max(answered, 1):.2f} ms per message, webhook "
        f"included; busy {100 * cpu_s / max(elapsed, 1e-9):.0f} % of the wall time: 100 % "
        "means its core was the limit, not the cap)"
    )
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.concurrency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--conversations", type=int, default=Options.conversations)
    p.add_argument("--messages", type=int, default=Options.messages)
    p.add_argument("--delay", type=float, default=Options.delay_s, help="model seconds per call")
    p.add_argument("--cap", type=int, default=Options.cap, help="agent.max_concurrent_runs")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--full", action="store_true", help="10,000 conversations, cap 1,000")
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    return p


def options(args: argparse.Namespace) -> Options:
    opts = Options(
        conversations=args.conversations,
        messages=args.messages,
        delay_s=args.delay,
        cap=args.cap,
        store=args.store,
    )
    if args.full:
        opts.conversations, opts.cap = 10_000, 1_000
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = asyncio.run(run(options(args)))
    result.print()
    result.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
