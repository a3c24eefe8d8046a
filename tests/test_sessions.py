"""The session manager: isolation, serialization, queue modes, caps, restart and delivery."""

from __future__ import annotations

import asyncio
import gc
import re
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from core.agent.loop import AgentLoop, Limits, RunOutcome, Turn
from core.agent.model import DeltaSink, ModelRequest, ModelResponse, ToolCall
from core.agent.sanitize import wrap_user_text
from core.agent.tools import ToolRegistry
from core.errors import ChannelError, StoreError
from core.models import (
    Attachment,
    InboundMessage,
    MessageKind,
    OutboundPart,
    Reply,
    Sender,
    SessionKey,
)
from core.periodic import every
from core.routing import Binding, Router
from core.runner import _about_run
from core.sessions import (
    KEYS_REMEMBERED,
    OVERFLOW_NOTICE,
    RESET_REPLY,
    AgentProfile,
    ChannelPolicy,
    DeliveryPolicy,
    QueueMode,
    SessionManager,
    SessionPolicy,
)
from core.store import InboxStatus, SqliteStore, Store
from core.store.admin import console
from tests.fakes import RecordingOutlet, count_calls, fail_first

_USER = re.compile(r"<user_message>\n(.*?)\n</user_message>", re.DOTALL)


@dataclass
class EchoModel:
    """Answers "echo: <texts of the newest user messages>"; records overlap per conversation."""

    delay_s: float = 0.0
    requests: list[ModelRequest] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    overlaps: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    tool_first: bool = False  # first call of a turn asks for a tool, so the turn has 2 calls

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        convo = request.messages[0].content or ""
        self.active[convo] += 1
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        if self.active[convo] > 1:
            self.overlaps += 1
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.tool_first and not any(m.role == "tool" for m in _this_turn(request)):
                call = ToolCall("t1", "nothing", "{}")
                return ModelResponse("", (call,), 10, 5, "tool_calls")
            texts = _user_texts(request)
            answer = "echo: " + " | ".join(texts)
            if on_delta is not None:
                await on_delta(answer)
            return ModelResponse(answer, (), 10, 5, "stop")
        finally:
            self.active[convo] -= 1
            self.concurrent -= 1

    async def aclose(self) -> None:
        return None


def _this_turn(request: ModelRequest) -> list[Any]:
    """The messages after the last assistant text reply: this turn's input and tool steps."""
    msgs = list(request.messages)
    start = 0
    for i, m in enumerate(msgs):
        if m.role == "assistant" and not m.tool_calls:
            start = i + 1
    return msgs[start:]


def _user_texts(request: ModelRequest) -> list[str]:
    out: list[str] = []
    for m in _this_turn(request):
        if m.role == "user":
            out.extend(_USER.findall(m.content or ""))
    return out


def msg(text: str, convo: str = "c1", pid: str | None = None, **kw: Any) -> InboundMessage:
    return InboundMessage(
        channel="test",
        conversation=convo,
        sender=Sender(id=convo),
        text=text,
        platform_id=pid or f"{convo}-{text}-{time.monotonic_ns()}",
        **kw,
    )


def press(value: str, on: str | None = "m1", who: str = "ana") -> InboundMessage:
    return InboundMessage(
        channel="test",
        conversation="c1",
        sender=Sender(id=who),
        text=value.title(),
        platform_id=f"press-{time.monotonic_ns()}",  # each tap is its own platform event
        kind=MessageKind.BUTTON,
        button_value=value,
        reply_to=on,
    )


def key(convo: str = "c1") -> SessionKey:
    return SessionKey("default", "test", "default", convo)


@dataclass
class Rig:
    store: SqliteStore
    model: EchoModel
    outlet: RecordingOutlet
    manager: SessionManager


@pytest_asyncio.fixture
async def make_rig(
    store: SqliteStore,
) -> AsyncIterator[Callable[..., Any]]:
    managers: list[SessionManager] = []

    async def make(
        *,
        mode: QueueMode = QueueMode.COLLECT,
        delay_s: float = 0.0,
        max_pending: int = 100,
        debounce_s: float = 0.0,
        max_runs: int = 8,
        tool_first: bool = False,
        model: EchoModel | None = None,
        outlet: RecordingOutlet | None = None,
        lease_ttl_s: float = 15.0,
        channel: ChannelPolicy | None = None,
        history_turns: int = 10,
        delivery: DeliveryPolicy | None = None,
        workspace_dir: Path | None = None,
    ) -> Rig:
        model = model or EchoModel(delay_s=delay_s, tool_first=tool_first)
        outlet = outlet or RecordingOutlet()
        loop = AgentLoop(model, ToolRegistry([_Nothing()]), Limits())
        profile = AgentProfile(
            name="default",
            instructions="test agent",
            loop=loop,
            policy=SessionPolicy(
                queue_mode=mode,
                max_pending=max_pending,
                debounce_s=debounce_s,
                lease_ttl_s=lease_ttl_s,
                history_turns=history_turns,
            ),
            workspace_dir=workspace_dir,
        )
        manager = SessionManager(
            store,
            {"default": profile},
            {"test": outlet},
            max_concurrent_runs=max_runs,
            delivery=delivery or DeliveryPolicy(base_delay_s=0.01),
            channel_policies={"test": channel} if channel else None,
        )
        managers.append(manager)
        await manager.start()
        return Rig(store, model, outlet, manager)

    yield make
    for m in managers:
        await m.aclose(grace_s=1)


class _NothingArgs(__import__("pydantic").BaseModel):
    pass


class _Nothing:
    name = "nothing"
    description = "does nothing"
    args_model = _NothingArgs
    read_only = True
    timeout_s = 1.0

    async def __call__(self, args: Any, ctx: Any) -> dict[str, str]:
        return {"ok": "yes"}


async def settle(rig: Rig) -> None:
    await asyncio.wait_for(rig.manager.wait_idle(), 10.0)


async def test_session_keys_follow_the_bindings_and_only_recent_ones_are_remembered(
    store: SqliteStore,
) -> None:
    router = Router([Binding("vip", channel="test", conversation="c7")])
    manager = SessionManager(store, {}, {}, router=router)
    for _ in range(2):  # built, then remembered: the same answers
        assert manager.session_key("test", "default", "c7") == SessionKey(
            "vip", "test", "default", "c7"
        )
        assert manager.session_key("test", "default", "c8", "t 1") == SessionKey(
            "default", "test", "default", "c8", "t 1"
        )
        assert str(manager.session_key("test", "a:b", "c/d")) == "default:test:a%3Ab:c%2Fd"
    assert manager.session_key("test", "default", "c7") is manager.session_key(
        "test", "default", "c7"
    )
    for i in range(5 * KEYS_REMEMBERED):
        manager.session_key("test", "default", f"many-{i}")
    remembered = manager.session_key("test", "default", "many-0")
    assert remembered == SessionKey("default", "test", "default", "many-0")
    assert manager._keys.cache_info().currsize <= KEYS_REMEMBERED


async def test_sessions_are_isolated(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("alpha secret", "A"))
    await rig.manager.submit(msg("bravo secret", "B"))
    await settle(rig)
    await rig.manager.submit(msg("second from A", "A"))
    await settle(rig)
    assert rig.outlet.texts(key("A")) == ["echo: alpha secret", "echo: second from A"]
    assert rig.outlet.texts(key("B")) == ["echo: bravo secret"]
    for request in rig.model.requests:
        seen = " ".join(m.content or "" for m in request.messages)
        assert not ("alpha" in seen and "bravo" in seen)


async def test_twenty_messages_followup_in_order_never_overlapping(
    make_rig: Callable[..., Any],
) -> None:
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP, delay_s=0.02)
    for i in range(20):
        await rig.manager.submit(msg(f"m{i}"))
    await settle(rig)
    assert rig.outlet.texts() == [f"echo: m{i}" for i in range(20)]
    assert rig.model.overlaps == 0
    assert await rig.store.pending(str(key())) == []


async def test_twenty_messages_collect_all_answered_in_order(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(delay_s=0.05)
    for i in range(20):
        await rig.manager.submit(msg(f"m{i}"))
        await asyncio.sleep(0.01)
    await settle(rig)
    answered = [t for r in rig.outlet.texts() for t in r.removeprefix("echo: ").split(" | ")]
    assert answered == [f"m{i}" for i in range(20)]
    assert 1 < len(rig.outlet.texts()) < 20  # mid-run arrivals were collected into turns
    assert rig.model.overlaps == 0
    assert await rig.store.pending(str(key())) == []


async def test_collect_answers_mid_run_messages_together(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(delay_s=0.2)
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.05)
    await rig.manager.submit(msg("second"))
    await rig.manager.submit(msg("third"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: first", "echo: second | third"]


# each mode set by the agent, or by the channel over an agent that says otherwise (DESIGN §2:
# queue modes per agent, overridable per channel; debounce per channel)
BY_AGENT_OR_CHANNEL = pytest.mark.parametrize("by", ["agent", "channel"])


@BY_AGENT_OR_CHANNEL
async def test_followup_answers_each_queued_message_alone(
    make_rig: Callable[..., Any], by: str
) -> None:
    followup = (
        {"mode": QueueMode.FOLLOWUP}
        if by == "agent"
        else {"channel": ChannelPolicy(queue_mode=QueueMode.FOLLOWUP)}
    )
    rig: Rig = await make_rig(delay_s=0.1, **followup)
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.03)
    await rig.manager.submit(msg("second"))
    await rig.manager.submit(msg("third"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: first", "echo: second", "echo: third"]


async def test_steer_injects_mid_run_messages_into_the_running_turn(
    make_rig: Callable[..., Any],
) -> None:
    rig: Rig = await make_rig(mode=QueueMode.STEER, delay_s=0.15, tool_first=True)
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.05)  # during the first model call
    await rig.manager.submit(msg("also this"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: first | also this"]
    assert len(rig.model.requests) == 2
    assert await rig.store.pending(str(key())) == []


async def test_steer_leaves_a_confirm_press_to_open_the_next_turn(
    make_rig: Callable[..., Any],
) -> None:
    """A turn reads Confirm and Cancel presses from its first batch only: steered into a
    running turn, the press would be mere text and the confirmed action would never run."""
    rig: Rig = await make_rig(mode=QueueMode.STEER, delay_s=0.15, tool_first=True)
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.05)  # during the first model call
    press = msg("Confirm", kind=MessageKind.BUTTON, button_value="confirm:0badc0de")
    await rig.manager.submit(press)
    await rig.manager.submit(msg("and this"))
    await settle(rig)
    assert rig.outlet.texts() == [
        "echo: first",
        "echo: [pressed the button: Confirm] | and this",  # never the token
    ]


async def test_steer_on_final_call_falls_to_next_turn(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(mode=QueueMode.STEER, delay_s=0.15)  # one call: it is final
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.05)
    await rig.manager.submit(msg("late"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: first", "echo: late"]


async def test_interrupt_cancels_and_never_sends_the_old_reply(
    make_rig: Callable[..., Any],
) -> None:
    rig: Rig = await make_rig(mode=QueueMode.INTERRUPT, delay_s=0.2)
    await rig.manager.submit(msg("first"))
    await asyncio.sleep(0.05)
    await rig.manager.submit(msg("actually this"))
    await settle(rig)
    await asyncio.sleep(0.3)  # a cancelled reply must not arrive late either
    assert rig.outlet.texts() == ["echo: first | actually this"]
    kinds = [e[0] for e in rig.outlet.events]
    assert "discarded" in kinds
    assert await rig.store.pending(str(key())) == []
    # the usage view sums runs' credits: the cancelled run's messages are charged once, by
    # the run that answered them (it recorded a credit of its own without quotas configured)
    runs = await console(rig.store).runs(str(key()), 10)
    assert [(r.status, r.credits) for r in runs] == [("cancelled", 0.0), ("ok", 1.0)]


async def test_duplicate_delivery_is_answered_once(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    first = await rig.manager.submit(msg("hello", pid="same-id"))
    again = await rig.manager.submit(msg("hello", pid="same-id"))
    await settle(rig)
    assert first.status is InboxStatus.PENDING
    assert again.status is InboxStatus.DUPLICATE
    assert again.id == first.id
    assert rig.outlet.texts() == ["echo: hello"]


async def test_restart_answers_stored_unanswered_messages(
    store: SqliteStore, make_rig: Callable[..., Any]
) -> None:
    for i in range(3):
        await store.put_inbound(str(key("R")), msg(f"r{i}", "R"), 100)
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP)  # start() resumes stored work
    await settle(rig)
    assert rig.outlet.texts(key("R")) == ["echo: r0", "echo: r1", "echo: r2"]


async def test_work_of_an_agent_no_longer_served_moves_to_the_conversations_session(
    store: SqliteStore, make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its agent made a draft or removed: its messages stayed pending for good."""
    monkeypatch.setattr("core.sessions.REHOME_GRACE_S", 0.0)  # see the next test
    gone = SessionKey("vip", "test", "default", "V")
    await store.enqueue_replies(str(gone), [Reply(text="vip's last words")])
    for i in range(2):
        await store.put_inbound(str(gone), msg(f"v{i}", "V"), 100)
    await store.put_inbound(str(gone), msg("busy", "V"), 100)
    await store.acquire_lease(str(SessionKey("vip", "test", "default", "L")), "other", 60)
    await store.put_inbound(str(SessionKey("vip", "test", "default", "L")), msg("l", "L"), 100)
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP)
    await settle(rig)
    assert rig.outlet.texts(key("V")) == ["vip's last words", "echo: v0", "echo: v1", "echo: busy"]
    assert await store.pending(str(gone)) == []
    assert await store.pending(str(key("V"))) == []
    # a session another replica holds (it still serves the agent) keeps its work
    assert len(await store.pending(str(SessionKey("vip", "test", "default", "L")))) == 1
    assert rig.outlet.texts(key("L")) == []


async def test_with_replicas_fresh_work_of_an_agent_unknown_here_is_left_to_one_that_knows_it(
    store: SqliteStore, make_rig: Callable[..., Any]
) -> None:
    """A rolling deploy: a replica on the old configuration moved a new agent's message to
    the old one, which answered it."""
    new_agent = SessionKey("vip", "test", "default", "N")
    await store.put_inbound(str(new_agent), msg("for the new agent", "N"), 100)
    rig: Rig = await make_rig()
    await settle(rig)
    if isinstance(store, SqliteStore):  # one process: unknown here is unknown everywhere
        assert rig.outlet.texts(key("N")) == ["echo: for the new agent"]
    else:
        assert rig.outlet.texts(key("N")) == []
        assert len(await store.pending(str(new_agent))) == 1


async def test_overflow_gets_one_visible_notice_and_is_kept(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(delay_s=0.3, max_pending=2)
    results = [await rig.manager.submit(msg(f"m{i}")) for i in range(2)]
    while not rig.model.requests:  # the turn for m0 and m1 has started
        await asyncio.sleep(0.01)
    results += [await rig.manager.submit(msg(f"m{i}")) for i in range(2, 4)]
    assert [r.status for r in results] == [
        InboxStatus.PENDING,
        InboxStatus.PENDING,
        InboxStatus.OVERFLOW,
        InboxStatus.OVERFLOW,
    ]
    await settle(rig)
    texts = rig.outlet.texts()
    assert texts.count(OVERFLOW_NOTICE) == 1
    assert "echo: m0 | m1" in texts
    transcript = await rig.store.transcript(str(key()), 50)
    assert [e.text for e in transcript if e.role == "user"] == ["m0", "m1", "m2", "m3"]


async def test_an_overflow_notice_is_left_to_the_replica_holding_the_lease(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    """Another replica holds the session, with a reply of its own not yet sent: this one
    stores the notice but sends nothing, or that reply would go out twice."""
    rig: Rig = await make_rig(max_pending=1)
    skey = str(key("O"))
    assert await store.acquire_lease(skey, "other-replica", 30.0)
    await store.enqueue_replies(skey, [Reply(text="the other replica's answer")])
    await rig.manager.submit(msg("m0", "O"))
    assert (await rig.manager.submit(msg("m1", "O"))).status is InboxStatus.OVERFLOW
    for _ in range(100):  # the notice is stored by a task of its own
        if len(await store.outbox_pending(skey)) == 2:
            break
        await asyncio.sleep(0.01)
    await settle(rig)
    assert rig.outlet.texts(key("O")) == []
    assert [p.reply.text for p in await store.outbox_pending(skey)] == [
        "the other replica's answer",
        OVERFLOW_NOTICE,
    ]


async def test_global_cap_limits_concurrent_runs(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(delay_s=0.05, max_runs=2)
    for i in range(6):
        await rig.manager.submit(msg("hi", f"s{i}"))
    await settle(rig)
    assert len(rig.outlet.sent) == 6
    assert rig.model.max_concurrent == 2


@BY_AGENT_OR_CHANNEL
async def test_debounce_merges_a_burst_into_one_turn(make_rig: Callable[..., Any], by: str) -> None:
    quiet = {"debounce_s": 0.15} if by == "agent" else {"channel": ChannelPolicy(debounce_s=0.15)}
    rig: Rig = await make_rig(**quiet)
    for word in ("so", "about", "my bike"):
        await rig.manager.submit(msg(word))
        await asyncio.sleep(0.03)
    await settle(rig)
    assert rig.outlet.texts() == ["echo: so | about | my bike"]


async def test_followup_with_debounce_merges_a_burst_and_answers_later_messages_alone(
    make_rig: Callable[..., Any],
) -> None:
    """DESIGN §2: debounce merges the bursts people type; followup gives each queued message
    its own turn. A burst is messages each within the window of the one before."""
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP, debounce_s=0.4, delay_s=0.6)
    for word in ("so", "about", "my bike"):  # a loaded machine may take a while to store one
        await rig.manager.submit(msg(word))
        await asyncio.sleep(0.03)
    await asyncio.sleep(0.6)  # during the burst's turn
    await rig.manager.submit(msg("one more"))
    await asyncio.sleep(0.8)  # more than the window after it
    await rig.manager.submit(msg("and another"))
    await settle(rig)
    assert rig.outlet.texts() == [
        "echo: so | about | my bike",
        "echo: one more",
        "echo: and another",
    ]


async def test_the_parts_of_one_post_are_one_turn_in_followup_mode(
    make_rig: Callable[..., Any],
) -> None:
    """An album's photos come one by one, with no debounce set: each was its own turn, and in
    followup mode stayed so even once all had arrived."""
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP, delay_s=0.2)
    await rig.manager.submit(msg("next"))
    await asyncio.sleep(0.05)  # during its turn the album arrives
    for word in ("photo1", "photo2", "photo3"):
        await rig.manager.submit(msg(word, part_of="album-9"))
        await asyncio.sleep(0.05)
    await rig.manager.submit(msg("after"))
    await settle(rig)
    assert rig.outlet.texts() == [
        "echo: next",
        "echo: photo1 | photo2 | photo3",
        "echo: after",
    ]


async def test_an_albums_photos_that_take_a_while_to_fetch_are_one_turn(
    make_rig: Callable[..., Any],
) -> None:
    """Each photo is stored once fetched, and the platform sends the next one only then: with
    fetches of 0.8 and 1.2 s the second came after the one-second wait, and each photo was
    answered on its own."""
    rig: Rig = await make_rig()
    photo = (Attachment(kind="image"),)
    started = time.time()
    for word, fetch_s in (("photo1", 0.8), ("photo2", 1.2), ("photo3", 0.3)):
        arrived = time.time()  # when the update was read; stored once its file is fetched
        await asyncio.sleep(fetch_s)
        part = msg(word, part_of="album-7", attachments=photo, received_at=arrived)
        await rig.manager.submit(part)
    await settle(rig)
    (answer,) = rig.outlet.texts()
    assert [w for w in ("photo1", "photo2", "photo3") if w in answer] == [
        "photo1",
        "photo2",
        "photo3",
    ]
    assert time.time() - started < 10


async def test_parts_another_replica_stored_are_waited_for_too(
    make_rig: Callable[..., Any],
) -> None:
    """The wait went by the wake-up a part gave on this replica: parts stored by another one
    (their wake-up says nothing of parts) let the turn start with half the album."""
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("photo1", part_of="album-3"))
    for word in ("photo2", "photo3"):
        await asyncio.sleep(0.3)
        await rig.store.put_inbound(str(key()), msg(word, part_of="album-3"), 100)
        rig.manager._remote_arrival(str(key()))  # as a NOTIFY from the other replica
    await settle(rig)
    assert rig.outlet.texts() == ["echo: photo1 | photo2 | photo3"]


async def test_a_turn_waiting_for_a_run_slot_answers_what_arrived_meanwhile(
    make_rig: Callable[..., Any],
) -> None:
    """One run slot, taken by another session: the second message, sent while this session
    waited for the slot, is part of its turn (interrupt: one reply, not an outdated one)."""
    rig: Rig = await make_rig(mode=QueueMode.INTERRUPT, delay_s=0.3, max_runs=1)
    await rig.manager.submit(msg("busy", "other"))
    while not rig.model.requests:
        await asyncio.sleep(0.01)
    await rig.manager.submit(msg("I want to book"))
    await asyncio.sleep(0.05)
    await rig.manager.submit(msg("for two people"))
    await settle(rig)
    assert rig.outlet.texts(key()) == ["echo: I want to book | for two people"]


async def test_no_turn_starts_once_shutdown_began(make_rig: Callable[..., Any]) -> None:
    """SIGTERM drains: the running turn may finish, queued messages wait for the restart."""
    rig: Rig = await make_rig(mode=QueueMode.FOLLOWUP, delay_s=0.2)
    for i in range(4):
        await rig.manager.submit(msg(f"m{i}"))
    while not rig.model.requests:
        await asyncio.sleep(0.01)
    await rig.manager.aclose(grace_s=2.0)
    assert len(rig.model.requests) == 1
    assert rig.outlet.texts() == ["echo: m0"]
    assert [i.message.text for i in await rig.store.pending(str(key()))] == ["m1", "m2", "m3"]


async def test_the_history_window_is_whole_turns_without_commands_or_notices(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    rig: Rig = await make_rig(history_turns=1)
    for text in ("first question", "second question"):
        await rig.manager.submit(msg(text))
        await settle(rig)
    await rig.manager.submit(msg("/help", kind=MessageKind.COMMAND, command="help"))
    await settle(rig)
    await rig.manager.notify(key(), "a notice")
    await settle(rig)
    await rig.manager.submit(msg("third question"))
    await settle(rig)
    seen = [(m.role, m.content) for m in rig.model.requests[-1].messages[1:-1]]
    assert seen == [
        ("user", wrap_user_text("second question")),
        ("assistant", "echo: second question"),
        ("assistant", "a notice"),
    ]
    await rig.manager.submit(msg("/reset", kind=MessageKind.COMMAND, command="reset"))
    await settle(rig)
    await rig.manager.submit(msg("fourth question"))
    await settle(rig)
    assert [m.role for m in rig.model.requests[-1].messages] == ["system", "user"]


async def test_reset_command_starts_a_fresh_session(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("remember the word zebra"))
    await settle(rig)
    await rig.manager.submit(msg("/reset", kind=MessageKind.COMMAND, command="reset"))
    await settle(rig)
    await rig.manager.submit(msg("what was the word?"))
    await settle(rig)
    assert rig.outlet.texts()[1] == RESET_REPLY
    last = rig.model.requests[-1]
    assert all("zebra" not in (m.content or "") for m in last.messages)
    assert any(wrap_user_text("what was the word?") == m.content for m in last.messages)


async def test_reset_clears_the_sessions_workspace(
    make_rig: Callable[..., Any], tmp_path: Path
) -> None:
    """Kept tool results and skill files stayed readable by the fresh session after /reset."""
    rig: Rig = await make_rig(workspace_dir=tmp_path / "ws")
    await rig.manager.submit(msg("hello"))
    await settle(rig)
    folder = tmp_path / "ws" / "default_test_default_c1"  # the session's, as runs name it
    (folder / "results").mkdir(parents=True, exist_ok=True)
    (folder / "results" / "r1-1.json").write_text('"the old card number"')
    other = tmp_path / "ws" / "default_test_default_c2"
    other.mkdir(parents=True)
    await rig.manager.submit(msg("/reset", kind=MessageKind.COMMAND, command="reset"))
    await settle(rig)
    assert not folder.exists()
    assert other.exists()  # only this session's


async def test_history_is_shown_on_the_next_turn(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("my name is Ada"))
    await settle(rig)
    await rig.manager.submit(msg("what is my name?"))
    await settle(rig)
    contents = [m.content or "" for m in rig.model.requests[-1].messages]
    assert any("my name is Ada" in c for c in contents)
    assert "echo: my name is Ada" in contents


async def test_delivery_retries_then_succeeds_once(make_rig: Callable[..., Any]) -> None:
    outlet = RecordingOutlet()
    outlet.fail_with.extend(
        [
            ChannelError("slow down", retryable=True, retry_after=0.01),
            ChannelError("5xx", retryable=True),
        ]
    )
    rig: Rig = await make_rig(outlet=outlet)
    await rig.manager.submit(msg("hi"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: hi"]
    assert await rig.store.outbox_pending(str(key())) == []


async def test_a_platform_outage_of_many_retries_still_delivers_once(
    make_rig: Callable[..., Any],
) -> None:
    """Retries are bounded by time, not by a count: six failures used to make a stored reply
    a dead letter (a 12-second outage lost it)."""
    outlet = RecordingOutlet()
    outlet.fail_with.extend(ChannelError("502 bad gateway", retryable=True) for _ in range(40))
    rig: Rig = await make_rig(
        outlet=outlet, delivery=DeliveryPolicy(base_delay_s=0.001, max_delay_s=0.002)
    )
    await rig.manager.submit(msg("hi"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: hi"]
    part = rig.outlet.sent[0][1]
    assert await rig.store.delivery(part.id) == ("sent", None, "502 bad gateway")


async def test_a_reply_is_a_dead_letter_once_its_retry_time_is_spent(
    make_rig: Callable[..., Any],
) -> None:
    outlet = RecordingOutlet()
    outlet.fail_with.extend(ChannelError("502 bad gateway", retryable=True) for _ in range(10**6))
    rig: Rig = await make_rig(
        outlet=outlet,
        delivery=DeliveryPolicy(retry_for_s=0.2, base_delay_s=0.001, max_delay_s=0.002),
    )
    await rig.manager.submit(msg("one"))
    await settle(rig)
    assert rig.outlet.texts() == []
    assert await rig.store.outbox_pending(str(key())) == []  # failed for good
    outlet.fail_with.clear()
    await rig.manager.submit(msg("two"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: two"]


async def test_a_reply_sent_while_the_store_is_down_is_recorded_later_not_sent_again(
    make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform took the reply, then recording that failed: the StoreError escaped, and
    the delivery, that reply included, was made again once the store was back."""
    rig: Rig = await make_rig()
    original, left = rig.store.mark_sent, [3]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise StoreError("connection lost")
        return await original(*args, **kwargs)

    monkeypatch.setattr(rig.store, "mark_sent", flaky)
    await rig.manager.submit(msg("hi"))
    await settle(rig)
    assert left == [0]
    assert rig.outlet.texts() == ["echo: hi"]
    assert await rig.store.outbox_pending(str(key())) == []


async def test_the_sweeper_outlives_an_error_it_did_not_expect(
    make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver error that was no StoreError ended the sweeper's task, silently: that replica
    never again resumed a dead replica's sessions."""
    rig: Rig = await make_rig()
    original, failed = rig.store.sessions_with_work, []

    async def flaky() -> list[str]:
        if not failed:
            failed.append(True)
            raise RuntimeError("cannot switch to state 12; another operation is in progress")
        return await original()

    monkeypatch.setattr(rig.store, "sessions_with_work", flaky)
    assert await rig.store.acquire_lease(str(key()), "a-replica-that-died", 0.3)
    await rig.manager.submit(msg("left behind"))  # its runner finds the lease taken
    sweeper = asyncio.create_task(every(0.05, rig.manager._sweep, "sweep"))
    try:
        async with asyncio.timeout(3):  # the manager's own sweeper comes only after 5 s
            while not rig.outlet.texts():
                await asyncio.sleep(0.02)
    finally:
        sweeper.cancel()
    assert failed
    assert rig.outlet.texts() == ["echo: left behind"]


async def test_an_operator_taking_over_mid_run_silences_the_bot_until_hand_back(
    make_rig: Callable[..., Any],
) -> None:
    """The run going on when the operator paused sent its answer anyway, after the
    operator's own reply."""
    rig: Rig = await make_rig(delay_s=0.5)
    await rig.manager.submit(msg("I want to cancel"))
    async with asyncio.timeout(5):
        while not rig.model.requests:
            await asyncio.sleep(0.01)
    await rig.manager.pause(key(), "operator")
    await rig.manager.submit(msg("hello?"))
    await settle(rig)
    await asyncio.sleep(0.7)  # the cancelled answer would have come by now
    assert rig.outlet.texts() == []
    assert "handoff" in (await rig.store.get_session(str(key()))).state
    assert await rig.manager.hand_back(key()) == 2
    await settle(rig)
    assert rig.outlet.texts() == ["echo: I want to cancel | hello?"]


async def test_an_operator_pausing_on_another_replica_silences_the_running_turn(
    make_rig: Callable[..., Any],
) -> None:
    """The pause cancels a turn running on the replica the operator asked; one running on
    another replica (behind a load balancer, most of them) sent its answer anyway."""
    here: Rig = await make_rig(delay_s=0.5)
    there: Rig = await make_rig()  # the replica the operator's request reached
    await here.manager.submit(msg("I want to cancel"))
    async with asyncio.timeout(5):
        while not here.model.requests:
            await asyncio.sleep(0.01)
    await there.manager.pause(key(), "operator")
    await settle(here)
    assert here.outlet.texts() == []
    runs = [r for r in await console(here.store).runs(str(key()), 10) if r.status == "cancelled"]
    assert [r.limits_hit for r in runs] == [["paused"]]
    assert (runs[0].steps, runs[0].detail["calls"][0]["step"]) == (1, 1)  # what it spent
    assert await there.manager.hand_back(key()) == 1
    await settle(there)
    assert there.outlet.texts() == ["echo: I want to cancel"]


async def test_an_operator_pausing_just_before_the_commit_silences_the_turn(
    make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pause was looked for by a read after the model's answer: an operator who paused on
    another replica between that read and the commit got the bot's answer beside theirs."""
    here: Rig = await make_rig()
    there: Rig = await make_rig()  # the replica the operator's request reached
    commit, paused = here.store.complete_turn, False

    async def pausing_first(*args: Any, **kwargs: Any) -> Any:
        nonlocal paused
        if not paused:  # the first commit, this turn's: the operator pauses just before it
            paused = True
            await there.manager.pause(key(), "operator")
        return await commit(*args, **kwargs)

    monkeypatch.setattr(here.store, "complete_turn", pausing_first)
    await here.manager.submit(msg("I want to cancel"))
    await settle(here)
    assert here.outlet.texts() == []
    runs = await console(here.store).runs(str(key()), 10)
    assert [r.limits_hit for r in runs] == [["paused"]]
    assert await there.manager.hand_back(key()) == 1
    await settle(there)
    assert there.outlet.texts() == ["echo: I want to cancel"]


async def test_a_store_error_at_the_commit_ends_the_preview(
    make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit failed (the store went away): the turn is tried again, and the first try's
    live preview does not stay on screen."""
    rig: Rig = await make_rig(delay_s=0.3)
    fail_first(monkeypatch, rig.store, "complete_turn", 1, StoreError("connection lost"))
    await rig.manager.submit(msg("hello"))
    await settle(rig)
    await asyncio.sleep(0.5)
    await settle(rig)
    first = next(e[2] for e in rig.outlet.events if e[0] == "started")
    assert ("discarded", key(), first) in rig.outlet.events
    assert rig.outlet.texts() == ["echo: hello"]


async def test_a_session_paused_while_it_waits_for_a_run_slot_stays_silent(
    make_rig: Callable[..., Any],
) -> None:
    """The handoff was checked before the wait for a slot only: once another session's run
    ended, the paused session's turn ran, and the bot answered beside the operator."""
    rig: Rig = await make_rig(delay_s=0.4, max_runs=1)
    await rig.manager.submit(msg("hold the slot", "other"))
    async with asyncio.timeout(5):
        while not rig.model.requests:
            await asyncio.sleep(0.01)
    await rig.manager.submit(msg("hello from B"))  # waits for the slot
    await asyncio.sleep(0.05)
    await rig.manager.pause(key(), "operator")
    await settle(rig)
    await asyncio.sleep(0.6)
    assert rig.outlet.texts() == ["echo: hold the slot"]
    assert await rig.manager.hand_back(key()) == 1
    await settle(rig)
    assert rig.outlet.texts() == ["echo: hold the slot", "echo: hello from B"]


async def test_permanent_send_failure_does_not_block_later_replies(
    make_rig: Callable[..., Any],
) -> None:
    outlet = RecordingOutlet()
    outlet.fail_with.append(ChannelError("blocked", retryable=False))
    rig: Rig = await make_rig(outlet=outlet)
    await rig.manager.submit(msg("one"))
    await settle(rig)
    await rig.manager.submit(msg("two"))
    await settle(rig)
    assert rig.outlet.texts() == ["echo: two"]
    assert await rig.store.outbox_pending(str(key())) == []


async def test_idle_sessions_leave_memory(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    for i in range(50):
        await rig.manager.submit(msg("hi", f"idle{i}"))
    await settle(rig)
    assert rig.manager.active() == 0
    assert len(rig.outlet.sent) == 50


async def test_live_events_stream_and_end(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("hi"))
    await settle(rig)
    kinds = [e[0] for e in rig.outlet.events]
    assert kinds == ["started", "delta", "ended"]


@pytest.mark.parametrize(
    ("mode", "runs"),
    [(QueueMode.COLLECT, [["m0"], ["m1", "m2", "m3"]]), (QueueMode.FOLLOWUP, [["m0"], ["m1"]])],
)
async def test_a_run_starts_with_the_newest_message_it_answers(
    make_rig: Callable[..., Any], mode: QueueMode, runs: list[list[str]]
) -> None:
    """What a channel marks read (WhatsApp) or quotes (Telegram groups): the batch's newest,
    not whatever arrived after the batch was taken."""
    rig: Rig = await make_rig(mode=mode, delay_s=0.3)
    await rig.manager.submit(msg("m0", pid="m0"))
    while not rig.model.requests:
        await asyncio.sleep(0.01)
    for i in (1, 2, 3):  # arrive while m0 is answered
        await rig.manager.submit(msg(f"m{i}", pid=f"m{i}"))
    while len(rig.outlet.newest) < len(runs):
        await asyncio.sleep(0.01)
    assert rig.outlet.newest == [batch[-1] for batch in runs]
    await settle(rig)


async def test_shutdown_leaves_unfinished_work_pending(
    store: SqliteStore, make_rig: Callable[..., Any]
) -> None:
    rig: Rig = await make_rig(delay_s=5)
    await rig.manager.submit(msg("slow one"))
    await asyncio.sleep(0.05)
    await rig.manager.aclose(grace_s=0.1)
    assert [i.message.text for i in await store.pending(str(key()))] == ["slow one"]
    assert rig.outlet.sent == []
    fresh: Rig = await make_rig()
    await settle(fresh)
    assert fresh.outlet.texts() == ["echo: slow one"]


@pytest.mark.parametrize("mode", list(QueueMode))
async def test_no_overlap_in_any_mode(make_rig: Callable[..., Any], mode: QueueMode) -> None:
    rig: Rig = await make_rig(mode=mode, delay_s=0.01, tool_first=True)
    for i in range(10):
        await rig.manager.submit(msg(f"m{i}"))
        await asyncio.sleep(0.005)
    await settle(rig)
    assert rig.model.overlaps == 0
    assert await rig.store.pending(str(key())) == []
    answered = [t for r in rig.outlet.texts() for t in r.removeprefix("echo: ").split(" | ")]
    assert answered == [f"m{i}" for i in range(10)]


async def test_notify_delivers_a_notice_outside_any_run(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.notify(key("N"), "Sorry, I can't read stickers yet.")
    await settle(rig)
    assert rig.outlet.texts(key("N")) == ["Sorry, I can't read stickers yet."]
    assert rig.model.requests == []


async def test_run_messages_lists_what_a_run_answered(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig()
    await rig.manager.submit(msg("question", pid="q-1"))
    await settle(rig)
    (_, part) = rig.outlet.sent[0]
    assert part.run_id is not None
    answered = await rig.store.run_messages(part.run_id)
    assert [m.platform_id for m in answered] == ["q-1"]


async def test_restart_delivers_committed_but_unsent_parts_once(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    skey = str(key("O"))
    sent_before, unsent = await store.enqueue_replies(
        skey, [Reply(text="already delivered"), Reply(text="crashed before sending")]
    )
    await store.mark_sent(sent_before.id, "p-old")
    rig: Rig = await make_rig()  # start() finds the undelivered part
    await settle(rig)
    assert rig.outlet.texts(key("O")) == ["crashed before sending"]
    assert await store.outbox_pending(skey) == []
    assert unsent.id > sent_before.id


async def test_a_run_longer_than_its_lease_ttl_keeps_the_lease(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    rig: Rig = await make_rig(lease_ttl_s=1.5, delay_s=3.6)  # renewed every 0.5 s
    skey = str(key("K"))
    await rig.manager.submit(msg("slow one", "K"))
    await asyncio.sleep(3.2)  # more than twice the ttl into the model call
    assert not await store.acquire_lease(skey, "other-replica", 30.0)
    await settle(rig)
    assert rig.outlet.texts(key("K")) == ["echo: slow one"]
    assert await store.acquire_lease(skey, "other-replica", 30.0)  # released at the end


async def test_the_store_calls_of_a_one_message_turn(
    store: Store, make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call is a round trip to PostgreSQL (a write on SQLite's thread for the leases)
    for every answered message: the lease just taken is not renewed before the turn's first
    model call, and the session is read once (an operator's pause is looked for in the
    commit). The second model call of a turn renews it."""
    calls: Counter[str] = Counter()
    rig: Rig = await make_rig()
    periodic = {"sessions_with_work", "renew_leases"}  # the sweep's and the heartbeat's
    for name in (n for n in dir(Store) if not n.startswith("_") and n not in periodic):
        if asyncio.iscoroutinefunction(getattr(store, name, None)):
            count_calls(monkeypatch, store, name, calls)
    await rig.manager.submit(msg("hello", "C"))
    await settle(rig)
    assert rig.outlet.texts(key("C")) == ["echo: hello"]
    assert calls == Counter(
        put_inbound=1,
        acquire_lease=1,
        outbox_pending=2,  # what an earlier holder left, then this turn's reply
        pending=1,
        get_session=1,
        history=1,
        complete_turn=1,
        mark_sent=1,
        release_lease=1,
    )
    calls.clear()
    rig.model.tool_first = True  # two model calls: the second one is fenced
    await rig.manager.submit(msg("again", "C"))
    await settle(rig)
    assert rig.outlet.texts(key("C"))[-1].startswith("echo: ")
    assert calls["renew_lease"] == 1


async def test_a_lease_taken_mid_run_stops_the_run_at_the_next_heartbeat(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    rig: Rig = await make_rig(lease_ttl_s=0.3, delay_s=60.0)
    skey = str(key("T"))
    await rig.manager.submit(msg("hello", "T"))
    while not rig.model.requests:
        await asyncio.sleep(0.01)
    await store.release_lease(skey, rig.manager.owner)  # as if it expired and was taken
    assert await store.acquire_lease(skey, "other-replica", 30.0)
    await asyncio.wait_for(rig.manager.wait_idle(), 5.0)  # not the model's 60 s
    assert rig.outlet.texts(key("T")) == []
    assert [i.message.text for i in await store.pending(skey)] == ["hello"]
    assert ("discarded", key("T")) in [(e[0], e[1]) for e in rig.outlet.events]
    assert await store.renew_leases([skey], "other-replica", 30.0) == {skey}  # untouched


async def test_a_send_waiting_out_a_429_is_left_to_the_replica_that_took_the_lease(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    """The wait outlasted the lease (the database was down, another replica took the session
    and sent the part): the first replica sent it again when its wait was over."""
    rig: Rig = await make_rig()
    skey = str(key("T"))
    rig.outlet.fail_with.append(ChannelError("Too Many Requests", retryable=True, retry_after=0.5))
    await rig.manager.submit(msg("hello", "T"))
    while not rig.outlet.events or ("ended", key("T")) not in [e[:2] for e in rig.outlet.events]:
        await asyncio.sleep(0.01)
    await store.release_lease(skey, rig.manager.owner)  # as if it expired and was taken
    assert await store.acquire_lease(skey, "other-replica", 30.0)
    await asyncio.wait_for(rig.manager.wait_idle(), 5.0)
    assert rig.outlet.texts(key("T")) == []  # the other replica sends it
    assert [p.reply.text for p in await store.outbox_pending(skey)] == ["echo: hello"]
    assert await store.renew_leases([skey], "other-replica", 30.0) == {skey}  # untouched


async def test_a_429s_retry_after_outlasts_a_restart(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    """Restarted two seconds into a 30-second retry_after, the gateway sent again at once."""
    skey = str(key("T"))

    tries: list[float] = []  # by both processes' outlets

    class Timed(RecordingOutlet):
        async def send(self, k: SessionKey, part: OutboundPart) -> str | None:
            tries.append(time.monotonic())
            return await super().send(k, part)

    first: Rig = await make_rig(outlet=Timed())
    first.outlet.fail_with.append(ChannelError("Too Many Requests", retryable=True, retry_after=1))
    await store.enqueue_replies(skey, [Reply(text="later")])
    await first.manager.notify(key("T"), "after it")
    while not tries:
        await asyncio.sleep(0.01)
    await first.manager.aclose(grace_s=5)  # mid-wait: the process stops (and lets go at once)
    [pending, _] = await store.outbox_pending(skey)
    assert pending.not_before is not None
    assert pending.not_before > time.time() + 0.5

    second: Rig = await make_rig(outlet=Timed())
    await asyncio.wait_for(second.manager.wait_idle(), 5.0)
    assert second.outlet.texts(key("T")) == ["later", "after it"]
    assert tries[1] - tries[0] >= 0.9  # the wait was owed after the restart too


async def test_shutdown_does_not_wait_out_a_retry(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    """A reply waiting to be retried (a platform down) held SIGTERM for all of
    shutdown_grace_s, though no turn was running; the wait is owed at the next start."""
    skey = str(key("T"))
    rig: Rig = await make_rig()
    rig.outlet.fail_with.append(ChannelError("Too Many Requests", retryable=True, retry_after=30))
    await store.enqueue_replies(skey, [Reply(text="later")])
    await rig.manager.notify(key("T"), "after it")
    while not (await store.outbox_pending(skey))[0].not_before:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    await rig.manager.aclose(grace_s=20)
    assert time.monotonic() - started < 5
    assert [p.reply.text for p in await store.outbox_pending(skey)] == ["later", "after it"]


async def test_the_parts_after_one_whose_send_outlasted_the_lease_are_left_to_the_new_holder(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    """Recording a sent part waited out a store outage longer than the lease; the replica
    that took the session sent the rest, and so did this one, straight after."""
    skey = str(key("T"))

    class SlowFirst(RecordingOutlet):
        async def send(self, k: SessionKey, part: OutboundPart) -> str | None:
            if not self.sent:  # meanwhile the lease expired and another replica took it
                await store.release_lease(skey, rig.manager.owner)
                assert await store.acquire_lease(skey, "other-replica", 30.0)
            return await super().send(k, part)

    rig: Rig = await make_rig(outlet=SlowFirst())
    await store.enqueue_replies(skey, [Reply(text="one"), Reply(text="two")])
    await rig.manager.notify(key("T"), "three")
    await asyncio.wait_for(rig.manager.wait_idle(), 5.0)
    assert rig.outlet.texts(key("T")) == ["one"]
    assert [p.reply.text for p in await store.outbox_pending(skey)] == ["two", "three"]


async def test_a_renewal_that_races_a_release_and_reacquire_stops_nothing(
    store: Store, make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await make_rig()

    @dataclass
    class Holder:  # what the heartbeat reads of a runner
        skey: str = str(key("R"))
        holding: bool = True
        lease_term: int = 1
        policy: SessionPolicy = field(default_factory=SessionPolicy)
        lost: bool = False

        def lose_lease(self) -> None:
            self.lost = True

    holder = Holder()
    original = store.renew_leases

    async def racing(sessions: Any, owner: str, ttl: float) -> set[str]:
        holder.lease_term += 1  # released and taken again while this renewal ran
        return await original(sessions, owner, ttl)  # so it renewed nothing

    rig.manager._runners[holder.skey] = holder  # type: ignore[assignment]
    try:
        monkeypatch.setattr(store, "renew_leases", racing)
        await rig.manager.renew_leases()
        assert not holder.lost
        monkeypatch.undo()
        await rig.manager.renew_leases()  # no race this time: the lease is really not held
        assert holder.lost
    finally:
        del rig.manager._runners[holder.skey]


async def test_a_run_whose_lease_was_taken_makes_no_further_model_call(
    store: Store, make_rig: Callable[..., Any]
) -> None:
    rig: Rig = await make_rig(tool_first=True)
    skey = str(key("L"))
    original = rig.model.complete

    async def steal_during_first_call(request: ModelRequest, on_delta: Any = None) -> Any:
        if len(rig.model.requests) == 0:  # another replica takes the lease meanwhile
            await store.release_lease(skey, rig.manager.owner)
            assert await store.acquire_lease(skey, "other-replica", 30.0)
        return await original(request, on_delta)

    rig.model.complete = steal_during_first_call  # type: ignore[method-assign]
    await rig.manager.submit(msg("hello", "L"))
    await settle(rig)
    assert len(rig.model.requests) == 1  # the second call was fenced off
    assert rig.outlet.texts(key("L")) == []
    assert [i.message.text for i in await store.pending(skey)] == ["hello"]
    assert ("discarded", key("L")) in [(e[0], e[1]) for e in rig.outlet.events]


async def test_a_double_tap_is_one_turn(make_rig: Callable[..., Any]) -> None:
    rig: Rig = await make_rig(delay_s=0.2)
    first = await rig.manager.submit(press("yes"))
    again = await rig.manager.submit(press("yes"))
    await settle(rig)
    assert first.status is InboxStatus.PENDING
    assert again.status is InboxStatus.DUPLICATE
    assert again.id == first.id
    assert len(rig.model.requests) == 1


async def test_a_double_tap_whose_second_tap_reached_another_replica_is_one_turn(
    make_rig: Callable[..., Any],
) -> None:
    """Each replica remembers only the taps it stored: a second tap that another replica stored,
    while the first one's turn ran or before it began, was answered again."""
    rig: Rig = await make_rig(delay_s=0.3)
    skey = str(key())
    await rig.manager.submit(press("yes"))
    while not rig.model.requests:
        await asyncio.sleep(0.01)
    await rig.store.put_inbound(skey, press("yes"), 100)  # by the other replica
    rig.manager._remote_arrival(skey)
    await settle(rig)
    assert len(rig.model.requests) == 1
    assert await rig.store.pending(skey) == []
    for _ in range(2):  # both stored before the turn began
        await rig.store.put_inbound(skey, press("no"), 100)
    rig.manager._remote_arrival(skey)
    await settle(rig)
    assert len(rig.model.requests) == 2
    assert rig.outlet.texts()[-1].count("pressed the button") == 1
    assert await rig.store.pending(skey) == []


async def test_a_new_message_a_new_value_or_another_person_is_a_new_press(
    make_rig: Callable[..., Any],
) -> None:
    rig: Rig = await make_rig()
    presses = [press("yes"), press("no"), press("yes", on="m2"), press("yes", who="c2")]
    results = [await rig.manager.submit(p) for p in presses]
    await settle(rig)
    assert [r.status for r in results] == [InboxStatus.PENDING] * 4


async def test_the_same_typed_text_is_not_a_press(make_rig: Callable[..., Any]) -> None:
    """Only presses are compared, and only where the channel says which message they were on
    (the web chat does not: its page disables the buttons once one is pressed)."""
    rig: Rig = await make_rig()
    results = [
        await rig.manager.submit(msg("yes")),
        await rig.manager.submit(msg("yes")),
        await rig.manager.submit(press("yes", on=None)),
        await rig.manager.submit(press("yes", on=None)),
    ]
    await settle(rig)
    assert [r.status for r in results] == [InboxStatus.PENDING] * 4


async def test_a_press_the_store_failed_to_keep_is_taken_when_delivered_again(
    make_rig: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await make_rig()
    real = rig.store.put_inbound

    async def down(*args: Any, **kw: Any) -> Any:
        raise StoreError("database is locked")

    monkeypatch.setattr(rig.store, "put_inbound", down)
    tap = press("yes")
    with pytest.raises(StoreError):
        await rig.manager.submit(tap)
    monkeypatch.setattr(rig.store, "put_inbound", real)
    result = await rig.manager.submit(tap)  # the platform's redelivery
    await settle(rig)
    assert result.status is InboxStatus.PENDING
    assert rig.outlet.texts()


async def test_a_turn_cancelled_before_it_started_leaves_nothing_unawaited() -> None:
    """A newer message interrupting at once cancelled the turn's task before it ran: the
    agent loop's coroutine, made beforehand, was never awaited (a RuntimeWarning that failed
    a test now and then)."""
    started: list[Turn] = []

    async def run(turn: Turn, emit: Any) -> RunOutcome:
        started.append(turn)
        return RunOutcome("never")

    turn = Turn(run_id="r1", session=str(key()), system="", history=[], user_texts=["hi"])
    task = asyncio.create_task(_about_run("r1", run, turn, lambda _: asyncio.sleep(0)))
    task.cancel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await asyncio.gather(task, return_exceptions=True)
        gc.collect()
    assert started == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
