"""The channel toolkit: context, files, rate limits, and the send_buttons tool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from channels.base import ChannelContext
from channels.limiter import KeyedLimiter
from core.agent.builtin import SendButtons
from core.agent.loop import AgentLoop, Limits, Turn
from core.agent.tools import ToolRegistry
from core.models import Button, InboundMessage, Sender, SessionKey
from core.store import SqliteStore
from tests.fakes import ScriptedModel, calls, text


async def test_context_refuses_to_submit_before_binding(store: SqliteStore, tmp_path: Path) -> None:
    ctx = ChannelContext(store=store, files_dir=tmp_path)
    msg = InboundMessage(channel="x", conversation="c", sender=Sender(id="u"), platform_id="1")
    with pytest.raises(RuntimeError):
        await ctx.submit(msg)

    async def notify(key: SessionKey, text: str, *, about: InboundMessage | None = None) -> None:
        raise AssertionError("not expected")

    ctx.bind(
        lambda m, key=None: store.put_inbound(str(key or ctx.session_key(m)), m, 10),
        notify,
        lambda ch, acc, conv, thread: SessionKey("default", ch, acc, conv, thread),
    )
    assert (await ctx.submit(msg)).id > 0


def test_save_file_stays_inside_the_session_folder(store: SqliteStore, tmp_path: Path) -> None:
    ctx = ChannelContext(store=store, files_dir=tmp_path / "files")
    key = SessionKey("default", "telegram", "bot", "../../etc", "7")
    path = ctx.save_file(key, "../../passwd", b"data")
    assert path.read_bytes() == b"data"
    assert (tmp_path / "files") in path.parents
    assert ".." not in path.relative_to(tmp_path / "files").as_posix()


def test_the_same_file_saved_again_is_kept_once(store: SqliteStore, tmp_path: Path) -> None:
    """A redelivered media message downloads again before the store dedupes it."""
    ctx = ChannelContext(store=store, files_dir=tmp_path / "files")
    key = SessionKey("default", "whatsapp", "1001", "15551234567")
    paths = {ctx.save_file(key, "photo.jpg", b"jpeg bytes") for _ in range(5)}
    other = ctx.save_file(key, "photo.jpg", b"other bytes")
    assert len(paths) == 1
    assert other not in paths
    assert sorted(p.name for p in other.parent.iterdir()) == sorted(p.name for p in (*paths, other))


async def test_keyed_limiter_holds_back_a_busy_key_only() -> None:
    limiter = KeyedLimiter(1, 1.0)
    await limiter.acquire("chat-a")
    await asyncio.wait_for(limiter.acquire("chat-b"), 0.2)  # other keys are not held back
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(limiter.acquire("chat-a"), 0.2)


async def test_send_buttons_reach_the_run_outcome() -> None:
    model = ScriptedModel()
    model.add(
        calls(("send_buttons", '{"buttons": [{"label": "Yes"}, {"label": "No", "value": "n"}]}')),
        text("Shall I book it?"),
    )
    loop = AgentLoop(model, ToolRegistry([SendButtons()]), Limits())
    turn = Turn(run_id="r", session="s", system="sys", history=[], user_texts=["book"])

    async def emit(event: object) -> None:
        return None

    outcome = await loop.run(turn, emit)
    assert outcome.text == "Shall I book it?"
    assert outcome.buttons == [Button(label="Yes", value="Yes"), Button(label="No", value="n")]


async def test_store_kv_delivery_and_last_inbound(store: SqliteStore) -> None:
    assert await store.kv_get("telegram", "offset") is None
    await store.kv_set("telegram", "offset", "41")
    await store.kv_set("telegram", "offset", "42")
    assert await store.kv_get("telegram", "offset") == "42"
    key = str(SessionKey("default", "whatsapp", "pn1", "155"))
    assert await store.last_inbound_at(key) is None
    msg = InboundMessage(
        channel="whatsapp",
        account="pn1",
        conversation="155",
        sender=Sender(id="155"),
        platform_id="wamid.1",
        received_at=1000.0,
    )
    await store.put_inbound(key, msg, 10)
    assert await store.last_inbound_at(key) == 1000.0
    (part,) = await store.enqueue_replies(key, [__import__("core.models").models.Reply(text="hi")])
    await store.mark_sent(part.id, "wamid.out")
    assert await store.update_delivery("whatsapp", "wamid.out", "read")
    assert not await store.update_delivery("telegram", "wamid.out", "read")
    assert await store.delivery(part.id) == ("sent", "read", None)
    assert await store.update_delivery("whatsapp", "wamid.out", "failed", "131026")
    assert await store.delivery(part.id) == ("sent", "failed", "131026")
