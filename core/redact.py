"""Secrets blanked out of text that may echo them: a provider's error, an endpoint's answer,
what the operator console shows."""

from __future__ import annotations

import json
from collections.abc import Iterable

__all__ = ["Blanker"]


class Blanker:
    """Replaces each secret, each of its whitespace-separated parts (the token after
    "Bearer"), and each as it appears inside a JSON string, longest first. Values shorter than
    `min_len` are left alone: they would blank out ordinary words."""

    def __init__(self, secrets: Iterable[str], *, min_len: int = 8, mark: str = "***") -> None:
        parts = {p for s in secrets for p in (s, *s.split()) if len(p) >= min_len}
        forms = parts | {json.dumps(p)[1:-1] for p in parts}
        self._forms = sorted(forms, key=len, reverse=True)
        self._mark = mark
        self.longest = max((len(f.encode()) for f in forms), default=0)  # in UTF-8 bytes

    def __call__(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, self._mark)
        return text
