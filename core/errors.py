"""The one error tree of Switchboard.

    SwitchboardError                 root; never shown raw to a user
    ├── ConfigError                  a configuration problem, names the key
    ├── ChannelError                 a platform refused or failed a call
    │   (retryable: bool, retry_after: float | None, code: str | None)
    ├── StoreError                   the store is unreachable or refused a write
    │   └── SessionPaused            a turn's commit refused: an operator took the session
    ├── ModelError                   the model endpoint failed after retries
    │   (retryable: bool, retry_after: float | None, status: int | None)
    └── ToolError                    a tool failed; becomes a result the model can read

Third-party exceptions are translated into these at the boundary that calls the library, so the
layers above only ever handle this tree.
"""

from __future__ import annotations

__all__ = [
    "ChannelError",
    "ConfigError",
    "ModelError",
    "SessionPaused",
    "StoreError",
    "SwitchboardError",
    "ToolError",
]


class SwitchboardError(Exception):
    """Root of every error Switchboard raises on purpose."""


class ConfigError(SwitchboardError):
    """Configuration problems, each as (key, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{key}: {msg}" for key, msg in problems))


class ChannelError(SwitchboardError):
    """A send or API call to a platform failed."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.code = code


class StoreError(SwitchboardError):
    """The store could not be reached or refused an operation."""


class SessionPaused(StoreError):
    """An operator took the session while its turn ran: the turn's answer was not committed
    (its messages stay for the operator)."""


class ModelError(SwitchboardError):
    """The model endpoint failed (after the client's own retries)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


class ToolError(SwitchboardError):
    """A tool could not do its job; the message is shown to the model, never to the user."""
