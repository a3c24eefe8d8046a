"""Text every chunker is tested on: grapheme clusters that a hard cut must keep whole."""

from __future__ import annotations

__all__ = ["CLUSTERS", "JOINED", "cluster_bounds"]

# the first and last are one code point each; the rest are what a cut once split
CLUSTERS = [
    "a",
    "e\u0301",  # e and a combining acute accent
    "\U0001f1fa\U0001f1f8",  # a flag: two regional indicators
    "\U0001f1ec\U0001f1e7",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: joined by ZWJ
    "\U0001f44d\U0001f3fd",  # a thumb with a skin tone
    "\u2764\ufe0f",  # a heart with a variation selector
    "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # England
    "\u0e01\u0e34",  # Thai: a consonant and a vowel sign (Mn, combining class 0)
    "\u0e01\u0e33",  # Thai SARA AM (Lo, a spacing mark)
    "\u0915\u093f",  # Devanagari: a consonant and a vowel sign (Mc)
    "\u0915\u094d\u0937\u093f",  # a conjunct: consonant, virama, consonant, vowel sign
    "\u1100\u1161\u11a8",  # Hangul as conjoining jamo
    "1\ufe0f\u20e3",  # a keycap (Me)
    "\U0001f600",
]
JOINED = CLUSTERS[1:-1]  # the clusters of more than one code point


def cluster_bounds(clusters: list[str]) -> set[int]:
    """Where, in "".join(clusters), a cut keeps every cluster whole."""
    bounds, at = {0}, 0
    for cluster in clusters:
        at += len(cluster)
        bounds.add(at)
    return bounds
