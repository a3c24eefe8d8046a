"""Files people send: described from the update, fetched through getFile with a size cap,
kept in the session's folder, and handed to the agent as attachments with a description (so an
agent without vision still knows what was sent)."""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from channels.base import ChannelContext
from channels.telegram.client import TelegramClient
from core.errors import ChannelError
from core.models import Attachment, SessionKey

__all__ = ["MediaRef", "fetch_all", "media_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MediaRef:
    """What an update says about one attached item; file_id None = nothing to download."""

    kind: str
    description: str
    file_id: str | None = None
    name: str | None = None
    mime: str | None = None
    size: int | None = None


def media_of(fields: Mapping[str, Any]) -> list[MediaRef]:
    """The attachments of a message (its media fields, as the update has them)."""
    out: list[MediaRef] = []
    if photos := [p for p in fields.get("photo") or () if isinstance(p, dict)]:
        big = max(
            photos, key=lambda p: (_int(p, "width") * _int(p, "height"), _int(p, "file_size"))
        )
        size = f" ({_int(big, 'width')}x{_int(big, 'height')})" if big.get("width") else ""
        out.append(_ref("image", f"a photo{size}", big, "photo.jpg", "image/jpeg"))
    if v := _dict(fields, "voice"):
        out.append(_ref("audio", f"a voice note{_secs(v)}", v, "voice.ogg", "audio/ogg"))
    if a := _dict(fields, "audio"):
        title = " – ".join(str(a[k]) for k in ("performer", "title") if a.get(k))
        named = f' "{title or a.get("file_name") or "audio"}"'
        out.append(_ref("audio", f"an audio file{named}{_secs(a)}", a, "audio.mp3", "audio/mpeg"))
    if v := _dict(fields, "video"):
        dims = f", {_int(v, 'width')}x{_int(v, 'height')}" if v.get("width") else ""
        out.append(_ref("video", f"a video{_secs(v, dims)}", v, "video.mp4", "video/mp4"))
    if v := _dict(fields, "video_note"):
        out.append(_ref("video", f"a round video message{_secs(v)}", v, "note.mp4", "video/mp4"))
    if d := _dict(fields, "document"):
        named = f' "{d["file_name"]}"' if d.get("file_name") else ""
        out.append(_ref("document", f"a document{named}", d, "document", None))
    if s := _dict(fields, "sticker"):
        mime = "video/webm" if s.get("is_video") else "image/webp"
        if s.get("is_animated"):
            mime = "application/x-tgsticker"
        emoji = f" {s['emoji']}" if s.get("emoji") else ""
        out.append(_ref("sticker", f"a sticker{emoji}", s, "sticker.webp", mime))
    if loc := _dict(fields, "location"):
        where = f"{loc.get('latitude')}, {loc.get('longitude')}"
        venue = _dict(fields, "venue") or {}  # a named place: its location comes with it
        place = ", ".join(str(venue[k]) for k in ("title", "address") if venue.get(k))
        what = f"a place: {place} ({where})" if place else f"a location ({where})"
        out.append(MediaRef("location", what))
    if c := _dict(fields, "contact"):
        who = " ".join(str(c[k]) for k in ("first_name", "last_name") if c.get(k))
        out.append(MediaRef("contact", f"a contact: {who}, {c.get('phone_number', '')}".strip()))
    return out


async def fetch_all(
    refs: list[MediaRef],
    *,
    client: TelegramClient,
    http: httpx.AsyncClient,
    ctx: ChannelContext,
    key: SessionKey,
    timeout_s: float,
) -> tuple[Attachment, ...]:
    """Download what can be downloaded within `timeout_s` in all; the rest is described as not
    downloaded, with the reason, so the message is never lost for a slow file."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    out = []
    for ref in refs:
        try:
            async with asyncio.timeout_at(deadline):
                out.append(await _fetch(ref, client, http, ctx, key))
        except TimeoutError:
            out.append(_missing(ref, "it took too long"))
        except (ChannelError, httpx.HTTPError, _TooLarge, OSError) as exc:
            reason = str(exc) if isinstance(exc, _TooLarge) else "the download failed"
            log.warning(
                "media %s not downloaded: %s",
                ref.kind,
                type(exc).__name__,
                extra={"session": str(key), "channel": "telegram"},
            )
            out.append(_missing(ref, reason))
    return tuple(out)


class _TooLarge(Exception):
    pass


async def _fetch(
    ref: MediaRef,
    client: TelegramClient,
    http: httpx.AsyncClient,
    ctx: ChannelContext,
    key: SessionKey,
) -> Attachment:
    if ref.file_id is None:
        return Attachment(kind=ref.kind, description=ref.description)
    cap = ctx.max_media_bytes
    _check_size(ref.size, cap)
    file_id = ref.file_id
    file = await client.call(lambda: client.bot.get_file(file_id))
    _check_size(file.file_size, cap)
    if not file.file_path:
        raise ChannelError("getFile returned no file_path", code="no_path")
    data = bytearray()
    async with http.stream("GET", file.file_path) as resp:
        resp.raise_for_status()
        async for part in resp.aiter_bytes():
            data += part
            _check_size(len(data), cap)
    name = ref.name or posixpath.basename(urlsplit(file.file_path).path) or ref.kind
    path = ctx.save_file(key, name, bytes(data))
    return Attachment(
        kind=ref.kind,
        name=name,
        mime=ref.mime,
        size=len(data),
        path=str(path),
        description=ref.description,
    )


def _check_size(size: int | None, cap: int) -> None:
    if size is not None and size > cap:
        limit = f"{cap / 2**20:g} MB" if cap >= 2**20 else f"{cap // 1024} KB"
        raise _TooLarge(f"larger than the {limit} limit")


def _missing(ref: MediaRef, reason: str) -> Attachment:
    return Attachment(
        kind=ref.kind,
        name=ref.name,
        mime=ref.mime,
        size=ref.size,
        description=f"{ref.description}, not downloaded ({reason})",
    )


def _ref(kind: str, desc: str, obj: dict[str, Any], default: str, mime: str | None) -> MediaRef:
    file_id = obj.get("file_id")
    return MediaRef(
        kind=kind,
        description=desc,
        file_id=str(file_id) if file_id else None,
        name=str(obj.get("file_name") or default),
        mime=str(obj.get("mime_type") or mime or "") or None,
        size=_int(obj, "file_size") or None,
    )


def _dict(fields: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = fields.get(name)
    return value if isinstance(value, dict) and value else None


def _int(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _secs(obj: Mapping[str, Any], extra: str = "") -> str:
    d = _int(obj, "duration")
    length = (f"{d // 60}:{d % 60:02d}" if d >= 60 else f"{d} s") if d else ""
    inner = ", ".join(p for p in (length, extra.lstrip(", ")) if p)
    return f" ({inner})" if inner else ""
