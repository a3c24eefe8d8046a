"""A model client that replays hand-written steps, for tests and demos with no model at all.

Each call takes the next step: text (streamed in word pieces), tool calls, or an error. A script
can be written in code or kept as a JSON file (a list of steps, or {"steps": [...]}), e.g.

    [{"tool_calls": [["search_knowledge", {"query": "hours"}]]},
     {"text": "We open at 9.", "input_tokens": 120, "output_tokens": 8}]

It fails loudly, with a ModelError naming the call, when the script has run out or a step calls
tools on a call that allows none (what no real provider would do).
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.agent.model import DeltaSink, ModelRequest, ModelResponse, ToolCall
from core.errors import ConfigError, ModelError

__all__ = ["ScriptStep", "ScriptedModel", "load_script"]

_PIECES = re.compile(r"\S+\s*|\s+")


class ScriptStep(BaseModel):
    """One model call's answer. With `error`, the call raises ModelError after any `text`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments as JSON text, valid or not)
    finish_reason: str | None = None  # default: "tool_calls" with calls, else "stop"
    input_tokens: int | None = Field(default=None, ge=0)  # None: no usage, the loop estimates
    output_tokens: int | None = Field(default=None, ge=0)
    error: str | None = None

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _dump_arguments(cls, value: Any) -> Any:
        """Arguments may be written as a JSON object; a string is kept as it is, bad JSON too."""
        if not isinstance(value, list | tuple):
            return value
        return [
            [pair[0], pair[1] if isinstance(pair[1], str) else json.dumps(pair[1])]
            if isinstance(pair, list | tuple) and len(pair) == 2
            else pair
            for pair in value
        ]

    @model_validator(mode="after")
    def _error_has_no_calls(self) -> ScriptStep:
        if self.error is not None and self.tool_calls:
            raise ValueError("a step with an error cannot also call tools")
        return self


class ScriptedModel:
    def __init__(self, steps: Iterable[ScriptStep | Mapping[str, Any]] = ()) -> None:
        self._steps: deque[ScriptStep] = deque()
        self.requests: list[ModelRequest] = []  # every request received, for assertions
        self.add(*steps)

    @classmethod
    def from_file(cls, path: str | Path, *, key: str = "model.script") -> ScriptedModel:
        return cls(load_script(path, key=key))

    def add(self, *steps: ScriptStep | Mapping[str, Any]) -> None:
        """Append steps; a mapping is validated as a ScriptStep (ValidationError if it is not)."""
        self._steps.extend(
            s if isinstance(s, ScriptStep) else ScriptStep.model_validate(s) for s in steps
        )

    @property
    def remaining(self) -> int:
        return len(self._steps)

    async def aclose(self) -> None:
        return None

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        n = len(self.requests)
        if not self._steps:
            raise ModelError(f"scripted model: the script has no step left for call {n}")
        step = self._steps.popleft()
        if step.tool_calls and (request.tool_choice == "none" or not request.tools):
            names = ", ".join(name for name, _ in step.tool_calls)
            raise ModelError(
                f"scripted model: step {n} calls tools ({names}), but call {n} allows none"
            )
        if step.text and on_delta is not None:
            for piece in _PIECES.findall(step.text):
                await on_delta(piece)
        if step.error is not None:
            raise ModelError(f"scripted model: step {n}: {step.error}")
        calls = tuple(
            ToolCall(f"script_{n}_{i}", name, args)
            for i, (name, args) in enumerate(step.tool_calls)
        )
        return ModelResponse(
            text=step.text,
            tool_calls=calls,
            input_tokens=step.input_tokens,
            output_tokens=step.output_tokens,
            finish_reason=step.finish_reason or ("tool_calls" if calls else "stop"),
        )


def load_script(path: str | Path, *, key: str = "model.script") -> list[ScriptStep]:
    """The steps of a JSON script file; any problem is a ConfigError naming `key` and the step."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([(key, f"cannot read {path}: {exc.strerror or exc}")]) from exc
    except ValueError as exc:
        raise ConfigError([(key, f"{path} is not valid JSON: {exc}")]) from exc
    if isinstance(data, dict) and set(data) == {"steps"}:
        data = data["steps"]
    if not isinstance(data, list) or not data:
        raise ConfigError(
            [(key, f'{path} must hold a non-empty list of steps (or {{"steps": ...}})')]
        )
    steps: list[ScriptStep] = []
    for i, raw in enumerate(data, start=1):
        try:
            steps.append(ScriptStep.model_validate(raw))
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'step'}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError([(key, f"{path} step {i}: {detail}")]) from exc
    return steps
