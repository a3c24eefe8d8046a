"""Bindings route a channel, an account or a conversation to an agent; most specific wins."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Binding", "Router"]


@dataclass(frozen=True, slots=True)
class Binding:
    agent: str
    channel: str | None = None
    account: str | None = None
    conversation: str | None = None

    def matches(self, channel: str, account: str, conversation: str) -> bool:
        return (
            (self.channel is None or self.channel == channel)
            and (self.account is None or self.account == account)
            and (self.conversation is None or self.conversation == conversation)
        )

    @property
    def specificity(self) -> int:
        return (
            (self.conversation is not None) * 4
            + (self.account is not None) * 2
            + (self.channel is not None)
        )


class Router:
    """Picks the agent for a conversation: the matching binding that names the most (a
    conversation beats an account beats a channel); among equals the first declared."""

    def __init__(self, bindings: list[Binding] | None = None, default: str = "default") -> None:
        self._bindings = sorted(bindings or [], key=lambda b: -b.specificity)
        self.default = default

    def agent_for(self, channel: str, account: str, conversation: str) -> str:
        for binding in self._bindings:
            if binding.matches(channel, account, conversation):
                return binding.agent
        return self.default
