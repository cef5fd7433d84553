"""``petastorm.utils``: unihub's row decoder."""

from unihub import DecodeFieldError, decode_row

__all__ = ["DecodeFieldError", "decode_row"]
