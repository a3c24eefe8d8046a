"""Helpers for channel configuration sections (pydantic models composed into Settings)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo

__all__ = ["ChannelSection", "present", "required_when_enabled", "secret"]


class ChannelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False

    def problems(self, public_url: str | None) -> list[tuple[str, str]]:
        """Rules that need other sections (e.g. a webhook needs server.public_url); keys are
        dotted from the top of the configuration."""
        return []


def present(value: object) -> bool:
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return bool(text)


def required_when_enabled(value: Any, info: ValidationInfo) -> Any:
    """Channels fail closed: an enabled channel without its secrets does not start."""
    if info.data.get("enabled") and not present(value):
        raise ValueError("required when the channel is enabled")
    return value


def secret() -> Any:
    """A field validated even when absent, so a missing secret is reported by its key."""
    return Field(default=None, validate_default=True)
