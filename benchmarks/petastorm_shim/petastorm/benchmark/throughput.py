"""``petastorm.benchmark.throughput``: unihub's ``reader_throughput``."""

from unihub.readers.throughput import ReadMethod, WorkerPoolType, reader_throughput

__all__ = ["ReadMethod", "WorkerPoolType", "reader_throughput"]
