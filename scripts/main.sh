#!/usr/bin/env bash
# Install poprun-py (into .venv) and run the main job: data-parallel training of a small NumPy network
# (examples/train.py) on 2 instances x 2 local replicas, on IPUs of a partition that poprun allocates from
# the embedded simulated V-IPU service (not offline mode); -v and --print-topology=yes show the partition
# and the topology. The guide's validation command runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Install (editable) unless this checkout is already installed there with this pyproject.toml: the stamp
# file names the pyproject's hash, so a changed dependency list installs again. (Reinstalling every time
# would also swap the package's files under anything running from this venv, the README's test among them.)
stamp=".venv/.poprun-py-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ] || ! .venv/bin/python -c "import poprun_py, popdist, simipu" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
    touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"  # poprun, and the python3 its instances run
set -x
poprun --num-instances 2 --num-replicas 2 --offline-mode=1 echo "Hello world!"
poprun -v --print-topology=yes --num-instances 2 --num-replicas 4 python3 examples/train.py
