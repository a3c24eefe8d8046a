"""The configuration's rules that span keys, and its warnings: what `check` and `run` report
beyond each key's own type and range (channels enabled without their secrets, stores that
cannot open, models and agents, budgets, webhook URLs)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, SecretStr

from channels.config import url_problem
from core.agent.scripted import load_script
from core.errors import ConfigError
from core.skills import discover_skills
from gateway.agents_config import (
    DEFAULT_AGENT,
    AgentOverride,
    AgentSettings,
    ModelEndpoint,
    ModelSettings,
)
from gateway.settings import (
    ADMIN_TOKEN_MIN,
    CHANNEL_NAMES,
    PLATFORM_CHANNELS,
    Settings,
    is_dir,
)
from gateway.tools import BUILTIN_TOOLS

__all__ = ["secret_values", "semantic_problems", "settings_warnings"]


def _postgres_url_problem(url: str) -> str | None:
    """What makes a PostgreSQL URL unusable before any connection is tried (the driver would
    fail on it with a traceback), or None."""
    try:
        parts = urlsplit(url)
        if parts.fragment or "@" in parts.path + parts.query or parts.netloc.count("@") > 1:
            return (  # first: the port check below would quote a piece of such a password
                "the user or password holds a character URLs reserve (@ / # ?): percent-encode"
                " it (p@ss/w#rd is p%40ss%2Fw%23rd)"
            )
        parts.port  # noqa: B018 - reading it checks it: a number from 0 to 65535
    except ValueError as exc:
        return f"not a valid PostgreSQL URL ({exc}); e.g. postgresql://user:pass@host:5432/db"
    for mode in parse_qs(urlsplit(url).query).get("sslmode", []):
        if mode not in SSL_MODES:
            return f"sslmode={mode!r} is not one of {', '.join(SSL_MODES)}"
    return None


SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _sqlite_path_problem(path: str) -> str | None:
    """Why the store could not open (or create) its file there, as `run` would find out."""
    if "\x00" in path:
        return "a NUL character in the file's path"
    if "?" in path:  # sqlite:///x.db?mode=ro made a file named "x.db?mode=ro"
        return "no ?parameters: everything after sqlite:/// is the file's path"
    file = Path(path)
    if path.endswith("/") or file.is_dir():
        return f"{path} is a folder; name the database file in it"
    folder = next((d for d in file.parents if d.exists()), Path("."))
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK) or not _root_can_write(folder):
        # SQLite writes its -wal and -shm files beside the database
        return f"{folder} is not writable by this user"
    if file.exists() and not os.access(file, os.R_OK | os.W_OK):
        return f"{path} is not readable and writable by this user"
    return None


def _root_can_write(folder: Path) -> bool:
    """For root, whom access(2) lets write anywhere, whether a file can be made there (not
    in /proc, say): tried with a file removed at once."""
    if os.geteuid() != 0:
        return True
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def semantic_problems(s: Settings) -> list[tuple[str, str]]:
    """Rules that span keys. Channels fail closed: enabled without their secrets is an error."""
    p: list[tuple[str, str]] = []

    if not s.store.url.startswith(("sqlite:", "postgresql:", "postgres:")):
        p.append(("store.url", 'must start with "sqlite:///" or "postgresql://"'))
    elif s.store.url.startswith("sqlite:") and not s.store.url.startswith("sqlite:///"):
        p.append(("store.url", 'a SQLite URL looks like "sqlite:///data/switchboard.db"'))
    elif s.store.url.startswith("sqlite:") and s.sqlite_path() in (":memory:", "/"):
        # an in-memory database would lose every message at the next start
        p.append(("store.url", 'names no file; e.g. "sqlite:///data/switchboard.db"'))
    elif s.store.url.startswith("sqlite:") and (problem := _sqlite_path_problem(s.sqlite_path())):
        p.append(("store.url", problem))
    elif s.store.url.startswith("postgres") and not _has_asyncpg():
        p.append(("store.url", "PostgreSQL needs the postgres extra: pip install '.[postgres]'"))
    elif s.store.url.startswith("postgres") and (problem := _postgres_url_problem(s.store.url)):
        p.append(("store.url", problem))
    p.extend(_model_problems("model", s.model))
    p.extend(_agent_problems(s))
    url = s.server.public_url
    if url is not None and (problem := url_problem(url)):
        p.append(("server.public_url", problem))
    elif url is not None and ("?" in url or "#" in url):
        # the webhook addresses are built by adding /webhooks/... to it
        p.append(("server.public_url", "no ?query or #fragment: the routes' paths go after it"))

    for name in PLATFORM_CHANNELS:
        p.extend(getattr(s.channels, name).problems(s.server.public_url))
    token = s.admin.token.get_secret_value() if s.admin.token is not None else ""
    if token and len(token.strip()) < ADMIN_TOKEN_MIN:  # empty: the console is off
        p.append(("admin.token", f"at least {ADMIN_TOKEN_MIN} characters (or leave it unset)"))
    return p


def _model_problems(key: str, m: ModelEndpoint) -> list[tuple[str, str]]:
    p: list[tuple[str, str]] = []
    if m.provider == "openai" and not m.name:
        p.append((f"{key}.name", 'required for provider "openai" (e.g. "gpt-4o-mini")'))
    if m.provider == "anthropic" and not m.name:
        p.append((f"{key}.name", 'required for provider "anthropic" (e.g. "claude-sonnet-4-5")'))
    if m.base_url is not None and (problem := url_problem(m.base_url)):
        p.append((f"{key}.base_url", problem))
    blank_key = m.api_key is None or not m.api_key.get_secret_value().strip()
    if m.provider in ("openai", "anthropic") and m.base_url is None and blank_key:
        p.append((f"{key}.api_key", f"required for the {m.provider} API (or set base_url)"))
    if m.provider == "scripted":
        if not m.script:
            p.append((f"{key}.script", 'required for provider "scripted"'))
        else:
            try:
                load_script(m.script, key=f"{key}.script")
            except ConfigError as exc:
                p.extend(exc.problems)
    if isinstance(m, ModelSettings) and m.fallback is not None:
        p.extend(_model_problems(f"{key}.fallback", m.fallback))
    return p


def _agent_problems(s: Settings) -> list[tuple[str, str]]:
    p: list[tuple[str, str]] = []
    agents = s.resolved_agents()
    for name, agent in agents.items():
        key = "agent" if name == DEFAULT_AGENT else f"agents.{name}"
        if name != DEFAULT_AGENT and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", name):
            p.append((key, "agent names are lowercase letters, digits, - and _ (max 32)"))
        if name == DEFAULT_AGENT and name in s.agents:
            p.append(("agents.default", "the default agent is configured in [agent]"))
        if not agent.settings.knowledge_dir.strip():  # "" is the working directory, all of it
            p.append((f"{key}.knowledge_dir", "empty: name the folder of the knowledge base"))
        elif not is_dir(agent.settings.knowledge_dir):
            p.append((f"{key}.knowledge_dir", f"not a directory: {agent.settings.knowledge_dir}"))
        own = s.agent if name == DEFAULT_AGENT else s.agents[name]
        if problem := _skills_dir_problem(agent.settings.skills_dir, own):
            p.append((f"{key}.skills_dir", problem))
        else:
            try:
                discover_skills(agent.settings.skills_dir)
            except ConfigError as exc:
                p.extend((f"{key}.skills_dir", f"{k}: {m}") for k, m in exc.problems)
        known = set(BUILTIN_TOOLS) | set(s.tools.http)
        unknown = sorted(set(agent.settings.tools or ()) - known)
        if unknown:
            p.append((f"{key}.tools", f"unknown tools: {', '.join(unknown)}"))
        if name in s.agents and s.agents[name].model is not None:
            p.extend(_model_problems(f"{key}.model", agent.model))
    for name in s.tools.http:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            p.append((f"tools.http.{name}", "tool names are letters, digits, - and _ (max 64)"))
        elif name in BUILTIN_TOOLS:
            p.append((f"tools.http.{name}", "that name belongs to a built-in tool"))
    for i, binding in enumerate(s.bindings):
        target = agents.get(binding.agent)
        if target is None:
            p.append((f"bindings[{i}].agent", f"no agent named {binding.agent!r}"))
        elif target.draft:
            p.append((f"bindings[{i}].agent", f"agent {binding.agent!r} is a draft"))
        if binding.channel is not None and binding.channel not in CHANNEL_NAMES:
            p.append((f"bindings[{i}].channel", f"unknown channel {binding.channel!r}"))
    return p


def _skills_dir_problem(folder: str, own: AgentSettings | AgentOverride) -> str | None:
    """A skills folder the configuration names must exist, as a knowledge_dir must: one
    misspelt left the agent without its skills, and check said nothing. The default
    (config/skills) may be absent: an agent needs no skills."""
    if "skills_dir" not in own.model_fields_set:  # the default, or [agent]'s (checked there)
        return None
    if not folder.strip():  # "" is the working directory
        return "empty: name the folder of the skills (or leave it unset)"
    return None if is_dir(folder) else f"not a directory: {folder}"


def _has_asyncpg() -> bool:
    import importlib.util

    return importlib.util.find_spec("asyncpg") is not None


def secret_values(s: Settings) -> list[str]:
    """Every secret the configuration holds, so logs can be scrubbed of them."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(s)
    for tool in s.tools.http.values():
        found.extend(tool.headers.values())
    if (m := re.search(r"//[^:/@]+:([^@]+)@", s.store.url)) is not None:
        found.append(m.group(1))
    return [v for v in found if v]


ROOM_FOR_A_MESSAGE = 200  # tokens: a person's message of a few sentences, in its tags


def _budget_warning(a: AgentSettings, s: Settings) -> str | None:
    """Whether token_budget leaves room for a message and a whole answer once the system
    prompt and the tool definitions, which every call repeats, are counted."""
    from gateway.tools import standing_tokens  # builds the tools: only when asked

    try:
        standing = standing_tokens(a, s.tools.http)
    except ConfigError:  # a broken skill: reported as a problem under skills_dir
        return None
    lim = a.limits
    needed = standing + ROOM_FOR_A_MESSAGE + lim.max_output_tokens
    if lim.token_budget >= needed:
        return None
    left = max(lim.token_budget - standing, 0)
    return (
        f"the system prompt and the tool definitions take about {standing} of its "
        f"{lim.token_budget} tokens in every model call, leaving {left}"
        f" for the conversation and a {lim.max_output_tokens}-token answer (max_output_tokens):"
        f" answers will be cut short, or runs will end before answering. Raise it to at least"
        f" {needed}"
    )


def settings_warnings(s: Settings) -> list[tuple[str, str]]:
    """Valid but worth saying: things that will not do what the operator may expect."""
    w: list[tuple[str, str]] = []
    from gateway.channels import available  # settings must not import channel code eagerly

    for name in PLATFORM_CHANNELS:
        if getattr(s.channels, name).enabled and not available(name):
            w.append(
                (f"channels.{name}.enabled", "this channel is not available in this version yet")
            )
    for name, agent in s.resolved_agents().items():
        m, run_timeout = agent.model, agent.settings.limits.run_timeout_s
        # the first model's retries stop at half the run; one more call may take timeout_s
        if m.fallback is not None and m.timeout_s >= run_timeout / 2:
            w.append(
                (
                    "model.fallback" if name == DEFAULT_AGENT else f"agents.{name}.model.fallback",
                    "a first model that does not answer holds the run past half of "
                    "agent.limits.run_timeout_s, leaving the fallback little or no time; lower "
                    "model.timeout_s",
                )
            )
        if agent.draft:
            w.append((f"agents.{name}", "draft (no instructions, or draft = true): not served"))
        elif (budget := _budget_warning(agent.settings, s)) is not None:
            key = "agent" if name == DEFAULT_AGENT else f"agents.{name}"
            w.append((f"{key}.limits.token_budget", budget))
    if not (
        s.channels.web.enabled
        or any(getattr(s.channels, n).enabled for n in ("telegram", "slack", "whatsapp"))
    ):
        w.append(("channels", "no channel is enabled; only `switchboard chat` can reach the agent"))
    w.extend(_webhook_url_warnings(s))
    if (s.server.public_url or "").startswith("https://") and not s.server.trust_forwarded:
        w.append(
            (
                "server.trust_forwarded",
                "off with an https public_url: behind a TLS proxy, set it (and have the proxy "
                "send X-Forwarded-Proto and X-Forwarded-For) or cookies lose Secure, the web "
                "chat cannot be embedded in another site, and every client has the proxy's "
                "address",
            )
        )
    return w


TELEGRAM_PORTS = (443, 80, 88, 8443)  # the ports setWebhook accepts


def _webhook_url_warnings(s: Settings) -> list[tuple[str, str]]:
    """A public URL the platforms will not deliver webhooks to (they call only https://)."""
    c, url = s.channels, s.server.public_url
    callers = [
        name
        for name, on in (
            ("Telegram", c.telegram.enabled and c.telegram.effective_mode(url) == "webhook"),
            ("Slack", c.slack.enabled and c.slack.mode == "events"),
            ("WhatsApp", c.whatsapp.enabled),
        )
        if on
    ]
    if url is None and "Telegram" in callers:  # updates come, once Telegram is told where
        why = (
            "unset: Telegram delivers no webhook until `switchboard telegram set-webhook` "
            'gives it this address (or set channels.telegram.mode = "polling")'
        )
        return [("server.public_url", why)]
    if url is None or not callers:
        return []
    parts = urlsplit(url)
    if parts.scheme != "https":
        return [("server.public_url", f"{', '.join(callers)} deliver webhooks only to https://")]
    try:
        port = parts.port or 443
    except ValueError:
        return []
    if "Telegram" in callers and port not in TELEGRAM_PORTS:
        ports = ", ".join(map(str, TELEGRAM_PORTS))
        return [("server.public_url", f"Telegram delivers webhooks only to ports {ports}")]
    return []
