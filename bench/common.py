"""Shared pieces: processes pinned to a core, their RSS and CPU time, results and machine facts.

Every benchmark returns a `Result`: rows of (case, metric, value, baseline, ratio, target) and
series for the plot. Rows are plain data so a run can be saved as JSON and rendered later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp

__all__ = [
    "GATEWAY_CORE",
    "LOAD_CORE",
    "PG_BASE",
    "PY",
    "REPO",
    "RESULTS",
    "Proc",
    "Result",
    "Row",
    "Steal",
    "free_port",
    "machine_facts",
    "percentile",
    "pg_available",
    "pg_schema",
    "pin",
    "pin_self",
    "wait_http",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PY = sys.executable
GATEWAY_CORE, LOAD_CORE = 0, 1
PG_BASE = os.environ.get("SWITCHBOARD_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1/test")
_TICK = os.sysconf("SC_CLK_TCK")


def _two_cores() -> bool:
    try:
        return len(os.sched_getaffinity(0)) >= 2 or (os.cpu_count() or 1) >= 2
    except AttributeError:  # not Linux
        return False


def pin(core: int) -> list[str]:
    """A command prefix that pins a process (and its threads) to one core, where possible."""
    if shutil.which("taskset") and _two_cores() and core < (os.cpu_count() or 1):
        return ["taskset", "-c", str(core)]
    return []


def pin_self(core: int = LOAD_CORE) -> None:
    """Pin this process (the load generator and the fakes) to `core`."""
    with contextlib.suppress(AttributeError, OSError):
        if _two_cores():
            os.sched_setaffinity(0, {core})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


class Proc:
    """A child process (a gateway or a baseline server) with its CPU time and memory."""

    def __init__(self, argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> None:
        self.argv, self.log = argv, log
        self._fh = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _status(self, field_name: str) -> float:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024  # kB -> MB
        except OSError:
            pass
        return float("nan")

    def rss_mb(self) -> float:
        return self._status("VmRSS")

    def peak_rss_mb(self) -> float:
        return self._status("VmHWM")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and all its threads so far."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / _TICK

    def tail(self, lines: int = 30) -> str:
        self._fh.flush()
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._fh.close()


async def wait_http(url: str, proc: Proc | None = None, within_s: float = 30.0) -> None:
    """Wait until GET url answers 200 (or fail with the process's last log lines)."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.argv[-3:]} exited:\n{proc.tail()}")
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {within_s}s" + (f":\n{proc.tail()}" if proc else ""))


def pg_available() -> bool:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return False
    try:
        return (
            subprocess.run(
                ["psql", PG_BASE, "-qtc", "select 1"], capture_output=True, timeout=5
            ).returncode
            == 0
            if shutil.which("psql")
            else _pg_ping()
        )
    except (OSError, subprocess.TimeoutExpired):
        return _pg_ping()


def _pg_ping() -> bool:
    import asyncpg

    async def ping() -> bool:
        try:
            conn = await asyncpg.connect(PG_BASE, timeout=3)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        await conn.close()
        return True

    return asyncio.run(ping())


@contextlib.asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A PostgreSQL store URL on a fresh schema, dropped afterwards."""
    import asyncpg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_BASE)
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        yield f"{PG_BASE}?search_path={schema}"
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


@dataclass
class Row:
    """One figure beside its same-run baseline. `ratio` is value / baseline."""

    bench: str
    case: str
    metric: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        base = self.baseline
        if base is None or base == 0 or base != base:
            return None
        return self.value / base


@dataclass
class Result:
    bench: str
    rows: list[Row] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)  # for the plot
    notes: list[str] = field(default_factory=list)  # settings, sizes, durations
    profiles: dict[str, str] = field(default_factory=dict)  # name -> function-level summary
    facts: dict[str, str] = field(default_factory=dict)  # the machine and commit it ran on

    def add(self, case: str, metric: str, value: float, unit: str, **kw: Any) -> Row:
        row = Row(self.bench, case, metric, value, unit, **kw)
        self.rows.append(row)
        return row

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "rows": [asdict(r) for r in self.rows],
            "series": self.series,
            "notes": self.notes,
            "profiles": self.profiles,
            "facts": self.facts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(
            data["bench"],
            [Row(**r) for r in data["rows"]],
            data.get("series", {}),
            data.get("notes", []),
            data.get("profiles", {}),
            data.get("facts", {}),
        )

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.bench}.json"
        path.write_text(json.dumps(self.to_json(), indent=1, default=float))
        return path

    def print(self) -> None:
        from bench.report import table

        print(table(self.rows))
        for note in self.notes:
            print(f"- {note}")
        for name, text in self.profiles.items():
            print(f"\nprofile {name}:\n{text}")


class Steal:
    """The share of each core's time the hypervisor gave to someone else (the `steal`
    column of /proc/stat) between `start` and `text`: on a shared virtual machine it is
    where a noisy figure's time went. Empty where /proc/stat is missing (not Linux)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> dict[str, list[int]]:
        try:
            lines = Path("/proc/stat").read_text().splitlines()
        except OSError:
            return {}
        return {
            f"core {name[3:]}": [int(v) for v in values]
            for name, *values in (line.split() for line in lines)
            if name.startswith("cpu") and name[3:].isdigit() and len(values) >= 8
        }

    def text(self) -> str:
        end, shares = self._read(), []
        for core, start in self._start.items():
            spent = [b - a for a, b in zip(start, end.get(core, start), strict=True)]
            if sum(spent) > 0:
                shares.append(f"{core} {100 * spent[7] / sum(spent):.0f}%")
        return f"CPU stolen by the host: {', '.join(shares)}" if shares else ""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def _cmd(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, cwd=REPO)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "-"


def machine_facts() -> dict[str, str]:
    import sqlite3

    cpu = "-"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "-"
    with contextlib.suppress(OSError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _cmd(["git", "rev-parse", "--short", "HEAD"]),
        "cores": f"{os.cpu_count()} ({cpu})",
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": _version("aiohttp"),
        "slack-bolt": _version("slack-bolt"),
        "python-telegram-bot": _version("python-telegram-bot"),
        "sqlite": sqlite3.sqlite_version,
        "asyncpg": _version("asyncpg"),
        "postgresql": _cmd(["psql", PG_BASE, "-Atc", "show server_version"]),
        "wrk": _cmd(["wrk", "--version"]).split(" Copyright")[0] if shutil.which("wrk") else "-",
        "pinning": "gateway on core 0, load generator and fakes on core 1"
        if pin(1)
        else "none (one core or no taskset)",
    }
