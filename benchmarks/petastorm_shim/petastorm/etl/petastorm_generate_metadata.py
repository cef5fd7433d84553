"""``petastorm.etl.petastorm_generate_metadata``: unihub's ``generate_petastorm_metadata``."""

from unihub import generate_petastorm_metadata

__all__ = ["generate_petastorm_metadata"]
