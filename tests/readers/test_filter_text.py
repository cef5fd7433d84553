"""``--where`` text -> pyarrow expressions: the same rows as ``filters=``, and never code run."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from unihub.errors import FilterExpressionError, InvalidArgumentError
from unihub.readers.filter_text import parse_filter

TABLE = pa.table({"label": pa.array([0, 1, 2, 3, 4, None], pa.int32()),
                  "split": ["train", "val", "test", "train", "val", "test"],
                  "x": pa.array([0.5, None, 2.5, float("nan"), 4.0, 5.0]), "i": range(6)})
NAMES = ["label", "split", "x"]


def rows(expression: pc.Expression) -> list[int]:
    return ds.dataset(TABLE).to_table(filter=expression).column("i").to_pylist()


@pytest.mark.parametrize(("text", "same_as"), [
    ('label >= 3 and split != "test"', (pc.field("label") >= 3) & (pc.field("split") != "test")),
    ('(pc.field("label") == 1) | pc.field("split").isin(["test"])',
     (pc.field("label") == 1) | pc.field("split").isin(["test"])),
    ("label in [1, 3] or not x > 1", pc.field("label").isin([1, 3]) | ~(pc.field("x") > 1)),
    ("label is None", pc.field("label").is_null()),
    ("x.is_nan()", pc.field("x").is_nan()),
    ("1 < label <= 3", (pc.field("label") > 1) & (pc.field("label") <= 3)),
    ('[["label", ">", 2]]', pq.filters_to_expression([("label", ">", 2)])),
    ('[[["label", "=", 0]], [["split", "in", ["val"]]]]',
     pq.filters_to_expression([[("label", "=", 0)], [("split", "in", ["val"])]])),
])
def test_text_selects_the_rows_of_the_expression(text: str, same_as: pc.Expression) -> None:
    parsed = parse_filter(text, NAMES)
    assert rows(parsed.expression) == rows(same_as)
    assert set(parsed.fields) <= set(NAMES) and parsed.fields


def test_the_fields_read_are_named() -> None:
    assert parse_filter('split == "a" and label > 1 or split == "b"', NAMES).fields == ("split", "label")
    assert parse_filter('[["x", "<", 1], ["label", "=", 2]]', NAMES).fields == ("x", "label")


@pytest.mark.parametrize(("text", "message"), [
    ("lbl > 1", "names 'lbl', which is not a field; the fields: label, split, x"),
    ('__import__("os").system("touch pwned")', "only field(), isin()"),
    ("label.__class__", "not allowed in a filter"),
    ("label > ", "is not an expression: invalid syntax at its end"),  # was 'at column 0'
    ("label == 1 )", "is not an expression: unmatched ')' at column 12"),
    ("3", "compares nothing"),
    ("label + 1 > 2", "only & and | combine conditions"),
    ("[[1, 2", "is not JSON"),
    ('[["zz", "=", 1]]', "names 'zz'"),
    ("", "the filter is empty"),
    ("lambda: 1", "not allowed in a filter"),
    ("label > 99999999999999999999999", "filter 'label > 99999999999999999999999': Python int too large"),
    ("label.isin([99999999999999999999999])", "Python int too large"),
    ('[["label", ">", 99999999999999999999999]]', "Python int too large"),
    ("label > -'a'", "only not/~ and a negative number are allowed"),  # was a raw TypeError (unary - of a str)
    ("label > -None", "only not/~ and a negative number are allowed"),
    ("label > -[1]", "only not/~ and a negative number are allowed"),
    ("label > 1if 1 else 2", "not allowed in a filter"),  # Python's SyntaxWarning was a line of its own before it
])
def test_bad_text_is_a_named_error_and_runs_nothing(text: str, message: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FilterExpressionError) as caught, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        parse_filter(text, NAMES)
    assert message in str(caught.value) and not said, said
    assert isinstance(caught.value, InvalidArgumentError) and isinstance(caught.value, ValueError)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("text", "message"), [
    ("not " * 100_000 + "label > 1", "is nested too deeply to parse"),  # MemoryError from Python's parser
    ("~" * 5_000 + "label", "is nested too deeply to parse"),  # RecursionError from ast.parse
    ("(label > 1) & " * 3_000 + "(label > 1)", "is nested too deeply to parse"),  # RecursionError building it
    ("[" * 100_000, "is nested too deeply to parse"),  # RecursionError from json.loads
    ('[["label", "in", ' + "[" * 5_000 + "]" * 5_000 + "]]", "is nested too deeply to parse"),
    ("label == 1 or " * 1_000 + "label == 1", "holds 1,001 conditions, more than the 1,000"),
    ("[" + '["label", "=", 1], ' * 1_000 + '["label", "=", 1]]', "holds 1,001 conditions, more than the 1,000"),
    ('split == "\udcff"', "is not UTF-8 text: surrogates not allowed at column 11"),  # a non-UTF-8 byte of argv
    ('split == "\\ud800"', "surrogates not allowed"),  # the same, escaped: refused by Arrow
])
def test_hostile_text_is_a_named_error_in_bounded_time(text: str, message: str) -> None:
    # Each was a RecursionError, MemoryError or UnicodeEncodeError; a chain of 10,000 conditions crashed
    # the process (a C stack overflow in Arrow) when the reader used it.
    with pytest.raises(FilterExpressionError, match=message):
        parse_filter(text, NAMES)


def test_the_most_conditions_allowed_run_in_arrow() -> None:
    expression = parse_filter("label == 1 or " * 999 + "label == 3", NAMES).expression
    assert rows(expression) == [1, 3]
    assert rows(parse_filter("[" + '[["label", "=", 1]], ' * 999 + '[["label", "=", 3]]]', NAMES).expression) == [1, 3]
