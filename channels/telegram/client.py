"""The Bot API through python-telegram-bot: one Bot, rate limits in front of every write, and
PTB's exceptions translated into ChannelError at this boundary."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import warnings
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlencode

from telegram import Bot, InlineKeyboardMarkup, ReplyParameters
from telegram import error as tg
from telegram.constants import ParseMode
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning

from channels.limiter import KeyedLimiter
from channels.telegram.settings import TelegramSettings
from core.errors import ChannelError

__all__ = ["BLOCKED", "RATES", "TelegramClient", "bot_id_of", "is_parse_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")
BLOCKED = "blocked"
# (messages, per seconds): per chat, per group chat (new messages only), and for the whole bot
RATES = {"chat": (1, 1.0), "group": (20, 60.0), "overall": (30, 1.0)}


def bot_id_of(token: str) -> str:
    """The bot's numeric id, which is the part of the token before ':' (a hash if malformed,
    so a broken token never leaks into keys)."""
    head = token.partition(":")[0]
    return head if head.isdigit() else "h" + hashlib.sha256(token.encode()).hexdigest()[:12]


def is_parse_error(exc: ChannelError) -> bool:
    """Telegram could not read our markup: "can't parse entities: ...", as documented, or any
    other 400 about parsing or entities (the wording is not a contract; a markup error
    mistaken for another failed the part for good instead of sending it plain)."""
    text = str(exc).lower()
    return exc.code == "bad_request" and ("parse" in text or "entit" in text)


class TelegramClient:
    """Bot API calls for one bot. Writes wait for the limiters: ≤1 message/s per chat,
    ≤20/min per group, ≤30/s overall."""

    def __init__(self, section: TelegramSettings) -> None:
        assert section.token is not None
        self._token = section.token.get_secret_value()
        self.bot_id = bot_id_of(self._token)
        base = section.api_base
        self._requests = (
            HTTPXRequest(connection_pool_size=1, read_timeout=10.0),
            HTTPXRequest(connection_pool_size=64, read_timeout=20.0, pool_timeout=10.0),
        )
        self.bot = Bot(
            self._token,
            base_url=f"{base}/bot",
            base_file_url=f"{base}/file/bot",
            get_updates_request=self._requests[0],
            request=self._requests[1],
        )
        self.per_chat = KeyedLimiter(*RATES["chat"])
        self.per_group = KeyedLimiter(*RATES["group"])
        self.overall = KeyedLimiter(*RATES["overall"])

    async def aclose(self) -> None:
        for request in self._requests:
            await request.shutdown()

    async def get_updates(
        self, offset: int | None, timeout_s: int, allowed: list[str] | None
    ) -> list[Any]:
        """getUpdates, each update left as JSON for the caller to read one by one.
        python-telegram-bot's Bot.get_updates parses the whole batch first, so a single update
        it cannot read failed every call and the updates after it were never received. Its
        request object still carries the call (the parameters in the query string, which the
        Bot API takes) and turns error answers into its exceptions, translated as any call's."""
        query = {"offset": offset, "timeout": timeout_s, "allowed_updates": allowed}
        url = f"{self.bot.base_url}/getUpdates?" + urlencode(
            {
                k: v if isinstance(v, int) else json.dumps(v)
                for k, v in query.items()
                if v is not None
            }
        )
        poll = self._requests[0]
        result = await self.call(lambda: poll.post(url, read_timeout=timeout_s + 10.0))
        return result if isinstance(result, list) else []

    async def write(self, chat_id: int, call: Callable[[], Awaitable[T]], *, new: bool) -> T:
        """A call that posts to a chat, after the limiters let it through (`new`: it creates a
        message, which the per-group budget counts)."""
        async with contextlib.AsyncExitStack() as slots:
            await slots.enter_async_context(self.per_chat.slot(str(chat_id)))
            if new and chat_id < 0:
                await slots.enter_async_context(self.per_group.slot(str(chat_id)))
            await slots.enter_async_context(self.overall.slot("all"))
            return await self.call(call)

    async def send_text(
        self,
        chat_id: int,
        html: str,
        plain: str,
        *,
        thread: int | None = None,
        reply_to: int | None = None,
        markup: InlineKeyboardMarkup | None = None,
    ) -> int:
        """sendMessage as HTML; if Telegram still cannot parse it, the same text, plain."""
        reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to else None

        async def attempt(text: str, mode: str | None) -> int:
            msg = await self.write(
                chat_id,
                lambda: self.bot.send_message(
                    chat_id,
                    text,
                    parse_mode=mode,
                    message_thread_id=thread,
                    reply_parameters=reply,
                    reply_markup=markup,
                ),
                new=True,
            )
            return msg.message_id

        try:
            return await attempt(html, ParseMode.HTML)
        except ChannelError as exc:
            if not is_parse_error(exc):
                raise
            log.warning("Telegram refused our HTML (%s); sending the chunk as plain text", exc)
            return await attempt(plain, None)

    async def edit_text(
        self,
        chat_id: int,
        message_id: int,
        html: str,
        plain: str,
        *,
        markup: InlineKeyboardMarkup | None = None,
    ) -> None:
        """editMessageText as HTML (plain if refused); "not modified" counts as done."""

        async def attempt(text: str, mode: str | None) -> None:
            await self.write(
                chat_id,
                lambda: self.bot.edit_message_text(
                    text, chat_id, message_id, parse_mode=mode, reply_markup=markup
                ),
                new=False,
            )

        try:
            await attempt(html, ParseMode.HTML)
        except ChannelError as exc:
            if _not_modified(exc):
                return
            if not is_parse_error(exc):
                raise
            log.warning("Telegram refused our HTML (%s); editing with plain text", exc)
            try:
                await attempt(plain, None)
            except ChannelError as again:
                if not _not_modified(again):
                    raise

    async def call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except tg.TelegramError as exc:
            raise self.translate(exc) from None

    def translate(self, exc: tg.TelegramError) -> ChannelError:
        """PTB's exception → ChannelError; the token never appears in the message."""
        text = str(exc).replace(self._token, "<token>")
        if isinstance(exc, tg.RetryAfter):
            return ChannelError(text, retryable=True, retry_after=retry_after(exc), code="flood")
        if isinstance(exc, tg.Forbidden):
            return ChannelError(text, retryable=False, code=BLOCKED)
        if isinstance(exc, tg.ChatMigrated):
            return ChatMigrated(text, int(exc.new_chat_id))
        if isinstance(exc, tg.BadRequest):
            return ChannelError(text, retryable=False, code="bad_request")
        if isinstance(exc, tg.InvalidToken):
            return ChannelError(text, retryable=False, code="not_found")
        if isinstance(exc, tg.Conflict):
            return ChannelError(text, retryable=True, code="conflict")
        return ChannelError(text, retryable=True, code="network")  # NetworkError, TimedOut, …


class ChatMigrated(ChannelError):
    """The group became a supergroup with a new chat id: worth sending there instead."""

    def __init__(self, message: str, new_chat_id: int) -> None:
        super().__init__(message, retryable=True, code="migrated")
        self.new_chat_id = new_chat_id


def _not_modified(exc: ChannelError) -> bool:
    return exc.code == "bad_request" and "not modified" in str(exc).lower()


def retry_after(exc: tg.RetryAfter) -> float:
    """Seconds to wait; PTB 22 gives an int (or float) or, opted in, a timedelta."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value: int | float | timedelta = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
