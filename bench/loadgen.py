"""Load generators: wrk (closed loop, for throughput ceilings) and an aiohttp client (closed
loop when wrk is absent; open loop at a fixed rate for acknowledgement latency, measured from
each request's scheduled time so a stalled server cannot hide its queueing). Every loop is
bounded by a request count and a duration."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.common import LOAD_CORE, Steal, percentile, pin
from bench.payloads import HttpReq

__all__ = ["LoadStats", "closed_loop", "have_wrk", "open_loop", "wrk"]


@dataclass
class LoadStats:
    tool: str
    sent: int = 0
    ok: int = 0
    elapsed_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    wrapped: bool = False  # wrk ran out of unique requests and repeated some
    steal: str = ""  # the host's steal of each core while the loop ran (Steal.text)

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def errors(self) -> int:
        return self.sent - self.ok

    def finish(self, steal: Steal | None = None) -> LoadStats:
        if steal is not None:
            self.steal = steal.text()
        if self.latencies_ms:
            self.p50_ms = percentile(self.latencies_ms, 50)
            self.p99_ms = percentile(self.latencies_ms, 99)
        return self

    def describe(self) -> str:
        bad = ", ".join(f"{k}x{v}" for k, v in self.statuses.items() if k != "200")
        text = (
            f"{self.tool}: {self.ok}/{self.sent} ok in {self.elapsed_s:.1f}s = {self.rate:.0f}/s, "
            f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms"
        )
        return text + (f"; errors {bad}" if bad else "") + (f"; {self.steal}" if self.steal else "")


@contextlib.contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """The load generator must not stall: a full collection in this process (30 to 50 ms
    was seen here, at the start of a 5 s open loop) makes dozens of requests late, and the
    latency, counted from each due time, charges that to the server. A few seconds of
    garbage are collected afterwards."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _connector(limit: int) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=limit, force_close=False, ttl_dns_cache=None)


async def _send(
    http: aiohttp.ClientSession, base: str, req: HttpReq, stats: LoadStats, start: float
) -> None:
    stats.sent += 1
    try:
        async with http.post(base + req.path, data=req.body, headers=req.headers) as resp:
            await resp.read()
            status = str(resp.status)
    # AttributeError: raised once here inside aiohttp's client (a response without headers)
    except (aiohttp.ClientError, TimeoutError, AttributeError) as exc:
        status = type(exc).__name__
    stats.statuses[status] += 1
    if status == "200":
        stats.ok += 1
        stats.latencies_ms.append((time.perf_counter() - start) * 1000)


async def closed_loop(
    base: str, reqs: Sequence[HttpReq], *, concurrency: int, duration_s: float
) -> LoadStats:
    """`concurrency` clients each sending the next request as soon as the last is answered,
    until the duration is over or the requests run out."""
    stats = LoadStats("aiohttp-client")
    index = iter(range(len(reqs)))
    timeout = aiohttp.ClientTimeout(total=30)
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    steal = Steal()
    async with aiohttp.ClientSession(connector=_connector(concurrency), timeout=timeout) as http:

        async def worker() -> None:
            for i in index:
                if time.perf_counter() >= deadline:
                    return
                await _send(http, base, reqs[i], stats, time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.elapsed_s = time.perf_counter() - t0
    return stats.finish(steal)


async def open_loop(
    base: str, reqs: Sequence[HttpReq], *, rate: float, duration_s: float, max_in_flight: int = 2000
) -> LoadStats:
    """One request every 1/rate s whatever the answers do; latency counts from the moment
    each request was due (so a server that stalls is charged for the whole wait)."""
    stats = LoadStats(f"aiohttp-client @ {rate:.0f}/s")
    count = min(len(reqs), int(rate * duration_s))
    timeout = aiohttp.ClientTimeout(total=30)
    tasks: set[asyncio.Task[None]] = set()
    with _no_gc_pauses():
        async with aiohttp.ClientSession(
            connector=_connector(max_in_flight), timeout=timeout
        ) as http:
            t0, steal = time.perf_counter(), Steal()
            for i in range(count):
                due = t0 + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(tasks) >= max_in_flight:
                    stats.sent += 1
                    stats.statuses["overload"] += 1
                    continue
                task = asyncio.create_task(_send(http, base, reqs[i], stats, due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=30)
            stats.elapsed_s = max(time.perf_counter() - t0, count / rate)
    return stats.finish(steal)


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


_LUA = r"""
local reqs, n, i = {}, 0, 0
init = function(args)
  local f = assert(io.open(args[1], "rb"))
  while true do
    local line = f:read("*l")
    if not line then break end
    n = n + 1
    reqs[n] = f:read(tonumber(line))
  end
  f:close()
end
request = function()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d " ..
    "p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(base: str, reqs: Sequence[HttpReq], *, connections: int, duration_s: float) -> LoadStats:
    """Closed-loop load from wrk on the load core: one thread, `connections` keep-alive
    connections, each request taken in turn from `reqs` (raw HTTP, signed in advance)."""
    host = base.removeprefix("http://")
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        script, data = Path(tmp) / "post.lua", Path(tmp) / "requests.bin"
        script.write_text(_LUA)
        with data.open("wb") as fh:
            for r in reqs:
                head = f"POST {r.path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(
                    f"{k}: {v}\r\n" for k, v in r.headers.items()
                )
                raw = head.encode() + f"Content-Length: {len(r.body)}\r\n\r\n".encode() + r.body
                fh.write(f"{len(raw)}\n".encode() + raw)
        argv = [
            *pin(LOAD_CORE),
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration_s))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            base,
            "--",
            str(data),
        ]
        steal = Steal()
        out = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 120)
        stolen = steal.text()
    m = re.search(r"BENCH (.*)", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout}\n{out.stderr}")
    f = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    stats = LoadStats(f"wrk -c{connections}")
    stats.sent = f["requests"]
    bad = f["status"] + f["timeout"]
    stats.ok = stats.sent - bad
    stats.statuses["200"] = stats.ok
    if bad:
        stats.statuses["non-2xx/timeout"] = bad
    for k in ("connect", "read", "write"):
        if f[k]:
            stats.statuses[f"socket {k}"] = f[k]
    stats.elapsed_s = f["duration_us"] / 1e6
    stats.p50_ms, stats.p99_ms = f["p50_us"] / 1000, f["p99_us"] / 1000
    stats.wrapped = stats.sent > len(reqs)
    stats.steal = stolen
    return stats
