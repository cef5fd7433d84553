"""Old path of :mod:`unihub.bridges.tf.checkpoint`, kept so that code written against it runs unchanged: the same module object."""

import sys

import unihub.bridges.tf.checkpoint  # noqa: F401  (the module itself, under its old name)

sys.modules[__name__] = sys.modules["unihub.bridges.tf.checkpoint"]
