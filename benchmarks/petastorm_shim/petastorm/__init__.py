"""Petastorm's top-level names, re-exported from unihub (the conformance run's import shim).

Only imports and name bindings: ``tests/test_petastorm_shim.py`` fails on anything else.
``petastorm.tests`` is not here: ``benchmarks/petastorm_conformance.py`` copies Petastorm's own
tests beside this package.
"""

from unihub import TransformSpec, make_batch_reader, make_reader

__all__ = ["TransformSpec", "make_batch_reader", "make_reader"]
