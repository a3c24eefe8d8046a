"""Helpers for channel configuration sections (pydantic models composed into Settings)."""

from __future__ import annotations

import unicodedata
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from core.access import Access, AccessRule
from core.policies import ChannelPolicy, QueueMode

__all__ = [
    "REQUIRED_WHEN_ENABLED",
    "ChannelSection",
    "Section",
    "present",
    "required_when_enabled",
    "secret",
]

# how a missing secret of an enabled channel is reported ("… in webhook mode" where a mode
# asks for it): the configuration names the variables that enabled it by these words
REQUIRED_WHEN_ENABLED = "required when the channel is enabled"


class Section(BaseModel):
    """A configuration section: unknown keys refused, and true/false never taken for a number
    (pydantic would read `port = true` as port 1)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            raise ValueError("a number, not true or false")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _clean_secret(cls, value: Any, info: ValidationInfo) -> Any:
        """A secret read from a file (a mounted Kubernetes secret, `$(cat key)`) often ends in
        a line break: it is dropped. One inside is refused here, by its key: sent in a header,
        it failed every request (and `check` with a traceback)."""
        field = cls.model_fields.get(info.field_name or "")
        if not isinstance(value, str) or field is None or not _secret(field.annotation):
            return value
        value = value.strip()
        if any(unicodedata.category(c).startswith("C") for c in value):
            raise ValueError("a control or invisible character inside it (a line break?)")
        return value


def _numeric(annotation: Any) -> bool:
    return any(a in (int, float) for a in (get_args(annotation) or (annotation,)))


def _secret(annotation: Any) -> bool:
    return SecretStr in (get_args(annotation) or (annotation,))


class ChannelSection(Section):
    enabled: bool = False
    # who may talk to the agent here: anyone, listed senders, or approved ones (pairing codes)
    access: Literal["open", "allowlist", "pairing"] = "open"
    allow_from: list[str] = Field(default_factory=list)  # sender ids always allowed
    block_from: list[str] = Field(default_factory=list)  # sender ids never heard
    flood_messages: int = Field(default=0, ge=0, le=10_000)  # per window and sender; 0: off
    flood_window_s: float = Field(default=60.0, gt=0, le=86_400)
    pairing_ttl_s: float = Field(default=3600.0, ge=60, le=30 * 86_400)
    # the agent's queue mode and debounce for this channel's sessions (unset: the agent's)
    queue_mode: QueueMode | None = None
    debounce_ms: int | None = Field(default=None, ge=0, le=60_000)

    def access_rule(self) -> AccessRule:
        return AccessRule(
            mode=Access(self.access),
            allow=frozenset(self.allow_from),
            block=frozenset(self.block_from),
            flood_messages=self.flood_messages,
            flood_window_s=self.flood_window_s,
            pairing_ttl_s=self.pairing_ttl_s,
        )

    def channel_policy(self) -> ChannelPolicy:
        debounce_s = None if self.debounce_ms is None else self.debounce_ms / 1000
        return ChannelPolicy(queue_mode=self.queue_mode, debounce_s=debounce_s)

    def problems(self, public_url: str | None) -> list[tuple[str, str]]:
        """Rules that need other sections (e.g. a webhook needs server.public_url); keys are
        dotted from the top of the configuration."""
        return []


def url_problem(value: str) -> str | None:
    """Why `value` is no usable http(s) URL (no host, spaces, a bad port), or None."""
    if not value.startswith(("https://", "http://")):
        return "must be an http:// or https:// URL"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - reading it checks it
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if not parts.hostname or any(c.isspace() for c in value):
        return "not a valid URL (no host, or a space in it)"
    return None


def http_url(value: str) -> str:
    """A field validator: an http(s) URL with a host, without its trailing slash."""
    if problem := url_problem(value):
        raise ValueError(problem)
    return value.rstrip("/")


def present(value: object) -> bool:
    """Set to something: an empty or blank value (`${TOKEN}` with TOKEN set but empty) is not."""
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return bool(text.strip()) if isinstance(text, str) else bool(text)


def required_when_enabled(value: Any, info: ValidationInfo) -> Any:
    """Channels fail closed: an enabled channel without its secrets does not start."""
    if info.data.get("enabled") and not present(value):
        raise ValueError(REQUIRED_WHEN_ENABLED)
    return value


def secret() -> Any:
    """A field validated even when absent, so a missing secret is reported by its key."""
    return Field(default=None, validate_default=True)
