"""HTTP tools declared in configuration, with no code: a URL template, a JSON schema for the
arguments, secret headers, and a host allowlist that nothing else gets past.

SSRF defences: only http(s); the host must be allowlisted; every address it resolves to must
be public unless `allow_private` (so a tool cannot be pointed at loopback, the LAN or cloud
metadata); an argument filling a path segment cannot be "." or ".." (which would move the call
to another path); redirects are followed by hand, each hop re-checked, the configured headers
sent only to the tool's own origin (or its https upgrade) and never over a downgrade to plain
http; the response is read up to a byte cap. (Between our DNS check and httpx's own lookup a
name could change: allowlisting names you control is what makes that window harmless.)
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx
from pydantic import BaseModel, RootModel, model_validator

from core.agent.tools import ToolContext
from core.errors import ToolError
from core.redact import Blanker

__all__ = ["PLACEHOLDER", "HttpTool", "HttpToolSpec", "host_allowed"]

log = logging.getLogger(__name__)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MAX_REDIRECTS = 3
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class HttpToolSpec:
    name: str
    description: str
    url: str  # template: "https://api.example.com/orders/{order_id}"
    method: str = "GET"
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    headers: dict[str, str] = field(default_factory=dict)
    allow_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    timeout_s: float = 10.0
    max_response_bytes: int = 65_536
    read_only: bool = True
    confirm: bool = False


def host_allowed(host: str, allow: tuple[str, ...]) -> bool:
    """Exact names, or "*.example.com" for its subdomains."""
    host = host.lower().rstrip(".")
    for pattern in allow:
        p = pattern.lower().rstrip(".")
        if host == p or (p.startswith("*.") and host.endswith(p[1:])):
            return True
    return False


def _args_model(spec: HttpToolSpec) -> type[BaseModel]:
    """A pydantic model whose schema is the configured one and whose validation is JSON
    Schema's, so the model sees exactly what the operator wrote."""
    from jsonschema import Draft202012Validator  # 2-3 MB: only for a gateway with HTTP tools

    validator = Draft202012Validator(spec.parameters)
    schema = spec.parameters

    class Args(RootModel[dict[str, Any]]):
        @model_validator(mode="after")
        def _valid(self) -> Args:
            errors = sorted(validator.iter_errors(self.root), key=lambda e: list(e.path))
            if errors:
                where = "/".join(str(p) for p in errors[0].path) or "arguments"
                raise ValueError(f"{where}: {errors[0].message}")
            return self

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(schema)

    Args.__name__ = f"{spec.name}_args"
    return Args


@functools.cache
def _tls() -> ssl.SSLContext:
    """The certificate checks every call makes, built once: a new client built its own, reading
    the whole CA bundle (about 50 ms, a tenth of a core at a few calls a second)."""
    return httpx.create_ssl_context()


class HttpTool:
    """One configured HTTP endpoint as a tool."""

    def __init__(self, spec: HttpToolSpec, *, transport: httpx.AsyncBaseTransport | None = None):
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.args_model = _args_model(spec)
        self.read_only = spec.read_only
        self.timeout_s = spec.timeout_s
        self.confirm = spec.confirm
        self._transport = transport
        # an endpoint may echo the request back: its headers (tokens) never reach the model,
        # the run record or the history
        self._blank = Blanker(spec.headers.values())

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> dict[str, Any]:
        values = dict(args.model_dump())
        url = self._url(values)
        origin = _origin(url)
        method = self.spec.method.upper()
        params = values if method not in BODY_METHODS else None
        body = values if method in BODY_METHODS else None
        async with httpx.AsyncClient(
            timeout=self.spec.timeout_s,
            follow_redirects=False,
            transport=self._transport,
            verify=_tls(),
        ) as client:
            for _ in range(MAX_REDIRECTS + 1):
                await self._check(url)
                target = httpx.URL(url).copy_merge_params(params) if params else httpx.URL(url)
                # the headers hold the tool's credentials: only for the origin they were meant for
                headers = self.spec.headers if _same_origin(origin, _origin(url)) else None
                request = client.build_request(method, target, json=body, headers=headers)
                try:
                    response = await client.send(request, stream=True)
                except httpx.TimeoutException as exc:
                    raise ToolError(f"{self.name} timed out") from exc
                except httpx.HTTPError as exc:
                    raise ToolError(
                        f"{self.name} could not connect ({type(exc).__name__})"
                    ) from exc
                try:
                    if response.is_redirect and "location" in response.headers:
                        following = urljoin(url, response.headers["location"])
                        if urlsplit(url).scheme == "https" and _origin(following)[0] == "http":
                            raise ToolError(f"{self.name}: refused a redirect from https to http")
                        url = following
                        params = None  # the Location is a complete URL
                        if response.status_code not in (307, 308):
                            method, body = "GET", None
                        continue
                    # read past the cap by the longest secret: blanked before the cut, a
                    # secret the cut would halve cannot leave its first part behind
                    cap = self.spec.max_response_bytes
                    data, truncated = await _read_capped(response, cap + self._blank.longest)
                finally:
                    await response.aclose()
                if truncated or len(data) > cap:
                    text, truncated = self._blank.cut(data, cap), True
                else:
                    text = self._blank(data.decode("utf-8", "replace"))
                return _result(response, text, truncated)
        raise ToolError(f"{self.name}: too many redirects")

    def _url(self, values: dict[str, Any]) -> str:
        """The template filled with the arguments it names (which then leave the query or
        body); each value is one URL-encoded piece, never a path step of its own."""
        template = self.spec.url
        query_at = template.find("?") if "?" in template else len(template)
        used: set[str] = set()

        def fill(m: re.Match[str]) -> str:
            key = m.group(1)
            if key not in values:
                raise ToolError(f"missing argument {key!r} for the URL")
            used.add(key)
            text = str(values[key])
            if m.start() < query_at and text in ("", ".", ".."):
                raise ToolError(f"{key}: {text!r} is not a valid value here")
            return quote(text, safe="")

        url = PLACEHOLDER.sub(fill, template)
        for key in used:
            del values[key]
        return url

    async def _check(self, url: str) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host:
            raise ToolError(f"{self.name}: only http(s) URLs are allowed")
        if not host_allowed(host, self.spec.allow_hosts):
            raise ToolError(f"{self.name}: host {host!r} is not on the allowlist")
        if self.spec.allow_private:
            return
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise ToolError(f"{self.name}: cannot resolve {host!r}") from exc
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                log.warning(
                    "tool %s refused non-public address %s for %s", self.name, address, host
                )
                raise ToolError(f"{self.name}: {host!r} is not a public address")


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # an out-of-range port: _check refuses the URL
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _same_origin(first: tuple[str, str, int], now: tuple[str, str, int]) -> bool:
    """The same scheme, host and port, or the same host upgraded from http to https on the
    default ports (as browsers and httpx let credentials follow)."""
    upgrade = first[0] == "http" and first[2] == 80 and now[0] == "https" and now[2] == 443
    return now == first or (upgrade and now[1] == first[1])


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            return b"".join(chunks)[:cap], True
    return b"".join(chunks), False


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _result(response: httpx.Response, text: str, truncated: bool) -> dict[str, Any]:
    body: Any = text
    if not truncated and "json" in response.headers.get("content-type", ""):
        try:
            body = json.loads(text, parse_constant=_not_json)
        except ValueError:  # NaN and Infinity included: the model is shown JSON only
            body = text
    out: dict[str, Any] = {"status": response.status_code, "body": body}
    if truncated:
        out["truncated"] = True
    if response.status_code >= 400:
        out["error"] = f"HTTP {response.status_code}"
    return out
