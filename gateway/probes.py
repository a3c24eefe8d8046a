"""`switchboard check`'s live part: each enabled channel's credentials and the model endpoint
tried against their APIs, and the webhook URLs to configure on each platform."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.client import SlackApi
from channels.slack.settings import SlackSettings
from channels.telegram.client import TelegramClient
from channels.telegram.settings import TelegramSettings
from channels.whatsapp.client import GraphClient
from channels.whatsapp.settings import WhatsAppSettings
from core.errors import SwitchboardError
from gateway.agents_config import DEFAULT_AGENT, ModelEndpoint
from gateway.settings import Settings
from providers.anthropic import ANTHROPIC_VERSION, DEFAULT_BASE_URL

__all__ = ["Probe", "probe_all", "webhook_urls"]

TIMEOUT_S = 8.0


@dataclass(frozen=True, slots=True)
class Probe:
    name: str
    ok: bool
    detail: str


# the key whose value each check tries, named when it fails
_KEYS = {
    "telegram": "channels.telegram.token",
    "slack": "channels.slack.bot_token",
    "slack socket": "channels.slack.app_token",
    "whatsapp": "channels.whatsapp.access_token, channels.whatsapp.phone_number_id",
}


def webhook_urls(settings: Settings) -> list[tuple[str, str]]:
    """(platform, URL to configure there) for every enabled channel that is called by URL."""
    base = (settings.server.public_url or "https://<server.public_url>").rstrip("/")
    c = settings.channels
    out: list[tuple[str, str]] = []
    if c.telegram.enabled and c.telegram.effective_mode(settings.server.public_url) == "webhook":
        out.append(("telegram", f"{base}/webhooks/telegram (switchboard telegram set-webhook)"))
    if c.slack.enabled and c.slack.mode == "events":
        out.append(("slack", f"{base}/webhooks/slack (Event Subscriptions and Interactivity)"))
    if c.whatsapp.enabled:
        out.append(("whatsapp", f"{base}/webhooks/whatsapp (callback URL, with the verify token)"))
    return out


async def probe_all(settings: Settings) -> list[Probe]:
    """Try every enabled channel's credentials and every configured model; never raises."""
    checks: list[tuple[str, Callable[[], Awaitable[str]], str]] = []  # name, check, its keys
    if settings.store.url.startswith("postgres"):
        checks.append(("store (PostgreSQL)", lambda: _postgres(settings.store.url), "store.url"))
    c = settings.channels
    if c.telegram.enabled:
        checks.append(("telegram getMe", lambda: _telegram(c.telegram), _KEYS["telegram"]))
    if c.slack.enabled:
        checks.append(("slack auth.test", lambda: _slack(c.slack), _KEYS["slack"]))
        if c.slack.mode == "socket":
            check = ("slack app_token (Socket Mode)", lambda: _slack_socket(c.slack))
            checks.append((*check, _KEYS["slack socket"]))
    if c.whatsapp.enabled:
        checks.append(("whatsapp phone number", lambda: _whatsapp(c.whatsapp), _KEYS["whatsapp"]))
    seen: set[str] = set()
    for name, agent in settings.resolved_agents().items():
        section = "model" if name == DEFAULT_AGENT else f"agents.{name}.model"
        for label, endpoint in (("model", agent.model), ("fallback", agent.model.fallback)):
            if endpoint is None or endpoint.provider in ("offline", "scripted"):
                continue
            ident = f"{endpoint.provider}:{endpoint.base_url}:{endpoint.name}"
            if ident not in seen:
                seen.add(ident)
                at = section if label == "model" else f"{section}.fallback"
                keys = ", ".join(f"{at}.{k}" for k in ("base_url", "api_key", "name"))
                checks.append(
                    (f"{label} of {name} ({endpoint.provider})", _model_check(endpoint), keys)
                )
    probes = await asyncio.gather(*(_run(name, check) for name, check, _ in checks))
    return [
        p if p.ok else Probe(p.name, False, f"{p.detail} (check {_hint(p, keys)})")
        for p, (_, _, keys) in zip(probes, checks, strict=True)
    ]


# how a failed call reads when the server was never reached (httpx, aiohttp, the Graph client)
# or what answered is not the platform's API (a body that is not JSON)
_UNREACHED = ("Connect", "unreachable", "no answer within", "not JSON")


def _hint(probe: Probe, keys: str) -> str:
    """The keys to look at: a server never reached says nothing of the credentials, so the
    address is named (a channel's api_base) instead of its token."""
    if not any(mark in probe.detail for mark in _UNREACHED):
        return keys
    section = keys.split(",")[0].rpartition(".")[0]
    return f"{section}.api_base" if section.startswith("channels.") else keys


def _model_check(endpoint: ModelEndpoint) -> Callable[[], Awaitable[str]]:
    return lambda: _model(endpoint)


async def _run(name: str, check: Callable[[], Awaitable[str]]) -> Probe:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            return Probe(name, True, await check())
    except TimeoutError:
        return Probe(name, False, f"no answer within {TIMEOUT_S:g} s")
    except (SwitchboardError, httpx.HTTPError, OSError) as exc:
        return Probe(name, False, str(exc)[:200] or type(exc).__name__)
    except Exception as exc:  # a library's own complaint about a value: still a report
        return Probe(name, False, f"{type(exc).__name__}: {str(exc)[:200]}")


async def _postgres(url: str) -> str:
    """Connect, and find the schema the tables go in; nothing is created (`run` does that)."""
    import asyncpg  # the postgres extra, present whenever such a URL passed validation

    from core.store.postgres import DRIVER_ERRORS

    try:
        conn = await asyncpg.connect(url, timeout=TIMEOUT_S)
        try:
            version = await conn.fetchval("SHOW server_version")
            schema = await conn.fetchval("SELECT current_schema()")
        finally:
            await conn.close()
    except (ValueError, *DRIVER_ERRORS) as exc:  # ValueError: a URL the driver cannot read
        raise SwitchboardError(str(exc) or type(exc).__name__) from None
    if schema is None:
        raise SwitchboardError("no schema of the URL's search_path exists; create it first")
    return f"PostgreSQL {str(version).split()[0]}, schema {schema}"


async def _telegram(section: TelegramSettings) -> str:
    client = TelegramClient(section)
    try:
        me = await client.call(client.bot.get_me)
    finally:
        await client.aclose()
    return f"@{me.username}"


async def _slack(section: SlackSettings) -> str:
    token = section.bot_token.get_secret_value() if section.bot_token else ""
    api = SlackApi(AsyncWebClient(token=token, base_url=section.api_base + "/"))
    data = await api.auth_test()
    return f"{data.get('user', '?')} in {data.get('team', '?')}"


async def _slack_socket(section: SlackSettings) -> str:
    """apps.connections.open with the app-level token: the call Socket Mode starts with (the
    URL it gives is left unused and expires)."""
    token = section.app_token.get_secret_value() if section.app_token else ""
    api = SlackApi(AsyncWebClient(base_url=section.api_base + "/"))
    await api.open_connection(token)
    return "a connection URL was issued"


async def _whatsapp(section: WhatsAppSettings) -> str:
    token = section.access_token.get_secret_value() if section.access_token else ""
    graph = GraphClient(section.api_base, section.api_version, token, TIMEOUT_S)
    numbers = [n for n in [section.phone_number_id, *section.phone_number_ids] if n]
    try:
        found = [await graph.lookup(number) for number in dict.fromkeys(numbers)]
    finally:
        await graph.aclose()
    return ", ".join(str(f.get("display_phone_number", "?")) for f in found)


async def _model(m: ModelEndpoint) -> str:
    """List the models: proves the URL and the key without spending tokens."""
    key = m.api_key.get_secret_value() if m.api_key else None
    if m.provider == "anthropic":
        url = (m.base_url or DEFAULT_BASE_URL).rstrip("/").removesuffix("/v1") + "/v1/models"
        headers = {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}
    else:
        url = (m.base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.get(url, headers=headers)
    if response.status_code in (401, 403):
        raise SwitchboardError(f"the endpoint refused the key (HTTP {response.status_code})")
    if response.status_code >= 400:
        raise SwitchboardError(f"HTTP {response.status_code} from {url}")
    ids = [str(x.get("id")) for x in (response.json().get("data") or []) if isinstance(x, dict)]
    if m.name and ids and m.name not in ids:
        return f"reachable, but {m.name!r} is not among its {len(ids)} models"
    return "reachable" + (f", {m.name} listed" if m.name in ids else "")
