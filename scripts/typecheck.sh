#!/usr/bin/env bash
# Type-check the package with mypy, as CI does (extra arguments go to mypy).
# The repository root is the package `unihub` (package-dir in pyproject.toml), so mypy is shown it
# through a link named `unihub` in a temporary directory; the cache stays in the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
ln -s "$root" "$view/unihub"
cd "$view"
"$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" -p unihub "$@"
