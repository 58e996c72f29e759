#!/usr/bin/env bash
# Install everything the tests need (into .venv, and the Debian packages for the
# real sshd and Slurm the tests start when run as root) and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

install_system_packages() {
    # The multi-host tests run a real OpenSSH server and a real single-node Slurm.
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

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    install_system_packages
else
    echo "not root: the SSH and Slurm tests run only if openssh-server, slurm-wlm and munge are installed" >&2
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,torch]'
# Two workers: the machine has two cores; every test bounds its own time.
exec .venv/bin/python -m pytest -n 2 "$@"
