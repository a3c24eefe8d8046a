"""What the HTTP model clients share: one aiohttp session, the retry rule, and a call that
streams or not.

aiohttp rather than httpx: on the benchmark's 100 concurrent conversations httpx spent about
ten times the CPU per call (its connection pool checks every connection on each request).
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
from cachetools import LRUCache
from yarl import URL

from core.agent.model import DeltaSink, ModelRequest, ModelResponse, ToolSpec
from core.agent.retry import RetryPolicy, with_retries
from core.errors import ModelError
from core.redact import Blanker
from providers.sse import ServerSentEvent, SSEDecoder, SSEError

__all__ = ["HttpModelClient"]


_CREDENTIALS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})


class HttpModelClient(ABC):
    """What the HTTP model clients share: one aiohttp session, the retry rule, and a call that
    streams or not. Subclasses build the body, judge the status and read their provider's
    answers.

    The session is opened on first use, inside the running loop (aiohttp needs one; clients
    are built before it runs), and closed by `aclose`."""

    def __init__(
        self,
        *,
        base_url: str,
        path: str,
        headers: dict[str, str],
        model: str,
        timeout_s: float,
        stream: bool,
        retry: RetryPolicy | None,
    ) -> None:
        self._url = URL(base_url.rstrip("/") + "/" + path)
        self._headers = dict(headers)
        if not any(k.lower() == "content-type" for k in headers):
            self._headers["Content-Type"] = "application/json"
        # a bound on connecting and on each read; a call's own bound (_post, _EventStream)
        # counts only what the model says, so keep-alive bytes cannot hold it open forever
        self._timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=min(timeout_s, 10.0), sock_read=timeout_s
        )
        self._proxy, proxy_auth = _env_proxy(self._url)
        self._proxy_headers = {"Proxy-Authorization": proxy_auth} if proxy_auth else None
        if proxy_auth and self._url.scheme == "http":  # no CONNECT: the proxy reads the request
            self._headers["Proxy-Authorization"] = proxy_auth
        # what a provider's error text may echo back (a wrong key, in full): never kept
        self._blank = Blanker(v for k, v in self._headers.items() if k.lower() in _CREDENTIALS)
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self._model = model
        self._stream = stream
        self._retry = retry or RetryPolicy()
        # the tools' JSON, encoded once per tool set: it is most of a request's bytes, and a
        # registry hands out the same tuple on every turn (the tuple is kept, so its id stays
        # its own)
        self._tools_json: LRUCache[int, tuple[tuple[ToolSpec, ...], bytes]] = LRUCache(16)

    async def aclose(self) -> None:
        """Close the session; safe when it never opened, and twice."""
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        payload = self._payload(request)

        async def once(sink: DeltaSink) -> ModelResponse:
            try:
                if not self._stream:
                    response = self._read_once(await self._post(payload))
                else:
                    try:
                        return await self._complete_stream(payload, sink)
                    except _WholeAnswer as whole:  # a server that does not stream
                        response = self._read_once(whole.body)
            except (AttributeError, TypeError, KeyError, IndexError) as exc:
                # valid JSON in a shape the reader did not expect (a null choice, a delta
                # that is a string): a bad answer from the model, never a stuck session
                raise ModelError(
                    f"model answered in an unexpected shape ({type(exc).__name__})",
                    retryable=True,
                ) from exc
            if response.text:
                await sink(response.text)
            return response

        try:
            return await with_retries(self._retry, once, on_delta, request.deadline)
        except ModelError as exc:
            if (clean := self._blank(str(exc))) == str(exc):
                raise
            raise ModelError(
                clean, retryable=exc.retryable, retry_after=exc.retry_after, status=exc.status
            ) from None

    def _payload(self, request: ModelRequest) -> bytes:
        """The encoded body, with the tools' cached JSON spliced in as its last member."""
        body = _encode(self._body(request))
        if not request.tools:
            return body
        cached = self._tools_json.get(id(request.tools))
        if cached is None or cached[0] is not request.tools:
            cached = (request.tools, _encode([self._tool(t) for t in request.tools]))
            self._tools_json[id(request.tools)] = cached
        return b'%s,"tools":%s}' % (body[:-1], cached[1])

    @abstractmethod
    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The provider's request body without "tools" (`_tool` encodes each, once)."""

    @abstractmethod
    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        """One tool as the provider declares it."""

    @abstractmethod
    def _check_status(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """Raise the ModelError an HTTP error status stands for; nothing below 400."""

    @abstractmethod
    def _read_once(self, body: bytes) -> ModelResponse:
        """A non-streamed answer's body as a ModelResponse (a bad one as ModelError)."""

    @abstractmethod
    async def _complete_stream(self, payload: bytes, sink: DeltaSink) -> ModelResponse:
        """One streamed call, pushing text to `sink` as it arrives."""

    async def _post(self, payload: bytes) -> bytes:
        """POST the body and return the answer's body, an HTTP error raised as ModelError.
        The whole answer within timeout_s (a server may send whitespace while it works)."""
        with _io_errors("request"):
            async with asyncio.timeout(self._timeout_s), await self._send(payload) as resp:
                body = await resp.read()
        self._check_status(resp.status, resp.headers, body)
        return body

    @asynccontextmanager
    async def _events(self, payload: bytes) -> AsyncIterator[_EventStream]:
        """POST the body and yield the answer's server-sent events; an HTTP error or an
        answer that is not an event stream raised as ModelError. Only reading the stream is
        translated into ModelError: what the caller does with an event is its own."""
        with _io_errors("stream"):
            resp = await self._send(payload)
        async with resp:
            if resp.status >= 400 or "text/event-stream" not in resp.content_type:
                with _io_errors("stream"):
                    body = await resp.read()
                self._check_status(resp.status, resp.headers, body)
                if resp.content_type == "application/json":
                    raise _WholeAnswer(body)  # asked to stream, it answered whole: read that
                raise ModelError("model did not answer with an event stream", retryable=True)
            yield _EventStream(resp.content, self._timeout_s)

    async def _send(self, payload: bytes) -> aiohttp.ClientResponse:
        if self._http is None:
            if self._closed:
                raise RuntimeError("the model client is closed")
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                # as many calls at once as runs at once: the session manager caps those
                connector=aiohttp.TCPConnector(limit=0),
            )
        return await self._http.post(
            self._url,
            data=payload,
            allow_redirects=False,  # a redirect is an answer: never re-send the key elsewhere
            proxy=self._proxy,
            proxy_headers=self._proxy_headers,
        )


class _WholeAnswer(Exception):
    """A streamed call answered with one JSON body, as servers that ignore "stream" do."""

    def __init__(self, body: bytes) -> None:
        super().__init__("answered without streaming")
        self.body = body


class _EventStream:
    """The events of one streamed answer, read errors raised as retryable ModelErrors. The
    next event must come within `idle_s` of the last (of the start, for the first): comments
    and `ping` events, which servers send to keep a connection open while the model is
    queued or thinking, do not count, so a stream of them alone times out."""

    def __init__(self, content: aiohttp.StreamReader, idle_s: float) -> None:
        self._content = content
        self._decoder = SSEDecoder()
        self._ready: deque[ServerSentEvent] = deque()
        self._idle_s = idle_s
        self._deadline = asyncio.get_running_loop().time() + idle_s

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> ServerSentEvent:
        while not self._ready:
            with _io_errors("stream"):
                async with asyncio.timeout_at(self._deadline):
                    chunk = await self._content.readany()
                self._ready.extend(self._decoder.feed(chunk))
            if not chunk:
                raise StopAsyncIteration
        event = self._ready.popleft()
        if event.event != "ping":
            self._deadline = asyncio.get_running_loop().time() + self._idle_s
        return event


@contextmanager
def _io_errors(what: str) -> Iterator[None]:
    """Timeouts, connection, HTTP and SSE errors as retryable ModelErrors: the same rule for
    both providers, streamed or not."""
    try:
        yield
    except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one
        raise ModelError(f"model {what} timed out", retryable=True) from exc
    except (aiohttp.ClientError, SSEError) as exc:
        raise ModelError(f"model {what} failed: {type(exc).__name__}", retryable=True) from exc


def _env_proxy(url: URL) -> tuple[URL | None, str | None]:
    """The proxy that HTTP(S)_PROXY or ALL_PROXY name for `url`, unless NO_PROXY spares it,
    and its Proxy-Authorization, read once per client (aiohttp's trust_env would read them,
    and ~/.netrc, in a thread on every request)."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy or not url.host or urllib.request.proxy_bypass(url.host):
        return None, None
    proxy_url = URL(proxy if "://" in proxy else f"http://{proxy}")
    if proxy_url.user is None:
        return proxy_url, None
    auth = base64.b64encode(f"{proxy_url.user}:{proxy_url.password or ''}".encode()).decode()
    return proxy_url.with_user(None), f"Basic {auth}"


def _encode(body: dict[str, Any] | list[Any]) -> bytes:
    """Compact UTF-8 JSON; NaN is refused here rather than by the API."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
