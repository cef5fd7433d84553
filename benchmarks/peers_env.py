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
    """A peer tool: its venv name, what pip installs, and the modules whose versions are recorded."""

    name: str
    packages: tuple[str, ...]
    modules: tuple[str, ...]


PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("lance", ("pylance", "pyarrow"), ("lance", "pyarrow")),
    Peer("hf", ("datasets",), ("datasets", "pyarrow")),
    Peer("litdata", ("litdata",), ("litdata",)),
    # streaming imports torchvision, whose PyPI wheel does not load beside the CPU torch (see the README)
    Peer("mosaic", ("mosaicml-streaming",), ("streaming",)),
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
