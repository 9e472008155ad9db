#!/usr/bin/env bash
# Set up, make sure Postgres is up, lint, and run every test. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "test: starting Postgres"
  version=$(ls /etc/postgresql 2>/dev/null | sort -n | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "${version:-15}" main start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
