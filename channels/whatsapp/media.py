"""Media that customers send, fetched through the two-step media API before the message is stored.

Our choice: the webhook is answered once its messages are stored, and a message is stored once
(deduped), so its file is fetched first, all files of a notification at once, within a bound
(`media_timeout_s`, 5 s by default). What cannot be fetched in time, is over the size cap or
fails is stored anyway, its attachment described as "not downloaded (…)": the message is
never lost or held back, and the agent can say it could not open the file.
"""

from __future__ import annotations

import asyncio
import logging

from channels.base import ChannelContext
from channels.whatsapp.client import GraphClient
from channels.whatsapp.parse import CHANNEL, MediaRef
from core.errors import ChannelError
from core.models import InboundMessage

__all__ = ["fetch_all"]

log = logging.getLogger(__name__)


async def fetch_all(
    graph: GraphClient,
    ctx: ChannelContext,
    items: list[tuple[InboundMessage, MediaRef | None]],
    timeout_s: float,
) -> list[InboundMessage]:
    """The messages with their files attached, in order; at most `timeout_s` for all of them."""
    tasks = {
        i: asyncio.create_task(_fetch(graph, ctx, msg, ref))
        for i, (msg, ref) in enumerate(items)
        if ref is not None
    }
    if tasks:
        _, late = await asyncio.wait(tasks.values(), timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    out = []
    for i, (msg, _) in enumerate(items):
        if i not in tasks:
            out.append(msg)
            continue
        task = tasks[i]
        if task.cancelled():
            _log_skip(ctx, msg, "took too long")
            out.append(_not_downloaded(msg, "took too long"))
        else:
            out.append(task.result())
    return out


async def _fetch(
    graph: GraphClient, ctx: ChannelContext, msg: InboundMessage, ref: MediaRef
) -> InboundMessage:
    cap = ctx.max_media_bytes
    try:
        media = await graph.media(ref.id, msg.account)
        if media.size is not None and media.size > cap:
            reason = "too large"
        else:
            data = await graph.download(media.url, cap)
            att = msg.attachments[0]
            key = ctx.session_key(msg)
            path = await asyncio.to_thread(ctx.save_file, key, att.name or att.kind, data)
            done = att.model_copy(
                update={"path": str(path), "size": len(data), "mime": att.mime or media.mime}
            )
            return msg.model_copy(update={"attachments": (done, *msg.attachments[1:])})
    except ChannelError as exc:
        reason = {"too_large": "too large", "auth": "no access"}.get(exc.code or "", "failed")
    except OSError as exc:
        reason = f"could not be saved: {type(exc).__name__}"
    _log_skip(ctx, msg, reason)
    return _not_downloaded(msg, reason)


def _not_downloaded(msg: InboundMessage, reason: str) -> InboundMessage:
    att = msg.attachments[0]
    note = f"not downloaded ({reason})"
    described = att.model_copy(
        update={"description": f"{att.description}; {note}" if att.description else note}
    )
    return msg.model_copy(update={"attachments": (described, *msg.attachments[1:])})


def _log_skip(ctx: ChannelContext, msg: InboundMessage, reason: str) -> None:
    log.warning(
        "media of %s not downloaded: %s",
        msg.platform_id,
        reason,
        extra={"session": str(ctx.session_key(msg)), "channel": CHANNEL},
    )
