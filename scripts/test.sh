#!/usr/bin/env bash
# Install everything the tests need and run them: mypy and ruff, the whole suite on the main Python (3.11),
# then a fast subset on each other supported Python (3.10, 3.12, 3.13) that pyenv has, each in its own venv.
#
# Usage: bash scripts/test.sh                      everything (what CI runs)
#        bash scripts/test.sh --main-python-only   the whole suite on the main Python only
#        bash scripts/test.sh [pytest args]        mypy, ruff, then pytest with these arguments, on the main Python only
#
# As root on Debian/Ubuntu it apt-installs what the multi-host tests start: openssh-server (a real sshd),
# slurm-wlm and munge (a real single-node Slurm) and iproute2 (network namespaces). PYTHON=... picks the
# main interpreter; by default pyenv's 3.11 if there is one, else python3, so which Python runs the whole
# suite does not depend on the shell's PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

MAIN_VERSION=3.11
OTHER_VERSIONS=(3.10 3.12 3.13)
# The subset the other versions run: the command line, the launch, output, failures, PopDist, the fabric's
# collectives, the V-IPU service, launch() and the pytest plugin, the wheel; about a minute each on 2 cores.
SUBSET=(
    tests/test_cli.py tests/test_launch.py tests/test_output.py tests/test_failures.py
    tests/test_popdist_core.py tests/test_popdist_env.py tests/test_data.py tests/test_options.py
    tests/test_collectives.py tests/test_vipu_service.py tests/test_devices.py
    tests/test_launch_functions.py tests/test_pytest_plugin.py tests/test_wheel.py
)
TORCH=torch==2.13.0
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
PIP_QUIET=(--quiet --disable-pip-version-check)

install_system_packages() {
    local missing=()
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v srun >/dev/null || missing+=(slurm-wlm)
    [ -x /usr/sbin/munged ] || missing+=(munge)
    command -v ip >/dev/null || missing+=(iproute2)  # hosts in network namespaces (tests/infra/netns.py)
    [ ${#missing[@]} -eq 0 ] && return
    echo "installing ${missing[*]} (apt-get)" >&2
    local policy=/usr/sbin/policy-rc.d placed=""
    if [ ! -e "$policy" ]; then  # the tests start their own daemons: keep the packages from starting theirs
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && placed=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    [ -z "$placed" ] || rm -f "$policy"
}

python_for() {  # the interpreter of version $1: pyenv's newest $1.x, else python$1 on PATH; nothing if neither
    local root candidate found=""
    root=${PYENV_ROOT:-$HOME/.pyenv}
    for candidate in "$root"/versions/"$1".*/bin/python"$1"; do
        [ -x "$candidate" ] && found=$candidate  # the glob sorts, so the last is the newest patch release
    done
    [ -n "$found" ] || found=$(command -v "python$1" || true)
    echo "$found"
}

make_venv() {  # $1 = interpreter, $2 = venv directory, $3 = extras: the venv with poprun-py (editable)
    local version='import sys; print(*sys.version_info[:2], sep=".")'
    if [ ! -x "$2/bin/python" ]; then
        "$1" -m venv "$2"
    elif [ "$("$2/bin/python" -c "$version")" != "$("$1" -c "$version")" ]; then
        echo "$2 was made with another Python: making it again with $1" >&2
        "$1" -m venv --clear "$2"
    fi
    "$2/bin/python" -m pip install "${PIP_QUIET[@]}" -e ".[$3]"
    # scripts/main.sh skips its install when this stamp (the pyproject's hash) is there
    touch "$2/.poprun-py-$(sha256sum pyproject.toml | cut -c1-16)"
}

install_torch() {  # $1 = a venv's python. torch's CPU build, and never PyPI's default Linux wheel of torch:
    # that one depends on several GB of CUDA packages. In order:
    #  1. already installed: nothing to do;
    #  2. a wheel on this machine (pip's --find-links, e.g. a wheelhouse; --no-index reads nothing else),
    #     kept only if it is a +cpu build; then its few small dependencies from the usual index;
    #  3. the CPU wheel index, which also serves torch's dependencies;
    #  4. otherwise a warning: the torch test is skipped with its reason and everything else runs.
    # (On the project's CI machine step 2 finds a 2.13.0+cpu wheel and download.pytorch.org is unreachable.)
    local py=$1 version
    if "$py" -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
        return 0
    fi
    if "$py" -m pip install "${PIP_QUIET[@]}" --no-index --no-deps "$TORCH" 2>/dev/null; then
        version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))')
        if [[ "$version" == *+cpu ]] && "$py" -m pip install "${PIP_QUIET[@]}" "$TORCH"; then
            return 0
        fi
        "$py" -m pip uninstall "${PIP_QUIET[@]}" -y torch
    fi
    if "$py" -m pip install "${PIP_QUIET[@]}" --index-url "$TORCH_CPU_INDEX" "$TORCH" 2>/dev/null; then
        return 0
    fi
    echo "torch 2.13.0 (CPU) could not be installed: its test will be skipped" >&2
}

main_only=""
if [ "${1:-}" = --main-python-only ]; then
    main_only=1
    shift
fi
[ $# -eq 0 ] || main_only=1  # pytest arguments: a focused run, on the main Python only

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    install_system_packages
else
    echo "not root: the SSH and Slurm tests run only if openssh-server, slurm-wlm, munge and iproute2 are installed" >&2
fi

PYTHON=${PYTHON:-$(python_for "$MAIN_VERSION")}
PYTHON=${PYTHON:-python3}
make_venv "$PYTHON" .venv test,bench  # bench: matplotlib, for the test that draws the benchmarks' pictures
install_torch .venv/bin/python
status=0
# The static checks first, a few seconds: types on src/ and lint everywhere (pyproject.toml configures both).
# A failure fails the run, but the tests still run, so one report shows everything.
.venv/bin/python -m mypy || { status=$?; echo "mypy found errors (above)" >&2; }
.venv/bin/python -m ruff check src tests benchmarks examples scripts || { status=$?; echo "ruff found errors (above)" >&2; }
# Two workers: the machine has two cores; every test bounds its own time.
.venv/bin/python -m pytest -n 2 "$@" || { code=$?; [ "$status" != 0 ] || status=$code; }
[ -z "$main_only" ] || exit "$status"

for version in "${OTHER_VERSIONS[@]}"; do
    interpreter=$(python_for "$version")
    if [ -z "$interpreter" ]; then
        echo "Python $version not found (pyenv or python$version): its subset is skipped" >&2
        continue
    fi
    echo "== Python $version ($interpreter): the fast subset, in .venv-$version" >&2
    make_venv "$interpreter" ".venv-$version" test
    ".venv-$version/bin/python" -m pytest -n 2 -q "${SUBSET[@]}" || { code=$?; [ "$status" != 0 ] || status=$code; }
done
exit "$status"
