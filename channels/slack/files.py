"""Files people share with the bot, downloaded with the bot token into the session's folder.

The token goes only to allowed hosts (api_base's own and the configured file hosts), redirects
are followed by hand under the same rule, and a body past the size cap is abandoned. A file
that cannot be fetched still reaches the agent, as an attachment with a description instead
of a path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import aiohttp

from channels.base import ChannelContext
from channels.slack.parse import FileRef
from core.models import Attachment, SessionKey

__all__ = ["Downloader"]

log = logging.getLogger(__name__)
MAX_REDIRECTS = 3
_KINDS = {"image": "image", "audio": "audio", "video": "video"}


class Downloader:
    def __init__(
        self,
        ctx: ChannelContext,
        session: Callable[[], aiohttp.ClientSession],
        token: str,
        api_base: str,
        file_hosts: list[str],
        timeout_s: float = 30.0,
    ) -> None:
        self._ctx, self._session, self._token = ctx, session, token
        base = urlsplit(api_base)
        self._base = (base.scheme, base.netloc)
        self._hosts = {h.lower() for h in file_hosts}
        self._timeout = timeout_s

    def allowed(self, url: str) -> bool:
        """Whether the bot token may be sent to this URL."""
        parts = urlsplit(url)
        if (parts.scheme, parts.netloc) == self._base:
            return True
        return parts.scheme == "https" and (parts.hostname or "").lower() in self._hosts

    async def fetch(self, key: SessionKey, ref: FileRef) -> Attachment:
        kind = _KINDS.get((ref.mime or "").split("/")[0], "document")
        extra = {"session": str(key), "channel": key.channel}
        limit = self._ctx.max_media_bytes
        if ref.size is not None and ref.size > limit:
            return _missing(kind, ref, f"not downloaded: larger than {limit} bytes")
        try:
            async with asyncio.timeout(self._timeout):
                data = await self._download(ref.url, limit)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("file download failed: %s", type(exc).__name__, extra=extra)
            return _missing(kind, ref, "could not be downloaded")
        except _Refused as exc:
            log.warning("file download refused: %s", exc, extra=extra)
            return _missing(kind, ref, f"not downloaded: {exc}")
        path = await asyncio.to_thread(self._ctx.save_file, key, ref.name, data)
        return Attachment(kind=kind, name=ref.name, mime=ref.mime, size=len(data), path=str(path))

    async def _download(self, url: str, limit: int) -> bytes:
        for _ in range(MAX_REDIRECTS + 1):
            if not self.allowed(url):
                raise _Refused("host not allowed for the bot token")
            headers = {"Authorization": f"Bearer {self._token}"}
            async with self._session().get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                if resp.status != 200:
                    raise _Refused(f"HTTP {resp.status}")
                if resp.content_type == "text/html":
                    raise _Refused("got a login page (is the files:read scope granted?)")
                if resp.content_length is not None and resp.content_length > limit:
                    raise _Refused(f"larger than {limit} bytes")
                data = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > limit:
                        raise _Refused(f"larger than {limit} bytes")
                return bytes(data)
        raise _Refused("too many redirects")


class _Refused(Exception):
    """A download we decline or the server refuses; the reason is safe to log."""


def _missing(kind: str, ref: FileRef, why: str) -> Attachment:
    return Attachment(kind=kind, name=ref.name, mime=ref.mime, size=ref.size, description=why)
