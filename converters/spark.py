"""``convert`` with the Spark engine: foreign source -> unihub dataset, one or more input files per task.

The conversion is the one ingest pipeline (:mod:`unihub.converters.pipeline`); the tasks run on
Spark executors (:mod:`unihub.converters.engines.spark`). Task ``i`` writes ``part-<i>-<n>.parquet``
into the staging area beside ``dst``, so the dataset reads back in input-file order (the order the
local engine writes); the driver writes ``_common_metadata`` and commits when every task succeeded.
A failed task fails the job with its own error, and neither ``dst`` nor the staging area is left.

    from unihub.converters.spark import convert_with_spark
    convert_with_spark("data/shard-{000..099}.tar", "data/train", master="spark://host:7077")

The input files must be readable by the executors at the same paths (relative ones are made
absolute by the driver), and the destination writable by them: a shared file system or an object
store (``s3://...`` with ``storage_options``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from unihub.converters.convert import convert
from unihub.converters.result import ConvertResult
from unihub.formats.base import OnError
from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB
from unihub.schema.image_checks import ValidateImages
from unihub.schema.unischema import Unischema


def convert_with_spark(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
                       schema: Unischema | str | os.PathLike[str] | None = None, overwrite: bool = False,
                       overwrite_foreign: bool = False, master: str = "local[2]", spark: Any = None, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB,
                       on_error: OnError = "raise", format_options: Mapping[str, Any] | None = None,
                       validate_images: ValidateImages = "header", max_image_pixels: int | None | str = "current",
                       storage_options: dict[str, Any] | None = None) -> ConvertResult:
    """Convert the foreign dataset ``src`` into the unihub dataset ``dst`` with Spark.

    ``spark`` is an existing SparkSession (left running); without one the running session is used,
    else one is started on ``master`` and stopped at the end. The other arguments are those of
    :func:`unihub.converters.convert.convert`.
    """
    return convert(src, dst, from_format=from_format, schema=schema, overwrite=overwrite,
                   overwrite_foreign=overwrite_foreign, engine="spark",
                   master=master, spark=spark, row_group_size_mb=row_group_size_mb, on_error=on_error,
                   format_options=format_options, validate_images=validate_images, max_image_pixels=max_image_pixels,
                   storage_options=storage_options)
