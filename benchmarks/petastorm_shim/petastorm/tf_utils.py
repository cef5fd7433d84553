"""``petastorm.tf_utils``: unihub's TensorFlow bridge."""

from unihub.readers.tf import make_petastorm_dataset
from unihub.readers.tf_graph import tf_tensors

__all__ = ["make_petastorm_dataset", "tf_tensors"]
