"""Results as Markdown (one table of figures beside their baselines, with ratios and targets)
and as a PNG of throughput and latency (matplotlib, from the `bench` extra)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Result, Row

__all__ = ["markdown", "plot", "table"]


def _num(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    a = abs(value)
    text = f"{value:,.0f}" if a >= 100 else f"{value:.1f}" if a >= 10 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def _met(row: Row) -> str:
    if not row.target:
        return ""
    return f"{row.target} {'✅' if row.met else '❌'}"


def table(rows: Sequence[Row]) -> str:
    head = "| benchmark | case | metric | value | baseline (same run) | ratio | target |"
    out = [head, "|---|---|---|---:|---|---:|---|"]
    for r in rows:
        base = f"{_num(r.baseline, r.unit)} ({r.baseline_name})" if r.baseline_name else "–"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "–"
        note = f" — {r.note}" if r.note else ""
        out.append(
            f"| {r.bench} | {r.case} | {r.metric} | {_num(r.value, r.unit)} | {base} | {ratio} "
            f"| {_met(r)}{note} |"
        )
    return "\n".join(out)


def markdown(
    results: Sequence[Result],
    facts: dict[str, str],
    png: str | None,
    intro: str = "",
    findings: str = "",
) -> str:
    rows = [r for res in results for r in res.rows]
    targets = [r for r in rows if r.target]
    met = sum(1 for r in targets if r.met)
    out = [f"# Switchboard benchmarks — {facts.get('date', '')}", ""]
    if intro:
        out += [intro, ""]
    out += [f"Targets met: **{met} of {len(targets)}**.", ""]
    out += ["## Machine", "", "| fact | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in facts.items()]
    out += ["", "## Results", "", table(rows), ""]
    if png:
        out += [f"![throughput and latency]({png})", ""]
    if findings:
        out += [findings.strip(), ""]
    out += ["## How each figure was measured", ""]
    for res in results:
        out += [f"- {n}" for n in res.notes]
    profiles = [(k, v) for res in results for k, v in res.profiles.items()]
    if profiles:
        out += ["", "## Profiles", ""]
        for name, text in profiles:
            out += [f"### {name}", "", "```", text, "```", ""]
    return "\n".join(out) + "\n"


def plot(results: Sequence[Result], path: Path) -> bool:
    """Throughput and latency panels; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by = {r.bench: r.series for r in results}
    panels: list[tuple[str, Any]] = []
    if by.get("ingest", {}).get("throughput"):
        panels.append(("ingest_rate", by["ingest"]))
        panels.append(("ingest_latency", by["ingest"]))
    if by.get("e2e", {}).get("levels"):
        panels.append(("e2e", by["e2e"]))
    if by.get("memory", {}).get("soak"):
        panels.append(("soak", by["memory"]))
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for ax, (kind, data) in zip(axes[:, 0], panels, strict=True):
        if kind == "ingest_rate":
            items = data["throughput"]
            colors = ["#9aa5b1" if i["kind"] == "baseline" else "#2f6fdf" for i in items]
            ax.bar(range(len(items)), [i["rate"] for i in items], color=colors)
            ax.set_xticks(range(len(items)), [i["case"] for i in items], fontsize=8)
            ax.set_ylabel("webhooks/s acknowledged")
            ax.set_title("Ingest throughput, saturated (grey: same-run baselines)")
        elif kind == "ingest_latency":
            items = data["latency"]
            x = range(len(items))
            ax.bar(
                [i - 0.2 for i in x], [i["p50"] for i in items], 0.4, label="p50", color="#7fb3ff"
            )
            ax.bar(
                [i + 0.2 for i in x], [i["p99"] for i in items], 0.4, label="p99", color="#1f3f8f"
            )
            ax.axhline(10, color="#d33", linestyle="--", linewidth=1, label="p99 target 10 ms")
            ax.set_xticks(list(x), [i["case"] for i in items], fontsize=8)
            ax.set_ylabel("ms")
            ax.set_yscale("log")
            ax.set_title("Acknowledgement latency at a fixed rate (open loop)")
            ax.legend(fontsize=8)
        elif kind == "e2e":
            levels = data["levels"]
            xs = [lv["conversations"] for lv in levels]
            ax.plot(
                xs, [lv["rate"] for lv in levels], "o-", color="#2f6fdf", label="gateway answered/s"
            )
            ax.plot(
                xs,
                [lv["baseline_rate"] for lv in levels],
                "s--",
                color="#9aa5b1",
                label="relay baseline answered/s",
            )
            ax.set_xscale("log")
            ax.set_xlabel("concurrent conversations")
            ax.set_ylabel("answered messages/s")
            ax2 = ax.twinx()
            ax2.plot(
                xs,
                [lv["cpu_ms"] for lv in levels],
                "^-",
                color="#e07b00",
                label="gateway CPU ms/answer",
            )
            ax2.set_ylabel("CPU ms per answer")
            ax.set_title("End to end (webhook → agent → fake model → fake platform)")
            lines = ax.get_legend_handles_labels()
            lines2 = ax2.get_legend_handles_labels()
            ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
        else:
            soak = data["soak"]
            ax.plot([s[0] for s in soak], [s[1] for s in soak], color="#2f6fdf")
            if data.get("idle_mb"):
                ax.axhline(data["idle_mb"], color="#9aa5b1", linestyle="--", label="idle RSS")
                ax.legend(fontsize=8)
            ax.set_xlabel("seconds into the soak")
            ax.set_ylabel("gateway RSS (MB)")
            ax.set_title("Memory during the soak")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
