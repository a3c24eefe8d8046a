"""Delivery of reply parts: the 24-hour window, templates, back-off and resumable chunks.

- Outside the customer service window (24 h after the customer's last message) no free-form
  message is attempted: the configured template is sent instead, or, without one, the part is
  failed with code "window_closed" (held for the operator, who is told in the log). Error 131047
  from the API takes the same path.
- Throughput errors (130429 …) hold the business number back, pair-rate errors (131056) the one
  customer; the part is retried by the outbox after `retry_after`, and later sends to that
  number or customer wait out the hold first.
- A part sent as several messages records each message that went out (kv, by part id), so a
  retry resumes after them and nothing is sent twice. The part's platform id is the wamid of
  its last message: delivery reports for that message update the part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from typing import Any

from cachetools import LRUCache

from channels.base import ChannelContext
from channels.limiter import KeyedLimiter
from channels.whatsapp.client import PAIR_LIMITED, RE_ENGAGEMENT, THROTTLED, GraphClient
from channels.whatsapp.format import ZWSP, plain, wlen
from channels.whatsapp.menus import Menus
from channels.whatsapp.outbound import MAX_PARAM, Plan, plan_reply, recipient
from channels.whatsapp.outbound import template as template_payload
from channels.whatsapp.parse import CHANNEL
from channels.whatsapp.settings import WhatsAppSettings
from core.errors import ChannelError, StoreError
from core.models import OutboundPart, Reply, SessionKey

__all__ = ["NS_SEEN", "Sender"]

log = logging.getLogger(__name__)

NS_PROGRESS = "whatsapp.sent"  # part id → wamids of the messages of that part already sent
NS_SEEN = "whatsapp.seen"  # session → when the customer last wrote something we did not store
MAX_PAIR_BACKOFF_S = 900.0
HEARD_MAX = 4096  # sessions whose last inbound time is remembered here


class Sender:
    def __init__(
        self, settings: WhatsAppSettings, ctx: ChannelContext, graph: GraphClient, menus: Menus
    ) -> None:
        self._s, self._ctx, self._graph, self._menus = settings, ctx, graph, menus
        self._limiter = KeyedLimiter(settings.max_per_second, 1.0)
        self._hold_until: dict[str, float] = {}  # number, or number/customer → monotonic time
        self._pair_strikes: dict[str, int] = {}
        # session → when the customer last wrote (received here): spares the store a read
        # per reply while the window is surely open; anything older or unknown asks the store
        self._heard: LRUCache[str, float] = LRUCache(HEARD_MAX)

    def heard(self, session: str, at: float) -> None:
        """The customer wrote at `at` (a message this process stored)."""
        self._heard[session] = max(at, self._heard.get(session, at))

    async def call(self, number: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Any messages-endpoint call (e.g. mark as read), under the number's rate limit."""
        async with self._limiter.slot(number):
            return await self._graph.send(number, payload)

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        number, user = key.account, key.conversation
        extra = {"session": str(key), "channel": CHANNEL}
        await self._wait_hold(number, user)
        try:
            if not await self.window_open(key):
                return await self._closed(key, part, "the 24-hour window is closed")
            try:
                return await self._free_form(key, part)
            except ChannelError as exc:
                if exc.code != str(RE_ENGAGEMENT):
                    raise
                log.warning("131047 re-engagement required", extra=extra)
                return await self._closed(key, part, "WhatsApp answered 131047")
        except ChannelError as exc:
            raise self._backoff(exc, key) from None

    async def window_open(self, key: SessionKey) -> bool:
        window = self._s.service_window_hours * 3600
        heard = self._heard.get(str(key))
        if heard is not None and time.time() - heard < window:
            return True
        last = await self._ctx.store.last_inbound_at(str(key))
        if last is not None and time.time() - last < window:
            return True
        seen = await self._ctx.store.kv_get(NS_SEEN, str(key))
        return seen is not None and time.time() - float(seen) < window

    def _plan(self, key: SessionKey, part: OutboundPart) -> Plan:
        s = self._s
        return plan_reply(
            part.reply,
            interactive=s.interactive,
            prompt=s.buttons_prompt,
            list_button=s.list_button,
            to=recipient(key.conversation),
        )

    async def _free_form(self, key: SessionKey, part: OutboundPart) -> str | None:
        plan = self._plan(key, part)
        if plan.skipped:
            log.warning(
                "attachments without a URL cannot be sent on WhatsApp: %s",
                ", ".join(plan.skipped),
                extra={"session": str(key), "channel": CHANNEL},
            )
        # any reply ends the menu before it, so a later "2" is not taken for a stale choice
        await self._menus.show(str(key), plan.menu or [])
        several = len(plan.payloads) > 1
        done = await self._progress(part) if several else []
        for n, payload in enumerate(plan.payloads):
            if n < len(done):
                continue
            async with self._limiter.slot(key.account):
                done.append(await self._graph.message_id(key.account, payload))
            if several and n < len(plan.payloads) - 1:
                await self._ctx.store.kv_set(NS_PROGRESS, str(part.id), json.dumps(done))
        if several:  # all sent: nothing to resume (a failure here must not send it again)
            with contextlib.suppress(StoreError):
                await self._ctx.store.kv_delete(NS_PROGRESS, str(part.id))
        self._pair_strikes.pop(f"{key.account}/{key.conversation}", None)
        return done[-1] if done else None

    async def _progress(self, part: OutboundPart) -> list[str]:
        """The wamids of this part's messages that an earlier attempt already sent."""
        try:
            done = json.loads(await self._ctx.store.kv_get(NS_PROGRESS, str(part.id)) or "[]")
        except ValueError:
            return []
        return [str(d) for d in done] if isinstance(done, list) else []

    async def _unsent(self, key: SessionKey, part: OutboundPart) -> Reply:
        """What of the part has not gone out: all of it, or, when the window closed after some
        of its messages were sent, the text of the others (sent again, they would repeat)."""
        done = await self._progress(part)
        if not done:
            return part.reply
        # the messages' text as sent, without the zero-width spaces that kept markers inert
        # (those in the reply's own text, Thai's say, stay)
        rest = [_INERT.sub("", _text_of(p)) for p in self._plan(key, part).payloads[len(done) :]]
        return part.reply.model_copy(update={"text": "\n\n".join(t for t in rest if t)})

    async def _closed(self, key: SessionKey, part: OutboundPart, why: str) -> str:
        s = self._s
        extra = {"session": str(key), "channel": CHANNEL}
        if not s.template_name:
            log.error(
                "operator: reply part %d held: %s and no template is configured "
                "(channels.whatsapp.template_name)",
                part.id,
                why,
                extra=extra,
            )
            raise ChannelError(f"{why}; no template configured", code="window_closed")
        log.info("%s: sending template %s", why, s.template_name, extra=extra)
        reply = await self._unsent(key, part)
        if wlen(plain(reply.text)) > MAX_PARAM or reply.buttons or reply.attachments:
            log.warning(
                "operator: reply part %d goes out as template %s, which carries at most %d "
                "characters of its text and none of its buttons or files",
                part.id,
                s.template_name,
                MAX_PARAM,
                extra=extra,
            )
        payload = template_payload(
            reply,
            name=s.template_name,
            language=s.template_language,
            params=s.template_params,
            fallback=s.buttons_prompt,
        )
        async with self._limiter.slot(key.account):
            to = recipient(key.conversation)
            wamid = await self._graph.message_id(key.account, {**to, **payload})
        with contextlib.suppress(StoreError):
            await self._ctx.store.kv_delete(NS_PROGRESS, str(part.id))
        return wamid

    async def _wait_hold(self, number: str, user: str) -> None:
        now = time.monotonic()
        until = max(
            self._hold_until.get(number, 0.0), self._hold_until.get(f"{number}/{user}", 0.0)
        )
        for k in (number, f"{number}/{user}"):
            if self._hold_until.get(k, now) < now:
                del self._hold_until[k]
        if until > now:
            await asyncio.sleep(until - now)

    def _backoff(self, exc: ChannelError, session: SessionKey) -> ChannelError:
        """Rate-limit errors become a hold on the number or the customer and a retry_after."""
        number, user = session.account, session.conversation
        if exc.code in {str(c) for c in THROTTLED}:
            delay, key = self._s.throughput_backoff_s, number
        elif exc.code == str(PAIR_LIMITED):
            key = f"{number}/{user}"
            strikes = self._pair_strikes[key] = self._pair_strikes.get(key, 0) + 1
            delay = min(self._s.pair_backoff_s * 4 ** (strikes - 1), MAX_PAIR_BACKOFF_S)
        else:
            return exc
        self._hold_until[key] = time.monotonic() + delay
        log.warning(
            "WhatsApp rate limit %s on %s: holding back %.1f s",
            exc.code,
            "the number" if key == number else "this customer",
            delay,
            extra={"session": str(session), "channel": CHANNEL},
        )
        return ChannelError(str(exc), retryable=True, retry_after=delay, code=exc.code)


_INERT = re.compile(f"{ZWSP}(?=[*_~`])|(?<=[*_~`]){ZWSP}")


def _text_of(payload: dict[str, Any]) -> str:
    """The text a message payload shows (a text message's body, an interactive one's)."""
    if payload.get("type") == "text":
        return str(payload["text"]["body"])
    if payload.get("type") == "interactive":
        return str(payload["interactive"].get("body", {}).get("text", ""))
    return ""
