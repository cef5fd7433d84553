"""``petastorm.errors``: unihub's errors under Petastorm's names."""

from unihub.errors import NoDataAvailableError

__all__ = ["NoDataAvailableError"]
