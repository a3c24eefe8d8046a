"""Every benchmark for about a second at tiny sizes, so none of them rots: exits nonzero when
one crashes or answers wrongly (targets are not checked: a second proves nothing about speed).
Writes nothing into bench/results/. Run by tests/test_bench_smoke.py; by hand:

    python -m bench.smoke
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench import concurrency, e2e, formatting, ingest, memory
from bench.common import Result, machine_facts, pg_available
from bench.report import markdown, plot

__all__ = ["main", "smoke"]

_CASES: dict[str, Callable[[], Coroutine[Any, Any, Result]]] = {
    "formatting": lambda: formatting.run(formatting.Options(seconds=0.2, size=2000)),
    "ingest": lambda: ingest.run(
        ingest.Options(
            stores=("sqlite", "postgres") if pg_available() else ("sqlite",),
            duration_s=1.0,
            latency_s=0.5,
            rate=200,
            connections=8,
            warmup_s=0.2,
        )
    ),
    "e2e": lambda: e2e.run(e2e.Options(levels=(1, 10), duration_s=1.0, warmup_s=0.5)),
    "concurrency": lambda: concurrency.run(
        concurrency.Options(
            conversations=20,
            messages=3,
            delay_s=0.2,
            cap=10,
            senders=8,
            timeout_s=60,
        )
    ),
    "memory": lambda: memory.run(
        memory.Options(
            sessions=30,
            concurrency=10,
            soak_s=1.0,
            rate=10,
            pool=5,
            settle_s=0.3,
        )
    ),
}


def _wrong(result: Result) -> list[str]:
    """Correctness rows that must hold even in a one-second run."""
    bad = []
    for row in result.rows:
        if row.metric in ("answered", "conversations in order") and not row.met:
            bad.append(f"{result.bench}: {row.metric} {row.value:g} of {row.baseline:g}")
        if row.value != row.value:  # NaN: nothing was measured
            bad.append(f"{result.bench}: {row.case} {row.metric} measured nothing")
    told = any("CPU stolen by the host: core 0" in note for note in result.notes)
    if result.bench in ("ingest", "e2e") and Path("/proc/stat").exists() and not told:
        bad.append(f"{result.bench}: no load note tells the host's steal of each core")
    return bad


def smoke(names: list[str] | None = None) -> int:
    results: list[Result] = []
    problems: list[str] = []
    for name in names or list(_CASES):
        t0 = time.monotonic()
        try:
            result: Result = asyncio.run(_CASES[name]())
        except Exception:
            traceback.print_exc()
            problems.append(f"{name}: crashed")
            continue
        results.append(result)
        problems += _wrong(result)
        print(f"smoke {name}: ok in {time.monotonic() - t0:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        png = Path(tmp) / "smoke.png"
        drawn = plot(results, png)
        (Path(tmp) / "smoke.md").write_text(
            markdown(results, machine_facts(), png.name if drawn else None)
        )
    for p in problems:
        print(f"smoke FAILED {p}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    return smoke(sys.argv[1:] or None)


if __name__ == "__main__":
    raise SystemExit(main())
