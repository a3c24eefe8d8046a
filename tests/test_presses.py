"""A button tapped twice is pressed once: the session manager's rule, on every channel that
says which message the buttons were on."""

from __future__ import annotations

from core.presses import MAX_TRACKED, Presses
from tests.test_sessions import press


def test_a_press_repeats_only_within_the_window() -> None:
    now = [100.0]
    presses = Presses(window_s=5.0, clock=lambda: now[0])
    mark = presses.mark("s", press("yes"))
    assert mark is not None
    assert presses.claim(mark) is None
    presses.stored(mark, 42)
    now[0] += 4.9
    assert presses.claim(mark) == 42
    now[0] += 0.2  # 5.1 s after the first
    assert presses.claim(mark) is None


def test_what_is_remembered_is_bounded() -> None:
    presses = Presses(window_s=60.0, clock=lambda: 0.0)
    marks = [presses.mark("s", press(f"v{i}")) for i in range(MAX_TRACKED + 5)]
    for mark in marks:
        assert mark is not None
        assert presses.claim(mark) is None
    assert len(presses._seen) <= MAX_TRACKED
    first = marks[0]
    assert first is not None
    assert presses.claim(first) is None  # forgotten, so taken as new
