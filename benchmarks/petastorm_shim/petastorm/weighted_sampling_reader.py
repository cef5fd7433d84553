"""``petastorm.weighted_sampling_reader``: unihub's WeightedSamplingReader."""

from unihub import WeightedSamplingReader

__all__ = ["WeightedSamplingReader"]
