#!/usr/bin/env bash
# Set up, run the CPU demo sweep on SQLite (sweeper.db), then serve the dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/sweeper launch --space spaces/cpu-demo.yaml "$@"
echo "open http://127.0.0.1:8000/ (Ctrl-C stops the server)"
exec .venv/bin/sweeper serve
