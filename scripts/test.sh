#!/usr/bin/env bash
# Set up, make sure Postgres is up, lint, and run every test:
#   1. the tests that run torch (marked `torch`: a trial child, or the trial side itself) on
#      Python 3.11 with the versions pinned in constraints.txt;
#   2. every other test (the controller: everything outside sweeper/trial, which never imports
#      torch) on Python 3.13, in an environment without torch, transformers or datasets, under
#      coverage: what it covers of sweeper, api and dashboards must reach pyproject's floor.
#      Steps 1 and 2 together run each test once (they ran the controller's tests twice, and
#      the suite took up to 33 minutes on 2 cores); mypy (step 4) checks the code for 3.11;
#   3. the tests that reach transformers' API (the engines, what each knob reads back, TRL's
#      packing, chat templates) with transformers at its floor (5.17.0, as CUDA images ship it);
#   4. mypy.
# Steps 3 and 4 run in the background beside the Postgres outage test and step 2 (their output
# follows step 2's).
# Extra arguments go to pytest and run step 1 only (for working on one test).
# Every step runs even when an earlier one fails; the failures are listed at the end, and the
# exit status is 1 if any step failed.
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

if [ $# -gt 0 ]; then
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  exec .venv/bin/python -m pytest "$@"
fi

failed=()
# step NAME COMMAND...: run it, and remember it if it fails
step() {
  local name=$1; shift
  if ! "$@"; then failed+=("$name"); echo "test: FAILED: $name" >&2; fi
}
# beside NAME COMMAND...: run it in the background, its output in a log printed by `joined`
# (steps 3 and 4 run beside step 2: the controller's tests mostly wait on servers, a browser
# and databases, so the three together take about as long as step 2 alone on 2 cores)
beside_names=(); beside_pids=(); beside_logs=()
beside() {
  local name=$1; shift
  local log
  log=$(mktemp "${TMPDIR:-/tmp}/sweeper-test-step.XXXXXX")
  "$@" >"$log" 2>&1 &
  beside_names+=("$name"); beside_pids+=("$!"); beside_logs+=("$log")
}
joined() {
  local i
  for i in "${!beside_pids[@]}"; do
    local status=0
    wait "${beside_pids[$i]}" || status=$?
    echo "test: ---- ${beside_names[$i]} (ran beside the outage test and step 2) ----"
    cat "${beside_logs[$i]}"; rm -f "${beside_logs[$i]}"
    if [ "$status" -ne 0 ]; then
      failed+=("${beside_names[$i]}"); echo "test: FAILED: ${beside_names[$i]}" >&2
    fi
  done
}
step "lint (ruff check)" .venv/bin/ruff check .
step "format (ruff format --check)" .venv/bin/ruff format --check .

# Two test processes (pytest-xdist; SWEEPER_TEST_PROCESSES to change): most tests wait on
# children, servers and databases, so two overlap well even on 2 cores. Tests marked
# `exclusive` (Postgres stopped mid-sweep) run alone afterwards.
processes=${SWEEPER_TEST_PROCESSES:-2}
echo "test: 1/4 the tests that run torch, Python $(.venv/bin/python -c 'import platform; print(platform.python_version())'), $processes processes"
# the slowest tests are listed at the end: the suite must stay well under 30 minutes on 2 cores
step "1/4 the tests that run torch" .venv/bin/python -m pytest -n "$processes" --dist worksteal \
  -m "torch and not exclusive" --durations=25 --durations-min=10
# 3. transformers at the floor of its range, over the pinned environment (PYTHONPATH comes
# first, and trial children inherit it). 5.17 needs a huggingface_hub below 2. Steps 3 and 4
# start before the Postgres outage test (neither reaches Postgres: the trial tests sweep on
# SQLite), whose 12 s outage and the sweep's retries leave the cores mostly idle, and go on
# beside step 2
floor=.floor/transformers-5.17.0
if [ ! -f "$floor/.installed" ]; then
  rm -rf "$floor"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$floor" transformers==5.17.0 huggingface_hub==1.33.0
  touch "$floor/.installed"
fi
echo "test: 3/4 the transformers-facing trial tests with transformers 5.17.0," \
  "beside the Postgres outage test and step 2"
beside "3/4 the transformers-facing trial tests with transformers 5.17.0" \
  env PYTHONPATH="$PWD/$floor" SWEEPER_EXPECT_TRANSFORMERS=5.17.0 .venv/bin/python -m pytest \
  -p no:cacheprovider -q -n "$processes" --dist worksteal tests/trial/test_engines.py \
  tests/trial/test_readback.py tests/trial/test_packing.py \
  "tests/trial/test_user_data.py::test_chat_records_train_replies_only_with_every_engine" \
  "tests/trial/test_user_data.py::test_users_model_directory_sweeps_with_its_own_tokenizer" \
  "tests/test_doctor.py::test_tiny_space_runs_here"

# 4. Types (issue 30). mypy reads pyproject's [tool.mypy]: sweeper, api and dashboards, 0 errors.
echo "test: 4/4 mypy, beside the Postgres outage test and step 2"
beside "4/4 types (mypy)" .venv/bin/mypy

echo "test: 1/4 the test that STOPS this machine's Postgres for 12 s (tests/test_faults.py), alone"
step "1/4 the Postgres outage test" .venv/bin/python -m pytest -p no:cacheprovider -m exclusive

# 2. Python 3.13 (or 3.12) for the controller. torch is left out on purpose: for these
# versions the registry's torch is the CUDA build (several GB).
controller_python=${CONTROLLER_PYTHON:-}
if [ -z "$controller_python" ]; then
  for candidate in python3.13 python3.12 \
      "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python3.13 \
      "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    # a pyenv shim exists for every installed version but fails unless that one is selected
    if "$candidate" -c 'import sys; assert sys.version_info[:2] in ((3, 12), (3, 13))' \
        >/dev/null 2>&1; then
      controller_python=$candidate; break
    fi
  done
fi
if [ -z "$controller_python" ]; then
  echo "error: no Python 3.13 or 3.12 for the controller tests; install one (pyenv install" >&2
  echo "       3.13) or set CONTROLLER_PYTHON=/path/to/python3.13" >&2
  exit 2
fi
venv=.venv-controller
stamp=$venv/.sweeper-installed
want=$( (cat pyproject.toml constraints.txt; "$controller_python" --version) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "test: creating $venv with $("$controller_python" --version) (no torch)"
  rm -rf "$venv"
  "$controller_python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
  .venv/bin/python scripts/requirements.py --extra dev \
    --without torch transformers datasets tokenizers accelerate trl peft deepspeed > "$venv/requirements.txt"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt \
    -r "$venv/requirements.txt"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e . >/dev/null
  echo "$want" > "$stamp"
fi

echo "test: 2/4 the controller without torch, $("$venv/bin/python" --version)"
# coverage is collected here (the controller's tests, the API and the browser's included; trial
# children are not traced) and checked by coverage itself: pytest-cov's own fail-under once
# printed FAIL and still exited 0 under xdist
rm -f .coverage .coverage.*
step "2/4 the controller on $("$venv/bin/python" --version)" \
  "$venv/bin/python" -m pytest -p no:cacheprovider -q -n "$processes" --dist worksteal \
  -m "not torch and not exclusive" --ignore=sweeper/trial --ignore=tests/trial \
  --cov --cov-report=
step "2/4 the controller's coverage floor (pyproject's fail_under)" \
  "$venv/bin/python" -m coverage report --skip-covered --sort=cover

joined

if [ ${#failed[@]} -gt 0 ]; then
  echo "test: ${#failed[@]} step(s) failed:" >&2
  printf '  - %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test: every step passed"
