"""A button tapped twice is pressed once: the session manager's rule, on every channel that
says which message the buttons were on."""

from __future__ import annotations

from core.presses import KEEP_S, MAX_TRACKED, Presses, Taken, mark
from core.store.base import InboxItem
from tests.test_sessions import press


def test_a_press_repeats_only_within_the_window() -> None:
    now = [100.0]
    presses = Presses(window_s=5.0, clock=lambda: now[0])
    pressed = mark("s", press("yes"))
    assert pressed is not None
    assert presses.claim(pressed) is None
    presses.stored(pressed, 42)
    now[0] += 4.9
    assert presses.claim(pressed) == 42
    now[0] += 0.2  # 5.1 s after the first
    assert presses.claim(pressed) is None


def test_what_is_remembered_is_bounded() -> None:
    presses = Presses(window_s=60.0, clock=lambda: 0.0)
    marks = [mark("s", press(f"v{i}")) for i in range(MAX_TRACKED + 5)]
    for one in marks:
        assert one is not None
        assert presses.claim(one) is None
    assert len(presses._seen) <= MAX_TRACKED
    first = marks[0]
    assert first is not None
    assert presses.claim(first) is None  # forgotten, so taken as new


def test_a_press_taken_into_a_turn_is_known_by_when_it_arrived() -> None:
    """The lease holder's rule: by arrival times, so a repeat that waited in the queue behind
    a long turn is still known as one; a press is never a repeat of itself."""
    now = [1000.0]
    taken = Taken(window_s=5.0, clock=lambda: now[0])
    first, again, later = (
        press("yes").model_copy(update={"received_at": t}) for t in (1000, 1004, 1005.5)
    )
    other = press("no").model_copy(update={"received_at": 1001.0})
    items = [InboxItem(1, first), InboxItem(2, other)]
    assert taken.repeats("s", items) == []
    assert taken.repeats("s", items) == []  # the same pending messages, read again
    now[0] += 60  # the repeat waited a minute in the queue
    queued = [InboxItem(3, again), InboxItem(4, later)]
    assert taken.repeats("s", queued) == [queued[0]]
    assert taken.repeats("t", [InboxItem(5, again)]) == []  # another session
    now[0] += KEEP_S
    assert taken.repeats("s", [InboxItem(6, again)]) == []  # forgotten after KEEP_S
