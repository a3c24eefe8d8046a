"""Where the time and memory go, for the targets the suite misses: py-spy on the gateway while
the WhatsApp route is saturated (ingest, SQLite) and while 100 conversations are answered
(end to end), and the RSS each group of imports adds to an idle gateway. Run separately from
the measurements so sampling never perturbs a reported figure.

    python -m bench.profile
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench import e2e, ingest
from bench.common import GATEWAY_CORE, PY, REPO, RESULTS, Result, pin

__all__ = ["import_rss", "main", "run"]

_IMPORTS = [
    ("python + asyncio", "import asyncio, json, ssl"),
    ("aiohttp", "import aiohttp.web"),
    ("pydantic + pydantic-settings", "import pydantic, pydantic_settings"),
    ("httpx (HTTP tools, Telegram, checks)", "import httpx"),
    ("core.store (sqlite3)", "import core.store"),
    ("core.sessions + agent loop", "import core.sessions"),
    ("core.knowledge", "import core.knowledge"),
    ("providers (openai, anthropic)", "import providers"),
    ("channels.whatsapp", "import channels.whatsapp"),
    ("channels.telegram (python-telegram-bot)", "import channels.telegram"),
    ("channels.slack (slack-bolt, slack-sdk)", "import channels.slack"),
    ("prometheus-client", "import prometheus_client"),
    ("gateway (settings, tools, runtime, app, cli)", "import gateway.app, gateway.cli"),
]

_SCRIPT = """
import sys
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
last = rss()
print(f'interpreter\\t{last:.1f}')
for name, stmt in STEPS:
    exec(stmt)
    now = rss()
    print(f'{name}\\t{now - last:.1f}')
    last = now
print(f'total\\t{last:.1f}')
"""


def import_rss() -> str:
    """RSS added by each group of imports, in the order an idle gateway loads them."""
    code = f"STEPS = {_IMPORTS!r}\n" + _SCRIPT
    out = subprocess.run(
        [*pin(GATEWAY_CORE), PY, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    if out.returncode != 0:
        return f"failed: {out.stderr[-800:]}"
    lines = ["MB added  import"]
    for line in out.stdout.strip().splitlines():
        name, mb = line.split("\t")
        lines.append(f"{float(mb):8.1f}  {name}")
    return "\n".join(lines)


async def run(seconds: float = 8.0) -> Result:
    result = Result("profile")
    got = await ingest.run(
        ingest.Options(
            channels=("whatsapp",),
            stores=("sqlite",),
            duration_s=seconds,
            latency_s=1.0,
            profile=True,
        )
    )
    result.profiles.update(got.profiles)
    got = await e2e.run(e2e.Options(levels=(100,), duration_s=seconds, profile=True))
    result.profiles.update(got.profiles)
    result.profiles["idle RSS by import (fresh interpreter)"] = await asyncio.to_thread(import_rss)
    result.notes.append(
        f"profiles: py-spy record at 250 Hz for {seconds:g} s on the gateway process, in "
        "separate runs from the measurements; raw stacks in bench/results/profiles/"
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    args = p.parse_args(argv)
    result = asyncio.run(run(args.seconds))
    result.print()
    result.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
