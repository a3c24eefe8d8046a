"""The adapter against the fake Web API, without the gateway: delivery resumed after a
failed chunk, errors translated for the outbox, file downloads, the bot's identity."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from pydantic import SecretStr

from channels.base import ChannelContext
from channels.slack import SlackAdapter, SlackSettings, create
from channels.slack.adapter import render
from channels.slack.client import SlackApi
from channels.slack.files import Downloader
from channels.slack.identity import BotIdentity
from channels.slack.parse import FileRef
from core.errors import ChannelError
from core.models import Attachment, OutboundPart, Reply, SessionKey
from core.store import SqliteStore
from tests.fake_slack import BOT_TOKEN, BOT_USER, FakeSlack


def _settings(api_base: str, token: str = BOT_TOKEN, **kw: Any) -> SlackSettings:
    return SlackSettings(
        enabled=True,
        bot_token=SecretStr(token),
        signing_secret=SecretStr("secret"),
        api_base=api_base,
        **kw,
    )


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """The adapter only keeps small state in the store: one kind is enough here."""
    s = SqliteStore(tmp_path / "test.db")
    await s.start()
    yield s
    await s.aclose()


@pytest_asyncio.fixture
async def adapter(
    slack: FakeSlack, store: SqliteStore, tmp_path: Path
) -> AsyncIterator[SlackAdapter]:
    ctx = ChannelContext(store=store, files_dir=tmp_path / "files", max_media_bytes=1024)
    a = create(_settings(slack.api_base), ctx)
    await a.start()
    yield a
    await a.aclose()


def _part(text: str, part_id: int = 1) -> OutboundPart:
    return OutboundPart(id=part_id, session="s", run_id=None, seq=0, reply=Reply(text=text))


def _key(conversation: str, thread: str | None = None) -> SessionKey:
    return SessionKey("default", "slack", "T1", conversation, thread)


@pytest.mark.parametrize("restarted", [False, True])
async def test_a_retry_resumes_after_the_messages_already_sent(
    adapter: SlackAdapter, slack: FakeSlack, store: SqliteStore, tmp_path: Path, restarted: bool
) -> None:
    """Also by another adapter on the same store (after a restart): the count of messages
    sent was kept in memory only, and the first ones were posted again."""
    text = "\n\n".join(f"paragraph {i} " + "x" * 900 for i in range(14))
    part = _part(text)
    assert len(render(part.reply)) == 2
    slack.fail("chat.postMessage", 500, retry_after=None, after=1)
    with pytest.raises(ChannelError) as failed:
        await adapter.send(_key("C1", "1.1"), part)
    assert failed.value.retryable
    assert len(slack.posted("C1")) == 1
    if restarted:
        ctx = ChannelContext(store=store, files_dir=tmp_path / "files", max_media_bytes=1024)
        adapter = create(_settings(slack.api_base), ctx)
        await adapter.start()
    try:
        platform_id = await adapter.send(_key("C1", "1.1"), part)
    finally:
        if restarted:
            await adapter.aclose()
    posted = slack.posted("C1")
    assert len(posted) == 2
    assert platform_id == f"C1:{posted[0]['ts']}"
    assert await store.kv_get("slack.sent", str(part.id)) is None  # nothing left to resume
    sections = [b["text"]["text"] for m in posted for b in m["blocks"]]
    assert [s.split()[0] for s in "\n\n".join(sections).split("paragraph")[1:]] == [
        str(i) for i in range(14)
    ]
    assert all(m["thread_ts"] == "1.1" for m in posted)


@pytest.mark.parametrize(
    ("setup", "retryable", "code", "retry_after"),
    [
        (lambda s: s.fail("chat.postMessage", 429, retry_after=7), True, "ratelimited", 7.0),
        (lambda s: s.fail("chat.postMessage", 503, retry_after=None), True, "internal_error", None),
        (  # a proxy's page where JSON was promised: was an AttributeError with a traceback
            lambda s: s.fail("chat.postMessage", 502, retry_after=None, body="<html>502</html>"),
            True,
            "http_502",
            None,
        ),
        (
            lambda s: s.fail("chat.postMessage", 200, retry_after=None, body="{not json"),
            True,
            "http_200",
            None,
        ),
        (lambda s: s.channel_errors.update(C1="not_in_channel"), False, "not_in_channel", None),
        (
            lambda s: s.channel_errors.update(C1="channel_not_found"),
            False,
            "channel_not_found",
            None,
        ),
        (lambda s: s.channel_errors.update(C1="is_archived"), False, "is_archived", None),
    ],
)
async def test_slack_errors_become_channel_errors(
    adapter: SlackAdapter,
    slack: FakeSlack,
    setup: Any,
    retryable: bool,
    code: str,
    retry_after: float | None,
) -> None:
    setup(slack)
    with pytest.raises(ChannelError) as caught:
        await adapter.send(_key("C1"), _part("hello"))
    assert (caught.value.retryable, caught.value.code, caught.value.retry_after) == (
        retryable,
        code,
        retry_after,
    )


async def test_a_wrong_token_is_permanent_and_an_unreachable_api_retryable(
    slack: FakeSlack, store: SqliteStore, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    for api_base, token, retryable, code in [
        (slack.api_base, "xoxb-wrong", False, "invalid_auth"),
        (closed, BOT_TOKEN, True, "network"),
    ]:
        a = create(_settings(api_base, token), ChannelContext(store=store, files_dir=tmp_path))
        await a.start()
        try:
            with pytest.raises(ChannelError) as caught:
                await a.send(_key("C1"), _part("hello"))
        finally:
            await a.aclose()
        assert (caught.value.retryable, caught.value.code) == (retryable, code)


async def test_an_empty_reply_sends_nothing(adapter: SlackAdapter, slack: FakeSlack) -> None:
    assert await adapter.send(_key("C1"), _part("   ")) is None
    assert slack.calls == []


async def test_downloads_keep_the_token_on_allowed_hosts_and_under_the_cap(
    slack: FakeSlack, store: SqliteStore, tmp_path: Path
) -> None:
    files = tmp_path / "files"
    ctx = ChannelContext(store=store, files_dir=files, max_media_bytes=1024)
    key = _key("D1")
    async with aiohttp.ClientSession() as http:
        d = Downloader(ctx, lambda: http, BOT_TOKEN, slack.api_base, ["files.slack.com"])
        assert d.allowed("https://files.slack.com/files-pri/T1-F1/a.png")
        assert d.allowed(f"{slack.url}/files/a.png")
        assert not d.allowed("http://files.slack.com/files-pri/T1-F1/a.png")  # not TLS
        assert not d.allowed("https://files.slack.com.evil.example/a.png")

        ok = await d.fetch(
            key, FileRef("a.png", "image/png", 3, slack.add_file("a.png", b"png", "image/png"))
        )
        assert (ok.kind, ok.size, ok.description) == ("image", 3, None)
        assert ok.path is not None
        assert await asyncio.to_thread(Path(ok.path).read_bytes) == b"png"

        big = slack.add_file("big.bin", b"0" * 2000, "application/octet-stream")
        declared = await d.fetch(key, FileRef("big.bin", None, 2000, big))
        undeclared = await d.fetch(key, FileRef("big.bin", None, None, big))
        assert declared.path is None
        assert undeclared.path is None
        assert "larger than 1024 bytes" in (undeclared.description or "")

        slack.redirects["moved.png"] = "https://evil.example/steal"
        moved = await d.fetch(key, FileRef("moved.png", None, None, f"{slack.url}/files/moved.png"))
        assert moved.description == "not downloaded: host not allowed for the bot token"

        wrong = Downloader(ctx, lambda: http, "xoxb-wrong", slack.api_base, [])
        login = await wrong.fetch(key, FileRef("a.png", None, None, f"{slack.url}/files/a.png"))
        assert "login page" in (login.description or "")
    assert [p.name.split("-", 1)[1] for p in files.rglob("*.*")] == ["a.png"]  # nothing else


async def test_bot_identity_needs_no_call_when_events_carry_it(slack: FakeSlack) -> None:
    api = SlackApi(create_client(slack.api_base))
    identity = BotIdentity(api, BOT_TOKEN, None)
    identity.learn({"authorizations": [{"user_id": "U0FROMEVENT", "is_bot": True}]})
    assert identity.user_id == "U0FROMEVENT"
    await identity.aclose()
    assert slack.calls == []


async def test_bot_identity_is_looked_up_once_in_the_background(slack: FakeSlack) -> None:
    api = SlackApi(create_client(slack.api_base))
    identity = BotIdentity(api, BOT_TOKEN, None)
    for _ in range(5):
        identity.learn({"event": {}})
        await identity.authorize(None, "T1", None)
    await slack.wait_for(lambda: identity.user_id is not None)
    identity.ensure()
    await identity.aclose()
    assert identity.user_id == BOT_USER
    assert len(slack.called("auth.test")) == 1


def create_client(api_base: str) -> Any:
    from slack_sdk.web.async_client import AsyncWebClient

    return AsyncWebClient(token=BOT_TOKEN, base_url=api_base + "/")


def test_reply_files_with_a_url_become_links_after_the_text() -> None:
    reply = Reply(
        text="Here is the menu:",
        attachments=(
            Attachment(kind="document", name="menu [v2].pdf", url="https://x.example/m.pdf"),
        ),
    )
    (only,) = render(reply)
    assert only.blocks[0]["text"]["text"] == (
        "Here is the menu:\n\n<https://x.example/m.pdf|menu [v2].pdf>"
    )


@pytest.mark.parametrize(
    ("name", "url", "shown"),
    [  # a file's name is whoever named it: it linked elsewhere, or showed as raw Markdown
        (
            "x](https://evil.example) [y",
            "https://f.io/a.pdf",
            "<https://f.io/a.pdf|x](https://evil.example) [y>",
        ),
        (
            "notes_v2 (final).pdf",
            "https://f.io/a b.pdf",
            "<https://f.io/a%20b.pdf|notes_v2 (final).pdf>",
        ),
    ],
)
def test_a_reply_files_name_is_shown_as_it_is(name: str, url: str, shown: str) -> None:
    (only,) = render(Reply(text="", attachments=(Attachment(kind="document", name=name, url=url),)))
    assert only.blocks[0]["text"]["text"] == shown
