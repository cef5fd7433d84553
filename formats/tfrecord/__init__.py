"""TFRecord files (``tf.train.Example``, ``SequenceExample``, tensors, raw bytes) as a foreign format."""

from . import format as format  # noqa: F401  (registers the format)
