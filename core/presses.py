"""A button pressed again at once is the same press.

People tap twice, or tap again while the answer is on its way; each tap reaches us as its own
event (its own Telegram update, Slack action, WhatsApp message), so the inbox's dedupe on the
platform id keeps both, and each became a turn. A press is the same one when the same person
pressed the same value on the same message within `window_s`. Only presses whose channel says
which message the buttons were on (`reply_to`) are compared: the same value on a new message
is a new choice.

Two rules, both in memory. `Presses` stores a repeat that reaches this replica as the press it
repeats. `Taken` catches one that reached another replica (and was stored there): the replica
holding the session's lease, which answers all of its messages, remembers the presses it took
into a turn, by when they arrived, and answers no repeat of one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from core.models import InboundMessage, MessageKind
from core.store.base import InboxItem

__all__ = ["REPEAT_WINDOW_S", "Presses", "Taken", "mark"]

REPEAT_WINDOW_S = 5.0
MAX_TRACKED = 10_000  # presses inside one window, at most (oldest forgotten first)
KEEP_S = 600.0  # how long a press taken into a turn is remembered

Mark = tuple[str, str, str, str]


def mark(session: str, msg: InboundMessage) -> Mark | None:
    """What makes a press the same as another; None for what the rule does not cover."""
    if msg.kind is not MessageKind.BUTTON or msg.reply_to is None:
        return None
    return session, msg.sender.id, msg.button_value or msg.text, msg.reply_to


class Presses:
    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s, self._clock = window_s, clock
        self._seen: OrderedDict[Mark, tuple[float, int]] = OrderedDict()

    def claim(self, mark: Mark) -> int | None:
        """None for a new press, now claimed (mark it `stored` once it is, or `release` it);
        for a repeat, the inbox id of the press it repeats (0 while that is being stored)."""
        now = self._clock()
        while self._seen:
            oldest, (at, _) = next(iter(self._seen.items()))
            if now - at < self._window_s and len(self._seen) < MAX_TRACKED:
                break
            del self._seen[oldest]
        if (seen := self._seen.get(mark)) is not None:
            return seen[1]
        self._seen[mark] = (now, 0)
        return None

    def stored(self, mark: Mark, inbox_id: int) -> None:
        if (seen := self._seen.get(mark)) is not None:
            self._seen[mark] = (seen[0], inbox_id)

    def release(self, mark: Mark) -> None:
        """The press was not stored (the store failed): its redelivery is no repeat."""
        self._seen.pop(mark, None)


class Taken:
    """The presses a session's lease holder took into its turns lately: mark -> (arrival, inbox
    id, when taken). Kept KEEP_S: a repeat may wait in the queue behind a long turn."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._window_s, self._clock = window_s, clock
        self._taken: OrderedDict[Mark, tuple[float, int, float]] = OrderedDict()

    def repeats(self, session: str, items: list[InboxItem]) -> list[InboxItem]:
        """Of a session's pending messages (oldest first), the presses that arrived less than
        window_s after the same press, taken earlier or pending before them; the others are
        remembered as taken."""
        now = self._clock()
        while self._taken:
            oldest, (_, _, taken) = next(iter(self._taken.items()))
            if now - taken < KEEP_S and len(self._taken) < MAX_TRACKED:
                break
            del self._taken[oldest]
        found = []
        for item in items:
            if (m := mark(session, item.message)) is None:
                continue
            at = item.message.received_at
            seen = self._taken.get(m)
            if seen is not None and seen[1] == item.id:
                continue
            if seen is not None and 0 <= at - seen[0] < self._window_s:
                found.append(item)
                continue
            self._taken[m] = (at, item.id, now)
            self._taken.move_to_end(m)
        return found
