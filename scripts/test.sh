#!/usr/bin/env bash
# Set up, make sure Postgres is up, lint, and run every test. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

# The browser tests drive Debian's chromium; Playwright never downloads a browser of its own.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "test: installing Debian's chromium for the browser tests (~35 s)"
  as_root=()
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then as_root=(sudo); fi
  # env, not a prefix assignment: sudo would drop DEBIAN_FRONTEND from the environment.
  if ! { "${as_root[@]}" apt-get update \
      && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }; then
    echo "error: chromium is missing and could not be installed. As root, run:" >&2
    echo "       apt-get update && apt-get install -y chromium" >&2
    echo "       (do not run 'playwright install'; the tests use /usr/bin/chromium)" >&2
    exit 2
  fi
fi

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
