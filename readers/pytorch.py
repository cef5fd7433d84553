"""Old path of :mod:`unihub.bridges.torch` (the package, which has every public name of the PyTorch bridge),
kept so that code written against it runs unchanged: the same module object."""

import sys

import unihub.bridges.torch  # noqa: F401  (the package itself, under its old name)

sys.modules[__name__] = sys.modules["unihub.bridges.torch"]
