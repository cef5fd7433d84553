"""``petastorm.codecs``: unihub's codecs."""

from unihub import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from unihub.schema.codecs import Codec as DataframeColumnCodec

__all__ = ["CompressedImageCodec", "CompressedNdarrayCodec", "DataframeColumnCodec", "NdarrayCodec", "ScalarCodec"]
