"""The session manager: one runner per session, FIFO, queue modes, a global cap on runs.

This module is the single home of the serialization rule: a message is stored, the session's
runner is woken, and the runner (holding the session's lease) turns pending messages into turns,
one at a time, then delivers the stored reply parts in order. Runners exist only while a session
has work; an idle session is nothing but rows in the store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping
from typing import Final

from core.access import AccessControl, AccessRule
from core.errors import StoreError
from core.models import InboundMessage, OutboundPart, Reply, SessionKey
from core.outbox import DeliveryPolicy, Outbox, Outlet
from core.periodic import every
from core.policies import (
    HELP_REPLY,
    OVERFLOW_NOTICE,
    RESET_REPLY,
    AgentProfile,
    ChannelPolicy,
    LiveOutlet,
    NotifyingStore,
    QueueMode,
    QuotaPolicy,
    SessionPolicy,
)
from core.presses import Presses, Taken, mark
from core.routing import Router
from core.runner import SessionRunner
from core.store.base import InboxStatus, PutResult, Store
from core.telemetry import NullTelemetry, Telemetry

__all__ = [
    "HELP_REPLY",
    "OVERFLOW_NOTICE",
    "RESET_REPLY",
    "AgentProfile",
    "ChannelPolicy",
    "DeliveryPolicy",
    "LiveOutlet",
    "NotifyingStore",
    "Outlet",
    "QueueMode",
    "QuotaPolicy",
    "SessionManager",
    "SessionPolicy",
]

log = logging.getLogger(__name__)
CANCEL_WAIT_S = 5.0  # at shutdown, for cancelled tasks to stop
KEYS_REMEMBERED = 1_024  # session keys built recently, kept to be used again
REHOME_GRACE_S = 600.0  # with replicas: how long work of an agent unknown here waits for one


class SessionManager:
    def __init__(
        self,
        store: Store,
        agents: Mapping[str, AgentProfile],
        outlets: Mapping[str, Outlet],
        *,
        max_concurrent_runs: int = 8,
        owner: str | None = None,
        delivery: DeliveryPolicy | None = None,
        router: Router | None = None,
        quota: QuotaPolicy | None = None,
        telemetry: Telemetry | None = None,
        access: dict[str, AccessRule] | None = None,
        channel_policies: Mapping[str, ChannelPolicy] | None = None,
    ) -> None:
        self.store = store
        self.channel_policies = dict(channel_policies or {})
        self.agents = agents
        self.router: Final = router or Router()
        # built for every message that comes in, and the same conversations come back: a
        # bounded memory of the last keys saves rebuilding (and re-quoting) each one
        self._keys = functools.lru_cache(maxsize=KEYS_REMEMBERED)(self._key)
        self.quota = quota or QuotaPolicy()
        self.outlets = outlets
        # the outlets that show a run as it happens (checked once: a Protocol isinstance is slow)
        self.live = {ch: o for ch, o in outlets.items() if isinstance(o, LiveOutlet)}
        self.presses = Presses()  # a button tapped twice is pressed once
        self.taken = Taken()  # ... when the second tap reached another replica too
        self.owner = owner or f"replica-{uuid.uuid4().hex[:12]}"
        self.telemetry: Telemetry = telemetry or NullTelemetry()
        self.access = AccessControl(access or {}, store)
        self.outbox = Outbox(store, outlets, delivery or DeliveryPolicy(), self.telemetry)
        self._slots = asyncio.Semaphore(max_concurrent_runs)
        self._runners: dict[str, SessionRunner] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._rehoming: set[str] = set()  # sessions without their agent, being moved
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def policy_for(self, key: SessionKey, profile: AgentProfile) -> SessionPolicy:
        """The agent's policy, with what the session's channel overrides (queue mode,
        debounce)."""
        override = self.channel_policies.get(key.channel)
        return profile.policy if override is None else override.applied(profile.policy)

    async def start(self, *, sweep_interval_s: float = 5.0) -> None:
        """Resume sessions with unanswered messages or undelivered replies, listen for
        messages stored by other replicas, and keep sweeping for work nobody holds (a dead
        replica's sessions once their leases expire)."""
        if isinstance(self.store, NotifyingStore):
            await self.store.listen(self._remote_arrival)
        await self._sweep()
        # both must outlive any one failure: a dead sweeper never resumes another replica's
        # work, and leases would lapse under long model calls
        self._sweeper = asyncio.create_task(every(sweep_interval_s, self._sweep, "sweep"))
        ttls = [p.policy.lease_ttl_s for p in self.agents.values()]
        renew_s = min(ttls, default=15.0) / 3
        self._heartbeat = asyncio.create_task(every(renew_s, self.renew_leases, "renewing leases"))

    async def _sweep(self) -> None:
        for skey in await self.store.sessions_with_work():
            try:
                key = SessionKey.parse(skey)
            except ValueError:
                log.error("skipping unparseable session key %r", skey)
                continue
            if key.channel in self.outlets and skey not in self._runners:
                self._wake(key, arrived=False)

    async def renew_leases(self) -> None:
        """Renew every lease this replica's runners hold, in one store call per lease ttl (not
        one per runner: 10,000 sessions queued behind the cap made 2,000 writes a second), and
        stop the runners whose lease is gone. A store error leaves them be: a lease that
        expires meanwhile is caught by the fence before the next model call, and by the commit."""
        terms: dict[float, list[tuple[SessionRunner, int]]] = {}
        for runner in self._runners.values():
            if runner.holding:
                terms.setdefault(runner.policy.lease_ttl_s, []).append((runner, runner.lease_term))
        for ttl, held in terms.items():
            try:
                kept = await self.store.renew_leases([r.skey for r, _ in held], self.owner, ttl)
            except StoreError as exc:
                log.warning("renewing %d lease(s) failed: %s", len(held), exc)
                continue
            for runner, term in held:
                # released (and maybe taken again) while the renewal ran: not lost
                if runner.skey not in kept and runner.holding and runner.lease_term == term:
                    runner.lose_lease()

    def _remote_arrival(self, skey: str) -> None:
        try:
            key = SessionKey.parse(skey)
        except ValueError:
            return
        if key.channel in self.outlets:
            self._wake(key, arrived=True)

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop taking turns; let running ones finish within the grace period, then cancel.
        Anything unfinished stays pending in the store and is resumed at the next start."""
        self._closing = True
        self.outbox.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        tasks = [r.task for r in self._runners.values()] + list(self._side_tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for t in late:
                t.cancel()
            if late:  # a task stuck where a cancel cannot reach it must not hold the exit
                _, stuck = await asyncio.wait(late, timeout=CANCEL_WAIT_S)
                if stuck:
                    log.warning("%d task(s) did not stop when cancelled; leaving them", len(stuck))
        if self._heartbeat is not None:  # after the runs: they hold their leases to the end
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    def session_key(
        self, channel: str, account: str, conversation: str, thread: str | None = None
    ) -> SessionKey:
        """The key policy in one place: bindings choose the agent, the rest is the address."""
        return self._keys(channel, account, conversation, thread)

    def _key(self, channel: str, account: str, conversation: str, thread: str | None) -> SessionKey:
        agent = self.router.agent_for(channel, account, conversation)
        return SessionKey(agent, channel, account, conversation, thread)

    async def submit(self, msg: InboundMessage, key: SessionKey | None = None) -> PutResult:
        """Store the message durably, then wake its session. Returns once it is stored.
        `key`: the message's `session_key`, when the caller has it already."""
        if key is None:
            key = self.session_key(msg.channel, msg.account, msg.conversation, msg.thread)
        verdict = await self.access.check(msg)
        if not verdict.store:
            result = PutResult(0, InboxStatus.REFUSED)
        elif (pressed := mark(str(key), msg)) and (
            first := self.presses.claim(pressed)
        ) is not None:
            extra = {"session": str(key), "channel": msg.channel}
            log.info("button %r pressed again at once: one press", msg.button_value, extra=extra)
            result = PutResult(first, InboxStatus.DUPLICATE)
        else:
            profile = self.agents.get(key.agent)
            max_pending = profile.policy.max_pending if profile else 100
            try:
                result = await self.store.put_inbound(
                    str(key), msg, max_pending, unpaired=verdict.unpaired
                )
            except BaseException:
                if pressed:
                    self.presses.release(pressed)
                raise
            if pressed:
                self.presses.stored(pressed, result.id)
        self.telemetry.inbound(msg.channel, str(result.status))
        if verdict.notice and result.status is not InboxStatus.DUPLICATE:
            await self.notify(key, verdict.notice)
        if result.status is InboxStatus.PENDING:
            self._wake(key, arrived=True)
            runner = self._runners.get(str(key))
            if runner is not None and verdict.coalesce:
                runner.coalesce = True
        elif result.status is InboxStatus.OVERFLOW:
            self._notify_overflow(key)
        return result

    def active(self) -> int:
        """Sessions with a runner in memory (a turn running, queued, or replies to deliver)."""
        return len(self._runners)

    def running(self) -> int:
        """Runs executing now (at most max_concurrent_runs)."""
        return sum(1 for r in self._runners.values() if r.turn_task is not None)

    def check_idle(self) -> None:
        """Tell wait_idle once no session has work in progress here."""
        if not self._runners and not self._rehoming:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no session has work in progress."""
        await self._idle.wait()

    def _wake(self, key: SessionKey, *, arrived: bool) -> None:
        if self._closing:
            return
        skey = str(key)
        runner = self._runners.get(skey)
        if runner is None:
            profile = self.agents.get(key.agent)
            if profile is None:
                if skey not in self._rehoming:
                    self._rehoming.add(skey)
                    self._idle.clear()
                    self._spawn(self._rehome(key))
                return
            runner = self._runners[skey] = SessionRunner(self, key, profile)
            self._idle.clear()
        runner.poke(arrived=arrived)

    async def _rehome(self, key: SessionKey) -> None:
        """A session whose agent is no longer served (made a draft, removed, its binding gone):
        its unanswered messages and undelivered replies go to the session the conversation
        has now, and are answered there in order."""
        try:
            await self._move_work(key)
        finally:
            self._rehoming.discard(str(key))
            self.check_idle()

    async def _move_work(self, key: SessionKey) -> None:
        new = self.session_key(key.channel, key.account, key.conversation, key.thread)
        if new.agent not in self.agents:
            log.error("no agent %r for session %s; its messages stay pending", key.agent, key)
            return
        try:
            # with replicas, one still on the old configuration may not know a new agent
            # (a rolling deploy): only work left that long is taken for abandoned
            grace = REHOME_GRACE_S if isinstance(self.store, NotifyingStore) else 0.0
            messages, parts = await self.store.move_work(str(key), str(new), time.time() - grace)
        except StoreError as exc:
            log.warning("moving the work of a session without its agent failed: %s", exc)
            return
        if messages or parts:
            log.warning(
                "agent %r is no longer served: %d unanswered message(s) and %d reply part(s)"
                " move to session %s",
                key.agent,
                messages,
                parts,
                new,
                extra={"session": str(key), "channel": key.channel},
            )
            self._wake(new, arrived=bool(messages))

    async def notify(
        self, key: SessionKey, text: str, *, about: InboundMessage | None = None
    ) -> None:
        """Send a notice that answers no message (e.g. "that message type is not supported"):
        stored in the outbox, then delivered in order by the session's runner. With `about`,
        nothing is sent when access control refuses its sender."""
        if about is not None and not await self.access.admits(about):
            return
        await self.store.enqueue_replies(str(key), [Reply(text=text)])
        self._wake(key, arrived=False)

    async def operator_reply(self, key: SessionKey, text: str) -> list[OutboundPart]:
        """A person answers in the session (human takeover): stored in the outbox like any
        reply, so the customer sees a normal message, and delivered in order by the runner."""
        parts = await self.store.enqueue_replies(str(key), [Reply(text=text)])
        self._wake(key, arrived=False)
        return parts

    async def pause(self, key: SessionKey, reason: str) -> None:
        """A person takes over: the bot starts no run here until hand_back, and the answer it
        is writing now is dropped (a turn whose commit went through before the pause still goes
        out, and keeps the pause); messages are kept for the operator."""
        session = await self.store.get_session(str(key))
        state = dict(session.state)
        state["handoff"] = {"reason": reason, "at": time.time(), "run": None}
        await self.store.set_state(str(key), state)
        if (runner := self._runners.get(str(key))) is not None:
            runner.discard_turn()

    async def hand_back(self, key: SessionKey) -> int:
        """The operator gives the session back to the bot; held messages are answered in order."""
        session = await self.store.get_session(str(key))
        state = {k: v for k, v in session.state.items() if k != "handoff"}
        await self.store.set_state(str(key), state)
        released = await self.store.release_held(str(key))
        self._wake(key, arrived=True)  # also for messages not held yet (paused mid-turn)
        return released

    def _notify_overflow(self, key: SessionKey) -> None:
        runner = self._runners.get(str(key))
        if runner is None:
            self._wake(key, arrived=False)
            runner = self._runners.get(str(key))
        if runner is None or runner.overflow_noticed:
            return
        runner.overflow_noticed = True
        self._spawn(runner.notice(OVERFLOW_NOTICE))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
