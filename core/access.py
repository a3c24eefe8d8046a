"""Who may talk to the agent on a channel, and how fast.

Access modes per channel: "open" (anyone), "allowlist" (only listed senders), "pairing" (an
unknown sender gets a one-time code; their messages are kept aside until the operator approves
the code with `switchboard pairing approve CODE`). A blocklist applies in every mode. Flood
control: past `flood_messages` in `flood_window_s` a sender's messages are still stored, but
answered together (coalesced), and the sender is told once.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from core.models import InboundMessage
from core.store.base import Store

__all__ = [
    "Access",
    "AccessControl",
    "AccessRule",
    "Verdict",
    "approve",
    "for_how_long",
    "pending_codes",
]

APPROVED = "access.approved"  # "channel:sender" -> approval time
CODES = "access.codes"  # code -> {"channel", "sender", "expires"}
PENDING_CODES_MAX = 20  # codes waiting for approval at once, per channel
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I
SWEEP_EVERY_S = 60.0  # how often senders gone quiet are forgotten by flood control
TOLD_MAX = 100_000  # refused senders remembered as already told


def for_how_long(seconds: float) -> str:
    """What a person reads of a time left: "45 seconds", "1 minute", "90 minutes", "2 hours"."""
    whole = max(0, round(seconds))
    if whole < 120:
        value, unit = (whole, "second") if whole < 60 else (whole // 60, "minute")
    elif whole < 3 * 3600:
        value, unit = round(whole / 60), "minute"
    else:
        value, unit = round(whole / 3600), "hour"
    return f"{value} {unit}{'' if value == 1 else 's'}"


class Access(StrEnum):
    OPEN = "open"
    ALLOWLIST = "allowlist"
    PAIRING = "pairing"


@dataclass(frozen=True, slots=True)
class AccessRule:
    mode: Access = Access.OPEN
    allow: frozenset[str] = frozenset()
    block: frozenset[str] = frozenset()
    flood_messages: int = 0  # 0: no flood control
    flood_window_s: float = 60.0
    pairing_ttl_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Verdict:
    store: bool  # keep the message at all
    unpaired: bool = False  # keep it aside until the sender is approved
    notice: str | None = None  # tell the sender this (once per code / flood episode)
    coalesce: bool = False  # answer this sender's queued messages together


_NO_RULES = AccessRule()  # a channel without rules (frozen: one is shared)
_STORE = Verdict(store=True)  # the common answer, made once


PAIRING_NOTICE = (
    "Hello! This assistant only talks to approved people. Please give the operator this code: "
    "{code} (valid for {valid}). Your messages are kept and will be answered once "
    "you are approved."
)
PAIRING_BUSY = "This assistant is not taking new people right now. Please try again later."
PRIVATE = "Sorry, this assistant is private."
FLOOD_NOTICE = (
    "You're sending messages quickly, so I'll read them all and answer them together in a moment."
)


@dataclass
class AccessControl:
    rules: dict[str, AccessRule]
    store: Store
    # memory of recent senders only: what has gone quiet is forgotten (see _forget_quiet)
    _recent: dict[str, deque[float]] = field(default_factory=dict)
    _flooding: dict[str, float] = field(default_factory=dict)  # sender -> episode end
    _told: set[str] = field(default_factory=set)  # senders told they are not allowed
    _sweep_at: float = 0.0  # monotonic time of the next _forget_quiet

    async def check(self, msg: InboundMessage) -> Verdict:
        rule = self.rules.get(msg.channel, _NO_RULES)
        who = f"{msg.channel}:{msg.sender.id}"
        if msg.sender.id in rule.block:
            return Verdict(store=False)
        if rule.mode is Access.ALLOWLIST and msg.sender.id not in rule.allow:
            if who in self._told:
                return Verdict(store=False)
            if len(self._told) >= TOLD_MAX:  # many strangers: some may be told twice
                self._told.clear()
            self._told.add(who)
            return Verdict(store=False, notice=PRIVATE)
        if (
            rule.mode is Access.PAIRING
            and msg.sender.id not in rule.allow
            and await self.store.kv_get(APPROVED, who) is None
        ):
            return await self._pairing(msg, rule, who)
        return self._flood(rule, who)

    async def admits(self, msg: InboundMessage) -> bool:
        """Whether the sender may be answered at all (not blocked; allowed or approved where
        the mode asks), without counting the message as `check` does."""
        rule = self.rules.get(msg.channel, _NO_RULES)
        if msg.sender.id in rule.block:
            return False
        if rule.mode is Access.OPEN or msg.sender.id in rule.allow:
            return True
        if rule.mode is Access.ALLOWLIST:
            return False
        return await self.store.kv_get(APPROVED, f"{msg.channel}:{msg.sender.id}") is not None

    async def _pairing(self, msg: InboundMessage, rule: AccessRule, who: str) -> Verdict:
        now = time.time()
        codes = {c: json.loads(v) for c, v in (await self.store.kv_items(CODES)).items()}
        live = {c: v for c, v in codes.items() if v["expires"] > now}
        for code in set(codes) - set(live):
            await self.store.kv_delete(CODES, code)
        if any(v["channel"] == msg.channel and v["sender"] == msg.sender.id for v in live.values()):
            return Verdict(store=True, unpaired=True)  # already told their code
        # per channel: anonymous web visitors (a new cookie each) must not use up the codes
        # of the people writing on Telegram, Slack or WhatsApp
        if sum(v["channel"] == msg.channel for v in live.values()) >= PENDING_CODES_MAX:
            return Verdict(store=True, unpaired=True, notice=PAIRING_BUSY)
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(8))
        entry = {
            "channel": msg.channel,
            "sender": msg.sender.id,
            "expires": now + rule.pairing_ttl_s,
        }
        await self.store.kv_set(CODES, code, json.dumps(entry))
        notice = PAIRING_NOTICE.format(code=code, valid=for_how_long(rule.pairing_ttl_s))
        return Verdict(store=True, unpaired=True, notice=notice)

    def _flood(self, rule: AccessRule, who: str) -> Verdict:
        if rule.flood_messages <= 0:
            return _STORE
        now = time.monotonic()
        if now >= self._sweep_at:
            self._forget_quiet(now)
        window = self._recent.setdefault(who, deque())
        window.append(now)
        while window and window[0] < now - rule.flood_window_s:
            window.popleft()
        if len(window) <= rule.flood_messages:
            if self._flooding.get(who, 0) < now:
                self._flooding.pop(who, None)
            return Verdict(store=True, coalesce=who in self._flooding)
        first = who not in self._flooding
        self._flooding[who] = now + rule.flood_window_s
        return Verdict(store=True, coalesce=True, notice=FLOOD_NOTICE if first else None)

    def _forget_quiet(self, now: float) -> None:
        """Drop the senders whose window holds nothing recent and whose flood episode is over,
        so a gateway that has heard from a million people does not remember them all."""
        self._sweep_at = now + SWEEP_EVERY_S
        for who in [w for w, times in self._recent.items() if self._quiet(w, times, now)]:
            del self._recent[who]
        for who in [w for w, end in self._flooding.items() if end < now]:
            del self._flooding[who]

    def _quiet(self, who: str, times: deque[float], now: float) -> bool:
        rule = self.rules.get(who.partition(":")[0], _NO_RULES)
        return not times or times[-1] < now - rule.flood_window_s


async def approve(store: Store, code: str) -> tuple[str, str] | None:
    """Approve a pairing code: returns (channel, sender), or None when unknown or expired."""
    raw = await store.kv_get(CODES, code.strip().upper())
    if raw is None:
        return None
    entry = json.loads(raw)
    await store.kv_delete(CODES, code.strip().upper())
    if entry["expires"] < time.time():
        return None
    await store.kv_set(APPROVED, f"{entry['channel']}:{entry['sender']}", str(time.time()))
    await store.release_unpaired(entry["channel"], entry["sender"])
    return entry["channel"], entry["sender"]


async def pending_codes(store: Store) -> dict[str, dict[str, object]]:
    """Codes waiting for the operator, with who asked and until when."""
    now = time.time()
    out = {}
    for code, raw in (await store.kv_items(CODES)).items():
        entry = json.loads(raw)
        if entry["expires"] > now:
            out[code] = entry
    return out
