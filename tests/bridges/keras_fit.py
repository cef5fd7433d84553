"""``model.fit`` through a reader's dataset with Keras' BackupAndRestore, recording what it trains on: the
run the Keras resume tests interrupt and resume (tests/bridges/test_framework_checkpoints.py, tf/test_checkpoint.py)."""

from __future__ import annotations

from typing import Any

from unihub.readers.reader import make_reader


def fit_recorded(url: Any, backup: str, seen: list[list[int]], interrupt_at: int | None, *, batch_size: int,
                 shuffle_buffer: int = 0, target: str = "id") -> None:
    """One epoch over a fresh shuffled reader with BackupAndRestore(save_freq=3), appending each batch's ids to
    ``seen`` as the model trains on it (``target``: the field it learns); raise at the end of batch
    ``interrupt_at``."""
    import keras

    from unihub.bridges.tf.checkpoint import ReaderPosition
    from unihub.bridges.tf.dataset import make_tf_dataset

    class Recording(keras.Model):
        def train_step(self, data: Any) -> Any:
            seen.append(data[0][:, 0].numpy().astype(int).tolist())
            return super().train_step(data)

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == interrupt_at:
                raise RuntimeError("interrupted")

    def as_float(column: Any) -> Any:
        return keras.ops.cast(keras.ops.expand_dims(column, 1), "float32")

    inputs = keras.Input((1,))
    model = Recording(inputs, keras.layers.Dense(1)(inputs))
    model.compile(keras.optimizers.SGD(0.001), "mse", run_eagerly=True)
    with make_reader(url, reader_pool_type="dummy", shuffle_rows=True, num_epochs=1) as reader:
        position = ReaderPosition(reader)
        position.attach(model)
        pairs = make_tf_dataset(reader, batch_size=batch_size, shuffle_buffer=shuffle_buffer).map(
            lambda b: (as_float(b["id"]), as_float(b[target]) if target == "id" else b[target][:, :1]))
        model.fit(position.track(pairs), epochs=1, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3), Interrupt()])
