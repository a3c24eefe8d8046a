"""[model], [agent], [agents.NAME] and [[bindings]]: what each agent is and who it serves."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from pydantic import Field, SecretStr, field_validator, model_validator

from channels.config import Section as _Section
from core.agent.http_tools import PLACEHOLDER, HttpToolSpec, host_allowed
from core.sessions import QueueMode

__all__ = [
    "DEFAULT_AGENT",
    "DEFAULT_INSTRUCTIONS",
    "AgentOverride",
    "AgentSettings",
    "BindingSettings",
    "FallbackModelSettings",
    "HttpToolSettings",
    "LimitsSettings",
    "ModelSettings",
    "QuotaSettings",
    "ResolvedAgent",
    "ToolsSettings",
]

DEFAULT_AGENT = "default"
DEFAULT_INSTRUCTIONS = (
    "You are a helpful, concise assistant for a business. Answer from the knowledge base using "
    "the search_knowledge tool; if it has no answer, say so plainly and do not invent facts, "
    "prices or times."
)


class ModelEndpoint(_Section):
    provider: Literal["offline", "openai", "anthropic", "scripted"] = "offline"
    base_url: str | None = None
    api_key: SecretStr | None = None
    name: str | None = None
    # per call: under half of the run's 45 s by default, so a fallback still has time
    timeout_s: float = Field(default=20.0, gt=0, le=600)
    stream: bool = True
    max_retries: int = Field(default=3, ge=0, le=10)
    script: str | None = None  # provider "scripted": a JSON file of steps to replay


class FallbackModelSettings(ModelEndpoint):
    cooldown_s: float = Field(default=30.0, ge=0, le=3600)  # fallback first for this long


class ModelSettings(ModelEndpoint):
    fallback: FallbackModelSettings | None = None  # asked when this model fails first


class LimitsSettings(_Section):
    max_steps: int = Field(default=5, ge=1, le=50)
    max_tool_calls: int = Field(default=6, ge=0, le=100)
    max_output_tokens: int = Field(default=350, ge=16, le=32_000)
    token_budget: int = Field(default=7000, ge=256, le=2_000_000)
    run_timeout_s: float = Field(default=45.0, gt=0, le=3600)
    temperature: float = Field(default=0.2, ge=0, le=2)


def _zone(value: str | None) -> str | None:
    if value is not None:
        try:
            ZoneInfo(value)
        except (KeyError, ValueError, OSError):  # OSError: a zone folder ("Europe"), a long name
            raise ValueError(f"unknown IANA timezone {value!r}") from None
    return value


class AgentSettings(_Section):
    """[agent]: the default agent, and what [agents.NAME] inherit."""

    instructions: str = DEFAULT_INSTRUCTIONS
    knowledge_dir: str = "config/knowledge"
    queue_mode: QueueMode = QueueMode.COLLECT
    history_turns: int = Field(default=10, ge=0, le=200)
    debounce_ms: int = Field(default=0, ge=0, le=60_000)
    max_concurrent_runs: int = Field(default=8, ge=1, le=10_000)  # for the whole gateway
    max_pending: int = Field(default=100, ge=1, le=10_000)
    greeting: str = "Hello! How can I help you today?"
    timezone: str = "UTC"  # what current_time answers in, e.g. "Europe/Madrid"
    workspace_dir: str = "data/workspace"  # one folder per session: kept tool results, files
    tools: list[str] | None = None  # tools this agent may use; None: every tool configured
    knowledge_cache: str = "data/knowledge-index.json"  # the stored search index
    skills_dir: str = "config/skills"  # one folder per skill with a SKILL.md; may be absent
    skill_timeout_s: float = Field(default=20.0, gt=0, lt=115)
    skill_memory_mb: int = Field(default=256, ge=16, le=16_384)
    skill_max_output_bytes: int = Field(default=65_536, ge=1024, le=10_000_000)
    limits: LimitsSettings = LimitsSettings()

    _tz = field_validator("timezone")(_zone)


class AgentOverride(_Section):
    """[agents.NAME]: anything not set here comes from [agent] (and [model])."""

    draft: bool = False
    instructions: str | None = None
    knowledge_dir: str | None = None
    queue_mode: QueueMode | None = None
    history_turns: int | None = Field(default=None, ge=0, le=200)
    debounce_ms: int | None = Field(default=None, ge=0, le=60_000)
    max_pending: int | None = Field(default=None, ge=1, le=10_000)
    greeting: str | None = None
    timezone: str | None = None
    tools: list[str] | None = None
    knowledge_cache: str | None = None
    workspace_dir: str | None = None
    skills_dir: str | None = None
    skill_timeout_s: float | None = Field(default=None, gt=0, lt=115)
    skill_memory_mb: int | None = Field(default=None, ge=16, le=16_384)
    skill_max_output_bytes: int | None = Field(default=None, ge=1024, le=10_000_000)
    limits: LimitsSettings | None = None
    model: ModelSettings | None = None

    _tz = field_validator("timezone")(_zone)

    @property
    def is_draft(self) -> bool:
        """Not served: marked so, or without its own instructions yet."""
        return self.draft or not (self.instructions or "").strip()

    def resolve(self, name: str, base: AgentSettings, model: ModelSettings) -> ResolvedAgent:
        own: dict[str, Any] = {
            k: v
            for k, v in self.model_dump(exclude={"draft", "model", "limits"}).items()
            if v is not None and k in AgentSettings.model_fields
        }
        settings = base.model_copy(update=own)
        if self.limits is not None:  # only the limits it sets: the rest stay [agent.limits]'
            limits = base.limits.model_copy(update=self.limits.model_dump(exclude_unset=True))
            settings = settings.model_copy(update={"limits": limits})
        return ResolvedAgent(name, settings, self._model(model), draft=self.is_draft)

    def _model(self, base: ModelSettings) -> ModelSettings:
        """[agents.NAME.model] over [model], key by key; whole when it names another provider
        (an endpoint, key or timeout of one provider means nothing to another)."""
        if self.model is None:
            return base
        own = self.model.model_dump(exclude_unset=True)
        if own.get("provider", base.provider) != base.provider:
            return self.model
        return base.model_copy(update={k: getattr(self.model, k) for k in own})


class BindingSettings(_Section):
    """[[bindings]]: route a channel, an account or one conversation to an agent."""

    agent: str
    channel: str | None = None
    account: str | None = None
    conversation: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedAgent:
    name: str
    settings: AgentSettings
    model: ModelSettings
    draft: bool = False


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")


class HttpToolSettings(_Section):
    """[tools.http.NAME]: an HTTP endpoint the agent can call, declared with no code."""

    description: str = Field(min_length=1, max_length=1000)
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    headers: dict[str, str] = Field(default_factory=dict)  # use "${VAR}" for secrets
    allow_hosts: list[str] | None = None  # default: the URL's own host
    allow_private: bool = False  # loopback and private networks are refused unless true
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    max_response_bytes: int = Field(default=65_536, ge=256, le=10_000_000)
    read_only: bool | None = None  # default: true for GET; a write tool must say false
    confirm: bool = False  # run only after the person presses Confirm

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value.replace("{", "x").replace("}", "x"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL (with {arg} placeholders)")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError("the port must be a number from 1 to 65535")
        return value

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, str]) -> dict[str, str]:
        """Names and values HTTP can carry, checked here: otherwise every call of the tool
        fails. Surrounding whitespace (a secret file's last newline) is dropped. Values are
        never quoted in the message: they are usually secrets."""
        out = {}
        for name, raw in value.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid HTTP header name")
            text = raw.strip()
            if not _HEADER_VALUE.fullmatch(text):
                raise ValueError(
                    f"the value of {name!r} has a line break, a control character or a"
                    " non-ASCII character, which HTTP headers cannot carry"
                )
            out[name] = text
        return out

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        # imported here: jsonschema is 2-3 MB that a gateway without HTTP tools never needs
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        if value.get("type") != "object":
            raise ValueError('the arguments schema must have "type": "object"')
        return value

    @model_validator(mode="after")
    def _writes_say_so(self) -> HttpToolSettings:
        if self.method != "GET" and self.read_only is not False:
            raise ValueError(f"a {self.method} tool changes things: set read_only = false")
        if self.confirm and self.read_only is not False:
            raise ValueError("confirm = true is for write tools (read_only = false)")
        host = urlsplit(self.url.replace("{", "x").replace("}", "x")).hostname or ""
        if "{" in urlsplit(self.url).netloc:  # its default allowlist would be "xshopx.…"
            if self.allow_hosts is None:
                raise ValueError(
                    "the URL's host has a placeholder: list the hosts it may become in"
                    ' allow_hosts (e.g. ["*.example.com"])'
                )
        elif self.allow_hosts is not None and not host_allowed(host, tuple(self.allow_hosts)):
            raise ValueError(f"the URL's host {host!r} is not in allow_hosts")
        # a placeholder that no declared argument fills failed every call ("missing argument")
        named = self.parameters.get("properties")
        if isinstance(named, dict):
            for placeholder in PLACEHOLDER.findall(self.url):
                if placeholder not in named:
                    raise ValueError(
                        f"the URL's {{{placeholder}}} is not one of parameters.properties"
                    )
        return self

    def spec(self, name: str) -> HttpToolSpec:
        host = urlsplit(self.url.replace("{", "x").replace("}", "x")).hostname or ""
        return HttpToolSpec(
            name=name,
            description=self.description,
            url=self.url,
            method=self.method,
            parameters=self.parameters,
            headers=self.headers,
            allow_hosts=tuple(self.allow_hosts if self.allow_hosts is not None else [host]),
            allow_private=self.allow_private,
            timeout_s=self.timeout_s,
            max_response_bytes=self.max_response_bytes,
            read_only=self.read_only is not False,
            confirm=self.confirm,
        )


class ToolsSettings(_Section):
    http: dict[str, HttpToolSettings] = Field(default_factory=dict)


class QuotaSettings(_Section):
    """[quotas]: what a run costs and what a person and a channel may spend per UTC day."""

    credits_per_run: float | Literal["limits"] = 1.0  # "limits": token budget / 1000
    user_daily_credits: float = Field(default=0.0, ge=0)  # 0: unlimited
    channel_daily_credits: float = Field(default=0.0, ge=0)  # 0: unlimited
    message: str = (
        "You've reached today's limit for questions here. Please try again tomorrow, or "
        "contact us directly."
    )

    @field_validator("credits_per_run", mode="before")
    @classmethod
    def _credits(cls, value: Any) -> Any:
        """One problem under this key (pydantic would report one per union branch)."""
        if value == "limits":
            return value
        try:
            if isinstance(value, bool):
                raise ValueError
            credits = float(value)
        except (TypeError, ValueError):
            raise ValueError('must be a number or "limits"') from None
        if not math.isfinite(credits) or credits < 0:
            raise ValueError('must be a number from 0 up, or "limits"')
        return credits
