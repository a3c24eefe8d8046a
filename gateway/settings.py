"""Typed configuration, read once: one TOML file, ${VAR} interpolation, SWITCHBOARD__* overrides.

Precedence: environment (SWITCHBOARD__SECTION__KEY) over the file over defaults. Every problem
is reported as (dotted key, message) through ConfigError; nothing here ever shows a traceback.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import tomllib
import types
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from channels.config import REQUIRED_WHEN_ENABLED, ChannelSection
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

__all__ = ["DEFAULT_CONFIG", "EXAMPLE_CONFIG", "Settings", "load_settings"]

DEFAULT_CONFIG = Path("config/switchboard.toml")
EXAMPLE_CONFIG = Path("config/switchboard.example.toml")
ENV_PREFIX = "SWITCHBOARD__"
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
    table = get_origin(leaf) is dict or leaf is dict or _is_model(leaf)
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


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _annotation_at(root: type[BaseModel], path: list[str]) -> Any:
    """The type of the key at path (`dict[str, Model]` entries included), or None if unknown."""
    node: Any = root
    for part in path:
        if get_origin(node) is dict:  # this part names an entry
            node = _without_none(get_args(node)[1])
        elif _is_model(node):
            field = node.model_fields.get(part)
            if field is None:
                return None
            node = _without_none(field.annotation)
        else:
            return None
    return node


def _without_none(annotation: Any) -> Any:
    """X for `X | None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


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
        env = {n: v for n, v in env.items() if _env_path(n)[:1] in kept}
    mistyped = _mistyped(data, Settings, "")  # the file's own values, before any ${VAR}
    unset: list[tuple[str, str]] = []  # reported with every other problem, not alone
    data = _interpolate(data, env, "", unset)
    # an override's ${VAR} is read too: taken as text, "${ADMIN_TOKEN}" became the token
    in_overrides: list[tuple[str, str]] = []
    overrides = {
        name: _interpolate(value, env, ".".join(keys), in_overrides)
        for name, value in env.items()
        if (keys := _env_path(name)) and "${" in value
    }
    unset += [(key, reason + env_source(key, env)) for key, reason in in_overrides]
    env = {**env, **overrides} if overrides else env
    # set aside from the start: lax, `enabled = 1` enabled the channel, which then lacked a token
    aside = [_key_path(k) for k, _ in mistyped]
    token = _SOURCES.set((_without(data, aside), env))
    try:
        settings, errors = Settings(), []
    except ValidationError as exc:
        settings, errors = None, exc.errors()
    finally:
        _SOURCES.reset(token)
    problems = mistyped + [_problem(e, env, data) for e in errors if _path(e["loc"]) not in aside]
    if problems or settings is None:
        problems += _more_problems(data, env, [_path(err["loc"]) for err in errors] + aside)
    else:  # a rule across keys names the variables that set its key, as a field's error does
        problems = [(k, _sourced(k, m, env, data)) for k, m in _rules()(settings)]
    problems = unset + [p for p in problems if not _covered(p[0], unset)]
    if only is not None:
        problems = [p for p in problems if p[0].split(".")[0].split("[")[0] in only]
    if problems or settings is None:
        raise ConfigError(problems)
    return settings


def _mistyped(data: Any, model: Any, key: str) -> list[tuple[str, str]]:
    """The file's values of the wrong TOML type that pydantic's lax mode would take
    (`enabled = 1` enabled a channel, `token_budget = "7000"` was a number): TOML has a type
    for each, so the file must use it. Text from ${VAR} is not checked: like a
    SWITCHBOARD__ override, it is text by nature, read as the key's type ("true", "8080")."""
    out: list[tuple[str, str]] = []
    if _is_model(model) and isinstance(data, dict):
        for name, value in data.items():
            field = model.model_fields.get(name)
            if field is not None:  # an unknown key is reported as one
                sub = f"{key}.{name}" if key else name
                out += _mistyped(value, _without_none(field.annotation), sub)
    elif get_origin(model) is dict and isinstance(data, dict):
        item = _without_none(get_args(model)[1])
        if _is_model(item):  # [tools.http.NAME], [agents.NAME]: checked key by key
            for name, value in data.items():
                out += _mistyped(value, item, f"{key}.{name}")
        else:
            out += _strictly(data, model, key)
    elif get_origin(model) is list and isinstance(data, list):
        item = get_args(model)[0]
        for i, value in enumerate(data):
            out += _mistyped(value, item, f"{key}[{i}]")
    elif not (isinstance(data, str) and "${" in data):
        out += _strictly(data, model, key)
    return out


def _strictly(value: Any, annotation: Any, key: str) -> list[tuple[str, str]]:
    """A problem at `key` when `value` is of the right type only to lax validation. Strict is
    JSON's strictness, which TOML's types match: a whole number is a number, a string may be
    one of an enumeration's values."""
    adapter = _adapter(annotation)
    try:
        lax = adapter.validate_python(value)
    except ValidationError:
        return []  # wrong whatever the mode: reported by the validation of the whole
    if isinstance(value, bool) and not isinstance(lax, bool):
        return []  # true for a number: each section refuses it, in its own words
    try:
        text = json.dumps(value)
    except TypeError:  # a TOML date in a tool's parameters, which then failed to be sent
        return [(key, f"a date or a time, which JSON cannot carry, in {_toml(value)}: quote it")]
    try:
        adapter.validate_json(text, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        quoted = " (in quotes, it is text)" if isinstance(value, str) else ""
        wanted = _WANTED.get(err["type"])
        told = f"must be {wanted}" if wanted else str(err["msg"])
        return [(key, f"{told}, not {_toml(value)}{quoted}")]
    return []


_WANTED = {"bool_type": "true or false", "int_type": "a whole number", "float_type": "a number"}


def _toml(value: Any) -> str:
    """How the file spells a value, near enough: "yes", 1, 2.0, true (a date as text)."""
    return json.dumps(value, default=str)


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


# keys and list positions from the top of the configuration: ("bindings", 0, "agent")
_KeyPath = tuple[str | int, ...]


def _more_problems(
    data: dict[str, Any], env: Mapping[str, str], bad: list[_KeyPath]
) -> list[tuple[str, str]]:
    """The problems the first validation could not see: a rule over a whole tool or section,
    which pydantic checks only once each of its keys is valid, and the rules across keys. They
    are checked among the keys that are valid (the failing ones set aside, and whatever setting
    them aside makes fail in turn), so that check reports every problem at once rather than one
    kind per attempt. Nothing about a key set aside.

    A key still failing once set aside is required (an enabled channel's token): it gets a
    stand-in value; one failing even so has its section set aside."""
    found: list[tuple[str, str]] = []  # before, these only set keys aside and were never shown
    stand_ins: list[_KeyPath] = []
    for _ in range(6):
        kept = _standing_in(_without(data, bad), stand_ins)
        kept_env = {n: v for n, v in env.items() if not _near(_env_path(n), bad)}
        token = _SOURCES.set((kept, kept_env))
        try:
            settings = Settings()
        except ValidationError as exc:
            for err in exc.errors():
                p = _path(err["loc"])
                if p in stand_ins:
                    bad.append(_path(p[:-1]))
                elif p in bad:
                    stand_ins.append(p)
                else:  # news: a problem of its own, not one of setting something aside
                    bad.append(p)
                    found.append(_problem(err, env, data))
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
            (k, _sourced(k, m, env, data))
            for k, m in _rules()(settings)
            if not _near(_key_path(k), bad)
            and not (_uses_names(k) and any(re.search(rf"\b{re.escape(n)}\b", m) for n in names))
        ]
    return found


def _uses_names(key: str) -> bool:
    """A key that names tools or agents: `agent.tools`, `agents.X.tools`, `bindings[N]...`."""
    return key.endswith(".tools") or key.startswith("bindings")


def _standing_in(data: dict[str, Any], paths: list[_KeyPath]) -> dict[str, Any]:
    """`data` with a placeholder string at each of `paths` (a required secret, say)."""
    out = dict(data)
    for path in paths:
        out = _put(out, path, "stand-in")
    return out


def _put(node: Any, path: _KeyPath, value: Any) -> Any:
    """A copy of `node` with `value` at `path`, tables made where they are missing."""
    if not path:
        return value
    part, rest = path[0], path[1:]
    if isinstance(part, int):
        items = list(node) if isinstance(node, list) else []
        if part < len(items):
            items[part] = _put(items[part], rest, value)
        return items
    table = dict(node) if isinstance(node, dict) else {}
    table[part] = _put(table.get(part), rest, value)
    return table


def _path(loc: tuple[Any, ...]) -> _KeyPath:
    """A pydantic location as a path to set aside. A list's item is set aside by its keys, never
    whole: dropping it would renumber the rest (a list item that is wrong as a whole, a name
    in a list of names, has its list set aside)."""
    out = [p if isinstance(p, int) else str(p) for p in loc]
    while out and isinstance(out[-1], int):
        out.pop()
    return tuple(out)


def _key(loc: tuple[Any, ...]) -> str:
    """A pydantic location as the key problems name: `bindings[0].agent`, as the README and
    the ${VAR} problems spell it (not pydantic's `bindings.0.agent`)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _key_path(key: str) -> _KeyPath:
    """`bindings[0].agent` as ("bindings", 0, "agent")."""
    return tuple(int(i) if i else name for i, name in re.findall(r"\[(\d+)\]|([^.\[]+)", key))


def _near(path: _KeyPath, bad: list[_KeyPath]) -> bool:
    """`path` is, holds or lies inside one of `bad`."""
    return any(path[: len(b)] == b or b[: len(path)] == path for b in bad if b)


def _env_path(name: str) -> tuple[str, ...]:
    if not name.upper().startswith(ENV_PREFIX):
        return ()
    return tuple(name[len(ENV_PREFIX) :].lower().split("__"))


def _without(data: Any, bad: list[_KeyPath]) -> Any:
    """`data` without the keys at `bad`, in tables and in the tables of lists."""
    if isinstance(data, list):
        return [_without(v, [b[1:] for b in bad if b[:1] == (i,)]) for i, v in enumerate(data)]
    if not isinstance(data, dict) or not bad:
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        inside = [b[1:] for b in bad if b and b[0] == key]
        if any(not rest for rest in inside):
            continue
        out[key] = _without(value, inside) if inside else value
    return out


def _covered(key: str, unset: list[tuple[str, str]]) -> bool:
    """Whether key is (inside) a value whose variable is unset: its empty stand-in is no news."""
    return any(key == bad or key.startswith((f"{bad}.", f"{bad}[")) for bad, _ in unset)


# "$${" (a literal "${"), a reference, or a "${" that starts none (a typo: refused, never kept
# as the text itself, which would make "${SECRET" the secret)
_VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


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
        if m.group(0) == "$${":
            return "${"
        if name is None:
            problems.append(
                (key, "a ${ that starts no ${NAME} or ${NAME:-default} (write $${ for the text)")
            )
            return m.group(0)
        if default is not None and "${" in default:
            problems.append((key, f"the default of ${{{name}:-...}} cannot hold another ${{NAME}}"))
            return m.group(0)
        value = env.get(name)
        if default is not None and not value:  # shell semantics: unset or empty
            return default
        if value is not None:
            return value
        problems.append((key, f"environment variable {name} is not set"))
        return ""

    return _VAR.sub(repl, value)


def _problem(err: Any, env: Mapping[str, str], data: dict[str, Any]) -> tuple[str, str]:
    key = _key(err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        return key, "unknown key" + env_source(key, env)
    msg = str(err["msg"]).removeprefix("Value error, ")
    return key, _sourced(key, msg, env, data, missing=err["type"] == "missing")


def _sourced(
    key: str, msg: str, env: Mapping[str, str], data: dict[str, Any], *, missing: bool = False
) -> str:
    """`msg` naming the variables behind the problem at `key`: those that set it, else those
    that made it required. A tool that SWITCHBOARD__TOOLS__HTTP__NAME__HEADERS alone made
    lacks its description, and a channel a variable enabled lacks its token: both named no
    variable, although the file had no such tool and the channel off."""
    source = env_source(key, env)
    parent = key.rpartition(".")[0]
    if source or not parent:
        return msg + source
    if missing and not _in_file(data, _key_path(parent)):
        return msg + env_source(parent, env)
    if msg.startswith(REQUIRED_WHEN_ENABLED):  # (in a mode)
        causes = ("enabled", "mode") if "mode" in msg else ("enabled",)
        return msg + _from({n for k in causes for n in _env_names(f"{parent}.{k}", env)})
    return msg


def _in_file(data: Any, path: _KeyPath) -> bool:
    """Whether the file has the table (or list item) at `path`."""
    for part in path:
        listed = isinstance(part, int) and isinstance(data, list) and part < len(data)
        if not (listed or (isinstance(data, dict) and part in data)):
            return False
        data = data[part]
    return True


def env_source(key: str, env: Mapping[str, str]) -> str:
    """ " (from SWITCHBOARD__…)" naming the variables that set `key` (the key itself, a list
    holding it, or a part of it), or "" when only the file did."""
    return _from(_env_names(key, env))


def _env_names(key: str, env: Mapping[str, str]) -> set[str]:
    # "bindings[0].agent" is in the list SWITCHBOARD__BINDINGS sets
    path = re.sub(r"\[\d+\]", "", key)
    var = ENV_PREFIX + path.replace(".", "__").upper()

    def sets_it(name: str) -> bool:
        n = name.upper()
        if not n.startswith(ENV_PREFIX):
            return False
        return n == var or var.startswith(f"{n}__") or n.startswith(f"{var}__")

    return {n for n in env if sets_it(n)}


def _from(names: set[str]) -> str:
    return f" (from {', '.join(sorted(names))})" if names else ""


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
