#!/usr/bin/env bash
# Installs unihub and everything its tests use into ./.venv, from nothing; safe to re-run.
# torch==2.13.0 goes first: it is the CPU build on this machine's disk, and an unpinned
# torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e '.[all,test]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "
import importlib.util, sys, unihub
missing = [m for m in ('torch', 'tensorflow', 'pyspark', 'h5py', 'webdataset', 'tfrecord', 'nvidia.dali', 'moto')
           if importlib.util.find_spec(m) is None]
sys.exit('missing: ' + ', '.join(missing) if missing else 0)" \
  || { echo "setup: an install step failed (see above)" >&2; exit 1; }
