"""What the core reports about its work, for metrics. The gateway plugs in Prometheus."""

from __future__ import annotations

from typing import Protocol

__all__ = ["NullTelemetry", "Telemetry"]


class Telemetry(Protocol):
    def inbound(self, channel: str, outcome: str) -> None:
        """A message reached the inbox: stored, duplicate or overflow."""

    def run_done(
        self, agent: str, channel: str, status: str, seconds: float, tokens_in: int, tokens_out: int
    ) -> None:
        """A run ended (ok, limit, timeout, model_error, cancelled, quota, ...)."""

    def model_call(self, seconds: float) -> None:
        """One model call's latency."""

    def send(self, channel: str, outcome: str, *, rate_limited: bool = False) -> None:
        """A reply part was sent, will be retried, or failed for good."""


class NullTelemetry:
    """Reports nowhere (tests, the terminal chat)."""

    def inbound(self, channel: str, outcome: str) -> None:
        return None

    def run_done(
        self, agent: str, channel: str, status: str, seconds: float, tokens_in: int, tokens_out: int
    ) -> None:
        return None

    def model_call(self, seconds: float) -> None:
        return None

    def send(self, channel: str, outcome: str, *, rate_limited: bool = False) -> None:
        return None
