"""``petastorm.cache``: unihub's cache base classes."""

from unihub.readers.cache import CacheBase, NullCache

__all__ = ["CacheBase", "NullCache"]
