"""``petastorm.ngram``: unihub's NGram windows."""

from unihub import NGram

__all__ = ["NGram"]
