"""Imports every foreign-format module so each registers itself in ``FORMATS``.

Format modules import their libraries (tensorflow, h5py, webdataset, ...) only when used,
so importing them here is cheap and works without those libraries installed.
"""

from __future__ import annotations

import importlib

FORMAT_MODULES = ("tfrecord", "hdf5", "webdataset", "imagefolder")

for _module in FORMAT_MODULES:
    importlib.import_module(f"unihub.formats.{_module}")
