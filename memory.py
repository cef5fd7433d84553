"""Old path of :mod:`unihub.runtime.memory`, kept so that code written against it runs unchanged: the same module object."""

import sys

import unihub.runtime.memory  # noqa: F401  (the module itself, under its old name)

sys.modules[__name__] = sys.modules["unihub.runtime.memory"]
