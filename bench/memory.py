"""Memory: the gateway's RSS at idle after start (every channel and the web chat enabled);
after N sessions have come and gone (each a new WhatsApp conversation answered once, then
idle: its runner is gone and only store rows remain); and its growth over a soak at a steady
rate. Baseline, same run: the RSS of a bare aiohttp server at idle.

Default: 3,000 sessions and a 120 s soak at 20 messages/s; `--full`: the issue's 100,000
sessions and 20 minutes.

    python -m bench.memory --sessions 3000 --soak 120
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import RESULTS, Result, pin_self
from bench.driver import drive
from bench.fakes import FakeModel, FakePlatform
from bench.gateway import GatewayOptions, RunningGateway, run_gateway, start_baseline
from bench.payloads import CHANNELS, build

__all__ = ["Options", "main", "run"]


@dataclass
class Options:
    sessions: int = 3000
    concurrency: int = 100  # sessions in flight at once
    soak_s: float = 120.0
    rate: float = 20.0  # soak messages per second
    pool: int = 500  # soak conversations, cycled
    settle_s: float = 5.0
    store: str = "sqlite"


async def _quiet(gw: RunningGateway, settle_s: float, limit_s: float = 120.0) -> float:
    """Wait until no session has a runner, then settle_s more; the RSS then."""
    deadline = time.monotonic() + limit_s
    # the gateway is another process: polling its /metrics is the only way to know
    while time.monotonic() < deadline and await gw.metric("switchboard_active_sessions") > 0:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    await asyncio.sleep(settle_s)
    return gw.proc.rss_mb()


async def _soak(
    gw: RunningGateway, platform: FakePlatform, opts: Options
) -> tuple[list[tuple[float, float]], int, int]:
    samples: list[tuple[float, float]] = []
    platform.reset()
    sent = 0
    ids = itertools.count(70_000_000)
    connector = aiohttp.TCPConnector(limit=64)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(n: int) -> None:
            req = build("whatsapp", n, 1_000_000 + n % opts.pool)
            async with http.post(gw.url + req.path, data=req.body, headers=req.headers) as r:
                await r.read()

        t0 = time.perf_counter()
        count = int(opts.soak_s * opts.rate)
        next_sample = 0.0
        for i in range(count):
            due = t0 + i / opts.rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            task = asyncio.create_task(post(next(ids)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
            now = time.perf_counter() - t0
            if now >= next_sample:
                samples.append((now, gw.proc.rss_mb()))
                next_sample += max(1.0, opts.soak_s / 120)
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    deadline = time.monotonic() + 60
    while platform.answered < sent and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    samples.append((time.perf_counter() - t0, gw.proc.rss_mb()))
    return samples, sent, platform.answered


async def run(opts: Options) -> Result:
    pin_self()
    result = Result("memory")
    async with start_baseline("aiohttp") as (_, bare):
        await asyncio.sleep(opts.settle_s)
        bare_rss = bare.rss_mb()
    model, platform = FakeModel(), FakePlatform()
    await model.start()
    await platform.start()
    try:
        gw_opts = GatewayOptions(
            channels=CHANNELS,
            web=True,
            store=opts.store,
            model_url=model.base_url,
            platform_url=platform.url,
            max_concurrent_runs=64,
        )
        async with run_gateway(gw_opts) as gw:
            await asyncio.sleep(opts.settle_s)
            idle = gw.proc.rss_mb()
            t0 = time.perf_counter()
            d = await drive(
                gw.url,
                platform,
                gw.proc,
                conversations=opts.concurrency,
                duration_s=24 * 3600,
                warmup_s=0.0,
                sessions=iter(range(opts.sessions)),
            )
            took = time.perf_counter() - t0
            after = await _quiet(gw, opts.settle_s)
            peak_sessions = gw.proc.peak_rss_mb()
            samples, sent, answered = await _soak(gw, platform, opts)
    finally:
        await model.aclose()
        await platform.aclose()
    row = result.add(
        "idle after start",
        "RSS",
        idle,
        "MB",
        baseline=bare_rss,
        baseline_name="bare aiohttp idle",
        target="≤ 80 MB",
    )
    row.met = idle <= 80
    row = result.add(
        f"after {opts.sessions:,} sessions",
        "RSS",
        after,
        "MB",
        baseline=idle,
        baseline_name="gateway idle",
        target="≤ 1.2x idle",
    )
    row.met = after <= 1.2 * idle and d.answered == opts.sessions
    warm = [s for s in samples if s[0] >= opts.soak_s * 0.2]
    start_rss = warm[0][1] if warm else samples[0][1]
    end_rss = samples[-1][1]
    row = result.add(
        f"soak {opts.soak_s:g} s at {opts.rate:g}/s",
        "RSS at end",
        end_rss,
        "MB",
        baseline=start_rss,
        baseline_name="RSS after 20 % warm-up",
        target="≤ 1.1x start",
    )
    row.met = end_rss <= 1.1 * start_rss and answered >= sent
    result.notes.append(
        f"memory: idle measured {opts.settle_s:g} s after /readyz with WhatsApp, Telegram, Slack "
        f"and the web chat enabled; {opts.sessions:,} sessions ({opts.concurrency} at a time, "
        f"one message each) answered {d.answered:,} in {took:.0f} s, RSS read once no session "
        f"had a runner + {opts.settle_s:g} s (peak {peak_sessions:.0f} MB); soak: "
        f"{opts.rate:g} msg/s over {opts.pool} conversations for {opts.soak_s:g} s, "
        f"{answered:,}/{sent:,} answered, RSS from {samples[0][1]:.0f} to {end_rss:.0f} MB "
        f"(max {max(s[1] for s in samples):.0f} MB)"
    )
    if importlib.util.find_spec("cryptography") is not None:
        result.notes.append(
            "memory: `cryptography` is installed here, and python-telegram-bot imports it (for "
            "Telegram Passport): about 7 MB at idle that `pip install .` does not bring"
        )
    result.series = {"soak": samples, "idle_mb": idle}
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sessions", type=int, default=Options.sessions)
    p.add_argument("--soak", type=float, default=Options.soak_s, help="seconds")
    p.add_argument("--rate", type=float, default=Options.rate, help="soak messages per second")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--full", action="store_true", help="100,000 sessions, 20-minute soak")
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    return p


def options(args: argparse.Namespace) -> Options:
    opts = Options(sessions=args.sessions, soak_s=args.soak, rate=args.rate, store=args.store)
    if args.full:
        opts.sessions, opts.soak_s = 100_000, 1200.0
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = asyncio.run(run(options(args)))
    result.print()
    result.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
