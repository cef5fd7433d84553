"""NumPy 1 aliases that Petastorm's tests use, for the unihub run of the conformance run.

Petastorm's tests were written for NumPy 1 and spell ``np.unicode_`` and ``np.string_``, which
NumPy 2 (in unihub's venv) removed; they are the same types as ``np.str_`` and ``np.bytes_``.
``benchmarks/petastorm_conformance.py`` puts this file on ``PYTHONPATH`` of the unihub run only, so
it also holds in the Python workers Spark starts. It changes no unihub behaviour: it lets the tests
import.
"""

import numpy

if not hasattr(numpy, "__version__") or numpy.__version__.split(".")[0] >= "2":
    numpy.unicode_ = numpy.str_
    numpy.string_ = numpy.bytes_
