"""TensorFlow: tf.data datasets over unihub readers, TF1 graph tensors, and reader positions in checkpoints.

- ``dataset.py``: ``make_petastorm_dataset``, ``make_tf_dataset`` (and the names README reaches through it:
  ``fill_value``, ``output_signature``, ``PRESENT_SUFFIX``); ``dataset_type.py``: the type of what they make;
- ``plans.py``: how each field travels (dtype, ragged rank, null mask); ``encode.py``: numpy columns into the
  flat arrays that cross; ``sources.py``: the readers served and the numpy stages; ``assemble.py``: the graph
  side; ``ngram.py``: NGram windows;
- ``graph.py``: Petastorm's TF1 ``tf_tensors``; ``checkpoint.py``: ``ReaderPosition``.

TensorFlow is imported when a dataset is made, never when this package is imported.
"""
