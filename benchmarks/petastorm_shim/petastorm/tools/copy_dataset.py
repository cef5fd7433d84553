"""``petastorm.tools.copy_dataset``: unihub's ``copy_dataset``."""

from unihub import copy_dataset

__all__ = ["copy_dataset"]
