"""The conversation a log line is about, for lines logged deep inside a session's work (a
model retry, a tool, a store write) by code that does not know it: each session runner sets
it in its own task (a task's context is its own copy), and the gateway's log handler copies it
onto every record that does not carry those fields itself."""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["CONTEXT", "about"]

CONTEXT: ContextVar[dict[str, str]] = ContextVar("switchboard_log_context", default={})  # noqa: B039


def about(**fields: str) -> None:
    """From now on in this task (and the tasks it starts), lines are about these."""
    CONTEXT.set({**CONTEXT.get(), **fields})
