#!/usr/bin/env bash
# Install poprun-py (into .venv) and run the main job.
# For now the main job is the guide's validation command.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
set -x
.venv/bin/poprun --num-instances 2 --num-replicas 2 --offline-mode=1 echo "Hello world!"
