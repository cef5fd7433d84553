"""The type of the datasets :mod:`unihub.bridges.tf.dataset` makes: a ``tf.data.Dataset`` that also speaks TF1.

Two things TensorFlow's own dataset types do not do, which these datasets add:

- **unihub's errors as themselves.** A unihub error raised in a ``Dataset.from_generator``
  generator reaches Python as a ``tf.errors.InvalidArgumentError`` holding only its text. The
  generators record their errors (:class:`Failures`) and the dataset's Python iterators raise the
  recorded error in place of TensorFlow's (where TensorFlow iterates on its own, in a ``map`` of
  the dataset, ``model.fit`` or a ``tf.function``, TensorFlow's error carries the text).
- **TF1's idioms**, as on the ``tf.compat.v1.data.Dataset`` Petastorm returned: the dataset and
  every dataset made from it (``batch``, ``map``, ``concatenate``, ...) answer
  ``make_one_shot_iterator()``, ``make_initializable_iterator()``, ``output_shapes``,
  ``output_types`` and ``output_classes``, in eager code and inside ``tf.Graph().as_default()``
  with ``tf.compat.v1.Session``. The transformations keep TF2's semantics, not TF1's: a ``map``
  keeps the dataset's cardinality (TF1's ``map`` loses it, so Keras would show no progress).

TensorFlow has no public hook for either: the classes extend tf.data's own
(``tensorflow.python.data.ops``); a dataset here is the graph of the dataset it wraps, under
another Python type, as ``tf.compat.v1.data.Dataset.from_generator``'s ``DatasetV1Adapter`` is.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from unihub.dependencies import require
from unihub.errors import UnihubError


class Failures:
    """The unihub errors a dataset's generators raised, kept for its iterators to raise in place of
    the ``tf.errors.InvalidArgumentError`` TensorFlow makes of each (which keeps only its text)."""

    def __init__(self) -> None:
        self._errors: collections.deque[UnihubError] = collections.deque(maxlen=16)
        self._lock = threading.Lock()

    def record(self, error: UnihubError) -> None:
        with self._lock:
            self._errors.append(error)

    def take(self, message: str) -> UnihubError | None:
        """The latest error recorded whose text TensorFlow's ``message`` holds; None where none does."""
        with self._lock:
            for error in reversed(self._errors):
                if str(error) in message:
                    self._errors.remove(error)
                    return error
        return None


@functools.cache
def dataset_types() -> tuple[type, type, type]:
    """(``CompatibleDataset``, ``BridgedDataset``, ``BridgedIterator``), built once TensorFlow is imported.

    ``CompatibleDataset(dataset)`` is ``dataset`` answering TF1's idioms, as are the datasets made
    from it; ``BridgedDataset(dataset, failures)`` is one whose Python iterators
    (``BridgedIterator``) raise the unihub errors recorded in ``failures``.
    """
    from tensorflow.python.data.ops import dataset_ops, iterator_ops
    from tensorflow.python.framework import ops

    tf = require("tensorflow", extra="tf", purpose="tf.data datasets")

    class CompatibleDataset(dataset_ops.DatasetV1Adapter):
        """A TF2 dataset with TF1's iterators and ``output_*`` properties (see the module docstring)."""

    def compatible_result(transformation: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(transformation)
        def transform(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = transformation(self, *args, **kwargs)
            if isinstance(result, dataset_ops.DatasetV2) and not isinstance(result, dataset_ops.DatasetV1):
                return CompatibleDataset(result)
            return result  # not a dataset (cardinality, reduce, ...), or one already TF1's
        return transform

    # every DatasetV2 method, TF2's own (TF1's ``map`` loses the cardinality), its dataset wrapped;
    # the adapter's own (``options``) read the wrapped dataset's
    adapter_own = vars(dataset_ops.DatasetV1Adapter)
    for name, method in vars(dataset_ops.DatasetV2).items():
        if not name.startswith("_") and inspect.isfunction(method) and name not in adapter_own:
            setattr(CompatibleDataset, name, compatible_result(method))

    class BridgedIterator(iterator_ops.OwnedIterator):
        def __init__(self, dataset: Any, failures: Failures) -> None:
            self._failures = failures
            super().__init__(dataset)

        def _next_internal(self) -> Any:
            try:
                return super()._next_internal()
            except tf.errors.OutOfRangeError:
                raise
            except tf.errors.OpError as exc:
                error = self._failures.take(exc.message)
                if error is None:
                    raise
                raise error from exc

    class BridgedDataset(CompatibleDataset):
        def __init__(self, dataset: Any, failures: Failures) -> None:
            self._failures = failures
            super().__init__(dataset)

        def __iter__(self) -> Any:
            if not tf.executing_eagerly():  # inside a tf.function: tf.data's own iterator (and errors)
                return super().__iter__()
            with ops.colocate_with(self._variant_tensor):
                return BridgedIterator(self, self._failures)

        def _make_one_shot_iterator(self) -> Any:
            # eager: the bridged iterator (its get_next raises unihub's errors); a graph: TF1's
            return iter(self) if tf.executing_eagerly() else super()._make_one_shot_iterator()

    return CompatibleDataset, BridgedDataset, BridgedIterator


def bridged(dataset: Any, failures: Failures) -> Any:
    """``dataset`` (the same graph) answering TF1's idioms, its iterators raising the unihub errors
    recorded in ``failures`` rather than TensorFlow's InvalidArgumentError that carries their text."""
    return dataset_types()[1](dataset, failures)
