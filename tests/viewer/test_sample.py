"""Choosing the rows a report shows: pure and deterministic, uniform, bounded."""

from __future__ import annotations

import numpy as np

from unihub.viewer.sample import Reservoir, Sampling


def offer_groups(sampling: Sampling, sizes: list[int], order: list[int] | None = None) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    reservoir = Reservoir(sampling)
    for group in order or range(len(sizes)):
        reservoir.offer(np.arange(starts[group], starts[group] + sizes[group]), group)
        assert len(reservoir.indices) <= sampling.rows  # bounded, whatever was offered
    return reservoir.chosen()


def test_same_seed_same_rows_in_any_reading_order_and_another_seed_others() -> None:
    sizes = [100, 7, 250, 3, 90]
    first = offer_groups(Sampling(20, seed=5), sizes)
    assert len(first) == 20 and len(set(first.tolist())) == 20 and list(first) == sorted(first)
    assert np.array_equal(first, offer_groups(Sampling(20, seed=5), sizes, order=[4, 2, 0, 3, 1]))
    assert not np.array_equal(first, offer_groups(Sampling(20, seed=6), sizes))


def test_first_keeps_the_first_rows_and_fewer_rows_than_asked_are_all_kept() -> None:
    assert offer_groups(Sampling(5, first=True), [3, 4]).tolist() == [0, 1, 2, 3, 4]
    assert offer_groups(Sampling(50, seed=1), [3, 4]).tolist() == list(range(7))
    assert offer_groups(Sampling(0), [3, 4]).tolist() == []


def test_the_random_sample_is_uniform_over_rows() -> None:
    hits = np.zeros(200, dtype=np.int64)
    for seed in range(400):
        hits[offer_groups(Sampling(10, seed=seed), [150, 50])] += 1
    expected = 400 * 10 / 200  # 20 per row
    assert abs(hits[:150].mean() - expected) < 1.5 and abs(hits[150:].mean() - expected) < 1.5
    assert hits.min() > 5 and hits.max() < 40
