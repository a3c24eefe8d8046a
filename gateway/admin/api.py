"""The console's JSON API: sessions, a session with its runs, takeover, usage, dead letters."""

from __future__ import annotations

import calendar
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from core.models import SessionKey
from core.store.admin import Console, DeadLetter, SessionRow, console
from core.store.base import RunRecord
from gateway.admin.state import ADMIN
from gateway.http import json_error, read_json
from gateway.keys import RUNTIME, SETTINGS

__all__ = [
    "dead_letters",
    "hand_back",
    "pause",
    "reply",
    "retry",
    "session",
    "sessions",
    "usage",
]

log = logging.getLogger(__name__)

SESSIONS_LIMIT = 200
SESSIONS_MAX = 5000
QUERY_MAX = 200
ENTRIES_LIMIT = 300
ENTRIES_MAX = 5000
RUNS_LIMIT = 100
DEAD_LIMIT = 200
REPLY_MAX = 4000
OPERATOR_NS = "admin-operator:"  # + session key: ids of reply parts an operator wrote
DEFAULT_PAUSE = "taken over by an operator"


def _console(request: web.Request) -> Console:
    return console(request.app[RUNTIME].store)


def _json(request: web.Request, data: Any, status: int = 200) -> web.Response:
    return request.app[ADMIN].redactor.json(data, status)


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: not a number") from None
    return min(max(value, low), high)


def _key(raw: Any) -> SessionKey:
    if not isinstance(raw, str) or not raw:
        raise web.HTTPBadRequest(text="key: a session key is required")
    try:
        key = SessionKey.parse(raw)
    except ValueError:
        raise web.HTTPBadRequest(text="key: not a session key") from None
    if str(key) != raw:
        raise web.HTTPBadRequest(text="key: not a session key")
    return key


def _session_json(row: SessionRow) -> dict[str, Any]:
    data = asdict(row)
    handoff = row.state.get("handoff")
    data["paused"] = row.paused
    data["handoff"] = handoff if isinstance(handoff, dict) else None
    return data


def _run_json(run: RunRecord) -> dict[str, Any]:
    data = asdict(run)
    data["latency_s"] = None if run.ended_at is None else round(run.ended_at - run.started_at, 3)
    return data


async def sessions(request: web.Request) -> web.StreamResponse:
    """GET /admin/api/sessions?q=&limit=&offset=: sessions waiting for an operator, then the
    most recently active; `q` keeps those whose key or messages contain it; `more` says
    whether the list goes on past `offset + limit`."""
    limit = _int(request, "limit", SESSIONS_LIMIT, 1, SESSIONS_MAX)
    offset = _int(request, "offset", 0, 0, 10**9)
    query = request.query.get("q", "").strip()
    if len(query) > QUERY_MAX:
        return json_error(400, f"q: at most {QUERY_MAX} characters")
    rows = await _console(request).sessions(limit + 1, offset=offset, query=query)
    manager = request.app[RUNTIME].manager
    return _json(
        request,
        {
            "sessions": [_session_json(r) for r in rows[:limit]],
            "more": len(rows) > limit,
            "replica": {"active": manager.active(), "running": manager.running()},
            "now": time.time(),
        },
    )


async def session(request: web.Request) -> web.StreamResponse:
    """GET /admin/api/session?key=&limit=: one session, its newest `limit` messages and reply
    parts (`earlier`: there are older ones) and its newest runs unfolded."""
    key = _key(request.query.get("key"))
    q = _console(request)
    row = await q.session(str(key))
    if row is None:
        return json_error(404, "no such session")
    store = request.app[RUNTIME].store
    limit = _int(request, "limit", ENTRIES_LIMIT, 1, ENTRIES_MAX)
    entries = await q.entries(str(key), limit + 1)
    earlier = len(entries) > limit
    entries = entries[1:] if earlier else entries  # oldest first: the extra one is the first
    runs = await q.runs(str(key), RUNS_LIMIT)
    operator = set(await store.kv_items(OPERATOR_NS + str(key)))
    out = []
    for e in entries:
        data = asdict(e)
        data["operator"] = e.id.removeprefix("out-") in operator if e.role == "assistant" else False
        out.append(data)
    return _json(
        request,
        {
            "session": _session_json(row),
            "entries": out,
            "earlier": earlier,  # older messages than these exist (ask with a larger limit)
            "runs": [_run_json(r) for r in runs],
            "channel_enabled": key.channel in request.app[RUNTIME].manager.outlets,
        },
    )


async def _existing(request: web.Request) -> tuple[SessionKey, dict[str, Any]]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body: a JSON object is required")
    key = _key(body.get("key"))
    if await _console(request).session(str(key)) is None:
        raise web.HTTPNotFound(text="no such session")
    return key, body


async def pause(request: web.Request) -> web.StreamResponse:
    """POST /admin/api/session/pause {key, reason?}: the bot stops answering here."""
    key, body = await _existing(request)
    reason = body.get("reason") or DEFAULT_PAUSE
    if not isinstance(reason, str) or len(reason) > 500:
        return json_error(400, "reason: text of at most 500 characters")
    await request.app[RUNTIME].manager.pause(key, reason.strip() or DEFAULT_PAUSE)
    log.info("operator paused the bot", extra={"session": str(key), "channel": key.channel})
    request.app[ADMIN].changes.bump()
    return _json(request, {"paused": True})


async def hand_back(request: web.Request) -> web.StreamResponse:
    """POST /admin/api/session/handback {key}: the bot answers again, held messages first."""
    key, _ = await _existing(request)
    released = await request.app[RUNTIME].manager.hand_back(key)
    log.info("operator handed back", extra={"session": str(key), "channel": key.channel})
    request.app[ADMIN].changes.bump()
    return _json(request, {"paused": False, "released": released})


async def reply(request: web.Request) -> web.StreamResponse:
    """POST /admin/api/session/reply {key, text}: a message from the operator, sent through
    the session's channel after anything already queued for it."""
    key, body = await _existing(request)
    text = body.get("text")
    if not isinstance(text, str) or not text.strip() or len(text) > REPLY_MAX:
        return json_error(400, f"text: 1 to {REPLY_MAX} characters")
    manager = request.app[RUNTIME].manager
    if key.channel not in manager.outlets:
        return json_error(409, f"channel {key.channel!r} is not enabled on this gateway")
    parts = await manager.operator_reply(key, text.strip())
    for part in parts:
        await manager.store.kv_set(OPERATOR_NS + str(key), str(part.id), json.dumps(time.time()))
    log.info("operator replied", extra={"session": str(key), "channel": key.channel})
    request.app[ADMIN].changes.bump()
    return _json(request, {"ids": [f"out-{p.id}" for p in parts]}, status=202)


async def usage(request: web.Request) -> web.StreamResponse:
    """GET /admin/api/usage?days=14: per UTC day, agent and channel; and quota counters."""
    days = _int(request, "days", 14, 1, 366)
    now = time.time()
    start_day = _day(now - (days - 1) * 86400)
    since = calendar.timegm(time.strptime(start_day, "%Y-%m-%d"))  # UTC midnight
    q = _console(request)
    rows = await q.usage(since)
    quotas = request.app[SETTINGS].quotas
    limits = {"user": quotas.user_daily_credits, "channel": quotas.channel_daily_credits}
    counters = []
    for c in await q.quotas(start_day, 500):
        data = asdict(c)
        data["limit"] = limits.get(c.scope) or None  # 0 (or unknown): unlimited
        counters.append(data)
    return _json(
        request,
        {
            "days": [
                time.strftime("%Y-%m-%d", time.gmtime(since + i * 86400)) for i in range(days)
            ],
            "rows": [asdict(r) for r in rows],
            "quotas": counters,
            "limits": limits,
            "today": _day(now),
        },
    )


def _day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


async def dead_letters(request: web.Request) -> web.StreamResponse:
    """GET /admin/api/dead-letters: sends that failed for good, messages of failed runs."""
    items: list[DeadLetter] = await _console(request).dead_letters(DEAD_LIMIT)
    return _json(request, {"items": [asdict(d) for d in items]})


async def retry(request: web.Request) -> web.StreamResponse:
    """POST /admin/api/dead-letters/retry {kind, id}: back to pending; its session is woken."""
    body = await read_json(request)
    if not isinstance(body, dict) or body.get("kind") not in ("outbox", "inbox"):
        return json_error(400, 'kind: "outbox" or "inbox"')
    item_id = body.get("id")
    if not isinstance(item_id, int) or isinstance(item_id, bool) or not 1 <= item_id < 2**63:
        return json_error(400, "id: a positive integer below 2^63 (a row id)")
    q = _console(request)
    if body["kind"] == "outbox":
        skey = await q.retry_outbox(item_id)
    else:
        skey = await q.retry_inbox(item_id)
    if skey is None:
        return json_error(404, "no such dead letter (already retried?)")
    try:
        key = SessionKey.parse(skey)
    except ValueError:
        return json_error(409, "the dead letter's session key is not valid")
    manager = request.app[RUNTIME].manager
    if key.channel in manager.outlets:
        # no public wake exists for "work was put back"; this is the one the manager uses
        manager._wake(key, arrived=False)
    log.info("operator retried %s %d", body["kind"], item_id, extra={"session": skey})
    request.app[ADMIN].changes.bump()
    return _json(request, {"retried": True, "session": skey}, status=202)
