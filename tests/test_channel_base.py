"""The channel toolkit: context, files, rate limits, and the send_buttons tool."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from channels.base import ChannelContext
from channels.limiter import KeyedLimiter
from core.agent.builtin import SendButtons
from core.agent.loop import AgentLoop, Limits, Turn
from core.agent.prompt import history_messages
from core.agent.tools import ToolRegistry
from core.models import Button, InboundMessage, Reply, Sender, SessionKey
from core.store import SqliteStore
from core.store.base import HistoryEntry
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


async def test_keyed_limiter_allows_the_rate_in_any_window_not_a_burst_on_top() -> None:
    """Telegram allows 20 messages a minute to a group: a bucket let 20 through at once and
    then refilled, so almost 40 went in the first minute and the platform answered 429."""
    limiter = KeyedLimiter(3, 0.3)
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(7):
        await limiter.acquire("group")
        times.append(loop.time())
    assert times[2] - times[0] < 0.1  # the rate itself may go at once
    for first, fourth in zip(times, times[3:], strict=False):
        assert fourth - first >= 0.29  # never a fourth within 0.3 s


async def test_keyed_limiter_take_counts_only_when_there_is_room() -> None:
    now = [100.0]
    limiter = KeyedLimiter(2, 60.0, clock=lambda: now[0])
    assert await limiter.take("chat") is None
    now[0] += 10
    assert await limiter.take("chat") is None
    assert await limiter.take("chat") == pytest.approx(50.0)  # until the first leaves
    now[0] += 50
    assert await limiter.take("chat") is None
    assert await limiter.take("chat") == pytest.approx(10.0)
    assert await limiter.take("other") is None


async def test_keyed_limiter_below_one_a_period_spaces_them_out() -> None:
    now = [0.0]
    limiter = KeyedLimiter(0.5, 1.0, clock=lambda: now[0])
    assert await limiter.take("n") is None
    assert await limiter.take("n") == pytest.approx(2.0)
    fractional = KeyedLimiter(2.5, 1.0, clock=lambda: now[0])  # 2.5 a second: 3 in 1.2 s
    assert [await fractional.take("n") for _ in range(3)] == [None, None, None]
    assert await fractional.take("n") == pytest.approx(1.2)


async def test_keyed_limiter_forgets_only_keys_that_are_no_longer_counting() -> None:
    """Past max_keys it forgot the least recently used key, even one whose window was full:
    that key's next sends went out as a burst on top of the window's (the platform's 429)."""
    now = [0.0]
    limiter = KeyedLimiter(2, 60.0, max_keys=3, clock=lambda: now[0])
    assert [await limiter.take("busy") for _ in range(2)] == [None, None]
    for i in range(10):
        now[0] += 1
        assert await limiter.take(f"chat-{i}") is None
    assert await limiter.take("busy") == pytest.approx(50.0)
    now[0] += 120  # every window empty: new keys let them go
    for i in range(30):
        assert await limiter.take(f"new-{i}") is None
    assert sorted(limiter._windows) == sorted(f"new-{i}" for i in range(30))


async def test_keyed_limiter_counts_a_call_from_when_it_went_out() -> None:
    """The platform counts calls as they come: calls let through together went out one by
    one over the connection pool, so counted from when they were let through, the next
    window's first calls reached Telegram within a second of the last window's last."""
    now = [0.0]
    limiter = KeyedLimiter(2, 1.0, clock=lambda: now[0])
    first = await limiter.acquire("all", until_done=True)
    second = await limiter.acquire("all", until_done=True)
    now[0] = 0.4
    first.done()
    now[0] = 0.5
    second.done()
    now[0] = 1.2
    assert await limiter.take("all") == pytest.approx(0.2)  # until 1.4: a second after 0.4
    now[0] = 1.4
    assert await limiter.take("all") is None


async def test_keyed_limiter_forgets_the_earliest_call_not_the_first_let_through() -> None:
    """A slow call let through first, done last, was forgotten first: the window then counted
    from an older call, and let two more through at once (three at the platform)."""
    now = [0.0]
    limiter = KeyedLimiter(2, 5.0, clock=lambda: now[0])
    slow = await limiter.acquire("k", until_done=True)
    now[0] = 1.0
    fast = await limiter.acquire("k", until_done=True)
    fast.done()
    now[0] = 10.0
    slow.done()  # went out only now
    assert await limiter.take("k") is None  # the fast one's window (1 + 5) is over
    assert await limiter.take("k") == pytest.approx(5.0)  # the slow one counts until 15


async def test_keyed_limiter_never_forgets_a_call_still_going_out() -> None:
    """A call let through but not yet sent was forgotten when the window filled: sent later,
    it came within a period of two others (three at the platform)."""
    now = [0.0]
    limiter = KeyedLimiter(2, 5.0, clock=lambda: now[0])
    slow = await limiter.acquire("k", until_done=True)
    now[0] = 1.0
    (await limiter.acquire("k", until_done=True)).done()
    now[0] = 6.0
    assert await limiter.take("k") is None  # the fast one's period is over; the slow one holds
    now[0] = 6.5
    slow.done()
    now[0] = 6.6
    assert await limiter.take("k") == pytest.approx(4.4)  # until 11: 5 s after the one at 6
    blocked = KeyedLimiter(1, 5.0, clock=lambda: now[0])
    await blocked.acquire("k", until_done=True)  # still going out: the window stays full
    now[0] = 100.0
    assert await blocked.take("k") == pytest.approx(5.0)


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


@pytest.mark.parametrize("label", [" ", "\u200b", "\n"])
def test_a_button_label_needs_something_to_read(label: str) -> None:
    """A blank title went out as is: WhatsApp refuses it, Telegram showed an empty button."""
    with pytest.raises(ValidationError):
        SendButtons.args_model.model_validate({"buttons": [{"label": label}]})
    args = SendButtons.args_model.model_validate({"buttons": [{"label": " Yes,\nplease "}]})
    assert args.buttons[0].label == "Yes, please"  # type: ignore[attr-defined]


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


async def test_buttons_alone_are_no_apology_and_the_next_turn_reads_them() -> None:
    """A model that called send_buttons and wrote nothing: the person got "Sorry, I couldn't
    put together an answer" above the buttons. Each channel words buttons alone its own way
    (WhatsApp's buttons_prompt, Telegram's arrow); the history shows the model what it offered
    (an empty assistant message is refused by model APIs)."""
    model = ScriptedModel()
    model.add(calls(("send_buttons", '{"buttons": [{"label": "Yes"}, {"label": "No"}]}')), text(""))
    loop = AgentLoop(model, ToolRegistry([SendButtons()]), Limits())
    turn = Turn(run_id="r", session="s", system="sys", history=[], user_texts=["book?"])

    async def emit(event: object) -> None:
        return None

    outcome = await loop.run(turn, emit)
    assert (outcome.text, [b.label for b in outcome.buttons]) == ("", ["Yes", "No"])
    reply = Reply(text="", buttons=tuple(outcome.buttons))
    entry = HistoryEntry("assistant", "", "r", 0.0, reply_json=reply.model_dump_json())
    assert [m.content for m in history_messages([entry])] == ["[offered buttons: Yes | No]"]


async def test_a_slot_counts_the_call_from_when_it_went_out() -> None:
    """Only Telegram's sends counted from when they went out (each caller marked its stamps
    done): WhatsApp and Slack counted from when they were let through. Every channel now
    sends inside a slot, which marks it when the block ends."""
    now = [0.0]
    limiter = KeyedLimiter(1, 5.0, clock=lambda: now[0])
    async with limiter.slot("k"):
        now[0] = 3.0  # the call takes three seconds to go out
    assert await limiter.take("k") == pytest.approx(5.0)


class _ListWindow:
    """The plain model: every stamp in a list, the earliest call sent found by a search."""

    def __init__(self, rate: int, period: float) -> None:
        self.rate, self.period = rate, period
        self.stamps: list[list[Any]] = []  # [at, sent]

    def wait(self, now: float) -> float:
        if len(self.stamps) < self.rate:
            return 0.0
        sent = [at for at, done in self.stamps if done]
        return max(0.0, min(sent) + self.period - now) if sent else self.period

    def add(self, now: float, *, sent: bool) -> list[Any]:
        done = [s for s in self.stamps if s[1]]
        if len(self.stamps) >= self.rate and done:
            self.stamps.remove(min(done, key=lambda s: s[0]))
        stamp = [now, sent]
        self.stamps.append(stamp)
        return stamp


async def test_keyed_limiter_answers_as_a_plain_list_of_stamps_would() -> None:
    rnd = random.Random(4)
    now = [0.0]
    limiter = KeyedLimiter(5, 2.0, clock=lambda: now[0])
    model = _ListWindow(5, 2.0)
    going: list[tuple[Any, list[Any]]] = []
    for _ in range(2000):
        now[0] += rnd.choice((0.0, 0.01, 0.1, 0.5))
        action = rnd.random()
        if action < 0.4 and going:  # a call let through goes out now
            stamp, modelled = going.pop(rnd.randrange(len(going)))
            stamp.done()
            modelled[:] = [max(modelled[0], now[0]), True]
        elif action < 0.7 and model.wait(now[0]) == 0:
            stamp = await limiter.acquire("k", until_done=True)
            going.append((stamp, model.add(now[0], sent=False)))
        else:
            expected = model.wait(now[0])
            got = await limiter.take("k")
            assert (got or 0.0) == pytest.approx(expected)
            if expected == 0:
                model.add(now[0], sent=True)
