"""Instructions per webhook, counted by callgrind: each channel route (SQLite) beside bare
aiohttp and, for Slack, the bare Bolt app. An instruction count does not move with the
host's load, the CPU's clock or another process's cache, so on a shared machine it compares
two versions of the route, or a route and its baseline, where timings cannot (two runs of
`bench.ingest` an hour apart differed by 30 %). It is a complement to the timed benchmarks,
never a substitute: it ignores cache misses, system calls and waiting, which the targets
count.

Each server runs under `valgrind --tool=callgrind` (about 50 times slower): it is started,
warmed up with webhooks until its caches are full, its counters are zeroed, then `--webhooks`
signed webhooks are sent (8 at a time) and the counters dumped. Everything the process does
in that window is counted, its store threads included; the load generator is not.

    python -m bench.instructions --channel all --webhooks 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import RESULTS, Proc, Result, pin_self
from bench.gateway import GatewayOptions, run_gateway, start_baseline
from bench.ingest import CONVERSATIONS, webhooks
from bench.payloads import CHANNELS, HttpReq

__all__ = ["Options", "available", "main", "run"]

SENDERS = 8  # webhooks in flight at once, as a small closed loop
READY_WITHIN_S = 600.0  # imports under valgrind take a minute or more
_SUMMARY = re.compile(rb"^summary: (\d+)$", re.M)


@dataclass
class Options:
    channels: tuple[str, ...] = CHANNELS
    webhooks: int = 1000  # counted, per server
    warmup: int = 1000  # sent before the count starts (the session key cache holds 1,024)


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


async def _send(url: str, reqs: list[HttpReq]) -> None:
    async with aiohttp.ClientSession() as http:

        async def sender(part: list[HttpReq]) -> None:
            for r in part:
                async with http.post(url + r.path, data=r.body, headers=r.headers) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"{r.path}: HTTP {resp.status} {await resp.text()}")

        await asyncio.gather(*(sender(reqs[k::SENDERS]) for k in range(SENDERS)))


def _control(flag: str, proc: Proc) -> None:
    subprocess.run(["callgrind_control", flag, str(proc.pid)], check=True, capture_output=True)


async def _count(url: str, proc: Proc, out: Path, channel: str, opts: Options) -> float:
    """Instructions per webhook of the server at `url`, running under callgrind into `out`."""
    await _send(url, webhooks(channel, opts.warmup))
    await asyncio.sleep(1.0)  # what the warm-up left (a commit, a checkpoint) is not counted
    await asyncio.to_thread(_control, "-z", proc)
    await _send(url, webhooks(channel, opts.webhooks))
    await asyncio.to_thread(_control, "-d", proc)
    # each dump is a file of its own: <out>.<pid>.<n>, n counting up from 1
    dumps = sorted(out.parent.glob(f"{out.name}.{proc.pid}.*"), key=lambda p: int(p.suffix[1:]))
    if not dumps or (m := _SUMMARY.search(dumps[-1].read_bytes())) is None:
        raise RuntimeError(f"callgrind wrote no counts for {out.name}")
    return int(m[1]) / opts.webhooks


def _callgrind(out: Path) -> tuple[str, ...]:
    return ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p")


@contextlib.asynccontextmanager
async def _server(name: str, channel: str, out: Path) -> AsyncIterator[tuple[str, Proc]]:
    if name == "route":
        opts = GatewayOptions(
            channels=(channel,),
            runs=False,
            log_level="WARNING",
            wrap=_callgrind(out),
            ready_within_s=READY_WITHIN_S,
        )
        async with run_gateway(opts) as gw:
            yield gw.url, gw.proc
    else:
        async with start_baseline(name, wrap=_callgrind(out), ready_within_s=READY_WITHIN_S) as (
            url,
            proc,
        ):
            yield url, proc


async def run(opts: Options) -> Result:
    result = Result("instructions")
    if not available():
        result.notes.append("valgrind (callgrind) is not installed: nothing counted")
        return result
    pin_self()
    result.notes.append(
        f"callgrind instruction counts per webhook: {opts.warmup} webhooks to warm up, then "
        f"{opts.webhooks} counted, {SENDERS} at a time, from {CONVERSATIONS} conversations; "
        "the route on SQLite with session runs off (bench.noruns)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmpdir:
        tmp = Path(tmpdir)

        async def count(name: str, channel: str) -> float:
            out = tmp / f"{name}-{channel}"
            async with _server(name, channel, out) as (url, proc):
                return await _count(url, proc, out, channel, opts)

        for channel in opts.channels:  # each beside bare aiohttp reading its own webhooks
            bare = await count("aiohttp", channel)
            route = await count("route", channel)
            case, metric = f"{channel}/sqlite", "instructions per webhook"
            result.add(case, metric, route, "instr", baseline=bare, baseline_name="bare aiohttp")
            if channel == "slack":
                bolt = await count("bolt", channel)
                result.add(case, metric, route, "instr", baseline=bolt, baseline_name="bare Bolt")
    return result


def _parse(argv: Sequence[str] | None) -> tuple[Options, Path]:
    p = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--channel", choices=(*CHANNELS, "all"), default="all")
    p.add_argument("--webhooks", type=int, default=Options.webhooks)
    p.add_argument("--warmup", type=int, default=Options.warmup)
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    a = p.parse_args(argv)
    channels = CHANNELS if a.channel == "all" else (a.channel,)
    return Options(channels=channels, webhooks=a.webhooks, warmup=a.warmup), a.out


def main(argv: Sequence[str] | None = None) -> int:
    opts, out = _parse(argv)
    result = asyncio.run(run(opts))
    result.print()
    result.save(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
