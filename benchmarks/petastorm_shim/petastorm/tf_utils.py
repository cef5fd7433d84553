"""``petastorm.tf_utils``: unihub's TensorFlow bridge."""

from unihub.bridges.tf.dataset import make_petastorm_dataset
from unihub.bridges.tf.graph import tf_tensors

__all__ = ["make_petastorm_dataset", "tf_tensors"]
