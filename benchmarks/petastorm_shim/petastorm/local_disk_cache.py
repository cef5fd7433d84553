"""``petastorm.local_disk_cache``: unihub's disk cache."""

from unihub.readers.local_disk_cache import LocalDiskCache

__all__ = ["LocalDiskCache"]
