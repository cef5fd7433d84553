"""``petastorm.benchmark.throughput``: unihub's ``reader_throughput``."""

from unihub.bridges.throughput import ReadMethod, WorkerPoolType, reader_throughput

__all__ = ["ReadMethod", "WorkerPoolType", "reader_throughput"]
