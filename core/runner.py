"""One session's runner: holds the session's lease while it has work, turns pending messages
into turns one at a time (queue modes, commands, quotas, confirmations), fences every model
call, commits each turn atomically and delivers the stored replies in order.

Past STYLE's 600 lines on purpose: a turn is one sequence over the runner's own state (its
lease, run, batch, live preview and quota reservation), and each exit from it (cancelled,
paused elsewhere, store down, committed) must settle all of them; split across modules, those
exits were harder to see together. The quota helpers are the first to move out when it grows."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import astuple
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.agent.loop import AgentEvent, Done, EventSink, RunOutcome, TextDelta, ToolStep, Turn
from core.agent.prompt import describe_inbound, history_messages, quote_note, system_prompt
from core.agent.tools import CONSENT
from core.errors import SessionPaused, StoreError, SwitchboardError
from core.logcontext import about
from core.models import InboundMessage, MessageKind, Reply, SessionKey
from core.policies import (
    HELP_REPLY,
    RESET_REPLY,
    AgentProfile,
    LiveOutlet,
    QueueMode,
)
from core.store.base import HistoryEntry, InboxItem, Quota, RunRecord, SessionRecord

if TYPE_CHECKING:
    from core.sessions import SessionManager

__all__ = ["SessionRunner"]

log = logging.getLogger("core.sessions")


class SessionRunner:
    """Works one session while it has work, holding its lease; gone when idle."""

    def __init__(self, mgr: SessionManager, key: SessionKey, profile: AgentProfile) -> None:
        self.mgr, self.key, self.skey, self.profile = mgr, key, str(key), profile
        self.policy = mgr.policy_for(key, profile)
        self.poked = True
        self.last_arrival = 0.0
        self.arrival = asyncio.Event()
        self.overflow_noticed = False
        self.coalesce = False  # a flood: answer everything queued together, whatever the mode
        self.turn_task: asyncio.Task[RunOutcome] | None = None
        self.committing = False
        self.lease_lost = False
        self.holding = False  # the lease is held: from acquire to release
        self.lease_term = 0  # one more each time the lease is acquired
        self.lease_young_until = 0.0  # monotonic: till then, the lease just taken surely holds
        self.batch_ids: set[int] = set()
        self.batch_texts: list[str] = []
        self.run: RunRecord | None = None
        self.deliver_lock = asyncio.Lock()
        self.task = asyncio.create_task(self._main(), name=f"session {self.skey}")

    def poke(self, *, arrived: bool) -> None:
        self.poked = True
        if not arrived:
            return
        self.last_arrival = time.monotonic()
        self.arrival.set()
        if self.policy.queue_mode is QueueMode.INTERRUPT:
            self.discard_turn()

    def discard_turn(self) -> None:
        """Cancel the turn running now, unless it is already committing: its reply is never
        sent and its messages stay pending."""
        turn = self.turn_task
        if turn is not None and not turn.done() and not self.committing:
            turn.cancel()

    async def _main(self) -> None:
        about(session=self.skey, channel=self.key.channel)  # this task's lines, and its turns'
        failures = 0
        try:
            while True:
                try:
                    if not await self._acquire():
                        log.info("session %s is leased elsewhere; leaving it", self.skey)
                        return
                    self.lease_term += 1
                    self.holding = True  # the manager's heartbeat renews it from now on
                    try:
                        await self._work()
                    finally:
                        self.holding = False
                        with contextlib.suppress(StoreError):
                            release = self.mgr.store.release_lease(self.skey, self.mgr.owner)
                            await asyncio.shield(release)
                    failures = 0
                except Exception as exc:
                    failures += 1
                    if isinstance(exc, SwitchboardError):
                        log.warning("session %s: %s (failure %d)", self.skey, exc, failures)
                    else:
                        log.exception("session %s runner failed", self.skey)
                    if self.mgr._closing:  # shutting down: the next start resumes it
                        return
                    if failures >= MAX_RUNNER_FAILURES:
                        log.error(
                            "session %s: giving up for now; its next message or the sweep for"
                            " unheld work (store.poll_interval_s) starts it again",
                            self.skey,
                        )
                        return
                    await asyncio.sleep(min(0.5 * 2**failures, 10.0))
                    continue
                if not self.poked or self.mgr._closing:
                    return
        finally:
            if self.mgr._runners.get(self.skey) is self:
                del self.mgr._runners[self.skey]
                self.mgr.check_idle()

    async def _acquire(self) -> bool:
        """Take the session's lease, or leave: whoever holds it reads pending work before it
        lets go, and the sweeper picks the session up if that holder dies."""
        asked = time.monotonic()
        acquired = await self.mgr.store.acquire_lease(
            self.skey, self.mgr.owner, self.policy.lease_ttl_s
        )
        self.lease_lost = not acquired
        if acquired:  # nobody can take it before it expires, a ttl from `asked` at the earliest
            self.lease_young_until = asked + self.policy.lease_ttl_s / 3
        return acquired

    def lose_lease(self) -> None:
        """The lease is gone (expired and taken by another replica): stop the run unless it is
        already committing (the commit is fenced by the store and fails cleanly)."""
        self.lease_lost = True
        if self.turn_task is not None and not self.committing:
            self.turn_task.cancel()

    async def _fence(self) -> None:
        """Before each model call: extend the lease, or stop the run. The heartbeat alone can
        be late under load; this way a model call only starts while the lease surely holds.
        The first call after the lease was taken needs no renewal while the lease is young
        (a third of its ttl): that was one store write more per answered message."""
        if not self.lease_lost and time.monotonic() < self.lease_young_until:
            self.lease_young_until = 0.0  # for one call: the next one renews
            return
        try:
            held = await self._still_holding()
        except StoreError:
            self.lease_lost = True
            held = False
        if not held:
            raise asyncio.CancelledError  # ends the turn as if interrupted; nothing is committed

    async def _work(self) -> None:
        drained = False  # the last turn took every pending message, and nothing came since
        while not self.lease_lost:
            self.poked = False
            await self.deliver()
            if self.mgr._closing or self.lease_lost:
                return  # draining (stored replies go out, no new turn starts), or not ours
            await self._debounce()
            if drained and not self.poked:
                return  # nothing to read: whatever arrives now pokes _main into another round
            drained = False
            items = await self.mgr.store.pending(self.skey)
            if not items:
                if self.poked:
                    continue
                return
            if (wait := _rest_of_post(items)) > 0:  # stored here or by another replica
                await asyncio.sleep(wait)
                continue
            session = await self.mgr.store.get_session(self.skey)
            if session.state.get("handoff"):
                held = await self.mgr.store.hold_pending(self.skey)
                log.info(
                    "session %s is with an operator; %d message(s) held",
                    self.skey,
                    held,
                    extra={"session": self.skey, "channel": self.key.channel},
                )
                continue
            head = items[0]
            if head.message.kind is MessageKind.COMMAND and head.message.command in COMMANDS:
                await self._command(head)
                continue
            if await self._drop_repeats(items):
                continue
            waits = self.mgr._slots.locked()  # the session may change while this run waits
            async with self.mgr._slots:
                if self.mgr._closing:
                    return
                if waits:  # what arrived while this waited for a run slot counts too, and an
                    # operator may have taken the session meanwhile
                    items = await self.mgr.store.pending(self.skey)
                    if not items or _is_command(items[0]) or await self._drop_repeats(items):
                        continue
                    session = await self.mgr.store.get_session(self.skey)
                    if session.state.get("handoff"):
                        continue  # the next round holds its messages
                batch = self._batch(items)
                await self._turn(batch, session)
            drained = len(batch) == len(items) and not self.poked

    def _batch(self, items: list[InboxItem]) -> list[InboxItem]:
        """The messages the next turn answers, by the queue mode: all pending up to the next
        command, or (followup) the first alone, with the burst it came in (debounce)."""
        batch = list(itertools.takewhile(lambda i: not _is_command(i), items))
        if self.policy.queue_mode is QueueMode.FOLLOWUP and not self.coalesce:
            batch = batch[: _burst(batch, self.policy.debounce_s)]
        self.coalesce = False
        return batch

    async def _debounce(self) -> None:
        """A quiet window after the last arrival, so a burst typed on a phone is one turn."""
        while True:
            self.arrival.clear()
            remaining = self.policy.debounce_s - (time.monotonic() - self.last_arrival)
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self.arrival.wait(), remaining)
            except TimeoutError:
                return

    async def _turn(self, batch: list[InboxItem], session: SessionRecord | None) -> None:
        run = RunRecord(
            id=uuid.uuid4().hex,
            session=self.skey,
            started_at=time.time(),
            inbox_ids=[i.id for i in batch],
        )
        self.run = run
        self.overflow_noticed = False
        self.batch_ids = set(run.inbox_ids)
        described = {i.id: describe_inbound(await self._quoting(i.message)) for i in batch}
        self.batch_texts = list(described.values())
        if session is None:
            session = await self.mgr.store.get_session(self.skey)
        turns = self.policy.history_turns
        # room for notices and operator replies (assistant entries that answer no turn)
        history = _last_turns(await self.mgr.store.history(self.skey, turns * 3), turns)
        rules = self.profile.output_rules.get(self.key.channel, "")
        turn = Turn(
            run_id=run.id,
            session=self.skey,
            system=system_prompt(self.profile.instructions, rules, session.state),
            history=history_messages(history),
            user_texts=list(self.batch_texts),
            state=session.state,
            steer=self._steer if self.policy.queue_mode is QueueMode.STEER else None,
            workspace=self._workspace(),
            guard=self._fence,
            confirmations=[c for i in batch if (c := _confirmation(i)) is not None],
            senders=_askers(batch),
        )
        day = time.strftime("%Y-%m-%d", time.gmtime())
        run.credits = self.mgr.quota.credits(self.profile.loop.limits)
        if self.mgr.quota.user_daily > 0 or self.mgr.quota.channel_daily > 0:
            await self._settle_holds()
        quotas, over, refused = await self._reserve(batch, day, run)
        if refused is not None:
            await self._refuse(run, refused)
            return
        live = self._live()
        try:  # until the turn starts: if this fails, the turn is tried again, and so is its
            # reservation, which must not stay
            if over:  # in a group: answer the others, and tell those over their limit
                self.batch_texts = [
                    described[i.id] for i in batch if i.message.sender.id not in over
                ]
                turn.user_texts = list(self.batch_texts)
                turn.senders = tuple(s for s in turn.senders if s not in over)
                await self.notice(self.mgr.quota.message)
            if live is not None:
                await _quietly(live.run_started(self.key, run.id, batch[-1].message), self.skey)
        except BaseException:
            if quotas:
                with contextlib.suppress(StoreError):
                    await asyncio.shield(self._give_back(run, day, quotas))
            raise
        tools: list[dict[str, Any]] = []  # each tool call, for the run record

        async def emit(event: AgentEvent) -> None:
            if live is not None and isinstance(event, TextDelta):
                await _quietly(live.run_delta(self.key, run.id, event.text), self.skey)
            elif isinstance(event, ToolStep):
                tools.append(_tool_record(event))
            elif isinstance(event, Done):
                log.info(
                    "run %s %s steps=%d tools=%d tokens=%d+%d limits=%s",
                    run.id,
                    event.outcome.status,
                    event.outcome.steps,
                    event.outcome.tool_calls,
                    event.outcome.input_tokens,
                    event.outcome.output_tokens,
                    ",".join(event.outcome.limits_hit) or "-",
                    extra={"session": self.skey, "channel": self.key.channel, "run_id": run.id},
                )

        self.turn_task = asyncio.create_task(_about_run(run.id, self.profile.loop.run, turn, emit))
        try:
            outcome = await self.turn_task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            why = "interrupted" if not self.lease_lost else "lease_lost"
            await self._discard(run, day, quotas, tools, live, why)
            if current is not None and current.cancelling():
                raise
            return
        finally:
            self.turn_task = None
        self.committing = True
        try:
            if outcome.status in UNCHARGED and outcome.steps == 0:  # the model produced nothing
                if quotas:
                    await self._give_back(run, day, quotas)
                run.credits = 0.0
            _fill(run, outcome)
            if tools:
                run.detail["tools"] = tools
            state = outcome.state
            if outcome.handoff:
                state["handoff"] = {"reason": outcome.handoff, "at": time.time(), "run": run.id}
            reply = Reply(text=outcome.text, buttons=tuple(outcome.buttons))
            await asyncio.shield(
                self.mgr.store.complete_turn(
                    self.mgr.owner,
                    run,
                    "\n\n".join(self.batch_texts),
                    [reply],
                    state if state != session.state else None,
                    unless_paused=True,
                )
            )
        except SessionPaused:
            # an operator took the session while this ran: on another replica, or here once the
            # turn could no longer be cancelled (the answer is dropped, its messages are held)
            log.info(
                "run %s answered a session an operator took meanwhile: answer dropped",
                run.id,
                extra={"session": self.skey, "channel": self.key.channel, "run_id": run.id},
            )
            await self._discard(run, day, quotas, tools, live, "paused")
            self.poked = True  # another round holds the messages
            return
        except StoreError:  # not committed (lease lost, store down): the preview must go;
            # its reservation stays held, for the next turn of the session to settle
            if live is not None:
                await _quietly(live.run_ended(self.key, run.id, discarded=True), self.skey)
            raise
        finally:
            self.committing = False
        if quotas:
            with contextlib.suppress(StoreError):  # left over, it is found committed
                await self.mgr.store.kv_delete(HOLDS_NS, self._note(run))
        if outcome.handoff:
            log.warning(
                "handoff to a human requested: %s",
                outcome.handoff,
                extra={"session": self.skey, "channel": self.key.channel, "run_id": run.id},
            )
        if live is not None:
            await _quietly(live.run_ended(self.key, run.id, discarded=False), self.skey)
        self._report(run)

    async def _discard(
        self,
        run: RunRecord,
        day: str,
        quotas: list[Quota],
        tools: list[dict[str, Any]],
        live: LiveOutlet | None,
        why: str,
    ) -> None:
        """A turn whose answer is never sent: its messages stay pending, its credits go back."""
        run.status, run.ended_at = "cancelled", time.time()
        if quotas and not self.lease_lost:  # lost: the new holder settles the reservation
            with contextlib.suppress(StoreError):
                await asyncio.shield(self._give_back(run, day, quotas))
        run.credits = 0.0  # the messages will be answered (and charged) by a later run
        run.limits_hit.append(why)
        if tools:
            run.detail["tools"] = tools
        if live is not None:
            await _quietly(live.run_ended(self.key, run.id, discarded=True), self.skey)
        with contextlib.suppress(StoreError):
            await asyncio.shield(self.mgr.store.record_run(run))
        self._report(run)

    def _note(self, run: RunRecord) -> str:
        """The key of the note a turn's reservation is written with (in the same transaction:
        a replica killed mid-turn never gives it back, and without the note nobody would)."""
        return f"{self.skey} {run.id}"

    async def _give_back(self, run: RunRecord, day: str, quotas: list[Quota]) -> None:
        """The turn's reservation, released with its note taken (in one transaction) by this
        turn, or (it was cut off) by the session's next one, never both."""
        await self.mgr.store.release_usage(
            day, run.credits, quotas, note=(HOLDS_NS, self._note(run))
        )

    async def _settle_holds(self) -> None:
        """Reservations of this session's turns that ended without settling them (a replica
        killed or cut off from the store mid-turn): no turn of the session runs now, so each
        is either committed (charged: its note goes) or given back."""
        prefix = self.skey + " "
        for key, value in (await self.mgr.store.kv_items(HOLDS_NS)).items():
            if not key.startswith(prefix):
                continue
            run_id = key[len(prefix) :]
            if await self.mgr.store.run_messages(run_id):  # committed, and charged
                await self.mgr.store.kv_delete(HOLDS_NS, key)
                continue
            hold = json.loads(value)
            quotas = [Quota(*q) for q in hold["quotas"]]
            note = (HOLDS_NS, key)
            if await self.mgr.store.release_usage(hold["day"], hold["credits"], quotas, note=note):
                log.info(
                    "gave back %s credits reserved by run %s, which never ended",
                    hold["credits"],
                    run_id,
                    extra={"session": self.skey, "channel": self.key.channel},
                )

    def _report(self, run: RunRecord) -> None:
        t = self.mgr.telemetry
        seconds = (run.ended_at or time.time()) - run.started_at
        t.run_done(
            self.key.agent,
            self.key.channel,
            run.status,
            seconds,
            run.input_tokens,
            run.output_tokens,
        )
        for call in run.detail.get("calls", []):
            if "seconds" in call:
                t.model_call(call["seconds"])

    async def _reserve(
        self, batch: list[InboxItem], day: str, run: RunRecord
    ) -> tuple[list[Quota], set[str], Quota | None]:
        """Each person whose message the turn answers is charged the run (in a group a turn
        can answer several): (the quotas reserved, the senders over their own limit, whose
        messages the turn leaves out, and the quota refusing the whole turn: the channel's,
        or every sender's own)."""
        senders = list(dict.fromkeys(i.message.sender.id for i in batch))
        wanted: dict[tuple[str, str], Quota] = {}
        owner: dict[tuple[str, str], str] = {}
        for sender in senders:
            for q in self.mgr.quota.quotas(self.key, sender):
                wanted[(q.scope, q.key)] = q
                if q.scope == "user":
                    owner[(q.scope, q.key)] = sender
        over: set[str] = set()
        while wanted:
            quotas = list(wanted.values())
            note = (HOLDS_NS, self._note(run), _hold(day, run.credits, quotas))
            refused = await self.mgr.store.reserve_usage(day, run.credits, quotas, note=note)
            if refused is None:
                break
            who = owner.get((refused.scope, refused.key))
            if who is None or len(over) + 1 == len(senders):
                return [], over, refused
            over.add(who)
            del wanted[(refused.scope, refused.key)]
        return list(wanted.values()), over, None

    async def _refuse(self, run: RunRecord, quota: Quota) -> None:
        """Over quota: a polite answer, no model call; the messages count as answered."""
        run.status, run.ended_at, run.credits = "quota", time.time(), 0.0
        run.limits_hit.append(f"quota_{quota.scope}")
        log.info("over the %s quota (%s)", quota.scope, quota.key, extra={"session": self.skey})
        await self.mgr.store.complete_turn(
            self.mgr.owner, run, "\n\n".join(self.batch_texts), [Reply(text=self.mgr.quota.message)]
        )
        self._report(run)

    async def _steer(self) -> list[str]:
        """Messages that arrived since the turn started, up to the next command or the next
        press of a Confirm or Cancel button (a turn reads those from its first batch only, so
        they open the next turn)."""
        new = []
        for item in await self.mgr.store.pending(self.skey):
            if item.id in self.batch_ids:
                continue
            if _is_command(item) or _confirmation(item) is not None:
                break
            new.append(item)
        texts = [describe_inbound(await self._quoting(i.message)) for i in new]
        self.batch_ids.update(i.id for i in new)
        self.batch_texts.extend(texts)
        if self.run is not None:
            self.run.inbox_ids.extend(i.id for i in new)
        return texts

    async def _quoting(self, msg: InboundMessage) -> InboundMessage:
        """`msg` with a note of what it quotes, when its platform names that message by id
        only and the store knows it (our reply, or one the person sent). Read here, once the
        webhook has been answered."""
        if msg.quotes is None or msg.reply_to is None or msg.kind is MessageKind.BUTTON:
            return msg
        try:
            found = await self.mgr.store.quoted(self.skey, msg.reply_to)
        except (StoreError, ValueError):  # a note is no reason to fail the turn (nor is an
            return msg  # old row the models cannot read)
        if found is None:
            return msg
        role, said = found
        whose = "your message" if role == "assistant" else "their message"
        return msg.model_copy(update={"notes": (*msg.notes, quote_note(whose, said, msg.quotes))})

    async def _command(self, item: InboxItem) -> None:
        name = item.message.command
        if name == "reset":
            await self.mgr.store.reset_session(self.skey, item.message.received_at)
            await self._clear_workspace()
            text = RESET_REPLY
        elif name == "start":
            text = self.profile.greeting
        else:
            text = HELP_REPLY
        run = RunRecord(
            id=uuid.uuid4().hex,
            session=self.skey,
            started_at=time.time(),
            status="command",
            ended_at=time.time(),
            inbox_ids=[item.id],
            detail={"command": name},
        )
        await self.mgr.store.complete_turn(
            self.mgr.owner, run, "", [Reply(text=text)], remember=False
        )

    async def _drop_repeats(self, items: list[InboxItem]) -> bool:
        """Mark answered, with no reply, the presses that repeat one this replica took (another
        replica stored them: its own check could not know). True when there were any."""
        repeats = self.mgr.taken.repeats(self.skey, items)
        if not repeats:
            return False
        now = time.time()
        run = RunRecord(
            id=uuid.uuid4().hex,
            session=self.skey,
            started_at=now,
            status="command",  # answered by the gateway itself, with no model call
            ended_at=now,
            inbox_ids=[i.id for i in repeats],
            detail={"repeated_press": True},
        )
        await self.mgr.store.complete_turn(self.mgr.owner, run, "", [], remember=False)
        log.info(
            "%d button press(es) repeated one taken already: one press",
            len(repeats),
            extra={"session": self.skey, "channel": self.key.channel},
        )
        return True

    async def notice(self, text: str) -> None:
        """A notice now, in the middle of a turn: sent at once by the lease holder; without
        the lease (another replica holds it) it waits in the outbox for whoever holds it."""
        await self.mgr.store.enqueue_replies(self.skey, [Reply(text=text)])
        if self.holding and not self.lease_lost:
            await self.deliver()
        else:
            self.mgr._wake(self.key, arrived=False)

    async def deliver(self) -> None:
        """Send stored reply parts in order; each is marked sent once the platform confirms."""
        async with self.deliver_lock:
            await self.mgr.outbox.deliver_pending(self.key, self._still_holding)

    async def _still_holding(self) -> bool:
        """The lease, renewed now (before a model call, and before a send that follows a
        wait: a StoreError ends that delivery as any store failure does, the runner lets go
        and comes back)."""
        if self.lease_lost:
            return False
        held = await self.mgr.store.renew_lease(self.skey, self.mgr.owner, self.policy.lease_ttl_s)
        if not held:
            self.lease_lost = True
        return held

    async def _clear_workspace(self) -> None:
        """A fresh session does not see the old one's kept tool results or skill files."""
        folder = self._workspace()
        if folder is None or not folder.exists():
            return
        try:
            await asyncio.to_thread(shutil.rmtree, folder)
        except OSError as exc:  # its name holds the session key (a web chat's cookie): not shown
            extra = {"session": self.skey, "channel": self.key.channel}
            reason = exc.strerror or type(exc).__name__
            log.warning("reset: the session's workspace was not cleared: %s", reason, extra=extra)

    def _workspace(self) -> Path | None:
        root = self.profile.workspace_dir
        if root is None:
            return None
        return root / re.sub(r"[^A-Za-z0-9_-]+", "_", self.skey)[:200]

    def _live(self) -> LiveOutlet | None:
        return self.mgr.live.get(self.key.channel)


COMMANDS = frozenset({"reset", "start", "help"})
UNCHARGED = frozenset({"model_error", "error", "timeout"})  # when no model call completed
PARTS_QUIET_S = 1.0  # the rest of a post sent as several messages comes within this
PARTS_MEDIA_QUIET_S = 3.0  # ... after a part with a file (two fetches of up to ~1.4 s each)
MAX_RUNNER_FAILURES = 5  # in a row; the work stays stored and resumes on the next wake
HOLDS_NS = "quota.holds"  # "<session key> <run id>" -> a running turn's quota reservation
TOOL_TEXT_MAX = 2000  # characters of a tool call's arguments and result kept in the run record


def _is_command(item: InboxItem) -> bool:
    return item.message.kind is MessageKind.COMMAND and item.message.command in COMMANDS


def _last_turns(entries: list[HistoryEntry], turns: int) -> list[HistoryEntry]:
    """The history from the `turns`-th newest user message on (all of it, with fewer): an
    answer whose question is out of the window is no use to the model."""
    users = [i for i, e in enumerate(entries) if e.role == "user"]
    if turns <= 0:
        return []
    return entries[users[-turns] :] if len(users) >= turns else entries


def _rest_of_post(items: list[InboxItem]) -> float:
    """Seconds to wait for more parts of a post sent as several messages (an album), when
    the newest pending message is one and came less than PARTS_QUIET_S ago; a part with a
    file is stored only once the file is fetched, and the platform sends the next part only
    then (each fetched in turn): PARTS_MEDIA_QUIET_S."""
    newest = items[-1].message
    if newest.part_of is None:
        return 0.0
    quiet = PARTS_MEDIA_QUIET_S if newest.attachments else PARTS_QUIET_S
    return max(0.0, quiet - (time.time() - newest.received_at))


def _burst(items: list[InboxItem], window_s: float) -> int:
    """How many of `items` came in one burst with the first: each within `window_s` of the one
    before, by when they were received, or a part of the same post (an album)."""
    n = 1
    while n < len(items):
        this, before = items[n].message, items[n - 1].message
        same_post = this.part_of is not None and this.part_of == before.part_of
        in_window = window_s > 0 and this.received_at - before.received_at <= window_s
        if not (same_post or in_window):
            break
        n += 1
    return n


def _askers(batch: list[InboxItem]) -> tuple[str, ...]:
    """Who may confirm what this turn asks for: its senders; anyone, when one of them wrote
    anonymously (their own press would carry an id nobody could match)."""
    if any(i.message.sender.anonymous for i in batch):
        return ()
    return tuple(dict.fromkeys(i.message.sender.id for i in batch))


def _confirmation(item: InboxItem) -> tuple[str, bool, str] | None:
    """(token, confirmed, who pressed) for a press of a Confirm or Cancel button a tool
    asked for."""
    if item.message.kind is not MessageKind.BUTTON:
        return None
    m = CONSENT.match(item.message.button_value or "")
    return (m.group(2), m.group(1) == "confirm", item.message.sender.id) if m else None


def _fill(run: RunRecord, outcome: RunOutcome) -> None:
    run.status = outcome.status
    run.ended_at = time.time()
    run.steps, run.tool_calls = outcome.steps, outcome.tool_calls
    run.input_tokens, run.output_tokens = outcome.input_tokens, outcome.output_tokens
    run.limits_hit = list(outcome.limits_hit)
    run.error = outcome.error
    run.detail = {"calls": outcome.calls, "steered": outcome.steered}
    if outcome.unverified_amounts:
        run.detail["unverified_amounts"] = outcome.unverified_amounts
    if outcome.handoff:
        run.detail["handoff"] = outcome.handoff


def _tool_record(step: ToolStep) -> dict[str, Any]:
    return {
        "name": step.name,
        "arguments": step.arguments[:TOOL_TEXT_MAX],
        "result": step.result[:TOOL_TEXT_MAX],
        "ok": step.ok,
    }


async def _about_run(
    run_id: str,
    run: Callable[[Turn, EventSink], Awaitable[RunOutcome]],
    turn: Turn,
    emit: EventSink,
) -> RunOutcome:
    """The turn, in its own task: what it logs is about this run (the runner's own lines,
    before and after, are about the session only). The run's coroutine is made here: made
    by the caller, a task cancelled before it started (a newer message interrupting at once)
    left it never awaited, and Python warned."""
    about(run_id=run_id)
    return await run(turn, emit)


async def _quietly(coro: Awaitable[None], skey: str) -> None:
    """Live feedback is best effort: a failed typing indicator must not fail the run."""
    try:
        await coro
    except Exception:
        log.warning("live update failed", exc_info=True, extra={"session": skey})


def _hold(day: str, credits: float, quotas: list[Quota]) -> str:
    return json.dumps(
        {"day": day, "credits": credits, "quotas": [list(astuple(q)) for q in quotas]}
    )
