"""Built-in tools with no home of their own."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_validator, model_validator

from core.agent.tools import CONSENT, ToolContext
from core.models import Button

__all__ = ["BUTTON_VALUE_MAX", "SendButtons"]

BUTTON_VALUE_MAX = 256  # what a press sends back; each channel carries this much


class ButtonArg(BaseModel):
    label: str = Field(min_length=1, max_length=80, description="What the button says.")
    value: str = Field(
        default="",
        max_length=BUTTON_VALUE_MAX,
        description="What pressing it sends back (default: label).",
    )

    @field_validator("label")
    @classmethod
    def _readable(cls, label: str) -> str:
        """On one line, with something to read (a blank title is refused by WhatsApp)."""
        label = " ".join(label.split())
        if not any(c.isprintable() and not c.isspace() for c in label):
            raise ValueError("a button's label needs something to read")
        return label

    @model_validator(mode="after")
    def _not_a_consent(self) -> ButtonArg:
        if CONSENT.match(self.value or self.label):
            raise ValueError("confirm:/cancel: values belong to the gateway's own buttons")
        return self


class SendButtonsArgs(BaseModel):
    buttons: list[ButtonArg] = Field(min_length=1, max_length=10)


class SendButtons:
    """send_buttons: quick replies shown with the answer; each channel renders them its way."""

    name: ClassVar[str] = "send_buttons"
    description: ClassVar[str] = (
        "Offer the person up to 10 quick-reply buttons with your answer (for example choices "
        "or yes/no). Call it once, then write the answer text as usual."
    )
    args_model: ClassVar[type[BaseModel]] = SendButtonsArgs
    read_only: ClassVar[bool] = True
    echoes: ClassVar[bool] = True  # grounds no amount (core.agent.tools.Echoes)
    timeout_s: ClassVar[float] = 1.0

    async def __call__(self, args: SendButtonsArgs, ctx: ToolContext) -> dict[str, Any]:
        ctx.buttons[:] = [Button(label=b.label, value=b.value or b.label) for b in args.buttons]
        return {"ok": True, "buttons": [b.label for b in ctx.buttons]}
