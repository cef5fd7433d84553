"""``petastorm.transform``: unihub's TransformSpec and its helpers."""

from unihub.readers.transform import TransformSpec, edit_field, transform_schema

__all__ = ["TransformSpec", "edit_field", "transform_schema"]
