#!/usr/bin/env bash
# Create .venv and install sweeper with the pinned versions in constraints.txt.
# Idempotent: a second run only checks a stamp. Needs Python 3.11 and a package registry.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin=${PYTHON:-}
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin=$candidate; break; fi
  done
fi
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "error: sweeper needs Python 3.11 ($python_bin is $("$python_bin" --version 2>&1))." >&2
  echo "       Set PYTHON=/path/to/python3.11 and run again." >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python_bin" --version)"
  "$python_bin" -m venv .venv
fi

stamp=.venv/.sweeper-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing pinned dependencies (torch 2.13.0 and friends; ~1-2 min the first time)"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
  # torch is named explicitly so that no range can ever pull a newer (CUDA) build.
  # deepspeed (dev extra: the ZeRO tests) is an sdist: DS_BUILD_OPS=0 builds no kernels now
  # (it JIT-builds what it needs; ZeRO on the CPU with gloo needs none): 14-38 s more,
  # measured without a pip cache on a 2-core machine at load 10-11 (its wheels, hjson, ninja).
  DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -c constraints.txt "torch==2.13.0" -e ".[dev]"
  echo "$want" > "$stamp"
fi
