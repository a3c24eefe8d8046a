"""The Slack channel: webhook route or Socket Mode in, Block Kit messages out."""

from __future__ import annotations

import contextlib
import logging

import aiohttp
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import ChannelContext
from channels.slack.chunk import SlackMessage, messages, sections
from channels.slack.client import SlackApi
from channels.slack.files import Downloader
from channels.slack.format import to_mrkdwn
from channels.slack.identity import BotIdentity
from channels.slack.inbound import Inbound
from channels.slack.live import Live, Preview
from channels.slack.settings import SlackSettings
from channels.slack.socket import SocketMode
from channels.text import link
from core.errors import ChannelError, StoreError
from core.models import InboundMessage, OutboundPart, Reply, SessionKey

__all__ = ["OUTPUT_RULES", "ROUTE", "SlackAdapter"]

log = logging.getLogger(__name__)
ROUTE = "/webhooks/slack"
PROGRESS_NS = "slack.sent"  # part id -> "<messages sent>:<first ts>", while a part is sent
OUTPUT_RULES = (
    "You are talking in Slack. Write plain Markdown: **bold**, *italic*, `code`, fenced code "
    "blocks, lists and [links](https://example.com). Headings show as bold lines and tables "
    "as plain rows, so prefer short paragraphs and lists. Keep answers brief."
)


class SlackAdapter:
    """ChannelAdapter, LiveOutlet, HttpRoutes and Lifecycle for one Slack app (one bot)."""

    name = "slack"
    output_rules = OUTPUT_RULES

    def __init__(self, settings: SlackSettings, ctx: ChannelContext) -> None:
        token = settings.bot_token.get_secret_value() if settings.bot_token else ""
        self._http: aiohttp.ClientSession | None = None
        self._ctx = ctx
        self.web = AsyncWebClient(token=token, base_url=settings.api_base + "/")
        self.api = SlackApi(self.web)
        self.identity = BotIdentity(self.api, token, settings.bot_user_id)
        downloader = Downloader(
            ctx,
            self._session,
            token,
            settings.api_base,
            settings.file_hosts,
            timeout_s=settings.download_timeout_s,
        )
        self.inbound = Inbound(settings, ctx, self.identity, downloader)
        self.live = Live(self.api, ctx.store, settings)
        self._socket: SocketMode | None = None
        if settings.mode == "socket" and settings.app_token is not None:
            app_token = settings.app_token.get_secret_value()
            self._socket = SocketMode(app_token, self.web, self.inbound)

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ROUTE, self.inbound.handle)]

    # Lifecycle

    def _session(self) -> aiohttp.ClientSession:
        """One connection pool for the Web API, file downloads and Socket Mode's URL call."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
            self.web.session = self._http
        return self._http

    async def start(self) -> None:
        self._session()
        if self._socket is not None:
            await self._socket.start()

    async def aclose(self) -> None:
        if self._socket is not None:
            await self._socket.aclose()
        await self.inbound.aclose()
        await self.live.aclose()
        await self.identity.aclose()
        if self._http is not None:
            await self._http.close()
            self._http = None
            self.web.session = None

    # Outlet

    async def send(self, key: SessionKey, part: OutboundPart) -> str | None:
        """Deliver one reply part in order; the first message replaces the run's preview.
        Messages already sent are remembered, so a retry resumes after them."""
        batch = render(part.reply)
        preview = await self.live.preview(key, part.run_id)
        extra = {"session": str(key), "channel": self.name}
        if any(a.url is None for a in part.reply.attachments):
            log.warning("slack: reply files without a URL are not uploaded", extra=extra)
        if not batch:
            if preview is not None:
                await self._drop(preview, key)
            await self.live.forget(key, part.run_id)
            return None
        several = len(batch) > 1
        done, first = await self._progress(part.id) if several else (0, "")
        try:
            for i in range(done, len(batch)):
                m = batch[i]
                if i == 0 and preview is not None:
                    ts = await self._replace(preview, key, m)
                else:
                    ts = await self.api.post(key.conversation, m.text, m.blocks, key.thread)
                first = first or ts
                if several and i < len(batch) - 1:  # a retry, even after a restart, goes on
                    await self._ctx.store.kv_set(PROGRESS_NS, str(part.id), f"{i + 1}:{first}")
        except ChannelError as exc:
            log.warning("slack send failed: %s", exc, extra=extra)
            raise
        if several:  # all sent: nothing to resume (a failure here must not send it again)
            with contextlib.suppress(StoreError):
                await self._ctx.store.kv_delete(PROGRESS_NS, str(part.id))
        await self.live.forget(key, part.run_id)
        return f"{key.conversation}:{first}"

    async def _progress(self, part_id: int) -> tuple[int, str]:
        """(messages of this part already sent, the first one's ts) by an earlier attempt."""
        saved = await self._ctx.store.kv_get(PROGRESS_NS, str(part_id)) or ""
        count, _, first = saved.partition(":")
        return (int(count), first) if count.isdigit() and first else (0, "")

    async def _replace(self, preview: Preview, key: SessionKey, m: SlackMessage) -> str:
        try:
            await self.live.edits_allowed(key.account)
            await self.api.update(preview.channel, preview.ts, m.text, m.blocks)
            return preview.ts
        except ChannelError as exc:
            if exc.retryable:
                raise
            log.info("slack preview not editable (%s); posting anew", exc.code)
        await self._drop(preview, key)
        return await self.api.post(key.conversation, m.text, m.blocks, key.thread)

    async def _drop(self, preview: Preview, key: SessionKey) -> None:
        try:
            await self.api.delete(preview.channel, preview.ts)
        except ChannelError as exc:
            log.info("slack preview not deleted: %s", exc, extra={"session": str(key)})

    # LiveOutlet

    async def run_started(self, key: SessionKey, run_id: str, newest: InboundMessage) -> None:
        await self.live.started(key, run_id)

    async def run_delta(self, key: SessionKey, run_id: str, text: str) -> None:
        await self.live.delta(key, run_id, text)

    async def run_ended(self, key: SessionKey, run_id: str, *, discarded: bool) -> None:
        await self.live.ended(key, run_id, discarded=discarded)


def render(reply: Reply) -> list[SlackMessage]:
    """A reply as the messages to post: mrkdwn sections, then its buttons."""
    text = reply.text
    links = [link(a.name or a.url or "", a.url) for a in reply.attachments if a.url]
    if links:
        text = "\n\n".join([text, *links]) if text.strip() else "\n\n".join(links)
    buttons = [(b.label, b.value) for b in reply.buttons]
    return messages(sections(to_mrkdwn(text)), buttons)
