"""Typed configuration, read once: one TOML file, ${VAR} interpolation, SWITCHBOARD__* overrides.

Precedence: environment (SWITCHBOARD__SECTION__KEY) over the file over defaults. Every problem
is reported as (dotted key, message) through ConfigError; nothing here ever shows a traceback.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from channels.slack.settings import SlackSettings
from channels.telegram.settings import TelegramSettings
from channels.whatsapp.settings import WhatsAppSettings
from core.errors import ConfigError
from core.sessions import QueueMode

__all__ = ["DEFAULT_CONFIG", "EXAMPLE_CONFIG", "Settings", "load_settings", "settings_warnings"]

DEFAULT_CONFIG = Path("config/switchboard.toml")
EXAMPLE_CONFIG = Path("config/switchboard.example.toml")
ENV_PREFIX = "SWITCHBOARD__"
PLATFORM_CHANNELS = ("telegram", "slack", "whatsapp")

DEFAULT_INSTRUCTIONS = (
    "You are a helpful, concise assistant for a business. Answer from the knowledge base using "
    "the search_knowledge tool; if it has no answer, say so plainly and do not invent facts, "
    "prices or times."
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_url: str | None = None
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)
    shutdown_grace_s: float = Field(default=10.0, ge=0, le=600)


class StoreSettings(_Section):
    url: str = "sqlite:///data/switchboard.db"
    lease_ttl_s: float = Field(default=15.0, ge=0.5, le=600)  # a dead replica's sessions wait this
    poll_interval_s: float = Field(default=5.0, ge=0.05, le=600)  # sweep for work nobody holds
    pool_size: int = Field(default=10, ge=1, le=200)  # PostgreSQL connections per replica


class ModelSettings(_Section):
    provider: Literal["offline", "openai", "anthropic"] = "offline"
    base_url: str | None = None
    api_key: SecretStr | None = None
    name: str | None = None
    timeout_s: float = Field(default=60.0, gt=0, le=600)
    stream: bool = True
    max_retries: int = Field(default=3, ge=0, le=10)


class LimitsSettings(_Section):
    max_steps: int = Field(default=5, ge=1, le=50)
    max_tool_calls: int = Field(default=6, ge=0, le=100)
    max_output_tokens: int = Field(default=350, ge=16, le=32_000)
    token_budget: int = Field(default=7000, ge=256, le=2_000_000)
    run_timeout_s: float = Field(default=45.0, gt=0, le=3600)
    temperature: float = Field(default=0.2, ge=0, le=2)


class AgentSettings(_Section):
    instructions: str = DEFAULT_INSTRUCTIONS
    knowledge_dir: str = "config/knowledge"
    queue_mode: QueueMode = QueueMode.COLLECT
    history_turns: int = Field(default=10, ge=0, le=200)
    debounce_ms: int = Field(default=0, ge=0, le=60_000)
    max_concurrent_runs: int = Field(default=8, ge=1, le=10_000)
    max_pending: int = Field(default=100, ge=1, le=10_000)
    greeting: str = "Hello! How can I help you today?"
    timezone: str = "UTC"  # what current_time answers in, e.g. "Europe/Madrid"
    workspace_dir: str = "data/workspace"  # one folder per session: kept tool results, files
    limits: LimitsSettings = LimitsSettings()

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (KeyError, ValueError):
            raise ValueError(f"unknown IANA timezone {value!r}") from None
        return value


class WebChannelSettings(_Section):
    enabled: bool = True


class ChannelsSettings(_Section):
    media_dir: str = "data/files"  # files people send, one folder per session
    max_media_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, le=2 * 1024 * 1024 * 1024)
    web: WebChannelSettings = WebChannelSettings()
    telegram: TelegramSettings = TelegramSettings()
    slack: SlackSettings = SlackSettings()
    whatsapp: WhatsAppSettings = WhatsAppSettings()


# what load_settings is reading: (interpolated file data, environment)
_SOURCES: ContextVar[tuple[dict[str, Any], Mapping[str, str]]] = ContextVar("switchboard_sources")


class _FileSource(PydanticBaseSettingsSource):
    """The (already interpolated) TOML file, below the environment in precedence."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        data, _ = _SOURCES.get(({}, {}))
        return dict(data)


class _EnvSource(PydanticBaseSettingsSource):
    """SWITCHBOARD__SECTION__KEY=value as nested keys; unknown names are reported, not ignored."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        _, environ = _SOURCES.get(({}, {}))
        out: dict[str, Any] = {}
        for name, value in environ.items():
            if not name.upper().startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
                continue
            path = name[len(ENV_PREFIX) :].lower().split("__")
            node = out
            for part in path[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    break
                node = child
            else:
                node[path[-1]] = value
        return out


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    server: ServerSettings = ServerSettings()
    store: StoreSettings = StoreSettings()
    model: ModelSettings = ModelSettings()
    agent: AgentSettings = AgentSettings()
    channels: ChannelsSettings = ChannelsSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvSource(settings_cls), _FileSource(settings_cls))

    def sqlite_path(self) -> str:
        """The file path of a sqlite: store URL (relative paths are relative to the cwd)."""
        return self.store.url.removeprefix("sqlite://").removeprefix("/") or ":memory:"


def config_path(path: str | Path | None) -> Path | None:
    """The file to read: the one given, else config/switchboard.toml, else the example."""
    if path is not None:
        return Path(path)
    for candidate in (DEFAULT_CONFIG, EXAMPLE_CONFIG):
        if candidate.is_file():
            return candidate
    return None


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read, interpolate, override and validate the configuration, or raise ConfigError."""
    env = os.environ if environ is None else environ
    file = config_path(path)
    data: dict[str, Any] = {}
    if file is not None:
        try:
            with file.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError([("config", f"file not found: {file}")]) from None
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError([("config", f"{file} is not valid TOML: {exc}")]) from None
    problems: list[tuple[str, str]] = []
    data = _interpolate(data, env, "", problems)
    if problems:
        raise ConfigError(problems)
    token = _SOURCES.set((data, env))
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError([_problem(err, env) for err in exc.errors()]) from None
    finally:
        _SOURCES.reset(token)
    problems = semantic_problems(settings)
    if problems:
        raise ConfigError(problems)
    return settings


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(
    value: Any, env: Mapping[str, str], key: str, problems: list[tuple[str, str]]
) -> Any:
    if isinstance(value, dict):
        return {
            k: _interpolate(v, env, f"{key}.{k}" if key else k, problems) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, env, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        if default is not None and not value:  # shell semantics: unset or empty
            return default
        if value is not None:
            return value
        problems.append((key, f"environment variable {name} is not set"))
        return ""

    return _VAR.sub(repl, value)


def _problem(err: Any, env: Mapping[str, str]) -> tuple[str, str]:
    key = ".".join(str(p) for p in err["loc"]) or "config"
    var = ENV_PREFIX + "__".join(str(p) for p in err["loc"]).upper()
    source = f" (from {var})" if any(n.upper() == var for n in env) else ""
    if err["type"] == "extra_forbidden":
        return key, f"unknown key{source}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return key, msg + source


def semantic_problems(s: Settings) -> list[tuple[str, str]]:
    """Rules that span keys. Channels fail closed: enabled without their secrets is an error."""
    p: list[tuple[str, str]] = []

    if not s.store.url.startswith(("sqlite:", "postgresql:", "postgres:")):
        p.append(("store.url", 'must start with "sqlite:///" or "postgresql://"'))
    elif s.store.url.startswith("sqlite:") and not s.store.url.startswith("sqlite:///"):
        p.append(("store.url", 'a SQLite URL looks like "sqlite:///data/switchboard.db"'))
    elif s.store.url.startswith("postgres") and not _has_asyncpg():
        p.append(("store.url", "PostgreSQL needs the postgres extra: pip install '.[postgres]'"))
    if s.model.provider == "openai" and not s.model.name:
        p.append(("model.name", 'required for provider "openai" (e.g. "gpt-4o-mini")'))
    if s.model.provider == "anthropic":
        p.append(("model.provider", '"anthropic" is not available in this version yet'))
    if s.model.base_url is not None and not s.model.base_url.startswith(("http://", "https://")):
        p.append(("model.base_url", "must be an http:// or https:// URL"))
    if s.model.provider == "openai" and s.model.base_url is None and s.model.api_key is None:
        p.append(("model.api_key", "required for the OpenAI API (or set model.base_url)"))
    url = s.server.public_url
    if url is not None and not url.startswith(("https://", "http://")):
        p.append(("server.public_url", "must be an http:// or https:// URL"))

    for name in PLATFORM_CHANNELS:
        p.extend(getattr(s.channels, name).problems(s.server.public_url))
    if not Path(s.agent.knowledge_dir).is_dir():
        p.append(("agent.knowledge_dir", f"not a directory: {s.agent.knowledge_dir}"))
    return p


def _has_asyncpg() -> bool:
    import importlib.util

    return importlib.util.find_spec("asyncpg") is not None


def settings_warnings(s: Settings) -> list[tuple[str, str]]:
    """Valid but worth saying: things that will not do what the operator may expect."""
    w: list[tuple[str, str]] = []
    from gateway.channels import available  # settings must not import channel code eagerly

    for name in PLATFORM_CHANNELS:
        if getattr(s.channels, name).enabled and not available(name):
            w.append(
                (f"channels.{name}.enabled", "this channel is not available in this version yet")
            )
    if not (
        s.channels.web.enabled
        or any(getattr(s.channels, n).enabled for n in ("telegram", "slack", "whatsapp"))
    ):
        w.append(("channels", "no channel is enabled; only `switchboard chat` can reach the agent"))
    return w
