"""What the channels remember per session in memory stays bounded, however many people write."""

from __future__ import annotations

from typing import Any

from channels.telegram.live import LAST_INBOUND_MAX, Live


def test_telegram_remembers_the_newest_message_of_recent_sessions_only() -> None:
    live = Live(client=Any, store=Any, streaming=False)
    for n in range(LAST_INBOUND_MAX + 500):
        live.heard(f"s{n}", n)
    live.heard("s600", 99_999)  # written to again: recent once more
    live.heard("new", 1)
    remembered = live._last_inbound
    assert len(remembered) == LAST_INBOUND_MAX
    assert "s0" not in remembered  # the oldest went first
    assert "s500" not in remembered  # made room for "new"
    assert "s501" in remembered
    assert remembered["s600"] == 99_999
    assert remembered["new"] == 1
