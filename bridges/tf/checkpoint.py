"""A reader's position in TensorFlow's own checkpoints: ``tf.train.Checkpoint`` and Keras' ``BackupAndRestore``.

A :class:`ReaderPosition` counts the rows the model actually took from a dataset over a reader
(the count runs in the last stage of the dataset, when the model pulls an element, so rows that
tf.data prefetched but the model never saw are not counted), and turns the count into the reader's
position: the reader's state when the count began, advanced by that many rows along the reader's
plan. Restoring it puts the reader on the next row the model had not taken, so training resumed
from a checkpoint sees each remaining row once.

    with make_reader(url, num_epochs=1, shuffle_rows=True, seed=0) as reader:
        position = ReaderPosition(reader)                       # before the reader is read
        dataset = position.track(make_tf_dataset(reader, batch_size=64).map(to_xy))  # the last stage
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, data=position)
        checkpoint.restore(tf.train.latest_checkpoint(directory))  # a fresh run restores nothing
        ...  # checkpoint.save(prefix) every few steps

        position.attach(model)  # or: model.fit's BackupAndRestore saves and restores it with the weights
        model.fit(dataset, callbacks=[keras.callbacks.BackupAndRestore(directory, save_freq=100)])

The rows must reach the model in the reader's order, or through ``make_tf_dataset(reader,
shuffle_buffer=)`` (which records the order it hands rows out in: :mod:`unihub.bridges.tf.emitted`;
the rows that sat in its buffer are read again, no others), not through ``Dataset.shuffle``; shuffle
in the reader too (``shuffle_rows``, ``shuffle_row_groups`` with a ``seed``). The reader's rows per
epoch must be known in advance (no predicate, filters or n-grams), as for
:meth:`~unihub.readers.reader.Reader.seek`. The position is the reader's (any number of its epochs),
not the dataset's: iterate the dataset once (a reader with ``num_epochs`` and
``model.fit(..., steps_per_epoch=)``), restore before iterating.

Elastic: the positions every rank of a run saved resume on any other number of ranks, each new rank
given them all (``position.load_state_dict([state_0, ..., state_n])``; :func:`saved_position` reads
each out of its rank's ``tf.train.Checkpoint``): it takes its equal share of the rows no rank's model
took, as the reader's elastic resume (:mod:`unihub.readers.elastic`) gives it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from unihub.bridges.tf.emitted import emitted_for
from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, UnihubError
from unihub.readers import elastic
from unihub.readers import plan as planning
from unihub.schema.metadata_json import parse_json

tf = require("tensorflow", extra="tf", purpose="a reader position in TensorFlow checkpoints")

POSITION_STATE_VERSION = 1
#: the attribute :meth:`ReaderPosition.attach` sets on a Keras model (its path in a weights file)
KERAS_ATTRIBUTE = "unihub_reader_position"
#: what tf.train.Checkpoint saves: an object with its own tensors to serialize (TF >= 2.11's protocol)
_Trackable: Any = tf.__internal__.tracking.Trackable


class PositionStateError(UnihubError, ValueError):
    """A saved reader position that is malformed or belongs to another reader."""


def _parsed(text: Any) -> Any:
    """The state a checkpoint or weights file holds as JSON text; :class:`PositionStateError` where it is not JSON."""
    try:
        return parse_json(text)
    except (ValueError, TypeError) as exc:
        raise PositionStateError(f"the saved reader position is not JSON ({str(exc)[:100]}): pass what "
                                 "ReaderPosition.state_dict() returned") from None


def _checked(state: Any) -> dict[str, Any]:
    """``state`` once it is a position of this version; :class:`PositionStateError` else."""
    if not isinstance(state, dict) or state.get("version") != POSITION_STATE_VERSION \
            or not {"reader", "row"} <= set(state) or not isinstance(state["reader"], dict) \
            or not elastic.is_count(state["row"]) \
            or not all(isinstance(x, int) and x > 0 for x in state.get("exclude", [])):
        raise PositionStateError(f"not a reader position of version {POSITION_STATE_VERSION}: pass what "
                                 "ReaderPosition.state_dict() returned")
    return state


def _reader_state(position: dict[str, Any], reader: Any) -> dict[str, Any]:
    """A rank's position as the reader state of an elastic resume: its row as a task and offset of its plan
    (a batch reader's state says no row inside a task: the rest, as ``skip``, is rows delivered past it)."""
    state = position["reader"]
    try:
        config = elastic.rank_config(state, reader._plan)
        tasks = planning.rank_plan(config, int(state["epoch"]), elastic.decode_done(state.get("done", [])))
    except KeyError as exc:  # a state saved before elastic resume
        raise PositionStateError(f"a saved position lacks {exc} in its reader state: it resumes only one by one, "
                                 "on the world size that saved it") from None
    except (TypeError, ValueError) as exc:  # ReaderStateError too
        raise PositionStateError(f"a saved position's reader state is malformed: {exc}") from None
    row, task = int(position["row"]), int(state["task"])
    index, row = _task_of(tasks, row + _rows_before(tasks, task) + int(state["offset"]))
    exclude = {"exclude": list(position["exclude"])} if position.get("exclude") else {}
    if reader.batched or index == len(tasks):
        return dict(state, task=index, offset=0, skip=row, **exclude)
    return dict(state, task=index, offset=row, **exclude)


class ReaderPosition(_Trackable):
    """The position of ``reader`` after the rows a model took from a :meth:`track` ed dataset.

    A TensorFlow trackable: ``tf.train.Checkpoint(data=position)`` saves it (one string tensor,
    the JSON of :meth:`state_dict`) and restores it into the reader. :meth:`attach` puts it in a
    Keras model's weights, which ``BackupAndRestore`` saves and restores.
    """

    def __init__(self, reader: Any) -> None:
        if not hasattr(reader, "state_dict") or not hasattr(reader, "seek"):
            raise InvalidArgumentError(f"ReaderPosition takes a unihub reader (make_reader/make_batch_reader), "
                                       f"got {type(reader).__name__}")
        if reader.num_rows_per_epoch is None:
            raise InvalidArgumentError("a reader position counts rows, so the reader's rows per epoch must be known "
                                       "in advance: not with a predicate, filters, n-grams or a batch transform")
        self.reader = reader
        self._start, self._drops = _split(reader.state_dict())
        self._taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="unihub_rows_taken")
        self._emitted = emitted_for(reader)  # where a shuffled make_tf_dataset over it records its rows' order

    # -- counting -----------------------------------------------------------------------------------
    def track(self, dataset: Any, *, batched: bool = True) -> Any:
        """``dataset`` with a last stage that counts the rows of each element the model takes (an element's
        first tensor's leading dim with ``batched``, else one per element). Nothing may follow it that
        reads ahead (``prefetch``): the count must be of what the model took, not of what was fetched."""
        taken = self._taken

        def count(*element: Any) -> Any:
            if batched:
                first = tf.nest.flatten(element)[0]
                rows = first.nrows(out_type=tf.int64) if isinstance(first, tf.RaggedTensor) \
                    else tf.shape(first, out_type=tf.int64)[0]
            else:
                rows = tf.constant(1, tf.int64)
            with tf.control_dependencies([taken.assign_add(rows)]):
                return tf.nest.map_structure(tf.identity, element[0] if len(element) == 1 else element)

        options = tf.data.Options()  # the stage must run when the model pulls, not ahead of it in parallel
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        return dataset.map(count).with_options(options)

    @property
    def rows_taken(self) -> int:
        """Rows the model took since the position began (was made or restored)."""
        return int(self._taken.numpy())

    # -- the state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The reader's position after the rows taken (JSON-able): its state at the start of an epoch, and the
        row of that epoch (in the reader's order) to go on from. Through a shuffled ``make_tf_dataset`` (its
        ``shuffle_buffer``) the row is the first the model did not take, and ``exclude`` the offsets after it
        of the rows it took (the reader's stream order, which a reader state's ``exclude`` counts in)."""
        taken, emitted = self.rows_taken, self._emitted
        low, above = emitted.taken(taken) if emitted.active else (taken, np.empty(0, np.int64))
        drops = self._drops
        if drops is not None:  # the reader passes over rows taken before: the rows it delivers are the others
            low, above = int(drops.kept(np.array([low]))[0]), drops.kept(above)
            keys = drops.state_keys(low)  # low is a row delivered: the rows passed over are after it
            above = np.union1d(above, low + keys["skip"] + np.asarray(keys["exclude"], np.int64))
        epoch, row = self._advanced(low)
        state = {"version": POSITION_STATE_VERSION, "reader": dict(self._start, epoch=epoch, task=0, offset=0),
                 "row": row}
        if len(above):
            state["exclude"] = [int(p) - low for p in above]
        return state

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Put the reader on ``state``'s row (reading nothing before it); the count starts again there. The rows
        taken past it through a shuffled dataset (``exclude``) the reader passes over as they come, sharded or not.

        Given a list, the positions every rank of a run saved (with any shard count), this reader goes on
        with its equal share of the rows none of them took: the reader's elastic resume
        (:meth:`~unihub.readers.reader.Reader.load_state_dict` of every rank's state, the rows taken past
        each state's position as its ``skip``). :func:`saved_position` reads a rank's out of its checkpoint.
        """
        if isinstance(state, (list, tuple)):
            self._load_elastic([_checked(s) for s in state])
            return
        state = _checked(state)
        reader, row = self.reader, int(state["row"])
        try:
            reader.load_state_dict(state["reader"])
            if state.get("exclude"):  # rows taken out of order: the reader passes over them as they come
                reader.load_state_dict(_at_row(reader, row, state["exclude"]))
            elif row:
                reader.seek(row)
        except UnihubError as exc:
            raise PositionStateError(f"the saved position belongs to another reader: {exc}") from exc
        if state.get("exclude"):  # the count goes on from the reader's position, through the rows it passes over
            self._start, self._drops = _split(reader.state_dict())
            self._start_row = 0
        else:  # the count goes on from the row (a batch reader's state cannot say a row inside a batch)
            self._start, self._drops, self._start_row = _split(state["reader"])[0], None, row
        self._count_again()

    def _load_elastic(self, states: list[dict[str, Any]]) -> None:
        """:meth:`load_state_dict` of every rank's position."""
        reader = self.reader
        try:
            reader.load_state_dict([_reader_state(s, reader) for s in states])
        except UnihubError as exc:
            raise PositionStateError(f"the saved positions do not resume this reader: {exc}") from exc
        (self._start, self._drops), self._start_row = _split(reader.state_dict()), 0
        self._count_again()

    def _count_again(self) -> None:
        """The count starts again where the reader was put (and a shuffled dataset's record of it)."""
        self._taken.assign(0)
        self._emitted.reset()

    _start_row = 0  # rows of the start state's epoch before the count began, beyond its task and offset

    def _advanced(self, rows: int) -> tuple[int, int]:
        """(epoch, row of that epoch) ``rows`` rows after the start state; (num_epochs, 0) past the end.
        An epoch's rows are those of the reader's plan of it under the start state: after an elastic resume
        (the state's ``done``) the epochs it names are this shard's runs of what was left, of other lengths."""
        start, reader, num_epochs = self._start, self.reader, self.reader.num_epochs
        config = dataclasses.replace(reader._plan, seed=int(start["seed"]))  # the plan the state was saved under
        done = elastic.decode_done(start.get("done", []))
        epoch = int(start["epoch"])
        row = self._start_row + _rows_before(planning.rank_plan(config, epoch, done), int(start["task"])) \
            + int(start["offset"]) + rows
        per_epoch = reader.num_rows_per_epoch  # a fresh epoch's rows
        while num_epochs is None or epoch < num_epochs:
            if not any(e >= epoch for e in done):  # fresh epochs from here on: step over whole ones
                epoch, row = (epoch + row // per_epoch, row % per_epoch) if per_epoch else (epoch, row)
                break
            size = _rows_before(planning.rank_plan(config, epoch, done))
            if row < size:
                break
            epoch, row = epoch + 1, row - size
        if num_epochs is not None and epoch >= num_epochs:
            return num_epochs, 0
        return epoch, row

    # -- tf.train.Checkpoint ----------------------------------------------------------------------------
    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"state": tf.constant(json.dumps(self.state_dict()))}

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> None:
        self.load_state_dict(_parsed(restored_tensors["state"].numpy()))

    # -- Keras ----------------------------------------------------------------------------------------------
    def attach(self, model: Any) -> Any:
        """Put this position in ``model``'s weights (``save_weights``/``load_weights``, and so Keras'
        ``BackupAndRestore``), as the attribute :data:`KERAS_ATTRIBUTE`; returns ``model``."""
        # object.__setattr__: Keras would track it as a sublayer (Sequential.layers); saving finds it all the same
        object.__setattr__(model, KERAS_ATTRIBUTE, _keras_holder()(self))
        return model


def saved_position(checkpoint: str, name: str = "data") -> dict[str, Any]:
    """The position a ``tf.train.Checkpoint(**{name: position})`` saved at ``checkpoint`` (a path as
    ``save`` returns it, or a folder: its latest), without restoring it: every rank's of a run, in a list,
    resume a position on another number of ranks (:meth:`ReaderPosition.load_state_dict`)."""
    path = tf.train.latest_checkpoint(checkpoint) or checkpoint
    key = f"{name}/.ATTRIBUTES/state"  # a nested one: name="outer/data"
    try:
        value = tf.train.load_checkpoint(path).get_tensor(key)
    except (tf.errors.NotFoundError, ValueError) as exc:
        raise PositionStateError(f"no reader position {name!r} in checkpoint {checkpoint}: {exc}") from None
    return _checked(_parsed(value))


@functools.cache
def _keras_holder() -> type:
    """A Keras layer holding a position in a weights file: its JSON state as a uint8 array."""
    keras = require("keras", extra="tf", purpose="a reader position in Keras weights")
    layer: Any = keras.layers.Layer

    class ReaderPositionHolder(layer):
        def __init__(self, position: ReaderPosition) -> None:
            super().__init__(name=KERAS_ATTRIBUTE, trainable=False)
            self.position = position
            self.built = True

        def save_own_variables(self, store: Any) -> None:
            store["state"] = np.frombuffer(json.dumps(self.position.state_dict()).encode(), np.uint8)

        def load_own_variables(self, store: Any) -> None:
            if "state" in store.keys():  # a weights file saved before the position was attached has none
                self.position.load_state_dict(_parsed(bytes(np.asarray(store["state"]))))

    return ReaderPositionHolder


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], elastic.Drops | None]:
    """A reader's state without the rows after its position it passes over (``skip``/``exclude``), and those."""
    return {k: v for k, v in state.items() if k not in ("skip", "exclude")}, elastic.Drops.of_state(state)


def _at_row(reader: Any, row: int, exclude: Sequence[int]) -> dict[str, Any]:
    """The state of ``reader`` (at the start of an epoch) at its epoch's row ``row``, the rows ``exclude`` offsets
    after it passed over (a batch reader's at the start of the row's task, the rows before it passed over too)."""
    state = reader.state_dict()
    tasks = reader.plan_of(int(state["epoch"]))
    index, row = _task_of(tasks, row)
    if reader.batched or index == len(tasks):
        return dict(state, task=index, offset=0, skip=row, exclude=list(exclude))
    return dict(state, task=index, offset=row, skip=0, exclude=list(exclude))


def _task_of(tasks: list[planning.ReadTask], row: int) -> tuple[int, int]:
    """(task, row into it) of the epoch's row ``row`` (``(len(tasks), 0)``: the epoch's end); a
    :class:`PositionStateError` past it (a position's row is one of its epoch's: a tampered one)."""
    index = 0
    while index < len(tasks) and row >= tasks[index].num_rows:
        row, index = row - tasks[index].num_rows, index + 1
    if row and index == len(tasks):
        raise PositionStateError(f"a saved position's row is {row} rows past the end of its epoch: pass what "
                                 "ReaderPosition.state_dict() returned")
    return index, row


def _rows_before(tasks: list[planning.ReadTask], task: int | None = None) -> int:
    """Rows of ``tasks`` before the ``task``-th (all of them: None)."""
    return sum(t.num_rows for t in tasks[:task])
