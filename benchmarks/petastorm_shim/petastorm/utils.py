"""``petastorm.utils``: unihub's row decoder and dataset-metadata writer."""

from unihub import DecodeFieldError, add_to_dataset_metadata, decode_row

__all__ = ["DecodeFieldError", "add_to_dataset_metadata", "decode_row"]
