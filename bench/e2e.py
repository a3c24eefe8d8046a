"""End to end: messages answered per second and gateway CPU milliseconds per answered message,
webhook → inbox → session → agent loop → model (a local fake with zero latency) → channel send
(a local fake platform), for 1, 100 and 1,000 concurrent conversations. Each conversation is a
closed loop (it sends its next message once the last is answered).

Baseline, same run: `bench.bare relay`, a bare aiohttp server that makes the same HTTP
exchanges per message (a streamed model call, a read receipt, a send) with no store, sessions
or agent: the HTTP floor of one answer on this machine.

    python -m bench.e2e --conversations 100
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS, Proc, Result, pin_self
from bench.driver import Drive, drive
from bench.fakes import FakeModel, FakePlatform
from bench.gateway import GatewayOptions, run_gateway, start_baseline
from bench.profiling import PySpy

__all__ = ["Options", "main", "run"]


@dataclass
class Options:
    levels: tuple[int, ...] = (1, 100, 1000)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    store: str = "sqlite"
    cap: int = 64  # agent.max_concurrent_runs
    profile: bool = False


async def _level(
    url: str, proc: Proc, platform: FakePlatform, conversations: int, opts: Options
) -> Drive:
    platform.reset()
    return await drive(
        url,
        platform,
        proc,
        conversations=conversations,
        duration_s=opts.duration_s,
        warmup_s=opts.warmup_s,
    )


async def run(opts: Options) -> Result:
    pin_self()
    result = Result("e2e")
    result.notes.append(
        f"e2e: WhatsApp route, {opts.store}, zero-latency streamed fake model, "
        f"max_concurrent_runs = {opts.cap}; per level {opts.warmup_s:g} s warm-up then "
        f"{opts.duration_s:g} s measured; CPU is the gateway process's (all threads)"
    )
    levels: list[dict[str, float]] = []
    model, platform = FakeModel(), FakePlatform()
    await model.start()
    await platform.start()
    try:
        for n in opts.levels:
            async with start_baseline(
                "relay", "--model-url", model.base_url, "--graph-url", platform.url
            ) as (url, proc):
                base = await _level(url, proc, platform, n, opts)
            gw_opts = GatewayOptions(
                channels=("whatsapp",),
                store=opts.store,
                model_url=model.base_url,
                platform_url=platform.url,
                max_concurrent_runs=opts.cap,
            )
            async with run_gateway(gw_opts) as gw:
                spy = None
                if opts.profile and n == 100:
                    out = RESULTS / "profiles" / f"e2e-{n}-{opts.store}.txt"
                    spy = PySpy(gw.proc.pid, opts.warmup_s + opts.duration_s, out)
                got = await _level(gw.url, gw.proc, platform, n, opts)
                if spy is not None:
                    result.profiles[f"e2e {n} conversations"] = await asyncio.to_thread(spy.wait)
            _rows(result, n, got, base)
            result.notes.append(
                f"{n} conversations: gateway {got.describe()}; relay {base.describe()}"
            )
            levels.append(
                {
                    "conversations": n,
                    "rate": got.rate,
                    "baseline_rate": base.rate,
                    "cpu_ms": got.cpu_ms_per_answer,
                }
            )
    finally:
        await model.aclose()
        await platform.aclose()
    result.series = {"levels": levels}
    return result


def _rows(result: Result, n: int, got: Drive, base: Drive) -> None:
    case = f"{n} conversation{'s' if n > 1 else ''}"
    result.add(case, "answered/s", got.rate, "/s", baseline=base.rate, baseline_name="bare relay")
    row = result.add(
        case,
        "gateway CPU per answer",
        got.cpu_ms_per_answer,
        "ms",
        baseline=base.cpu_ms_per_answer,
        baseline_name="bare relay",
    )
    if n == 100:
        row.target, row.met = "≤ 2 ms", got.cpu_ms_per_answer <= 2.0
    result.add(
        case, "p50 answer latency", got.p(50), "ms", baseline=base.p(50), baseline_name="bare relay"
    )
    result.add(
        case, "p99 answer latency", got.p(99), "ms", baseline=base.p(99), baseline_name="bare relay"
    )
    if got.errors or got.timeouts:
        result.notes.append(f"WARNING e2e {case}: {got.errors} errors, {got.timeouts} timeouts")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.e2e",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--conversations", default="1,100,1000", help="comma-separated levels (default 1,100,1000)"
    )
    p.add_argument("--duration", type=float, default=Options.duration_s)
    p.add_argument("--warmup", type=float, default=Options.warmup_s)
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--cap", type=int, default=Options.cap, help="agent.max_concurrent_runs")
    p.add_argument("--profile", action="store_true", help="py-spy the 100-conversation level")
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    opts = Options(
        levels=tuple(int(x) for x in args.conversations.split(",")),
        duration_s=args.duration,
        warmup_s=args.warmup,
        store=args.store,
        cap=args.cap,
        profile=args.profile,
    )
    result = asyncio.run(run(opts))
    result.print()
    result.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
