"""Aliases Petastorm's tests need on this project's Python, NumPy and pyarrow, for both conformance runs.

Petastorm's tests were written for Python <= 3.10, NumPy 1 and pyarrow < 16: ``create_tf_graph``
(in ``test_tf_utils.py``, used by six test files) calls ``inspect.getargspec``, removed in Python
3.11; the tests spell ``np.unicode_`` and ``np.string_``, removed in NumPy 2 (unihub's venv), and
``np.float`` (removed in NumPy 1.24), which Petastorm's own ``WeightedSamplingReader`` uses too; and
``test_end_to_end.py`` does ``import pyarrow.hdfs`` (and never uses it), a module newer pyarrow
dropped. The aliases are what those names meant: ``getfullargspec`` (its ``.args`` is the same
list), ``np.str_``, ``np.bytes_`` and ``float``, and an empty ``pyarrow.hdfs`` only where pyarrow has none.
``benchmarks/petastorm_conformance.py`` puts this file on ``PYTHONPATH`` of both runs, so it also
holds in the Python workers Spark starts. It changes neither Petastorm's nor unihub's behaviour:
it lets the tests import.
"""

import importlib.abc
import importlib.machinery
import inspect
import sys

import numpy

if not hasattr(inspect, "getargspec"):
    inspect.getargspec = inspect.getfullargspec  # type: ignore[attr-defined]
if not hasattr(numpy, "unicode_"):
    numpy.unicode_ = numpy.str_
    numpy.string_ = numpy.bytes_
if not hasattr(numpy, "float"):  # removed in NumPy 1.24; Petastorm's WeightedSamplingReader itself spells it
    numpy.float = float


class _EmptyPyarrowHdfs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: answers ``import pyarrow.hdfs`` only when pyarrow itself has no such module."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == "pyarrow.hdfs" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "empty: pyarrow.hdfs is gone from this pyarrow (Petastorm's tests only import it)"


sys.meta_path.append(_EmptyPyarrowHdfs())
