"""Where text may be cut: between grapheme clusters, what a person sees as one character (a
flag, a family emoji, a letter with its accents, a Thai syllable's vowel sign). A cut inside
one shows broken symbols on both sides. The clusters are Unicode's extended grapheme clusters
(UAX #29), from the `regex` module's `\\X`.
"""

from __future__ import annotations

from collections.abc import Iterator

import regex

__all__ = ["cluster_cut", "clusters"]

_CLUSTER = regex.compile(r"\X")


def clusters(text: str) -> Iterator[str]:
    """The grapheme clusters of `text`, in order."""
    for match in _CLUSTER.finditer(text):
        yield match[0]


def cluster_cut(text: str, start: int, end: int) -> int:
    """The last cut in `text[start:end]`, after `start` and at or before `end`, that keeps
    every cluster whole; `end` itself when one cluster runs past it from `start`."""
    cut = start
    for match in _CLUSTER.finditer(text, start):
        if match.end() > end:
            break
        cut = match.end()
    return cut if cut > start else end
