"""A small typed client of the WhatsApp Cloud API (Graph API) over aiohttp.

Graph errors arrive as `{"error": {"code", "message", ...}}`, usually with HTTP 400, so the
client branches on `error.code`, not on the status, and translates every failure into
ChannelError: `code` is the Graph code as text ("131026"), or "auth" for a bad token.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from core.agent.http_tools import host_allowed
from core.errors import ChannelError

__all__ = ["PAIR_LIMITED", "RE_ENGAGEMENT", "THROTTLED", "GraphClient", "Media"]

log = logging.getLogger(__name__)

RE_ENGAGEMENT = 131047  # more than 24 h since the customer's last message: template only
PAIR_LIMITED = 131056  # too many messages to this one customer
# the business number's (or the app's) throughput: back off on the number
THROTTLED = frozenset({4, 80007, 130429, 131057})
TRANSIENT = frozenset({1, 2, 131000, 133004})  # "unknown", "service unavailable": retry
AUTH = frozenset({0, 190})


@dataclass(frozen=True, slots=True)
class Media:
    """What GET /<media id> answers: where to fetch the bytes, and what they are."""

    url: str
    mime: str | None
    size: int | None


class MediaTooLarge(ChannelError):
    """The file is over the configured cap (announced or while streaming)."""


class GraphClient:
    def __init__(
        self,
        base_url: str,
        version: str,
        token: str,
        timeout_s: float,
        media_hosts: tuple[str, ...] = (),
    ) -> None:
        self._base = base_url.rstrip("/")
        self._version = version.strip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        # a per-read timeout, not a total one: a large download that keeps coming is fine
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeout_s, sock_read=timeout_s
        )
        # the bearer token goes only to the Graph host and the media hosts allowed here
        self._media_hosts = (urlsplit(base_url).hostname or "", *media_hosts)
        self._http: aiohttp.ClientSession | None = None  # made on first use, in the loop
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ChannelError("WhatsApp client is shut down", retryable=True)
        if self._http is None:
            self._http = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._http

    async def send(self, number: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /<version>/<number>/messages with `messaging_product` added."""
        body = {"messaging_product": "whatsapp", **payload}
        return await self._call("POST", f"/{self._version}/{number}/messages", json=body)

    async def message_id(self, number: str, payload: dict[str, Any]) -> str:
        """Send a message; returns its wamid."""
        data = await self.send(number, payload)
        try:
            return str(data["messages"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ChannelError(
                "Graph API answered without a message id", code="bad_response"
            ) from None

    async def lookup(self, number: str) -> dict[str, Any]:
        """The business number's public details (checks the token and the number id)."""
        fields = "display_phone_number,verified_name"
        return await self._call("GET", f"/{self._version}/{number}", params={"fields": fields})

    async def media(self, media_id: str, number: str) -> Media:
        data = await self._call(
            "GET", f"/{self._version}/{media_id}", params={"phone_number_id": number}
        )
        url, size = data.get("url"), data.get("file_size")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise ChannelError("media lookup answered without a URL", code="bad_response")
        mime = data.get("mime_type")
        return Media(
            url,
            mime if isinstance(mime, str) else None,
            int(size) if isinstance(size, int | str) and str(size).isdigit() else None,
        )

    async def download(self, url: str, cap: int) -> bytes:
        """The media bytes (the bearer token is required here too), at most `cap` of them."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - reading it checks it
        except ValueError:  # e.g. "https://[host/x": an answer nobody can fetch
            raise ChannelError("media URL is not a valid URL", code="bad_response") from None
        if not host_allowed(parts.hostname or "", self._media_hosts):
            raise ChannelError(f"media host {parts.hostname!r} is not allowed", code="host")
        if parts.scheme != "https" and not (parts.scheme == "http" and _loopback(parts.hostname)):
            # the access token goes with the request: never in the clear
            raise ChannelError("media URL is not https", code="host")
        try:
            # no redirects: the token must not follow one to a host nobody allowed
            async with self._session().get(url, allow_redirects=False) as resp:
                if resp.status >= 400:
                    raise graph_error(resp.status, _json_or_none(await resp.read()))
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise MediaTooLarge(f"media of {declared} bytes", code="too_large")
                data = bytearray()
                async for piece in resp.content.iter_any():
                    data.extend(piece)
                    if len(data) > cap:
                        raise MediaTooLarge(f"media over {cap} bytes", code="too_large")
                return bytes(data)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ChannelError(
                f"media download failed: {type(exc).__name__}", retryable=True
            ) from None

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            async with self._session().request(method, self._base + path, **kw) as resp:
                status, body = resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ChannelError(
                f"Graph API unreachable: {type(exc).__name__}", retryable=True
            ) from None
        data = _json_or_none(body)
        if status >= 400:
            raise graph_error(status, data)
        if not isinstance(data, dict):
            raise ChannelError("Graph API answered with no JSON object", code="bad_response")
        return data


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def graph_error(status: int, body: Any) -> ChannelError:
    """The ChannelError for a failed Graph call (HTTP `status`, JSON `body` if any)."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code = err.get("code")
    code = code if isinstance(code, int) else None
    title = str(err.get("message") or f"HTTP {status}")[:200]
    if code in AUTH or status == 401:
        log.error("WhatsApp access token rejected (%s): operator action needed", title)
        return ChannelError(f"WhatsApp auth failed: {title}", code="auth")
    text = f"WhatsApp error {code}: {title}" if code is not None else f"WhatsApp: {title}"
    label = str(code) if code is not None else f"http_{status}"
    retryable = (
        code in THROTTLED
        or code in TRANSIENT
        or code == PAIR_LIMITED
        or status >= 500
        or (code is None and status == 429)
    )
    return ChannelError(text, retryable=retryable, code=label)


def _loopback(host: str | None) -> bool:
    """A host on this machine (a local stand-in for the Graph API, as the tests run one)."""
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return host == "localhost"
