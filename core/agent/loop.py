"""The agent loop: model calls with tools under hard limits, emitting events as it goes."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.agent.grounding import check, warning_text
from core.agent.model import (
    ChatMessage,
    ModelClient,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    estimate_messages,
    estimate_tokens,
)
from core.agent.sanitize import StreamFilter, shows_nothing, strip_reasoning, wrap_user_text
from core.agent.tools import PENDING, ToolContext, ToolRegistry, refused_press
from core.errors import ModelError
from core.models import Button

__all__ = [
    "AgentEvent",
    "AgentLoop",
    "Done",
    "Limits",
    "RunOutcome",
    "TextDelta",
    "ToolStep",
    "Turn",
]

log = logging.getLogger(__name__)

APOLOGY_MODEL = "Sorry, I can't reach my language model right now. Please try again in a moment."
APOLOGY_TIMEOUT = "Sorry, that took me too long. Could you ask again, maybe more simply?"
APOLOGY_EMPTY = "Sorry, I couldn't put together an answer to that. Could you rephrase it?"
CUT_MARK = "[…]"  # ends an answer cut short by max_output_tokens
APOLOGY_LIMIT = (
    "Sorry, answering that needed more work than I can do for one message. Could you ask about "
    "one part of it at a time?"
)
APOLOGY_ERROR = "Sorry, something went wrong on my side. Please try again in a moment."


@dataclass(frozen=True, slots=True)
class Limits:
    max_steps: int = 5
    max_tool_calls: int = 6
    max_output_tokens: int = 350
    token_budget: int = 7000
    run_timeout_s: float = 45.0
    temperature: float = 0.2


@dataclass(frozen=True, slots=True)
class TextDelta:
    run_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolStep:
    run_id: str
    name: str
    arguments: str
    result: str
    ok: bool


@dataclass(frozen=True, slots=True)
class Done:
    run_id: str
    outcome: RunOutcome


AgentEvent = TextDelta | ToolStep | Done
EventSink = Callable[[AgentEvent], Awaitable[None]]
Steer = Callable[[], Awaitable[list[str]]]


@dataclass(slots=True)
class Turn:
    """Everything one run needs; the session manager builds it."""

    run_id: str
    session: str
    system: str  # instructions + channel output rules + session state, already composed
    history: list[ChatMessage]
    user_texts: list[str]
    state: dict[str, Any] = field(default_factory=dict)
    steer: Steer | None = None  # returns messages that arrived mid-run (queue mode "steer")
    workspace: Path | None = None  # the session's folder for kept results and files
    # (token, confirmed, who pressed): presses of the Confirm / Cancel buttons in this batch
    confirmations: list[tuple[str, bool, str]] = field(default_factory=list)
    senders: tuple[str, ...] = ()  # who wrote the messages this turn answers
    guard: Callable[[], Awaitable[None]] | None = None  # runs before each model call; may cancel


@dataclass(slots=True)
class RunOutcome:
    text: str
    status: str = "ok"  # ok | limit | timeout | model_error
    limits_hit: list[str] = field(default_factory=list)
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    steered: int = 0
    error: str | None = None
    buttons: list[Button] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # the session state after the run
    unverified_amounts: list[dict[str, str | None]] = field(default_factory=list)
    handoff: str | None = None  # the reason, when the agent handed over to a person


class AgentLoop:
    def __init__(self, model: ModelClient, tools: ToolRegistry, limits: Limits) -> None:
        self._model = model
        self._tools = tools
        self._limits = limits

    @property
    def limits(self) -> Limits:
        return self._limits

    async def run(self, turn: Turn, emit: EventSink) -> RunOutcome:
        out = RunOutcome(text="", state=copy.deepcopy(turn.state))
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._limits.run_timeout_s):
                await self._steps(turn, emit, out, started + self._limits.run_timeout_s)
        except TimeoutError:
            out.status = "timeout"
            out.limits_hit.append("run_timeout")
            out.text = APOLOGY_TIMEOUT
        except ModelError as exc:
            log.warning(
                "model failed: %s", exc, extra={"session": turn.session, "run_id": turn.run_id}
            )
            out.status = "model_error"
            out.error = str(exc)[:500]
            out.text = APOLOGY_MODEL
        except Exception as exc:  # a defect, not bad luck: the person still gets an answer,
            # and the queue goes on instead of the turn being retried forever
            log.exception("run failed", extra={"session": turn.session, "run_id": turn.run_id})
            out.status = "error"
            out.error = f"{type(exc).__name__}: {exc}"[:500]
            out.text = APOLOGY_ERROR
        if out.status == "ok" and out.limits_hit:
            out.status = "limit"
        out.calls.append({"elapsed_s": round(time.monotonic() - started, 3)})
        await emit(Done(turn.run_id, out))
        return out

    async def _steps(self, turn: Turn, emit: EventSink, out: RunOutcome, deadline: float) -> None:
        lim = self._limits
        messages: list[ChatMessage] = [ChatMessage("system", turn.system), *turn.history]
        messages.append(ChatMessage("user", "\n".join(wrap_user_text(t) for t in turn.user_texts)))
        ctx = ToolContext(
            session=turn.session,
            run_id=turn.run_id,
            state=out.state,
            workspace=turn.workspace,
            senders=turn.senders,
        )
        tools = self._tools.specs()
        tools_cost = self._tools.specs_tokens()  # in every call's input, beside the messages
        tool_results: list[str] = []  # facts tools returned: the numbers answers may quote
        prev_input = 0
        sent_upto = 0  # messages[:sent_upto] were part of the previous call's input
        last_text = ""
        cut = False  # the answer stopped at max_output_tokens, mid-sentence

        visible = StreamFilter()

        for n, (token, approved, presser) in enumerate(dict.fromkeys(turn.confirmations)):
            await self._confirmed(
                n, token, approved, presser, ctx, messages, tool_results, out, emit
            )

        # the budget binds the first call too: the oldest history goes until the call fits
        # and, where that lets the tools be used, until a tool call and the answer after it
        # fit (one long message in the history made every turn answer without its tools, for
        # as long as it stayed there; a prompt too big for tools keeps its history)
        smallest = min(32, lim.max_output_tokens)  # the least output worth asking for
        older = len(turn.history)
        alone = messages[:1] + messages[1 + older :]  # the call without any history
        for_tools = self._tools_fit(out, tools, tools_cost + estimate_messages(alone))

        def too_big() -> bool:
            est = tools_cost + estimate_messages(messages)
            return est + smallest > lim.token_budget or (
                for_tools and not self._tools_fit(out, tools, est)
            )

        while older and too_big():
            del messages[1]  # right after the system prompt
            older -= 1

        async def on_delta(text: str) -> None:
            if shown := visible.feed(text):
                await emit(TextDelta(turn.run_id, shown))

        for step in range(1, lim.max_steps + 1):
            if step > 1 and turn.steer is not None:
                for text in await turn.steer():
                    messages.append(ChatMessage("user", wrap_user_text(text)))
                    out.steered += 1
            spent = out.input_tokens + out.output_tokens
            est_input = (
                tools_cost + estimate_messages(messages)
                if step == 1
                else prev_input + estimate_messages(messages[sent_upto:])
            )
            final, reason = self._final_reason(step, out, tools != (), spent, est_input)
            room = lim.token_budget - spent - est_input
            if (
                step > 1
                and room < lim.max_output_tokens
                and _fit_results(messages, sent_upto, lim.max_output_tokens - room)
            ):  # the tools' results left no room for a whole answer: cut to fit, and answer
                # with what they say (the run used to end with nothing for them)
                est_input = prev_input + estimate_messages(messages[sent_upto:])
                room = lim.token_budget - spent - est_input
                final = True
                if "token_budget" not in out.limits_hit:
                    out.limits_hit.append("token_budget")
            if room < smallest:  # on the first call: the message alone is past the budget
                if "token_budget" not in out.limits_hit:
                    out.limits_hit.append("token_budget")
                break
            max_tokens = min(lim.max_output_tokens, room)
            if reason and reason not in out.limits_hit:
                out.limits_hit.append(reason)
            request = ModelRequest(
                messages=tuple(messages),
                tools=tools,
                tool_choice="none" if final else "auto",
                max_tokens=max_tokens,
                temperature=lim.temperature,
                deadline=deadline,
            )
            if turn.guard is not None:
                await turn.guard()
            call_started = time.monotonic()
            try:
                response = await self._model.complete(request, on_delta)
            except (ModelError, asyncio.CancelledError) as exc:  # a failed call is a call too:
                # its latency counts (a model timing out shows in the metrics, not only runs)
                failed = "timeout" if isinstance(exc, asyncio.CancelledError) else "error"
                elapsed = time.monotonic() - call_started
                out.calls.append(_failed_call(step, final, failed, elapsed))
                raise
            call_seconds = time.monotonic() - call_started
            if rest := visible.flush():
                await emit(TextDelta(turn.run_id, rest))
            out.steps = step
            response = _within(response, max_tokens)
            used_in = response.input_tokens or est_input
            floor = len(response.text) // MAX_TOKEN_CHARS  # whatever a server reports
            used_out = max(response.output_tokens or estimate_tokens(response.text), floor)
            out.input_tokens += used_in
            out.output_tokens += used_out
            out.calls.append(_call_record(step, final, response, used_in, used_out, call_seconds))
            prev_input, sent_upto = used_in, len(messages)
            if response.finish_reason == "length" and "max_output_tokens" not in out.limits_hit:
                out.limits_hit.append("max_output_tokens")
            if response.finish_reason == "content_filter" and (
                "content_filter" not in out.limits_hit
            ):  # the provider's filter stopped the answer: shown as cut, recorded as such
                out.limits_hit.append("content_filter")
            answer = strip_reasoning(response.text)
            if answer and not shows_nothing(answer):
                last_text, cut = answer, response.finish_reason in ("length", "content_filter")
            if final or not response.tool_calls:
                break
            messages.append(ChatMessage("assistant", response.text or None, response.tool_calls))
            for call in response.tool_calls:
                if out.tool_calls >= lim.max_tool_calls:
                    if "max_tool_calls" not in out.limits_hit:
                        out.limits_hit.append("max_tool_calls")
                    content = (
                        '{"error": "tool_budget", "detail": "No tool calls left in this run; '
                        'answer with what you have."}'
                    )
                    ok = False
                else:
                    out.tool_calls += 1
                    result = await self._tools.call(call.name, call.arguments, ctx)
                    content, ok = result.content, result.ok
                messages.append(ChatMessage("tool", content, tool_call_id=call.id, name=call.name))
                if ok and self._tools.grounds(call.name):
                    tool_results.append(content)
                await emit(ToolStep(turn.run_id, call.name, call.arguments, content, ok))
        out.text = last_text or (APOLOGY_LIMIT if out.limits_hit else APOLOGY_EMPTY)
        if not last_text and ctx.buttons and not out.limits_hit:
            out.text = ""  # buttons alone: each channel words them its way (not an apology)
        elif not last_text and not out.limits_hit and not ctx.handoff:
            out.status = "empty"  # the apology went out: the operator sees the model said nothing
        if last_text and cut:  # shown as cut short, not as if that were the whole answer
            out.text = f"{last_text.rstrip()} {CUT_MARK}"
            await emit(TextDelta(turn.run_id, f" {CUT_MARK}"))
        if last_text:
            await self._ground(turn, emit, out, tool_results)
        out.buttons = list(ctx.buttons)
        out.handoff = ctx.handoff
        if not last_text:
            log.info(
                "run %s ended without text",
                turn.run_id,
                extra={"session": turn.session, "run_id": turn.run_id},
            )

    async def _confirmed(
        self,
        n: int,
        token: str,
        approved: bool,
        presser: str,
        ctx: ToolContext,
        messages: list[ChatMessage],
        tool_results: list[str],
        out: RunOutcome,
        emit: EventSink,
    ) -> None:
        """Run (or drop) an action the person confirmed (or cancelled) with a button; the
        model then sees the call and its result as if it had just made it. In a group only
        those who asked for it may press: anyone else's press leaves it waiting for them."""
        pending = out.state.get(PENDING, {})
        action = pending.get(token)
        if not action:
            return
        # one id per press: two presses in a turn are two calls the model is shown
        call = ToolCall(f"confirmed-{token}-{n}", str(action["tool"]), json.dumps(action["args"]))
        askers = action.get("by")
        if isinstance(askers, list) and askers and presser not in askers:
            result = refused_press(call.name)
        elif not approved:
            del pending[token]
            return
        else:
            del pending[token]
            result = await self._tools.call(call.name, call.arguments, ctx, confirmed=True)
        out.tool_calls += 1
        messages.append(ChatMessage("assistant", None, (call,)))
        messages.append(ChatMessage("tool", result.content, tool_call_id=call.id, name=call.name))
        if result.ok and self._tools.grounds(call.name):
            tool_results.append(result.content)
        await emit(ToolStep(ctx.run_id, call.name, call.arguments, result.content, result.ok))

    async def _ground(
        self, turn: Turn, emit: EventSink, out: RunOutcome, tool_results: list[str]
    ) -> None:
        """Money amounts in the answer that no tool returned in this run get flagged: listed in
        the run record, and the person is asked to confirm them."""
        report = check(out.text, tool_results)
        out.unverified_amounts = [a.as_dict() for a in report.unmatched]
        if warning := warning_text(report):
            out.text = f"{out.text}\n\n{warning}"
            await emit(TextDelta(turn.run_id, f"\n\n{warning}"))

    def _tools_fit(self, out: RunOutcome, tools: tuple[ToolSpec, ...], est_input: int) -> bool:
        """Whether a first call of this size may use tools as far as the budget goes."""
        _, reason = self._final_reason(1, out, tools != (), 0, est_input)
        return bool(tools) and reason != "token_budget"

    def _final_reason(
        self, step: int, out: RunOutcome, has_tools: bool, spent: int, est_input: int
    ) -> tuple[bool, str | None]:
        """Whether this call must be the last (tool_choice "none"), and which limit made it so."""
        lim = self._limits
        if not has_tools:
            return True, None
        if step >= lim.max_steps:
            return True, "max_steps"
        if out.tool_calls >= lim.max_tool_calls:
            return True, "max_tool_calls"
        # Each call repeats all earlier input, so the call after this one costs at least this
        # call's input plus its output again. If that could not fit, end the run on this call.
        this_call = est_input + lim.max_output_tokens
        next_call = this_call + lim.max_output_tokens
        if spent + this_call + next_call > lim.token_budget:
            return True, "token_budget"
        return False, None


MAX_TOKEN_CHARS = 16  # characters in one token, at most (a run of spaces or dashes in one)


def _within(response: ModelResponse, max_tokens: int) -> ModelResponse:
    """The answer of a server that ignored max_tokens, cut where it should have stopped (at
    a word, as a model stops), as if it had: the limit is the gateway's, not the server's."""
    cap = max_tokens * MAX_TOKEN_CHARS
    if len(response.text) <= cap:
        return response
    text = response.text[:cap]
    if (space := text.rfind(" ", cap // 2)) > 0:
        text = text[:space]
    log.warning("the model server ignored max_tokens=%d: its answer was cut there", max_tokens)
    return dataclasses.replace(response, text=text, finish_reason="length")


CUT_RESULT = " … [cut here: the rest did not fit in this run's token budget]"


def _fit_results(messages: list[ChatMessage], start: int, over: int) -> bool:
    """Cut the tool results from messages[start:] by about `over` tokens, the longest to one
    length (each keeps its beginning; the shorter ones stay whole). False: nothing to cut."""
    newest = [i for i in range(start, len(messages)) if messages[i].role == "tool"]
    if not newest or over <= 0:
        return False
    sizes = sorted(len(messages[i].content or "") for i in newest)
    left = sum(sizes) - 4 * over - len(CUT_RESULT) * len(newest)  # characters to keep
    cap = sizes[-1]
    for n, size in enumerate(sizes):  # the length that keeps `left` in all
        share = max(0, left) // (len(sizes) - n)
        if size > share:
            cap = share
            break
        left -= size
    cut_any = False
    for i in newest:
        m = messages[i]
        text = m.content or ""
        if len(text) > cap + len(CUT_RESULT):
            cut = text[:cap] + CUT_RESULT
            messages[i] = ChatMessage("tool", cut, tool_call_id=m.tool_call_id, name=m.name)
            cut_any = True
    return cut_any


def _failed_call(step: int, final: bool, finish: str, seconds: float) -> dict[str, Any]:
    return {
        "step": step,
        "seconds": round(seconds, 4),
        "final": final,
        "input_tokens": 0,
        "output_tokens": 0,
        "finish_reason": finish,
        "tool_calls": [],
    }


def _call_record(
    step: int, final: bool, response: ModelResponse, used_in: int, used_out: int, seconds: float
) -> dict[str, Any]:
    return {
        "step": step,
        "seconds": round(seconds, 4),
        "final": final,
        "input_tokens": used_in,
        "output_tokens": used_out,
        "finish_reason": response.finish_reason,
        "tool_calls": [c.name for c in response.tool_calls],
        "model": response.model,
    }
