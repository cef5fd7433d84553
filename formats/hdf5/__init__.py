"""HDF5 files (through h5py, imported only when used) as a foreign format."""

from . import format as format  # noqa: F401  (registers the format)
