#!/usr/bin/env bash
# Record sweeper on a GPU machine, in one output folder:
#   install sweeper from a wheelhouse without touching the machine's torch, `sweeper doctor`,
#   the GPU-marked tests, a sweep of spaces/h100.yaml (seed 000's baseline, seed 000's and seed
#   001's configs, TrainingArguments defaults, then the search) within a time budget, its export,
#   fidelity (a trial against a run 10x longer) for the recommended config and seed 001's, and
#   a summary for bench/RESULTS.md.
#
#   bash scripts/gpu-record.sh run   [--wheelhouse .whl] [--out gpu-record] [--minutes 24]
#   bash scripts/gpu-record.sh start [same options]   # `run` in the background (setsid)
#   bash scripts/gpu-record.sh wait  [--out gpu-record] [--seconds 540]
#
# Other options (defaults: the H100 record): --space FILE --study NAME --fidelity-configs LIST
# (bench/trial_quality.py --configs; "none" skips the stage), --skip-tests, --doctor-plain (doctor
# without the space: the space's compile probes, max-autotune's ~6 min compile on an H100, are then
# paid only by a trial that samples them). tests/test_packaging.py runs it end to end on a CPU with
# a tiny space, so the GPU session finds it working.
#
# `run` is the one command on your own GPU box. `start` + `wait` are for a remote runner whose
# commands may last only minutes: `wait` returns when the run ends (exit 0, or 1 if it failed)
# or after --seconds (exit 3: call it again), and when the run has ended and $OUT is set, it
# packs the folder into $OUT/gpu-record.tgz and copies summary.md there.
#
# Prepare the wheelhouse where a registry is reachable (the target's Python version; carry only
# what the GPU image lacks):
#   bash scripts/wheelhouse.sh --python 3.12 --tests --out .whl --skip-file scripts/gpu-image-packages.txt
#
# --minutes is the whole run's budget; the sweep gets what is left after the earlier stages,
# less the fidelity runs' share. PYTHON picks the interpreter that has torch (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

# the comment block at the head of this file, without its "# "
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in -h|--help|help) usage; exit 0 ;; esac
wheelhouse=.whl
out=gpu-record
minutes=24
wait_seconds=540
space=spaces/h100.yaml
study=h100-llama-1b
fidelity_configs="best,also_try[1]"  # the recommendation and seed 001's "after"
skip_tests=0
doctor_plain=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) wheelhouse=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --seconds) wait_seconds=$2; shift 2 ;;
    --space) space=$2; shift 2 ;;
    --study) study=$2; shift 2 ;;
    --fidelity-configs) fidelity_configs=$2; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --doctor-plain) doctor_plain=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see bash $0 --help)" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-python3}

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/log.txt"; }

stage_install() {
  log "install: torch before: $("$py" -c 'import torch; print(torch.__version__)')"
  "$py" -c 'import torch, sys; print(torch.__version__, torch.__file__)' > "$out/torch-before.txt"
  if [ ! -d "$wheelhouse" ]; then
    echo "error: no wheelhouse at $wheelhouse; make one with scripts/wheelhouse.sh" >&2
    return 2
  fi
  # this checkout's wheel, built offline with the machine's setuptools when it has them
  "$py" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$wheelhouse" . \
    >> "$out/install.log" 2>&1 || log "install: could not rebuild sweeper's wheel; using $wheelhouse's"
  # a dry run first: stop if pip would install or replace torch
  "$py" -m pip install --dry-run --quiet --no-index --find-links "$wheelhouse" \
    --report "$out/pip-report.json" "sweeper[test,trainer,sft,lora]" >> "$out/install.log" 2>&1
  "$py" - "$out/pip-report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
names = sorted(item["metadata"]["name"].lower() for item in report["install"])
print("pip would install:", ", ".join(names))
if any(n == "torch" or n.startswith("nvidia-") or n == "triton" for n in names):
    sys.exit("error: pip would install torch or its CUDA libraries; stopping")
EOF
  "$py" -m pip install --quiet --no-index --find-links "$wheelhouse" "sweeper[test,trainer,sft,lora]" \
    >> "$out/install.log" 2>&1
  # bitsandbytes (4-bit/8-bit quantization) when the wheelhouse carries one: it needs only
  # torch, numpy and packaging, which the image has
  for bnb in "$wheelhouse"/bitsandbytes-*.whl; do
    [ -e "$bnb" ] || continue
    "$py" -m pip install --quiet --no-index --no-deps "$bnb" >> "$out/install.log" 2>&1
    log "install: $("$py" -c 'import bitsandbytes as b; print("bitsandbytes", b.__version__)' 2>&1 | tail -n 1)"
  done
  "$py" -c 'import torch, sys; print(torch.__version__, torch.__file__)' > "$out/torch-after.txt"
  if ! cmp -s "$out/torch-before.txt" "$out/torch-after.txt"; then
    log "install: ERROR torch changed: $(cat "$out/torch-before.txt") -> $(cat "$out/torch-after.txt")"
    return 1
  fi
  log "install: done; torch untouched ($(cat "$out/torch-after.txt"))"
  { nvidia-smi || true; "$py" -m pip list --format=freeze; } > "$out/machine.txt" 2>&1
}

stage_doctor() {
  log "doctor: $space"
  local status=0 args=(--space "$space")
  [ "$doctor_plain" = 1 ] && args=()
  "$py" -m sweeper.cli doctor "${args[@]}" --json > "$out/doctor.json" 2>> "$out/log.txt" \
    || status=$?
  log "doctor: exit $status (1 = the space asks for something this machine cannot do)"
  [ "$status" -le 1 ]
}

stage_tests() {
  [ "$skip_tests" = 1 ] && { log "tests: skipped (--skip-tests)"; return 0; }
  log "tests: pytest -m gpu"
  local status=0
  # sweeper[test] has no browser or optuna-dashboard (dev tools): those modules hold no GPU test
  "$py" -m pytest -m gpu -p no:cacheprovider -q -rA tests --ignore=tests/browser \
    --ignore=tests/test_optuna_dashboard.py --ignore=tests/test_api_fuzz.py > "$out/gpu-tests.log" 2>&1 || status=$?
  log "tests: exit $status; $(tail -n 1 "$out/gpu-tests.log")"
}

stage_sweep() {
  local left_min=$1
  log "sweep: $space for at most $left_min min"
  local status=0
  "$py" -m sweeper.cli launch --space "$space" --storage "sqlite:///$out/study.db" \
    --max-minutes "$left_min" > "$out/sweep.log" 2>&1 || status=$?
  log "sweep: exit $status"
  "$py" -m sweeper.cli study export --study "$study" --storage "sqlite:///$out/study.db" \
    --out "$out/$study.json" --force --overwrite >> "$out/log.txt" 2>&1
}

stage_fidelity() {
  [ "$fidelity_configs" = none ] && { log "fidelity: skipped (--fidelity-configs none)"; return 0; }
  log "fidelity: $fidelity_configs, each against a run 10x longer"
  local status=0
  "$py" bench/trial_quality.py --space "$space" --configs "$fidelity_configs" --repeats 0 \
    --storage "sqlite:///$out/study.db" --study "$study" > "$out/fidelity.md" \
    2> "$out/fidelity.log" || status=$?
  log "fidelity: exit $status"
}

stage_summary() {
  local args=("$out/$study.json")
  [ -s "$out/doctor.json" ] && args+=(--doctor "$out/doctor.json")
  [ -s "$out/fidelity.md" ] && args+=(--fidelity "$out/fidelity.md")
  "$py" bench/study_report.py "${args[@]}" > "$out/summary.md"
  log "summary: $out/summary.md"
}

run_all() {
  mkdir -p "$out"
  : > "$out/log.txt"
  local started=$SECONDS
  log "run: budget $minutes min, wheelhouse $wheelhouse, python $("$py" --version 2>&1)"
  stage_install
  stage_doctor
  stage_tests
  # the fidelity stage takes two trials and two 10x runs: about a quarter of what is left
  local used=$(( (SECONDS - started) / 60 ))
  local left=$(( minutes - used ))
  local sweep=$left
  [ "$fidelity_configs" = none ] || sweep=$(( left * 3 / 4 ))
  [ "$sweep" -ge 3 ] || sweep=3
  stage_sweep "$sweep"
  stage_fidelity
  stage_summary
  log "run: done in $(( (SECONDS - started) / 60 )) min"
  echo done > "$out/status"
}

case "$command" in
  run)
    mkdir -p "$out"
    rm -f "$out/status"
    # errexit stops at the first failed stage; the trap tells `wait` it failed
    trap 'echo failed > "$out/status"' EXIT
    run_all
    trap - EXIT
    ;;
  start)
    mkdir -p "$out"
    rm -f "$out/status"
    setsid nohup bash "$0" run --wheelhouse "$wheelhouse" --out "$out" --minutes "$minutes" \
      --space "$space" --study "$study" --fidelity-configs "$fidelity_configs" \
      $( [ "$skip_tests" = 1 ] && echo --skip-tests ) $( [ "$doctor_plain" = 1 ] && echo --doctor-plain ) \
      > "$out/run.out" 2>&1 < /dev/null &
    echo "started in the background (pid $!); follow with: bash $0 wait --out $out"
    ;;
  wait)
    deadline=$(( SECONDS + wait_seconds ))
    while [ ! -s "$out/status" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
    tail -n 5 "$out/log.txt" 2>/dev/null || true
    if [ ! -s "$out/status" ]; then echo "still running: call wait again"; exit 3; fi
    if [ -n "${OUT:-}" ]; then
      tar czf "$OUT/gpu-record.tgz" --exclude='*.db-*' -C "$out" .
      cp "$out/summary.md" "$OUT/" 2>/dev/null || true
    fi
    [ "$(cat "$out/status")" = done ]
    ;;
  *)
    echo "error: give a command: run, start or wait (bash $0 --help says more)" >&2
    exit 2
    ;;
esac
