"""``petastorm.etl.dataset_metadata``: unihub's dataset metadata functions."""

from unihub import (
    get_schema,
    get_schema_from_dataset_url,
    infer_or_load_unischema,
    load_row_groups,
    materialize_dataset,
)
from unihub.errors import PetastormMetadataError

__all__ = ["PetastormMetadataError", "get_schema", "get_schema_from_dataset_url", "infer_or_load_unischema",
           "load_row_groups", "materialize_dataset"]
