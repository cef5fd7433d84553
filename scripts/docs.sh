#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml, docs/) with warnings as errors, as CI does, into a temporary
# folder that is removed after; `bash scripts/docs.sh serve` serves it with live reload instead.
# The repository root is the package `unihub` (package-dir in pyproject.toml), so mkdocstrings is shown it
# through a link named `unihub` in a temporary folder, as scripts/typecheck.sh shows it to mypy.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
ln -s "$root" "$view/unihub"
export UNIHUB_DOCS_PATH="$view" NO_MKDOCS_2_WARNING=1  # the latter: material's end-of-life banner on every build
cd "$root"
if [ "${1:-build}" = serve ]; then
  "$root/.venv/bin/mkdocs" serve --config-file "$root/mkdocs.yml" "${@:2}"
else
  "$root/.venv/bin/mkdocs" build --strict --quiet --config-file "$root/mkdocs.yml" --site-dir "$view/site" "$@"
  # a Sphinx role left as literal text (docs/sphinx_roles.py renders them as code) is a rendering bug
  if grep -rlE ':(mod|class|func|meth|attr|exc|data|obj):(<code>|`)' "$view/site" --include='*.html' | head -5 | grep .; then
    echo "docs: Sphinx roles shown as literal text in the pages above" >&2
    exit 1
  fi
  echo "docs: built with no warnings"
fi
