#!/usr/bin/env bash
# Set up, run the CPU demo sweep on SQLite (sweeper.db), then serve the dashboard.
#   bash scripts/demo.sh [--port 8000] [--fresh] [other `sweeper launch` options]
# A second run serves what sweeper.db holds (it runs only trials the demo still lacks);
# --fresh moves the old sweeper.db aside (sweeper.db.bak) and sweeps again.
set -euo pipefail
cd "$(dirname "$0")/.."
port=8000
fresh=0
launch_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --port=*) port=${1#--port=}; shift ;;
    --fresh) fresh=1; shift ;;
    *) launch_args+=("$1"); shift ;;
  esac
done
bash scripts/setup.sh
# the port is checked before the sweep, not after it
.venv/bin/sweeper serve --port "$port" --check
if [ "$fresh" = 1 ] && [ -e sweeper.db ]; then
  for f in sweeper.db sweeper.db-wal sweeper.db-shm; do
    if [ -e "$f" ]; then mv "$f" "$f.bak"; fi
  done
  echo "moved the earlier sweeper.db to sweeper.db.bak"
fi
.venv/bin/sweeper launch --space spaces/cpu-demo.yaml --fill ${launch_args[@]+"${launch_args[@]}"}
exec .venv/bin/sweeper serve --port "$port"
