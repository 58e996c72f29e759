#!/usr/bin/env bash
# Install everything the tests need (into .venv) and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,torch]'
# Two workers: the machine has two cores; every test bounds its own time.
exec .venv/bin/python -m pytest -n 2 "$@"
