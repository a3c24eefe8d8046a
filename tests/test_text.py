"""Cuts between grapheme clusters (channels/text.py), which every channel's chunker uses."""

from __future__ import annotations

import pytest

from channels.text import cluster_cut, clusters

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
FLAG = "\U0001f1fa\U0001f1f8"


def test_clusters_are_what_a_person_sees_as_one_character() -> None:
    text = f"a{FLAG}{FLAG}{FAMILY}e\u0301\u0e01\u0e34"
    assert list(clusters(text)) == ["a", FLAG, FLAG, FAMILY, "e\u0301", "\u0e01\u0e34"]


@pytest.mark.parametrize(
    ("text", "end", "cut"),
    [
        (f"x{FLAG}{FLAG}", 4, 3),  # inside the second flag: before it
        (f"x{FAMILY}y", 4, 1),  # inside the family: before it
        ("xe\u0301y", 2, 1),  # between a letter and its accent: before the letter
        ("abcdef", 4, 4),  # plain text: exactly at the end
    ],
)
def test_a_cut_falls_at_the_last_whole_cluster(text: str, end: int, cut: int) -> None:
    assert cluster_cut(text, 0, end) == cut


def test_one_cluster_longer_than_the_room_is_cut_at_the_end() -> None:
    long_cluster = "e" + "\u0301" * 10  # no whole cluster fits: the cut cannot step back
    assert cluster_cut(long_cluster, 0, 5) == 5
