"""A button pressed again at once is the same press.

People tap twice, or tap again while the answer is on its way; each tap reaches us as its own
event (its own Telegram update, Slack action, WhatsApp message), so the inbox's dedupe on the
platform id keeps both, and each became a turn. A press is the same one when the same person
pressed the same value on the same message within `window_s`. Only presses whose channel says
which message the buttons were on (`reply_to`) are compared: the same value on a new message
is a new choice. Kept in memory: two taps that land on different replicas are both answered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from core.models import InboundMessage, MessageKind

__all__ = ["REPEAT_WINDOW_S", "Presses"]

REPEAT_WINDOW_S = 5.0
MAX_TRACKED = 10_000  # presses inside one window, at most (oldest forgotten first)

Mark = tuple[str, str, str, str]


class Presses:
    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s, self._clock = window_s, clock
        self._seen: OrderedDict[Mark, tuple[float, int]] = OrderedDict()

    def mark(self, session: str, msg: InboundMessage) -> Mark | None:
        """What makes a press the same as another; None for what the rule does not cover."""
        if msg.kind is not MessageKind.BUTTON or msg.reply_to is None:
            return None
        return session, msg.sender.id, msg.button_value or msg.text, msg.reply_to

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
