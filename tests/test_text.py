"""Cuts between grapheme clusters (channels/text.py), which every channel's chunker uses."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from channels.text import cluster_cut, clusters
from tests.text_samples import CLUSTERS, cluster_bounds


def test_clusters_are_what_a_person_sees_as_one_character() -> None:
    assert list(clusters("".join(CLUSTERS))) == CLUSTERS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=20), st.integers(1, 200))
def test_a_cut_falls_at_the_last_whole_cluster(sample: list[str], end: int) -> None:
    text = "".join(sample)
    end = min(end, len(text))
    bounds = cluster_bounds(sample)
    best = max(b for b in bounds if b <= end)
    assert cluster_cut(text, 0, end) == (best if best > 0 else end)


def test_one_cluster_longer_than_the_room_is_cut_at_the_end() -> None:
    long_cluster = "e" + "\u0301" * 10  # no whole cluster fits: the cut cannot step back
    assert cluster_cut(long_cluster, 0, 5) == 5
