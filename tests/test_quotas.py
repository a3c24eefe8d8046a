"""Usage and quotas: credits per run, daily per-user and per-channel limits reserved
atomically before the run, released when the model fails before producing anything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from core.agent.loop import AgentLoop, Limits
from core.agent.tools import ToolRegistry
from core.errors import ModelError, StoreError
from core.models import InboundMessage, Sender, SessionKey
from core.runner import HOLDS_NS
from core.sessions import AgentProfile, DeliveryPolicy, QuotaPolicy, SessionManager
from core.store import Quota, Store
from core.store.admin import console
from tests.fakes import RecordingOutlet, ScriptedModel, fail_first, text

DAY = "2026-11-29"


async def test_only_one_of_many_concurrent_reservations_takes_the_last_slot(store: Store) -> None:
    limit = [Quota("user", "web:default:ana", 3.0)]
    assert await store.reserve_usage(DAY, 2.0, limit) is None
    results = await asyncio.gather(*(store.reserve_usage(DAY, 1.0, limit) for _ in range(10)))
    assert results.count(None) == 1
    assert await store.usage(DAY, "user", "web:default:ana") == 3.0
    await store.release_usage(DAY, 1.0, limit)
    assert await store.usage(DAY, "user", "web:default:ana") == 2.0


async def test_a_refused_reservation_changes_no_counter(store: Store) -> None:
    both = [Quota("user", "u", 10.0), Quota("channel", "c", 1.0)]
    assert await store.reserve_usage(DAY, 1.0, both) is None
    refused = await store.reserve_usage(DAY, 1.0, both)
    assert refused == Quota("channel", "c", 1.0)
    assert await store.usage(DAY, "user", "u") == 1.0


class FailingModel(ScriptedModel):
    async def complete(self, request: Any, on_delta: Any = None) -> Any:
        self.requests.append(request)
        raise ModelError("down")


@pytest_asyncio.fixture
async def make(store: Store) -> AsyncIterator[Any]:
    managers: list[SessionManager] = []

    async def build(
        model: ScriptedModel, quota: QuotaPolicy, limits: Limits | None = None
    ) -> tuple[SessionManager, RecordingOutlet]:
        outlet = RecordingOutlet()
        loop = AgentLoop(model, ToolRegistry(), limits or Limits())
        profile = AgentProfile(name="default", instructions="x", loop=loop)
        manager = SessionManager(
            store,
            {"default": profile},
            {"test": outlet},
            delivery=DeliveryPolicy(base_delay_s=0.01),
            quota=quota,
        )
        await manager.start()
        managers.append(manager)
        return manager, outlet

    yield build
    for m in managers:
        await m.aclose(grace_s=1)


def _msg(t: str, pid: str, sender: str = "ana", convo: str = "c1") -> InboundMessage:
    return InboundMessage(
        channel="test", conversation=convo, sender=Sender(id=sender), text=t, platform_id=pid
    )


async def _settle(manager: SessionManager) -> None:
    await asyncio.wait_for(manager.wait_idle(), 10)


async def test_over_quota_gets_a_polite_message_and_no_model_call(make: Any, store: Store) -> None:
    model = ScriptedModel()
    model.add(text("first answer"), text("second answer"))
    policy = QuotaPolicy(credits_per_run=1.0, user_daily=2.0, message="Limit reached for today.")
    manager, outlet = await make(model, policy)
    for i in range(3):
        await manager.submit(_msg(f"q{i}", str(i)))
        await _settle(manager)
    assert outlet.texts() == ["first answer", "second answer", "Limit reached for today."]
    assert len(model.requests) == 2
    await manager.submit(_msg("other person", "9", sender="bob", convo="c2"))
    model.add(text("bob's answer"))
    await _settle(manager)
    assert outlet.texts(SessionKey("default", "test", "default", "c2")) == ["bob's answer"]


@pytest.mark.parametrize("failure", ["model_error", "timeout"])
async def test_model_failure_before_anything_releases_the_reservation(
    make: Any, store: Store, failure: str
) -> None:
    policy = QuotaPolicy(credits_per_run=5.0, channel_daily=100.0)
    if failure == "model_error":
        manager, outlet = await make(FailingModel(), policy)
    else:  # the first model call outlives the run
        slow = ScriptedModel(delay_s=5.0)
        slow.add(text("too late"))
        manager, outlet = await make(slow, policy, Limits(run_timeout_s=0.2))
    await manager.submit(_msg("hello", "1"))
    await _settle(manager)
    assert "Sorry" in outlet.texts()[0]
    assert await store.usage(_today(), "channel", "test:default") == 0.0


async def test_a_reservation_that_cannot_be_given_back_ends_the_preview(
    make: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model failed before producing anything, and giving the reservation back failed
    (the store went away): the turn is tried again, and the first try's live preview does
    not stay on screen. The next try settles the reservation the first one left."""
    fail_first(monkeypatch, store, "release_usage", 1, StoreError("connection lost"))
    manager, outlet = await make(
        FailingModel(), QuotaPolicy(credits_per_run=5.0, channel_daily=100.0)
    )
    await manager.submit(_msg("hello", "1"))
    await _settle(manager)
    started = [e[2] for e in outlet.events if e[0] == "started"]
    assert len(started) >= 2  # tried again
    assert (
        "discarded",
        SessionKey("default", "test", "default", "c1"),
        started[0],
    ) in outlet.events
    assert "Sorry" in outlet.texts()[0]
    assert await store.usage(_today(), "channel", "test:default") == 0.0


async def test_credits_are_charged_per_run(make: Any, store: Store) -> None:
    model = ScriptedModel()
    model.add(text("a"))
    manager, _ = await make(model, QuotaPolicy(credits_per_run=None, channel_daily=1000.0))
    await manager.submit(_msg("hello", "1"))
    await _settle(manager)
    assert await store.usage(_today(), "channel", "test:default") == 7.0  # 7000 tokens / 1000


def _today() -> str:
    import time

    return time.strftime("%Y-%m-%d", time.gmtime())


async def test_in_a_group_each_person_is_checked_and_charged_for_themselves(
    make: Any, store: Store
) -> None:
    """A turn answering several people (a group, a thread) checked and charged only the first
    message's sender: Bob, with his whole allowance left, was refused because Ana, over hers,
    wrote just before him (and the other way round, Ana got answers on Bob's credits)."""
    model = ScriptedModel(delay_s=0.3)
    model.add(text("for ana"), text("for carol"), text("for bob"))
    policy = QuotaPolicy(credits_per_run=1.0, user_daily=1.0, message="Limit reached.")
    manager, outlet = await make(model, policy)
    await manager.submit(_msg("ana's first", "1", sender="ana"))
    await _settle(manager)
    await manager.submit(_msg("carol asks", "2", sender="carol"))
    await asyncio.sleep(0.1)  # carol's turn is running: the next two wait for one turn
    await manager.submit(_msg("ana again", "3", sender="ana"))
    await manager.submit(_msg("bob asks", "4", sender="bob"))
    await _settle(manager)
    assert outlet.texts() == ["for ana", "for carol", "Limit reached.", "for bob"]
    asked = [m.content or "" for m in model.requests[-1].messages]
    assert any("bob asks" in c for c in asked)
    assert not any("ana again" in c for c in asked)
    for person in ("ana", "bob", "carol"):
        assert await store.usage(_today(), "user", f"test:default:{person}") == 1.0


async def test_a_turn_the_store_makes_retry_is_charged_once(
    make: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reservation came before the turn's store reads; when one failed, the runner tried
    the turn again and reserved again: one answer cost three credits."""
    model = ScriptedModel()
    model.add(text("answer"))
    manager, outlet = await make(model, QuotaPolicy(credits_per_run=1.0, user_daily=10.0))
    fail_first(monkeypatch, store, "history", 2, StoreError("statement timeout"))
    await manager.submit(_msg("hello", "1"))
    await asyncio.wait_for(_until_answered(outlet), 20)
    assert await store.usage(_today(), "user", "test:default:ana") == 1.0


async def _until_answered(outlet: RecordingOutlet) -> None:
    while not outlet.texts():
        await asyncio.sleep(0.05)


async def test_a_turn_cut_off_before_its_commit_is_charged_once(
    make: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica killed mid-turn (or whose commit the store refused) never gave its
    reservation back, and the turn that answered the same message reserved again: the person
    paid twice for one answer, and was refused early. The next turn of the session settles
    what a turn left: given back if it never committed, kept if it did."""
    skey = str(SessionKey("default", "test", "default", "c1"))
    who = Quota("user", "test:default:ana", 10.0)
    day = _today()
    # the leftovers of a replica killed mid-turn: its reservation and its note, message pending
    assert await store.reserve_usage(day, 1.0, [who]) is None
    note = {"day": day, "credits": 1.0, "quotas": [["user", "test:default:ana", 10.0]]}
    await store.kv_set(HOLDS_NS, f"{skey} run-of-a-dead-replica", json.dumps(note))
    model = ScriptedModel()
    model.add(text("answer"), text("second"), text("third"), text("third, again"))
    manager, outlet = await make(model, QuotaPolicy(credits_per_run=1.0, user_daily=10.0))
    await manager.submit(_msg("hello", "1"))
    await _settle(manager)
    assert outlet.texts() == ["answer"]
    assert await store.usage(day, "user", "test:default:ana") == 1.0
    assert await store.kv_items(HOLDS_NS) == {}
    # a note left by a turn that did commit (cut off just after): its charge stays
    (committed,) = [r.id for r in await console(store).runs(skey, 10) if r.status == "ok"]
    await store.kv_set(HOLDS_NS, f"{skey} {committed}", json.dumps(note))
    await manager.submit(_msg("again", "2"))
    await _settle(manager)
    assert await store.usage(day, "user", "test:default:ana") == 2.0
    # a commit the store refused: the turn is tried again, and charged once
    fail_first(monkeypatch, store, "complete_turn", 1, StoreError("connection lost"))
    await manager.submit(_msg("third time", "3"))
    await asyncio.wait_for(_until_count(outlet, 3), 20)
    await _settle(manager)
    assert await store.usage(day, "user", "test:default:ana") == 3.0
    assert await store.kv_items(HOLDS_NS) == {}


async def _until_count(outlet: RecordingOutlet, count: int) -> None:
    while len(outlet.texts()) < count:
        await asyncio.sleep(0.05)


async def test_a_reservation_and_its_note_are_written_and_taken_together(store: Store) -> None:
    """The note saying whose a reservation is was a second write: a replica killed between
    the two left a charge with no note, never given back (the person was refused early), and
    a failed note left one to be charged again. Now both go in one transaction, and the note
    is taken with the release, so of several givers-back one releases."""
    q = [Quota("user", "u", 10.0)]
    assert await store.reserve_usage(DAY, 1.0, q, note=(HOLDS_NS, "s r1", "v")) is None
    assert await store.kv_get(HOLDS_NS, "s r1") == "v"
    assert await store.reserve_usage(DAY, 20.0, q, note=(HOLDS_NS, "s r2", "v")) == q[0]
    assert await store.kv_get(HOLDS_NS, "s r2") is None  # refused: no note either
    gave = await asyncio.gather(
        *(store.release_usage(DAY, 1.0, q, note=(HOLDS_NS, "s r1")) for _ in range(3))
    )
    assert sorted(gave) == [False, False, True]
    assert await store.usage(DAY, "user", "u") == 0.0
