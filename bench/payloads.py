"""Signed webhook requests as each platform sends them (shapes from tests/payloads/), each with
unique ids so the gateway's dedupe never short-cuts one. Built ahead of a measurement, so the
load generator spends nothing on JSON or HMAC while it runs."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass

__all__ = [
    "APP_SECRET",
    "CHANNELS",
    "SLACK_SECRET",
    "TELEGRAM_SECRET",
    "TELEGRAM_TOKEN",
    "HttpReq",
    "build",
    "user_id",
]

APP_SECRET = "bench-wa-app-secret"
WA_TOKEN = "bench-wa-token"
WA_VERIFY = "bench-wa-verify"
WA_NUMBER = "1001"
TELEGRAM_TOKEN = "123456789:AAHbenchbenchbenchbenchbenchbenchbe"
TELEGRAM_SECRET = "bench_webhook-secret_0123"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SLACK_BOT_TOKEN = "xoxb-bench-bot-token"
SLACK_BOT_USER = "U0BOT00001"
CHANNELS = ("whatsapp", "telegram", "slack")
ROUTES = {
    "whatsapp": "/webhooks/whatsapp",
    "telegram": "/webhooks/telegram",
    "slack": "/webhooks/slack",
}


@dataclass(frozen=True, slots=True)
class HttpReq:
    path: str
    headers: dict[str, str]
    body: bytes


def user_id(channel: str, conversation: int) -> str:
    """The platform's id for conversation number `conversation` (what replies are sent to)."""
    if channel == "whatsapp":
        return str(15_550_000_000 + conversation)
    if channel == "telegram":
        return str(100_000 + conversation)
    return f"D{conversation:010d}"  # a Slack DM channel


def _whatsapp(n: int, conversation: int, text: str, now: int) -> HttpReq:
    wa = user_id("whatsapp", conversation)
    data = {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "102290129340398",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": "15550001001",
                                "phone_number_id": WA_NUMBER,
                            },
                            "contacts": [
                                {"profile": {"name": f"User {conversation}"}, "wa_id": wa}
                            ],
                            "messages": [
                                {
                                    "from": wa,
                                    "id": f"wamid.HBgLBENCH{n:012d}",
                                    "timestamp": str(now),
                                    "type": "text",
                                    "text": {"body": text},
                                }
                            ],
                        },
                    }
                ],
            }
        ],
    }
    body = json.dumps(data).encode()
    sig = "sha256=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return HttpReq(
        ROUTES["whatsapp"], {"Content-Type": "application/json", "X-Hub-Signature-256": sig}, body
    )


def _telegram(n: int, conversation: int, text: str, now: int) -> HttpReq:
    uid = int(user_id("telegram", conversation))
    person = {
        "id": uid,
        "is_bot": False,
        "first_name": "User",
        "last_name": str(conversation),
        "username": f"user{conversation}",
        "language_code": "en",
    }
    chat = {
        "id": uid,
        "first_name": "User",
        "last_name": str(conversation),
        "username": f"user{conversation}",
        "type": "private",
    }
    data = {
        "update_id": 500_000_000 + n,
        "message": {"message_id": n + 1, "from": person, "chat": chat, "date": now, "text": text},
    }
    body = json.dumps(data).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET,
    }
    return HttpReq(ROUTES["telegram"], headers, body)


def _slack(n: int, conversation: int, text: str, now: int) -> HttpReq:
    channel = user_id("slack", conversation)
    ts = f"{1_750_000_000 + n // 1_000_000}.{n % 1_000_000:06d}"
    data = {
        "token": "XXYYZZ",
        "team_id": "T0TEAM0001",
        "context_team_id": "T0TEAM0001",
        "api_app_id": "A0APP00001",
        "event": {
            "user": f"U{conversation:09d}",
            "type": "message",
            "ts": ts,
            "client_msg_id": f"00000000-0000-0000-0000-{n:012d}",
            "text": text,
            "team": "T0TEAM0001",
            "blocks": [
                {
                    "type": "rich_text",
                    "block_id": "Xq1",
                    "elements": [
                        {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}
                    ],
                }
            ],
            "channel": channel,
            "event_ts": ts,
            "channel_type": "im",
        },
        "type": "event_callback",
        "event_id": f"Ev0B{n:012d}",
        "event_time": now,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": "T0TEAM0001",
                "user_id": SLACK_BOT_USER,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }
    body = json.dumps(data).encode()
    stamp = str(now)
    digest = hmac.new(
        SLACK_SECRET.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256
    ).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest}",
    }
    return HttpReq(ROUTES["slack"], headers, body)


_BUILDERS = {"whatsapp": _whatsapp, "telegram": _telegram, "slack": _slack}


def build(channel: str, n: int, conversation: int, text: str | None = None) -> HttpReq:
    """Webhook number `n` (unique ids derive from it) from conversation `conversation`."""
    return _BUILDERS[channel](n, conversation, text or f"Hello, message {n}", int(time.time()))
