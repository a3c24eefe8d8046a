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

    def cut(self, data: bytes, cap: int) -> str:
        """At most the first `cap` bytes of `data` as text, blanked. `data` must hold `longest`
        bytes past the cap (or all there is): a secret the cap would halve is left out whole,
        so its first part cannot show."""
        end = cap
        for form in self._forms:
            raw = form.encode()
            at = data.find(raw, max(0, cap - len(raw) + 1))
            if 0 <= at < end:
                end = at
        return self(data[:end].decode("utf-8", "ignore"))
