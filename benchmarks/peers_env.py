"""Build the peers' virtual environments for ``benchmarks/peers.py``: one per tool, under ``benchmarks/.venvs/``.

Each peer (Lance, HuggingFace datasets, LitData, MosaicML Streaming, WebDataset, Ray Data)
gets its own venv, so that no peer's pins bend another's or unihub's. Every venv gets
``torch==2.13.0`` first (the CPU wheel on this machine's disk, as ``scripts/setup.sh`` installs
it: an unpinned torch would pull a multi-GB CUDA build), then the peer from the package
registry, plus simplejpeg (the JPEG decoder every contender uses, as unihub does) and psutil.

    python benchmarks/peers_env.py [lance hf ...]       # create the missing ones, print name -> python
    python benchmarks/peers_env.py --force lance        # reinstall

Idempotent: a marker file in each venv records a finished install and the versions that went
in; a later run only checks the imports. A peer that fails to install is reported with its
error line (``PeerUnavailable``), never silently dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
MARKER_NAME = "unihub-peer-installed.json"
TORCH_PIN = "torch==2.13.0"
COMMON = ["simplejpeg", "psutil", "numpy"]


@dataclass(frozen=True)
class Peer:
    """A peer tool: its venv name, what pip installs, the modules whose versions are recorded, and the
    stand-in packages written over what pip pulled in (name -> {module path: source})."""

    name: str
    packages: tuple[str, ...]
    modules: tuple[str, ...]
    stand_ins: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


#: ``import streaming`` imports ``streaming.vision``, which imports two names from torchvision; the only
#: torchvision wheel for torch 2.13.0 is built against the CUDA torch and fails to load beside the CPU one
#: ("operator torchvision::nms does not exist"). The benchmark uses neither name: this stand-in is what
#: ``streaming`` imports, and nothing else.
TORCHVISION_STAND_IN = ("torchvision", (
    ("__init__.py", '"""A stand-in for torchvision: only what mosaicml-streaming imports (benchmarks/peers_env.py)."""\n'
                    '__version__ = "0+stand-in"\n'),
    ("datasets/__init__.py", "import torch.utils.data\n\n\n"
                             "class VisionDataset(torch.utils.data.Dataset):\n"
                             '    """torchvision.datasets.VisionDataset\'s constructor, enough for streaming.vision."""\n\n'
                             "    def __init__(self, root=None, transforms=None, transform=None, target_transform=None):\n"
                             "        self.root, self.transforms = root, transforms\n"
                             "        self.transform, self.target_transform = transform, target_transform\n"),
    ("transforms/__init__.py", ""),
    ("transforms/functional.py", "import numpy as np\nimport torch\n\n\n"
                                 "def to_tensor(pic):\n"
                                 '    """HWC uint8 image -> CHW float tensor in [0, 1], as torchvision\'s."""\n'
                                 "    array = np.asarray(pic)\n"
                                 "    array = array[:, :, None] if array.ndim == 2 else array\n"
                                 "    return torch.from_numpy(array.transpose(2, 0, 1).copy()).float().div(255)\n"),
))


PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("lance", ("pylance", "pyarrow"), ("lance", "pyarrow")),
    Peer("hf", ("datasets",), ("datasets", "pyarrow")),
    Peer("litdata", ("litdata",), ("litdata",)),
    Peer("mosaic", ("mosaicml-streaming",), ("streaming",), (TORCHVISION_STAND_IN,)),
    Peer("wds", ("webdataset",), ("webdataset",)),
    Peer("ray", ("ray[data]", "pyarrow", "pandas", "pydantic"), ("ray", "pyarrow")),  # iter_torch_batches needs pydantic
]}


class PeerUnavailable(RuntimeError):
    """A peer's venv could not be built or does not import; the message is one line for the table."""


def _log(msg: str) -> None:
    print(f"[peers_env] {msg}", file=sys.stderr, flush=True)


def venv_python(name: str, venvs: Path = VENVS) -> Path:
    return venvs / name / "bin" / "python"


def _pip(python: Path, args: list[str]) -> str | None:
    """pip install ``args``; None on success, else the last meaningful line of its output."""
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    _log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    _log(f"pip exited {proc.returncode} after {time.perf_counter() - t0:.1f}s")
    if proc.returncode == 0:
        return None
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
    errors = [ln for ln in lines if "ERROR" in ln]
    return (errors or lines or [f"pip exited {proc.returncode}"])[-1].strip()


def _verify(python: Path, peer: Peer) -> dict[str, str]:
    """Import the peer's modules (and torch, simplejpeg) in its venv; their versions, or PeerUnavailable."""
    code = ("import json, importlib, torch, simplejpeg\n"
            f"mods = {list(peer.modules)!r}\n"
            "v = {m: getattr(importlib.import_module(m), '__version__', '?') for m in mods}\n"
            "v['torch'] = torch.__version__\n"
            "print(json.dumps(v))\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["import failed"])[-1]
        raise PeerUnavailable(f"import check failed: {last}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _stand_in(python: Path, package: str, files: tuple[tuple[str, str], ...]) -> None:
    """Replace ``package`` in the venv by the stand-in ``files`` (uninstalled first, so pip's record is honest)."""
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", package], capture_output=True, check=False)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for relative, source in files:
        target = Path(site) / package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    _log(f"{package}: stand-in written to {Path(site) / package}")


def existing_peers(venvs: Path = VENVS) -> list[str]:
    """The peers whose venv has finished installing (for ``--quick``: no building)."""
    return [name for name in PEERS if (venvs / name / MARKER_NAME).exists()]


def ensure_peer_venv(name: str, *, force: bool = False, venvs: Path = VENVS) -> Path:
    """Make sure ``venvs/name`` holds a working install of the peer; return its python."""
    peer = PEERS[name]
    venv = venvs / name
    python, marker = venv_python(name, venvs), venv / MARKER_NAME
    if marker.exists() and python.exists() and not force:
        try:
            _verify(python, peer)
            return python
        except PeerUnavailable as exc:
            _log(f"{name}: marker present but {exc}; reinstalling")
    t0 = time.perf_counter()
    if not python.exists():
        _log(f"creating venv {venv}")
        base = getattr(sys, "_base_executable", None) or sys.executable
        made = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            raise PeerUnavailable(f"python -m venv failed: {(made.stderr.strip().splitlines() or ['?'])[-1]}")
        _pip(python, ["--upgrade", "pip", "wheel"])
    marker.unlink(missing_ok=True)
    for step in ([TORCH_PIN], [*peer.packages, *COMMON, TORCH_PIN]):
        error = _pip(python, step)
        if error is not None:
            raise PeerUnavailable(f"pip install {' '.join(step)}: {error}")
    for package, files in peer.stand_ins:
        _stand_in(python, package, files)
    versions = _verify(python, peer)
    seconds = time.perf_counter() - t0
    _log(f"{name}: installed in {seconds:.0f}s: {versions}")
    marker.write_text(json.dumps({"versions": versions, "install_seconds": round(seconds, 1),
                                  "packages": list(peer.packages)}, indent=2))
    return python


def versions(name: str, venvs: Path = VENVS) -> dict[str, str]:
    """What the marker of a built venv recorded (empty when there is none)."""
    marker = venvs / name / MARKER_NAME
    return dict(json.loads(marker.read_text())["versions"]) if marker.exists() else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peers", nargs="*", help=f"some of {', '.join(PEERS)} (default: all)")
    ap.add_argument("--force", action="store_true", help="reinstall even if already installed")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        ap.error(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    failed = 0
    for name in args.peers or list(PEERS):
        try:
            print(f"{name} {ensure_peer_venv(name, force=args.force)}")
        except PeerUnavailable as exc:
            failed += 1
            print(f"{name} FAILED: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
