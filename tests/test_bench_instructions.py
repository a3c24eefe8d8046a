"""bench.instructions: what a server does between zeroing callgrind's counters and dumping
them, per webhook (valgrind is on every machine this runs on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import instructions


@pytest.mark.timeout(240)
async def test_a_server_under_callgrind_is_counted_per_webhook(tmp_path: Path) -> None:
    assert instructions.available(), "valgrind (callgrind) is needed: apt-get install valgrind"
    few = instructions.Options(channels=("whatsapp",), webhooks=150, warmup=20)
    more = instructions.Options(channels=("whatsapp",), webhooks=450, warmup=20)
    out = tmp_path / "bare"
    async with instructions._server("aiohttp", "whatsapp", out) as (url, proc):
        per_webhook = await instructions._count(url, proc, out, "whatsapp", few)
        again = await instructions._count(url, proc, out, "whatsapp", more)
    # aiohttp alone takes some hundred thousand instructions a request, and the count is of
    # the window only: three times the webhooks, about the same per webhook (the window's own
    # cost, a couple of million instructions however long it is, weighs less in the longer
    # one; counting from the start instead would make the ratio about a third)
    assert 20_000 < per_webhook < 5_000_000
    assert 0.6 < again / per_webhook < 1.4
