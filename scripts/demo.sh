#!/usr/bin/env bash
# Set up, run the CPU demo sweep on SQLite (sweeper.db), then serve the dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/sweeper launch --space spaces/cpu-demo.yaml "$@"
exec .venv/bin/sweeper serve
