"""Old path of :mod:`unihub.bridges.tf.dataset`, kept so that code written against it runs unchanged: the same module object."""

import sys

import unihub.bridges.tf.dataset  # noqa: F401  (the module itself, under its old name)

sys.modules[__name__] = sys.modules["unihub.bridges.tf.dataset"]
