"""The statistics' accumulators: exact counts whatever the order and size of the batches, bounded state."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from unihub.viewer.stats import BINS, MAX_CLASSES, ClassCounts, Histogram


@pytest.mark.parametrize("integer", [False, True])
def test_histogram_counts_are_exact_as_the_bins_grow(integer: bool) -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(0, 50, 5000)
    if integer:
        values = np.round(values)
    histogram = Histogram(integer=integer)
    for batch in np.array_split(values[np.argsort(np.abs(values))], 37):  # small values first: the bins grow
        histogram.add(batch)
    bins = histogram.edges_and_counts()
    assert len(bins) <= BINS
    assert sum(c for _, _, c in bins) == len(values)
    for low, high, count in bins:  # each bin holds exactly the values in [low, high)
        assert count == int(((values >= low) & (values < high)).sum())
    assert bins[0][0] <= values.min() and bins[-1][1] > values.max()


def test_histogram_ignores_nan_and_inf_and_one_value_has_one_bin() -> None:
    histogram = Histogram()
    histogram.add(np.array([np.nan, np.inf, -np.inf]))
    assert histogram.edges_and_counts() == []
    histogram.add(np.full(7, 2.5))
    assert [c for _, _, c in histogram.edges_and_counts()] == [7]


def test_class_counts_are_exact_until_there_are_too_many() -> None:
    counts = ClassCounts()
    counts.add(pa.array(["a", "b", None, "a"]))
    counts.add(pa.array(["b", "c"]))
    assert dict(counts.counts) == {"a": 2, "b": 2, "c": 1} and not counts.too_many
    counts.add(pa.array([str(i) for i in range(MAX_CLASSES)]))
    assert counts.too_many and not counts.counts  # the memory is given back, the field is not a class field
    counts.add(pa.array(["x"]))
    assert not counts.counts


@pytest.mark.parametrize("batches", [[[1e308, -1e308, 0.0]], [[0.0, 1.0], [1e308], [-1e308]]], ids=["one", "growing"])
def test_values_further_apart_than_a_float_holds_have_no_bins_and_no_error(batches: list[list[float]]) -> None:
    histogram = Histogram()
    for batch in batches:  # the span, 2e308, is inf: the bins' edges cannot be computed
        histogram.add(np.array(batch))
    assert histogram.edges_and_counts() == []
    histogram.add(np.array([5.0]))
    assert histogram.edges_and_counts() == []


def test_a_report_of_extreme_floats_renders(tmp_path) -> None:
    import pyarrow.parquet as pq

    import unihub

    (tmp_path / "extreme").mkdir()
    pq.write_table(pa.table({"x": [1e308, -1e308, 0.0]}), tmp_path / "extreme" / "part-0.parquet")
    stats = unihub.show(tmp_path / "extreme", rows=3).report.stats[0]
    assert (stats.minimum, stats.maximum, stats.counted) == (-1e308, 1e308, 3)


def test_a_categorical_string_column_gets_class_counts_and_lengths(tmp_path) -> None:
    """pandas writes its categoricals as Arrow dictionaries: they are strings with few values, not 'other'."""
    import pyarrow.parquet as pq

    import unihub

    (tmp_path / "cat").mkdir()
    pq.write_table(pa.table({"c": pa.array(["a", "bb", None, "a"]).dictionary_encode()}), tmp_path / "cat" / "p.parquet")
    assert pa.types.is_dictionary(unihub.open_dataset(tmp_path / "cat").stored_schema.field("c").type)
    stats = unihub.show(tmp_path / "cat", rows=4).report.stats[0]
    assert (stats.kind, stats.nulls, dict(stats.classes.counts)) == ("string", 1, {"a": 2, "bb": 1})
    assert [(low, count) for low, _, count in stats.lengths.edges_and_counts()] == [(1.0, 2), (2.0, 1)]
