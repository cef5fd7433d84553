"""Optional dependencies, imported lazily with an error that says what to install.

``import unihub`` needs only numpy, pyarrow and the image decoder; every framework
(torch, tensorflow, pyspark, h5py, DALI, ...) is imported where it is used through
:func:`require`, which names the ``pip install 'unihub[<extra>]'`` that provides it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from unihub.errors import MissingDependencyError

#: module name -> the extra of ``unihub`` that installs it.
EXTRAS: dict[str, str] = {
    "torch": "torch",
    "tensorflow": "tf",
    "pyspark": "spark",
    "h5py": "hdf5",
    "tqdm": "cli",
    "argcomplete": "cli",
    "nvidia.dali": "dali",
    "fsspec": "fsspec",
}


def is_available(module: str) -> bool:
    """True when ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, *, extra: str | None = None, purpose: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = extra or EXTRAS.get(module.split(".")[0]) or EXTRAS.get(module, "all")
        why = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(
            f"{module} is needed{why} but is not installed: pip install 'unihub[{extra}]'"
        ) from exc
