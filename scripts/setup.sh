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
.venv/bin/python -m pip install -q -e '.[all,test,docs]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "
import importlib.util, sys, unihub
missing = [m for m in ('torch', 'tensorflow', 'pyspark', 'h5py', 'webdataset', 'tfrecord', 'nvidia.dali', 'moto', 'tqdm', 'argcomplete', 'xdist',
                     'mkdocs', 'mkdocstrings_handlers.python', 'material')
           if importlib.util.find_spec(m) is None]
sys.exit('missing: ' + ', '.join(missing) if missing else 0)" \
  || { echo "setup: an install step failed (see above)" >&2; exit 1; }
# Headless Chromium for the HTML report's browser test (tests/viewer/test_browser.py, skipped without it):
# Debian's chromium package, where apt-get can install it (as root, or with sudo needing no password).
# A machine where it cannot only skips that test, so this step warns rather than fails.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo="-"; fi
  if [ "$sudo" = "-" ]; then
    echo "setup: chromium is missing and apt-get needs root: the browser test will be skipped" >&2
  elif ! { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >/dev/null 2>&1; then
    echo "setup: installing chromium with apt-get failed: the browser test will be skipped" >&2
  fi
fi
# Petastorm 0.13.1 in its own venv (.venv-petastorm: it needs pyarrow 14 and numpy 1): the tests read
# the datasets unihub writes with petastorm_compatible=True with real Petastorm. About 2 minutes and
# 1.8 GB the first time, a few seconds after (an import check). Its pip output goes to a log, shown on failure.
log=$(mktemp)
if ! .venv/bin/python benchmarks/petastorm_env.py --no-tf >/dev/null 2>"$log"; then
  tail -n 40 "$log" >&2; rm -f "$log"
  echo "setup: building the Petastorm venv failed (see above)" >&2; exit 1
fi
grep '^\[petastorm_env\] installed' "$log" || true
rm -f "$log"
