"""Logs: one JSON object per line for machines, readable lines in a terminal; both carry the
session, channel and run they are about."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Literal

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from core.logcontext import CONTEXT as LOG_CONTEXT

__all__ = ["redact", "setup_logging"]

CONTEXT = ("session", "channel", "run_id")
Format = Literal["auto", "json", "text"]


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={getattr(record, k)}" for k in CONTEXT if hasattr(record, k)]
        return f"{line} {' '.join(extras)}" if extras else line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT:
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class _ParserRefusals(logging.Filter):
    """aiohttp logs every request its HTTP parser refuses (an over-long line or header, bad
    framing, TLS on the plain port), and a body it cannot decode (a wrong Content-Encoding, met
    again as it drains the body after the 400), at ERROR with a traceback, though the client got
    a 400 with the reason. Anyone can send those: they become one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            code, text = exc.code, exc.message
        elif isinstance(exc, RequestPayloadError):
            code, text = 400, str(exc)
        else:
            return True
        reason = " ".join(text.split())[:200]
        record.msg, record.args = f"{record.getMessage()}: {code} {reason}", None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


PARSER_REFUSALS = _ParserRefusals()


class _OutOfFiles(logging.Filter):
    """Out of file descriptors (thousands of connections held open), asyncio logs each
    accept it retries, traceback and all: about 10,000 lines a second, 5 MB/s of log. One
    line a minute says it, with how many were left out."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._last = -self.EVERY_S
        self._skipped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        now = time.monotonic()
        if now - self._last < self.EVERY_S:
            self._skipped += 1
            return False
        more = f" ({self._skipped} more since the last such line)" if self._skipped else ""
        error = record.exc_info[1] if record.exc_info else None
        record.msg = f"out of file descriptors: new connections wait ({error}){more}"
        record.args, record.exc_info, record.exc_text = None, None, None
        self._last, self._skipped = now, 0
        return True


class _Context(logging.Filter):
    """Lines logged inside a session's work by code that does not know the session (a model
    retry, a store write) get its session, channel and run from core.logcontext."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in LOG_CONTEXT.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class _WebSessionIds(logging.Filter):
    """A web chat started before its cookie was a secret has the cookie itself, its only
    credential, at the end of its session key: whoever read it in a log could open that chat.
    Lines show its first 6 characters (as the console names a web visitor), enough to tell
    visitors apart. (Newer keys end in a digest of the cookie, "c.…", which is no credential
    and is shown whole.)"""

    _KEY = re.compile(r"(:web:[^:\s]+:)([A-Za-z0-9_-]{6})[A-Za-z0-9_-]{10,58}")

    def filter(self, record: logging.LogRecord) -> bool:
        session = getattr(record, "session", None)
        if isinstance(session, str) and ":web:" in session:
            record.session = self._KEY.sub(r"\1\2…", session)
        try:
            text = record.getMessage()
        except Exception:  # a malformed call: logging reports it itself, never its caller
            return True
        if ":web:" in text:
            record.msg, record.args = self._KEY.sub(r"\1\2…", text), None
        return True


def json_line(logger: logging.Logger, msg: str) -> str:
    """An INFO line from `logger`, formatted as the JSON log's lines are."""
    record = logger.makeRecord(logger.name, logging.INFO, "", 0, msg, (), None)
    return _JsonFormatter().format(record)


def logs_json() -> bool:
    """Whether the log is JSON lines (set up so by setup_logging)."""
    return any(isinstance(h.formatter, _JsonFormatter) for h in logging.getLogger().handlers)


def setup_logging(level: str = "INFO", fmt: Format = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(
        _JsonFormatter()
        if use_json
        else _TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    # neither format shows where a call was made from, its thread or its process: skip finding
    # them out (the logging HOWTO's "Optimization" list), a fifth of what a line costs
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler.addFilter(_Context())  # first: the web session ids it adds are shortened next
    handler.addFilter(_WebSessionIds())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if level.upper() in logging.getLevelNamesMapping() else "INFO")
    for noisy in ("httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # each failure they log with a traceback reaches our code, which says it in one line: an
    # error page from the Bot API, the pool retrying through a database outage
    logging.getLogger("telegram.request").setLevel(logging.CRITICAL)
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    logging.getLogger("aiohttp.server").addFilter(PARSER_REFUSALS)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _OutOfFiles) for f in asyncio_log.filters):
        asyncio_log.addFilter(_OutOfFiles())


class _Redactor(logging.Filter):
    """Replaces configured secrets in every record, whatever library logged it (a Bot API
    client logs its URL, token included, at debug level)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        text = record.getMessage()
        clean = text
        for secret in self._secrets:
            clean = clean.replace(secret, "***")
        if clean != text:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            error = str(record.exc_info[1])
            if any(secret in error for secret in self._secrets):
                record.exc_info, record.exc_text = None, None
                record.msg = f"{record.msg} (error details withheld: they held a secret)"
        return True


def redact(secrets: list[str]) -> None:
    """From now on, no log line shows any of these values."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Redactor(secrets))
