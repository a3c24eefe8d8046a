"""The gateway under test: a TOML written to a temp dir, `python -m gateway run` in a child
process pinned to the gateway core, and helpers to read what it stored and reports."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.common import GATEWAY_CORE, PY, REPO, Proc, free_port, pg_schema, pin, wait_http
from bench.payloads import (
    APP_SECRET,
    SLACK_BOT_TOKEN,
    SLACK_BOT_USER,
    SLACK_SECRET,
    TELEGRAM_SECRET,
    TELEGRAM_TOKEN,
    WA_NUMBER,
    WA_TOKEN,
    WA_VERIFY,
)

__all__ = [
    "STAGES",
    "STOP_BEFORE",
    "GatewayOptions",
    "RunningGateway",
    "run_gateway",
    "start_baseline",
]

STOP_BEFORE = "SWITCHBOARD_BENCH_STOP_BEFORE"  # read by bench.noruns
STAGES = ("submit", "store")  # where bench.noruns can cut a route short
CACHE = Path(tempfile.gettempdir()) / "switchboard-bench-cache"  # knowledge index, reused


@dataclass
class GatewayOptions:
    channels: tuple[str, ...] = ("whatsapp",)
    store: str = "sqlite"  # or "postgres"
    model_url: str = ""  # the fake model's base URL (…/v1)
    platform_url: str = ""  # the fake platform
    web: bool = False
    runs: bool = True  # False: bench.noruns (ingest only)
    stop_before: str = ""  # with runs off: one of STAGES, to cut the route short there
    max_concurrent_runs: int = 8
    queue_mode: str = "collect"
    max_pending: int = 100
    poll_interval_s: float = 5.0
    log_level: str = "INFO"
    extra: dict[str, str] = field(default_factory=dict)  # section -> more TOML lines
    wrap: tuple[str, ...] = ()  # a command the gateway runs under (valgrind, for one)
    ready_within_s: float = 60.0


def _toml(opts: GatewayOptions, tmp: Path, port: int, store_url: str) -> str:
    on = set(opts.channels)
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        'public_url = "https://bench.example.com"',
        "shutdown_grace_s = 1",
        "[store]",
        f'url = "{store_url}"',
        f"poll_interval_s = {opts.poll_interval_s}",
        "[model]",
        'provider = "openai"',
        f'base_url = "{opts.model_url or "http://127.0.0.1:9/v1"}"',
        'name = "fake"',
        "max_retries = 1",
        "timeout_s = 60",
        "[agent]",
        f'knowledge_dir = "{REPO / "config" / "knowledge"}"',
        f'knowledge_cache = "{CACHE / "knowledge-index.json"}"',
        f'workspace_dir = "{tmp / "workspace"}"',
        f"max_concurrent_runs = {opts.max_concurrent_runs}",
        f'queue_mode = "{opts.queue_mode}"',
        f"max_pending = {opts.max_pending}",
        *opts.extra.get("agent", "").splitlines(),
        "[channels]",
        f'media_dir = "{tmp / "files"}"',
        "[channels.web]",
        f"enabled = {str(opts.web).lower()}",
        "[channels.whatsapp]",
        f"enabled = {str('whatsapp' in on).lower()}",
        f'access_token = "{WA_TOKEN}"',
        f'app_secret = "{APP_SECRET}"',
        f'verify_token = "{WA_VERIFY}"',
        f'phone_number_id = "{WA_NUMBER}"',
        f'api_base = "{opts.platform_url or "http://127.0.0.1:9"}"',
        "max_per_second = 10000",
        "[channels.telegram]",
        f"enabled = {str('telegram' in on).lower()}",
        f'token = "{TELEGRAM_TOKEN}"',
        'mode = "webhook"',
        f'webhook_secret = "{TELEGRAM_SECRET}"',
        f'api_base = "{opts.platform_url or "http://127.0.0.1:9"}"',
        'bot_username = "bench_bot"',
        "[channels.slack]",
        f"enabled = {str('slack' in on).lower()}",
        f'bot_token = "{SLACK_BOT_TOKEN}"',
        f'signing_secret = "{SLACK_SECRET}"',
        f'api_base = "{(opts.platform_url or "http://127.0.0.1:9") + "/api"}"',
        f'bot_user_id = "{SLACK_BOT_USER}"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class RunningGateway:
    url: str
    proc: Proc
    store_url: str
    tmp: Path

    async def metric(self, name: str) -> float:
        """A gauge or counter from /metrics (summed over its labels)."""
        async with aiohttp.ClientSession() as http, http.get(self.url + "/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            total += float(m.group(1))
        return total

    async def stored(self) -> int:
        """Rows in the inbox: every message acknowledged must be there."""
        if self.store_url.startswith("sqlite:///"):
            path = self.store_url.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(path)) as db:
                return int(db.execute("SELECT count(*) FROM inbox").fetchone()[0])
        import asyncpg

        conn = await asyncpg.connect(self.store_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM inbox"))
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def run_gateway(opts: GatewayOptions) -> AsyncIterator[RunningGateway]:
    """The gateway with these options, ready (/readyz) on a free port; stopped afterwards."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmpdir:
        tmp = Path(tmpdir)
        async with contextlib.AsyncExitStack() as stack:
            if opts.store == "postgres":
                store_url = await stack.enter_async_context(pg_schema())
            else:
                store_url = f"sqlite:///{tmp / 'switchboard.db'}"
            port = free_port()
            config = tmp / "switchboard.toml"
            config.write_text(_toml(opts, tmp, port, store_url))
            module = "gateway" if opts.runs else "bench.noruns"
            argv = [
                *pin(GATEWAY_CORE),
                *opts.wrap,
                PY,
                "-m",
                module,
                "--log-level",
                opts.log_level,
                "--log-format",
                "json",
                "run",
                "--config",
                str(config),
            ]
            env = {STOP_BEFORE: opts.stop_before} if opts.stop_before else None
            proc = Proc(argv, tmp / "gateway.log", env=env)
            try:
                url = f"http://127.0.0.1:{port}"
                await wait_http(url + "/readyz", proc, within_s=opts.ready_within_s)
                yield RunningGateway(url, proc, store_url, tmp)
            finally:
                proc.stop()


@contextlib.asynccontextmanager
async def start_baseline(
    kind: str, *args: str, wrap: tuple[str, ...] = (), ready_within_s: float = 30.0
) -> AsyncIterator[tuple[str, Proc]]:
    """A baseline server from bench.bare, pinned to the gateway core (and run under `wrap`)."""
    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmpdir:
        port = free_port()
        argv = [*pin(GATEWAY_CORE), *wrap, PY, "-m", "bench.bare", kind, "--port", str(port)]
        proc = Proc([*argv, *args], Path(tmpdir) / f"{kind}.log")
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_http(url + "/healthz", proc, within_s=ready_within_s)
            yield url, proc
        finally:
            proc.stop()
