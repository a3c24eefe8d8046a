"""Formatting and chunking: conversions per second of a 10,000-character Markdown reply into
each channel's messages (WhatsApp text chunks, Telegram HTML chunks, Slack mrkdwn sections and
blocks), in process, against markdown-it-py rendering the same text to HTML in the same run
(the parser every converter builds on). The web chat sends Markdown as is, so it has no row.

    python -m bench.formatting --seconds 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import LOAD_CORE, RESULTS, Result, pin_self

__all__ = ["Options", "main", "reply_markdown", "run"]


@dataclass
class Options:
    seconds: float = 2.0  # per converter
    size: int = 10_000


_SECTION = """## {n}. Opening hours and services

Thanks for asking! Here is **everything** you need to know about _our shop_, including the
`rental` desk and the [booking page](https://example.com/book?id={n}&ref=bench).

- Weekdays: 9:00–18:00, with **late repairs** on Thursdays
- Saturdays: 10:00–16:00 (_rentals only_)
- Sundays & holidays: closed — see <https://example.com/holidays>
  - nested: e-bikes need a *deposit* of $50
  - nested: kids' bikes are ~~free~~ half price

1. Bring the bike
2. Tell us what's wrong; we answer within 24 h

> Note: prices below exclude tax & may change.

| Service | Price | Time |
|---|---|---|
| Flat tyre | $15 | 20 min |
| Full tune-up | $89 | 1 day |

```python
def quote(hours: int) -> str:
    return f"${{hours * 45}} < $500 & > $0"
```

"""


def reply_markdown(size: int = 10_000) -> str:
    """A realistic long agent reply of exactly `size` characters (cut at a line end)."""
    parts: list[str] = []
    n = 1
    while sum(len(p) for p in parts) < size:
        parts.append(_SECTION.format(n=n))
        n += 1
    text = "".join(parts)[:size]
    return text[: text.rfind("\n") + 1].ljust(size, ".")


def _converters() -> dict[str, Callable[[str], object]]:
    from markdown_it import MarkdownIt

    from channels.slack.adapter import render as slack_render
    from channels.telegram.outbound import _chunks as telegram_chunks
    from channels.whatsapp.format import chunk as whatsapp_chunk
    from core.models import Reply

    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    return {
        "baseline": md.render,
        "whatsapp": whatsapp_chunk,
        "telegram": lambda text: telegram_chunks(Reply(text=text), "bench"),
        "slack": lambda text: slack_render(Reply(text=text)),
    }


def _rate(fn: Callable[[str], object], text: str, seconds: float) -> float:
    fn(text)  # warm caches
    count, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        fn(text)
        count += 1
        now = time.perf_counter()
        if now >= deadline or count >= 1_000_000:
            return count / (now - t0)


async def run(opts: Options) -> Result:
    pin_self(LOAD_CORE)
    result = Result("formatting")
    text = reply_markdown(opts.size)
    conv = _converters()
    base = _rate(conv["baseline"], text, opts.seconds)
    for channel in ("whatsapp", "telegram", "slack"):
        rate = _rate(conv[channel], text, opts.seconds)
        result.add(
            channel,
            f"{opts.size:,}-char reply → messages",
            rate,
            "/s",
            baseline=base,
            baseline_name="markdown-it → HTML",
        )
    result.notes.append(
        f"formatting: one {opts.size:,}-character Markdown reply (headings, lists, tables, quotes, "
        f"code, links), each converter run for {opts.seconds:g} s in one process on core "
        f"{LOAD_CORE}; baseline markdown-it-py (commonmark + table + strikethrough) to HTML"
    )
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.formatting",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=Options.seconds)
    p.add_argument("--size", type=int, default=Options.size)
    p.add_argument("--out", type=Path, default=RESULTS / "last")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import asyncio

    args = parser().parse_args(argv)
    result = asyncio.run(run(Options(seconds=args.seconds, size=args.size)))
    result.print()
    result.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
