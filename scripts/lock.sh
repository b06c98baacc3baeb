#!/usr/bin/env bash
# Write requirements.lock: the exact versions `make setup` installs, resolved from
# pyproject.toml's ranges (runtime and dev extras) in a throwaway virtualenv.
# Run it (`make lock`) after changing a dependency, run `make test`, commit both files.
set -euo pipefail
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip
"$tmp/venv/bin/pip" install -q -e ".[dev]"
{
  echo "# Exact versions make setup installs (written by scripts/lock.sh from pyproject.toml)."
  echo "# Python $("$tmp/venv/bin/python" -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')"
  # --all: setuptools too (mypyc builds with it; make compiled); not pip itself.
  "$tmp/venv/bin/pip" freeze --all --exclude-editable | grep -v "^pip==" | LC_ALL=C sort -f
} > requirements.lock
echo "lock: wrote requirements.lock ($(grep -vc '^#' requirements.lock) packages)"
