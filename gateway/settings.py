"""Typed configuration, read once: one TOML file, ${VAR} interpolation, SWITCHBOARD__* overrides.

Precedence: environment (SWITCHBOARD__SECTION__KEY) over the file over defaults. Every problem
is reported as (dotted key, message) through ConfigError; nothing here ever shows a traceback.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from channels.config import ChannelSection
from channels.config import Section as _Section
from channels.slack.settings import SlackSettings
from channels.telegram.settings import TelegramSettings
from channels.whatsapp.settings import WhatsAppSettings
from core.errors import ConfigError
from gateway.agents_config import (
    DEFAULT_AGENT,
    AgentOverride,
    AgentSettings,
    BindingSettings,
    ModelSettings,
    QuotaSettings,
    ResolvedAgent,
    ToolsSettings,
)
from gateway.config_keys import (
    ENV_PREFIX,
    KeyPath,
    covered,
    env_path,
    env_source,
    interpolate,
    is_model,
    key_path,
    loc_path,
    mistyped,
    near,
    problem,
    sourced,
    standing_in,
    without,
    without_none,
)

__all__ = ["DEFAULT_CONFIG", "EXAMPLE_CONFIG", "Settings", "load_settings"]

DEFAULT_CONFIG = Path("config/switchboard.toml")
EXAMPLE_CONFIG = Path("config/switchboard.example.toml")
PLATFORM_CHANNELS = ("telegram", "slack", "whatsapp")
CHANNEL_NAMES = ("web", "console", *PLATFORM_CHANNELS)
ADMIN_TOKEN_MIN = 16  # the console's only lock; a short token is guessable


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_url: str | None = None
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)
    shutdown_grace_s: float = Field(default=10.0, ge=0, le=600)
    # behind a reverse proxy: the client's address, scheme and host are the last
    # X-Forwarded-For, -Proto and -Host entries (the ones it added); without a proxy those
    # headers are the client's to forge
    trust_forwarded: bool = False

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        """An IP address or a host name, checked without the network; `run` binds it."""
        if not value:
            raise ValueError('empty; use "0.0.0.0" (or "::") to listen on every interface')
        if not is_ip_address(value) and not _is_host_name(value):
            raise ValueError(f"{value!r} is not an IP address or a host name")
        return value


RETENTION_MIN_DAYS = 7


class StoreSettings(_Section):
    url: str = "sqlite:///data/switchboard.db"
    lease_ttl_s: float = Field(default=15.0, ge=0.5, le=600)  # a dead replica's sessions wait this
    poll_interval_s: float = Field(default=5.0, ge=0.05, le=600)  # sweep for work nobody holds
    pool_size: int = Field(default=10, ge=1, le=200)  # PostgreSQL connections per replica
    # what is older is deleted (core.retention); 0 keeps everything
    retention_days: float = Field(default=0, ge=0, le=36_500)

    @field_validator("retention_days")
    @classmethod
    def _a_week_at_least(cls, value: float) -> float:
        if 0 < value < RETENTION_MIN_DAYS:
            raise ValueError(
                f"must be 0 (keep everything) or at least {RETENTION_MIN_DAYS} days: WhatsApp"
                " redelivers a webhook for up to 7 days, and a message deleted before that"
                " would be answered twice"
            )
        return value


class WebChannelSettings(ChannelSection):
    enabled: bool = True
    # messages one client address may post per minute (0: no limit); loopback clients are
    # not limited, unless a trusted proxy forwards their real address
    posts_per_minute: int = Field(default=30, ge=0, le=100_000)


class AdminSettings(_Section):
    """[admin]: the operator console at /admin; without a token it is off (404)."""

    token: SecretStr | None = None


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
        data, environ = _SOURCES.get(({}, {}))
        out: dict[str, Any] = {}
        for name, value in environ.items():
            if not name.upper().startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
                continue
            path = _as_in_file(data, name[len(ENV_PREFIX) :].lower().split("__"))
            node = out
            for part in path[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    break
                node = child
            else:
                parsed = _env_value(self.settings_cls, path, value)
                known = node.get(path[-1])
                if isinstance(parsed, dict) and isinstance(known, dict):
                    parsed = _merged(parsed, known)  # a key's own variable beats its table's
                node[path[-1]] = parsed
        return out


def _as_in_file(data: dict[str, Any], path: list[str]) -> list[str]:
    """A variable's path with each name spelt as the file spells it (a variable's name has one
    case; `[tools.http.OrderStatus]` is still the table SWITCHBOARD__TOOLS__HTTP__ORDERSTATUS__…
    means, not a new one)."""
    out = []
    node: Any = data
    for part in path:
        if isinstance(node, dict) and part not in node:
            part = next((k for k in node if isinstance(k, str) and k.lower() == part), part)
        out.append(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` on top, table by table."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _env_value(root: type[BaseModel], path: list[str], value: str) -> Any:
    """A list key takes a JSON array, or for a list of strings comma-separated values too; a
    table (an HTTP tool's headers or parameters, a section) takes a JSON object. What does not
    parse is left as it is, for validation to report by key ("Input should be a valid …")."""
    leaf = _annotation_at(root, path)
    table = get_origin(leaf) is dict or leaf is dict or is_model(leaf)
    listed = get_origin(leaf) in (list, tuple, set, frozenset)
    if not (table or listed):
        return value
    if value.lstrip().startswith("{" if table else "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    item = next(iter(get_args(leaf)), Any)
    if get_origin(item) is Annotated:
        item = get_args(item)[0]
    if listed and item is str:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _annotation_at(root: type[BaseModel], path: list[str]) -> Any:
    """The type of the key at path (`dict[str, Model]` entries included), or None if unknown."""
    node: Any = root
    for part in path:
        if get_origin(node) is dict:  # this part names an entry
            node = without_none(get_args(node)[1])
        elif is_model(node):
            field = node.model_fields.get(part)
            if field is None:
                return None
            node = without_none(field.annotation)
        else:
            return None
    return node


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    server: ServerSettings = ServerSettings()
    store: StoreSettings = StoreSettings()
    model: ModelSettings = ModelSettings()
    agent: AgentSettings = AgentSettings()
    agents: dict[str, AgentOverride] = Field(default_factory=dict)
    bindings: list[BindingSettings] = Field(default_factory=list)
    tools: ToolsSettings = ToolsSettings()
    quotas: QuotaSettings = QuotaSettings()
    channels: ChannelsSettings = ChannelsSettings()
    admin: AdminSettings = AdminSettings()

    def resolved_agents(self) -> dict[str, ResolvedAgent]:
        """Every agent with its effective settings: [agent] is "default"; each [agents.NAME]
        takes what it does not set from [agent] and [model]."""
        out = {DEFAULT_AGENT: ResolvedAgent(DEFAULT_AGENT, self.agent, self.model)}
        for name, override in self.agents.items():
            out[name] = override.resolve(name, self.agent, self.model)
        return out

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
    """The file to read: the one given, else config/switchboard.toml, else the example. Once
    config/switchboard.toml exists in any form (a directory a container mount made, a dangling
    link), it is the one read, and its problem reported: the demo must not run in its place."""
    if path is not None:
        return Path(path)
    for candidate in (DEFAULT_CONFIG, EXAMPLE_CONFIG):
        if os.path.lexists(candidate):
            return candidate
    return None


def is_dir(path: str | Path) -> bool:
    try:
        return Path(path).is_dir()
    except OSError:  # a name too long for the file system, say
        return False


def load_settings(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    only: tuple[str, ...] | None = None,
) -> Settings:
    """Read, interpolate, override and validate the configuration, or raise ConfigError.
    `only`: the sections a command needs (`pairing` needs the store, not every channel's
    secrets in its environment); the rest are left at their defaults, unchecked."""
    env = os.environ if environ is None else environ
    file = config_path(path)
    data: dict[str, Any] = {}
    if file is not None:
        try:
            if file.exists() and not (file.is_file() or file.is_dir()):  # reading a FIFO waits
                raise ConfigError([("config", f"{file} is not a regular file")])
            # an editor's byte order mark is no TOML, and no reason to refuse the file
            data = tomllib.loads(file.read_bytes().removeprefix(b"\xef\xbb\xbf").decode())
        except FileNotFoundError:
            if file.is_symlink():
                reason = f"{file} is a link to {os.readlink(file)}, which does not exist"
                raise ConfigError([("config", reason)]) from None
            raise ConfigError([("config", f"file not found: {file}")]) from None
        except IsADirectoryError:
            reason = f"{file} is a directory, not a file (a container mount of a missing file?)"
            raise ConfigError([("config", reason)]) from None
        except PermissionError:
            reason = (
                f"cannot read {file}: permission denied (readable by the user the gateway runs"
                f" as? uid {os.getuid()} here; the Docker image runs as uid 10001)"
            )
            raise ConfigError([("config", reason)]) from None
        except OSError as exc:
            raise ConfigError([("config", f"cannot read {file}: {exc.strerror or exc}")]) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([("config", f"{file} is not valid TOML: {exc}")]) from None
    if only is not None:
        data = {k: v for k, v in data.items() if k in only}
        # the SWITCHBOARD__ overrides of the other sections go; ${VAR}s stay for the rest
        kept = {(), *((section,) for section in only)}
        env = {n: v for n, v in env.items() if env_path(n)[:1] in kept}
    wrong_type = mistyped(data, Settings, "")  # the file's own values, before any ${VAR}
    unset: list[tuple[str, str]] = []  # reported with every other problem, not alone
    data = interpolate(data, env, "", unset)
    # an override's ${VAR} is read too: taken as text, "${ADMIN_TOKEN}" became the token
    in_overrides: list[tuple[str, str]] = []
    overrides = {
        name: interpolate(value, env, ".".join(keys), in_overrides)
        for name, value in env.items()
        if (keys := env_path(name)) and "${" in value
    }
    unset += [(key, reason + env_source(key, env)) for key, reason in in_overrides]
    env = {**env, **overrides} if overrides else env
    # set aside from the start: lax, `enabled = 1` enabled the channel, which then lacked a token
    aside = [key_path(k) for k, _ in wrong_type]
    token = _SOURCES.set((without(data, aside), env))
    try:
        settings, errors = Settings(), []
    except ValidationError as exc:
        settings, errors = None, exc.errors()
    finally:
        _SOURCES.reset(token)
    problems = wrong_type + [
        problem(e, env, data) for e in errors if loc_path(e["loc"]) not in aside
    ]
    if problems or settings is None:
        problems += _more_problems(data, env, [loc_path(err["loc"]) for err in errors] + aside)
    else:  # a rule across keys names the variables that set its key, as a field's error does
        problems = [(k, sourced(k, m, env, data)) for k, m in _rules()(settings)]
    problems = unset + [p for p in problems if not covered(p[0], unset)]
    if only is not None:
        problems = [p for p in problems if p[0].split(".")[0].split("[")[0] in only]
    if problems or settings is None:
        raise ConfigError(problems)
    return settings


def _more_problems(
    data: dict[str, Any], env: Mapping[str, str], bad: list[KeyPath]
) -> list[tuple[str, str]]:
    """The problems the first validation could not see: a rule over a whole tool or section,
    which pydantic checks only once each of its keys is valid, and the rules across keys. They
    are checked among the keys that are valid (the failing ones set aside, and whatever setting
    them aside makes fail in turn), so that check reports every problem at once rather than one
    kind per attempt. Nothing about a key set aside.

    A key still failing once set aside is required (an enabled channel's token): it gets a
    stand-in value; one failing even so has its section set aside."""
    found: list[tuple[str, str]] = []  # before, these only set keys aside and were never shown
    stand_ins: list[KeyPath] = []
    for _ in range(6):
        kept = standing_in(without(data, bad), stand_ins)
        kept_env = {n: v for n, v in env.items() if not near(env_path(n), bad)}
        token = _SOURCES.set((kept, kept_env))
        try:
            settings = Settings()
        except ValidationError as exc:
            for err in exc.errors():
                p = loc_path(err["loc"])
                if p in stand_ins:
                    bad.append(loc_path(p[:-1]))
                elif p in bad:
                    stand_ins.append(p)
                else:  # news: a problem of its own, not one of setting something aside
                    bad.append(p)
                    found.append(problem(err, env, data))
            # a stand-in inside a section now set aside would bring that section back
            stand_ins = [s for s in stand_ins if not any(s[: len(b)] == b and s != b for b in bad)]
            continue
        finally:
            _SOURCES.reset(token)
        # an agent or a tool set aside is missing, not wrong: where it is used (an agent's
        # tools, a binding) that is no news
        names = {str(b[2]) for b in bad if b[:2] == ("tools", "http") and len(b) > 2}
        names |= {str(b[1]) for b in bad if b[:1] == ("agents",) and len(b) > 1}
        return found + [
            (k, sourced(k, m, env, data))
            for k, m in _rules()(settings)
            if not near(key_path(k), bad)
            and not (_uses_names(k) and any(re.search(rf"\b{re.escape(n)}\b", m) for n in names))
        ]
    return found


def _uses_names(key: str) -> bool:
    """A key that names tools or agents: `agent.tools`, `agents.X.tools`, `bindings[N]...`."""
    return key.endswith(".tools") or key.startswith("bindings")


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def _is_host_name(host: str) -> bool:
    """RFC 1123 syntax (plus _); an all-digit last label (999.1.1.1) is a bad address instead."""
    labels = host.removesuffix(".").split(".")
    return (
        len(host) <= 253
        and all(_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    )


def _rules() -> Callable[[Settings], list[tuple[str, str]]]:
    """The rules across keys (gateway.config_checks), which read Settings: imported when
    first used, as the two modules would import each other."""
    from gateway.config_checks import semantic_problems

    return semantic_problems
