"""WebDataset tar shards as a foreign format."""

from . import format as format  # noqa: F401  (registers the format)
