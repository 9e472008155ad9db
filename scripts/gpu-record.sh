#!/usr/bin/env bash
# Record sweeper on a GPU machine, in one output folder:
#   install sweeper from a wheelhouse without touching the machine's torch (DeepSpeed and the
#   levers' liger-kernel and torchao too), `sweeper doctor`, the GPU-marked tests (the levers'
#   tests/trial/test_levers_gpu.py first), a sweep of spaces/h100.yaml (seed 000's baseline, seed
#   000's and seed 001's configs, TrainingArguments defaults, the same with each lever of issue 36
#   alone, then the search) within a time budget, its export, fidelity (a trial against a run 10x
#   longer) for the recommended config and seed 001's, and a summary for bench/RESULTS.md: the
#   study's tables, each knob's verdict, and the recommended config's real-token MFU against the
#   40% goal.
#
#   bash scripts/gpu-record.sh run   [--wheelhouse .whl] [--out gpu-record] [--minutes 24]
#   bash scripts/gpu-record.sh start [same options]   # `run` in the background (setsid)
#   bash scripts/gpu-record.sh wait  [--out gpu-record] [--seconds 540]   # packs $OUT/gpu-record.tgz
#   bash scripts/gpu-record.sh install [--wheelhouse .whl] [--out gpu-record]  # the first stage
#     alone, for another bench on the machine (bench/spaces/script-parity-gpu.yaml says which)
#
# Other options (defaults: the H100 record): --space FILE --study NAME --fidelity-configs LIST
# (bench/trial_quality.py --configs; "none" skips the stage), --gpu KEY (the space as recorded
# on that catalog GPU, its name and price, under --study: spaces/h100.yaml's levers on an H200
# with --gpu h200-sxm --study h200-levers), --skip-tests, --levers-tests-only
# (of the GPU tests, only tests/trial/test_levers_gpu.py), --doctor-plain (doctor
# without the space: the space's compile probes, max-autotune's ~6 min compile on an H100, are then
# paid only by a trial that samples them), --skip-doctor (no doctor stage: the sweep's own
# preflight still probes what the space asks; 41-169 s saved on the H200 of 2026-11-27). tests/test_packaging.py runs it end to end on a CPU with
# a tiny space, so the GPU session finds it working.
#
# `run` is the one command on your own GPU box. `start` + `wait` are for a remote runner whose
# commands may last only minutes: `wait` returns when the run ends (exit 0, or 1 if it failed)
# or after --seconds (exit 3: call it again); where $OUT is set it packs the folder as it is
# into $OUT/gpu-record.tgz either way (a lease may end first) and copies summary.md there.
#
# Prepare the wheelhouse where a registry is reachable (the target's Python version; carry only
# what the GPU image lacks):
#   bash scripts/wheelhouse.sh --python 3.12 --tests --out .whl --skip-file scripts/gpu-image-packages.txt
#
# --minutes is the whole run's budget; the GPU tests get at most a sixth of it each for the
# levers' file and the rest (5 min at least), the sweep what is left after the earlier stages,
# less the fidelity runs' share. PYTHON picks the interpreter that has torch (default python3).
# For the levers in a 30-minute lease (the other GPU tests passed in earlier leases):
#   start --minutes 22 --doctor-plain --levers-tests-only --fidelity-configs none
# For a 15-minute lease (a machine start and the transfers take about 30 s of it), in one call:
#   start --minutes 9 --skip-doctor --skip-tests --fidelity-configs none; then wait --seconds 560
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
levers_tests_only=0
doctor_plain=0
skip_doctor=0
gpu=
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) wheelhouse=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --seconds) wait_seconds=$2; shift 2 ;;
    --space) space=$2; shift 2 ;;
    --study) study=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --fidelity-configs) fidelity_configs=$2; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --levers-tests-only) levers_tests_only=1; shift ;;
    --doctor-plain) doctor_plain=1; shift ;;
    --skip-doctor) skip_doctor=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see bash $0 --help)" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-python3}
extras=test,trainer,sft,lora,deepspeed

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
    --report "$out/pip-report.json" "sweeper[$extras]" >> "$out/install.log" 2>&1
  "$py" - "$out/pip-report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
names = sorted(item["metadata"]["name"].lower() for item in report["install"])
print("pip would install:", ", ".join(names))
if any(n == "torch" or n.startswith("nvidia-") or n == "triton" for n in names):
    sys.exit("error: pip would install torch or its CUDA libraries; stopping")
EOF
  "$py" -m pip install --quiet --no-index --find-links "$wheelhouse" "sweeper[$extras]" \
    >> "$out/install.log" 2>&1
  # bitsandbytes (4-bit/8-bit quantization), liger-kernel and torchao (the levers) when the
  # wheelhouse carries them, without dependencies: they need torch (and triton, which a CUDA
  # torch brings), numpy and packaging, which the image has. What imports is logged: preflight
  # drops a lever whose package does not, saying why.
  local wheel module
  for wheel in "$wheelhouse"/bitsandbytes-*.whl "$wheelhouse"/liger_kernel-*.whl \
    "$wheelhouse"/torchao-*.whl; do
    [ -e "$wheel" ] || continue
    "$py" -m pip install --quiet --no-index --no-deps "$wheel" >> "$out/install.log" 2>&1
    module=$(basename "$wheel" | cut -d- -f1)
    [ "$module" = liger_kernel ] && module=liger_kernel.transformers
    log "install: $module $("$py" -c "import importlib.metadata as m, $module; print(m.version('$(basename "$wheel" | cut -d- -f1)'), 'imports')" 2>&1 | tail -n 1)"
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
  [ "$skip_doctor" = 1 ] && { log "doctor: skipped (--skip-doctor)"; return 0; }
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
  # each pytest gets a sixth of the budget, 5 min at least: a hung test must not eat the sweep's
  local cap=$(( minutes * 10 > 300 ? minutes * 10 : 300 )) status=0
  log "tests: pytest -m gpu tests/trial/test_levers_gpu.py (at most $cap s)"
  timeout "$cap" "$py" -m pytest -m gpu -p no:cacheprovider -q -rA tests/trial/test_levers_gpu.py \
    > "$out/gpu-levers-tests.log" 2>&1 || status=$?
  [ "$status" = 124 ] && log "tests: levers stopped at $cap s"
  log "tests: levers exit $status; $(tail -n 1 "$out/gpu-levers-tests.log")"
  [ "$levers_tests_only" = 1 ] && { log "tests: the rest skipped (--levers-tests-only)"; return 0; }
  log "tests: pytest -m gpu, the rest (at most $cap s)"
  status=0
  # sweeper[test] has no browser or optuna-dashboard (dev tools): those modules hold no GPU test
  timeout "$cap" "$py" -m pytest -m gpu -p no:cacheprovider -q -rA tests --ignore=tests/browser \
    --ignore=tests/test_optuna_dashboard.py --ignore=tests/test_api_fuzz.py \
    --ignore=tests/trial/test_levers_gpu.py > "$out/gpu-tests.log" 2>&1 || status=$?
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
  # each knob's verdict at the recommendation, and its MFU on real tokens against the goal
  "$py" - "sqlite:///$out/study.db" "$study" "$out/$study.json" >> "$out/summary.md" <<'EOF'
import sys
from pathlib import Path
from sweeper.errors import SweeperError
from sweeper.store import Store
from sweeper.studyfile import model_shape, read_study_file, real_token_mfu
from sweeper.verdict import markdown_table, study_knob_effects

GOAL = 0.40  # issue 36: >= 40% MFU on the ~1.1B Llama, counting real tokens (P5)
url, study, path = sys.argv[1:]
store = Store(url)
try:
    effects = study_knob_effects(store, study)
except SweeperError as e:  # no completed trial: the tables above say why
    sys.exit(print(f"\nNo verdicts: {e}"))
finally:
    store.dispose()
print(f"\n### Each knob's verdict at the recommendation (trial #{effects.winner})\n")
print(markdown_table(effects))
document = read_study_file(Path(path))
trial = next(t for t in document.trials if t["number"] == effects.winner)
mfu = real_token_mfu(trial["measurement"], model_shape(document.study["space_yaml"]))
if mfu is None:
    print(f"\nRecommended config (trial #{effects.winner}): no MFU (no peak for this device)")
else:
    met = "met" if mfu.mfu >= GOAL else "not met"
    print(
        f"\nRecommended config (trial #{effects.winner}): MFU on real tokens {mfu.label} "
        f"against the {GOAL:.0%} goal: **{met}**"
    )
EOF
  log "summary: $out/summary.md"
}

run_all() {
  mkdir -p "$out"
  : > "$out/log.txt"
  local started=$SECONDS
  log "run: budget $minutes min, wheelhouse $wheelhouse, python $("$py" --version 2>&1)"
  stage_install
  if [ -n "$gpu" ]; then  # the space as recorded on that GPU (its name and price): sweeper's
    # catalog and PyYAML are there once installed
    "$py" scripts/rehearse_space.py "$space" --gpu-twin "$gpu" "$study" "$out/space.yaml" \
      | tee -a "$out/log.txt"
    space=$out/space.yaml
  fi
  stage_doctor
  stage_tests
  # in seconds, less 20 s for the export and the summary; the fidelity stage takes two trials
  # and two 10x runs: about a quarter of what is left. At least 3 minutes.
  local left_s=$(( minutes * 60 - (SECONDS - started) - 20 ))
  [ "$fidelity_configs" = none ] || left_s=$(( left_s * 3 / 4 ))
  [ "$left_s" -ge 180 ] || left_s=180
  stage_sweep "$(awk -v s="$left_s" 'BEGIN { printf "%.1f", s / 60 }')"
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
  install)
    mkdir -p "$out"
    : > "$out/log.txt"
    stage_install
    ;;
  start)
    mkdir -p "$out"
    rm -f "$out/status"
    setsid nohup bash "$0" run --wheelhouse "$wheelhouse" --out "$out" --minutes "$minutes" \
      --space "$space" --study "$study" --fidelity-configs "$fidelity_configs" \
      $( [ -n "$gpu" ] && echo --gpu "$gpu" ) \
      $( [ "$skip_tests" = 1 ] && echo --skip-tests ) $( [ "$doctor_plain" = 1 ] && echo --doctor-plain ) \
      $( [ "$skip_doctor" = 1 ] && echo --skip-doctor ) \
      $( [ "$levers_tests_only" = 1 ] && echo --levers-tests-only ) \
      > "$out/run.out" 2>&1 < /dev/null &
    echo "started in the background (pid $!); follow with: bash $0 wait --out $out"
    ;;
  wait)
    deadline=$(( SECONDS + wait_seconds ))
    while [ ! -s "$out/status" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
    tail -n 5 "$out/log.txt" 2>/dev/null || true
    # what is there so far comes back either way: a lease can end before the run does (the
    # sweep's study.db then holds every trial told so far; its -wal/-shm are left out, so a
    # trial in flight is not in the copy)
    if [ -n "${OUT:-}" ]; then
      tar czf "$OUT/gpu-record.tgz" --exclude='*.db-*' -C "$out" .
      cp "$out/summary.md" "$OUT/" 2>/dev/null || true
    fi
    if [ ! -s "$out/status" ]; then echo "still running: call wait again"; exit 3; fi
    [ "$(cat "$out/status")" = done ]
    ;;
  *)
    echo "error: give a command: run, start, wait or install (bash $0 --help says more)" >&2
    exit 2
    ;;
esac
