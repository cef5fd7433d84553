"""``petastorm.reader``: unihub's reader factories."""

from unihub import Reader, make_batch_reader, make_reader

__all__ = ["Reader", "make_batch_reader", "make_reader"]
