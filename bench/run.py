"""`python -m bench` (`make bench`): every benchmark in turn, then bench/results/<date>.md (a
table of figures beside their same-run baselines, ratios, targets, machine facts) and
bench/results/<date>.png (throughput and latency).

    python -m bench                 # the default sizes, about 12 minutes on 2 cores
    python -m bench --full          # the issue's sizes: 10,000 x 3 conversations, 100,000
                                    # sessions, a 20-minute soak (about an hour)
    python -m bench --only ingest,e2e --profile
    python -m bench --instructions  # and instructions per webhook (callgrind)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench import concurrency, e2e, formatting, ingest, instructions, memory, profile
from bench.common import RESULTS, Result, machine_facts
from bench.report import markdown, plot

__all__ = ["BENCHES", "main", "run_all"]

BENCHES = ("formatting", "ingest", "e2e", "concurrency", "memory")

INTRO = (
    "Every figure sits beside a baseline measured in the same run on the same machine, and "
    "the ratio is value ÷ baseline. The gateway runs pinned to core 0; the load generator "
    "and the fakes (model, platforms) to core 1. Rerun with `make bench`; see bench/README.md."
)


async def _one(name: str, full: bool) -> Result:
    if name == "formatting":
        return await formatting.run(formatting.Options())
    if name == "ingest":
        return await ingest.run(ingest.Options())
    if name == "e2e":
        return await e2e.run(e2e.Options())
    if name == "concurrency":
        c = concurrency.Options()
        if full:
            c.conversations, c.cap = 10_000, 1_000
        return await concurrency.run(c)
    if name == "memory":
        m = memory.Options()
        if full:
            m.sessions, m.soak_s = 100_000, 1200.0
        return await memory.run(m)
    if name == "profile":
        return await profile.run()
    if name == "instructions":
        return await instructions.run(instructions.Options())
    raise ValueError(name)


def run_all(
    names: Sequence[str], *, full: bool = False, out: Path = RESULTS, stamp: str | None = None
) -> tuple[list[Result], list[str], Path]:
    """Run the benchmarks; write <stamp>.md and .png into `out`. Returns the results, the
    names that crashed, and the Markdown file."""
    results: list[Result] = []
    failed: list[str] = []
    facts = machine_facts()
    for name in names:
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            result = asyncio.run(_one(name, full))
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        result.notes.append(f"{name} took {time.monotonic() - t0:.0f} s")
        result.facts = facts
        result.save(out / "last")
        result.print()
        results.append(result)
    stamp = stamp or time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{stamp}.png"
    drawn = plot(results, png)
    md = out / f"{stamp}.md"
    intro = INTRO + (" Sizes: `--full`." if full else " Sizes: the defaults (not `--full`).")
    md.write_text(
        markdown(results, facts, png.name if drawn else None, intro, _findings(out, stamp))
    )
    print(f"wrote {md}" + (f" and {png}" if drawn else " (no plot: matplotlib missing)"))
    return results, failed, md


def _findings(out: Path, stamp: str) -> str:
    """Hand-written analysis of a run (targets missed, profiles, proposed fixes), if any."""
    path = out / f"{stamp}-findings.md"
    return path.read_text() if path.exists() else ""


def _render(out: Path, stamp: str | None) -> int:
    """The report again from the last saved results (profiles re-summarized from raw stacks)."""
    from bench.profiling import summarize

    results = []
    for name in (*BENCHES, "instructions", "profile"):
        path = out / "last" / f"{name}.json"
        if path.exists():
            results.append(Result.from_json(json.loads(path.read_text())))
    raw = {
        "ingest whatsapp/sqlite (saturated)": out / "profiles" / "ingest-whatsapp-sqlite.txt",
        "e2e 100 conversations": out / "profiles" / "e2e-100-sqlite.txt",
    }
    for res in results:
        for key, file in raw.items():
            if key in res.profiles and file.exists():
                res.profiles[key] = summarize(file)
    stamp = stamp or time.strftime("%Y-%m-%d")
    png = out / f"{stamp}.png"
    drawn = plot(results, png)
    intro = INTRO + " Sizes: the defaults (not `--full`)."
    now = machine_facts()
    # the facts of the run itself (its commit, its date) when the results carry them
    facts = next((r.facts for r in results if r.facts), now)
    facts["date"] = f"{facts['date']} (rendered again {now['date']})"
    (out / f"{stamp}.md").write_text(
        markdown(results, facts, png.name if drawn else None, intro, _findings(out, stamp))
    )
    print(f"wrote {out / f'{stamp}.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}"
    )
    p.add_argument("--full", action="store_true", help="the issue's full sizes and durations")
    p.add_argument(
        "--profile",
        action="store_true",
        help="then profile the gateway (py-spy) and add the summaries",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="then count instructions per webhook under callgrind (about ten minutes)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--stamp", help="file name stem (default: today's date)")
    p.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the .md and .png from results/last/*.json (no benchmark runs)",
    )
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(BENCHES)
    if unknown:
        p.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    if args.render_only:
        return _render(args.out, args.stamp)
    if args.instructions:
        names.append("instructions")
    if args.profile:
        names.append("profile")
    _, failed, _ = run_all(names, full=args.full, out=args.out, stamp=args.stamp)
    if failed:
        print(f"crashed: {', '.join(failed)}")
    return 1 if failed else 0
