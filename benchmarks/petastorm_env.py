"""Create the side-by-side Petastorm 0.13.1 virtual environment the benchmarks compare against.

Petastorm's last release (0.13.1) only runs on an old stack, so it cannot share unihub's
venv (pyarrow >= 15 and numpy 2 break it). This script builds ``<repo>/.venv-petastorm``
(git-ignored) with the pins it needs::

    python benchmarks/petastorm_env.py            # create if missing, print the venv's python
    python benchmarks/petastorm_env.py --force    # reinstall even if the marker says done
    python benchmarks/petastorm_env.py --no-tf    # skip tensorflow-cpu

or from Python: ``from benchmarks.petastorm_env import ensure_petastorm_venv``.

Idempotent: a marker file inside the venv records a finished install (and what went in);
a second run only checks that ``import petastorm`` still works. Progress goes to stderr,
the venv's python path to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_DIR = REPO_ROOT / ".venv-petastorm"
MARKER = VENV_DIR / "unihub-petastorm-installed.json"

#: torch goes in first and alone: ``torch==2.13.0`` resolves to the CPU wheel that lies on
#: this machine's disk (pip's find-links), not the multi-GB CUDA build from the index.
#: It goes in with ``--no-deps``: torch 2.13 declares ``setuptools>=77`` while Petastorm
#: 0.13.1 declares ``setuptools<70`` (torch only needs setuptools to build C++ extensions),
#: so its other runtime dependencies are listed here and installed beside Petastorm.
TORCH_PIN = "torch==2.13.0"
TORCH_DEPS = ["filelock", "typing-extensions>=4.10.0", "sympy>=1.13.3", "networkx>=2.5.1", "jinja2", "fsspec>=0.8.5"]

#: Petastorm 0.13.1 and the old stack it runs on.
PETASTORM_PINS = [
    "petastorm==0.13.1",
    "pyarrow==14.0.2",
    "numpy<2",
    "pandas<3",
    "opencv-python-headless<4.12",  # newer ones need numpy 2: a looser pin makes pip download and discard several
    "setuptools<70",
    "pyspark==4.3.0",
    # what Petastorm's own tests need, for the conformance run (benchmarks/petastorm_conformance.py)
    "pytest>=8",
    "pillow",
    "pytz",
    "six",
]

#: tensorflow-cpu releases that still accept numpy < 2, tried newest first.
TF_CANDIDATES = ["tensorflow-cpu==2.17.*", "tensorflow-cpu==2.16.*"]

# What pip must not upgrade while tensorflow goes in.
_KEEP = ["numpy<2", "pyarrow==14.0.2", "pandas<3", "setuptools<70", "petastorm==0.13.1"]

_VERIFY = (
    "import petastorm, pyarrow, numpy, pandas, pyspark, cv2, torch, pytest, PIL, pytz, six\n"
    "from petastorm import make_reader, make_batch_reader\n"
    "import petastorm.pytorch\n"
    "v = dict(petastorm=petastorm.__version__, pyarrow=pyarrow.__version__, numpy=numpy.__version__,\n"
    "         pandas=pandas.__version__, pyspark=pyspark.__version__, opencv=cv2.__version__,\n"
    "         torch=torch.__version__)\n"
    "try:\n"
    "    import tensorflow as tf\n"
    "    import petastorm.tf_utils\n"
    "    v['tensorflow'] = tf.__version__\n"
    "except ImportError:\n"
    "    v['tensorflow'] = None\n"
    "import json; print(json.dumps(v))\n"
)


def _log(msg: str) -> None:
    print(f"[petastorm_env] {msg}", file=sys.stderr, flush=True)


def venv_python(venv_dir: Path = VENV_DIR) -> Path:
    return venv_dir / "bin" / "python"


def _pip(python: Path, args: list[str], *, timeout: float | None = None) -> bool:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    _log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        _log(f"pip timed out after {timeout:.0f}s")
        return False
    _log(f"pip exited {proc.returncode} after {time.perf_counter() - t0:.1f}s")
    return proc.returncode == 0


def _verify(python: Path) -> dict:
    """Import petastorm (and friends) in the venv; return their versions or raise."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([str(python), "-P", "-c", _VERIFY], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"petastorm venv import check failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ensure_petastorm_venv(*, force: bool = False, with_tf: bool = True, venv_dir: Path = VENV_DIR) -> Path:
    """Make sure ``venv_dir`` holds a working Petastorm 0.13.1; return its python.

    Creates the venv and installs torch, then Petastorm with its pins, then (optionally,
    best effort) tensorflow-cpu. Skips all of that when the marker of an earlier
    successful install is there, unless ``force``.
    """
    python = venv_python(venv_dir)
    marker = venv_dir / MARKER.name
    if marker.exists() and python.exists() and not force:
        try:
            _verify(python)
            return python
        except RuntimeError as exc:
            _log(f"marker present but import check failed, reinstalling: {exc}")

    t_start = time.perf_counter()
    if not python.exists():
        _log(f"creating venv {venv_dir}")
        # The base interpreter, not the one of unihub's venv.
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", str(venv_dir)], check=True)
        _pip(python, ["--upgrade", "pip", "wheel"])
    marker.unlink(missing_ok=True)

    if not _pip(python, ["--no-deps", TORCH_PIN]):
        raise RuntimeError("installing torch failed")
    if not _pip(python, [*PETASTORM_PINS, *TORCH_DEPS]):
        raise RuntimeError("installing petastorm 0.13.1 and its pins failed")

    tf_installed = None
    if with_tf:
        for spec in TF_CANDIDATES:
            if _pip(python, [spec, *_KEEP], timeout=900):
                tf_installed = spec
                break
            _log(f"{spec} did not install")
        if tf_installed is None:
            _log("no tensorflow-cpu compatible with numpy<2 installed; continuing without tf")

    versions = _verify(python)
    seconds = time.perf_counter() - t_start
    _log(f"installed in {seconds:.0f}s: {versions}")
    marker.write_text(json.dumps({"versions": versions, "install_seconds": round(seconds, 1),
                                  "tf_spec": tf_installed, "pins": PETASTORM_PINS}, indent=2))
    return python


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="reinstall even if already installed")
    ap.add_argument("--no-tf", action="store_true", help="do not try to install tensorflow-cpu")
    ap.add_argument("--venv", type=Path, default=VENV_DIR, help=f"venv directory (default {VENV_DIR})")
    args = ap.parse_args(argv)
    python = ensure_petastorm_venv(force=args.force, with_tf=not args.no_tf, venv_dir=args.venv)
    print(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
