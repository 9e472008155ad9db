#!/usr/bin/env bash
# Download every wheel sweeper needs except torch, for a machine with no package registry.
#
#   scripts/wheelhouse.sh [--python 3.12] [--arch x86_64] [--out wheelhouse] [--tests]
#                         [--skip-file FILE]
#
#   --python X.Y    the target's Python (3.11, 3.12 or 3.13; default: this machine's python3)
#   --arch A        x86_64 (default) or aarch64; wheels are manylinux
#   --out DIR       where the wheels go (default: wheelhouse/); existing wheels are kept
#   --tests         also the test tools, the engines' extras (pytest, httpx, hypothesis, trl,
#                   peft), DeepSpeed (a wheel built here from its sdist with DS_BUILD_OPS=0: no
#                   kernels, pure Python) and the CUDA levers (liger-kernel, torchao): what
#                   scripts/gpu-record.sh installs
#   --skip-file F   leave out packages the target already has (one name per line, '#' comments);
#                   pip then uses the target's own copy, so each must be in sweeper's ranges
#
# Then, on the machine without a registry, in the environment that has torch:
#
#   pip install --no-index --find-links wheelhouse sweeper
#
# torch and the packages only torch needs (nvidia-*, triton, sympy, networkx) are never
# downloaded: the target's torch is used as it is, and pip never replaces it while it is in
# sweeper's range (torch>=2.11). sweeper's own wheel is built from this checkout. The levers'
# wheels (sweeper[levers]) are installed there with --no-deps, as bitsandbytes is: liger-kernel
# requires triton, which a CUDA torch brings and a CPU torch lacks.
set -euo pipefail
cd "$(dirname "$0")/.."

# the comment block at the head of this file, without its "# "
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
target_python=""
arch=x86_64
out=wheelhouse
extras=()
skip_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) target_python=${2:?--python needs a version, e.g. 3.12}; shift 2 ;;
    --arch) arch=${2:?--arch needs x86_64 or aarch64}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --tests)
      extras=(--extra test --extra trainer --extra sft --extra lora --extra deepspeed --extra levers)
      shift ;;
    --skip-file) skip_file=${2:?--skip-file needs a file}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see $0 --help)" >&2; exit 2 ;;
  esac
done

# The pip that downloads: the project's venv if there is one, else python3 (any version: the
# target's version and platform are given to pip explicitly).
host_python=python3
[ -x .venv/bin/python ] && host_python=.venv/bin/python
[ -n "$target_python" ] || target_python=$("$host_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$target_python" in
  3.11|3.12|3.13) ;;
  *) echo "error: --python $target_python: sweeper supports Python 3.11, 3.12 and 3.13" >&2; exit 2 ;;
esac
case "$arch" in
  x86_64|aarch64) ;;
  *) echo "error: --arch $arch: use x86_64 or aarch64" >&2; exit 2 ;;
esac
if [ -n "$skip_file" ] && [ ! -r "$skip_file" ]; then
  echo "error: --skip-file $skip_file cannot be read" >&2; exit 2
fi
abi="cp${target_python/./}"

# pip matches platform tags exactly: name every manylinux glibc level a wheel may carry.
platforms=(--platform "manylinux2014_$arch")
for minor in $(seq 17 39); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
[ "$arch" = x86_64 ] && platforms+=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64)

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# accelerate (the trainer engine), trl (sft), peft (adapters), liger-kernel and torchao (the
# levers) require torch, directly or through accelerate, or nothing: they are fetched without
# their dependencies (the rest of them are sweeper's too, or the GPU image's), and pip resolves
# them against the user's torch there. deepspeed is an sdist: built below.
no_deps='accelerate|trl|peft|liger-kernel|torchao'
"$host_python" scripts/requirements.py "${extras[@]}" \
  --without torch accelerate trl peft liger-kernel torchao deepspeed > "$work/requirements.txt"
"$host_python" scripts/requirements.py "${extras[@]}" | grep -i -E "^($no_deps)\b" \
  > "$work/no-deps.txt" || true
"$host_python" scripts/requirements.py "${extras[@]}" | grep -i -E '^deepspeed\b' \
  > "$work/deepspeed.txt" || true
grep -v -i '^torch==' constraints.txt > "$work/constraints.txt"

echo "wheelhouse: sweeper's wheel from this checkout"
"$host_python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$out" . >/dev/null

echo "wheelhouse: dependencies for CPython $target_python on manylinux $arch (no torch)"
"$host_python" -m pip download --quiet --disable-pip-version-check \
  --only-binary=:all: --implementation cp --python-version "$target_python" --abi "$abi" \
  "${platforms[@]}" -c "$work/constraints.txt" -r "$work/requirements.txt" -d "$out"

if [ -s "$work/no-deps.txt" ]; then
  "$host_python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --implementation cp --python-version "$target_python" --abi "$abi" \
    "${platforms[@]}" -c "$work/constraints.txt" -r "$work/no-deps.txt" -d "$out"
fi

# DeepSpeed ships only an sdist: its wheel is built here, with DS_BUILD_OPS=0 (no CUDA kernels
# compiled: ZeRO-2/3 need none; its setup does not need torch), so it is pure Python and fits any
# target. Its requirements but torch are downloaded like the rest.
if [ -s "$work/deepspeed.txt" ]; then
  echo "wheelhouse: deepspeed's wheel from its sdist (DS_BUILD_OPS=0)"
  DS_BUILD_OPS=0 "$host_python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --no-binary deepspeed -c "$work/constraints.txt" -r "$work/deepspeed.txt" -w "$work/deepspeed" \
    >/dev/null
  deepspeed_wheel=$(ls "$work"/deepspeed/deepspeed-*-py3-none-any.whl)
  cp "$deepspeed_wheel" "$out/"
  "$host_python" - "$deepspeed_wheel" > "$work/deepspeed-deps.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" not in requirement and not requirement.lower().startswith("torch"):
        print(requirement.split(";")[0].strip())
EOF
  "$host_python" -m pip download --quiet --disable-pip-version-check \
    --only-binary=:all: --implementation cp --python-version "$target_python" --abi "$abi" \
    "${platforms[@]}" -c "$work/constraints.txt" -r "$work/deepspeed-deps.txt" -d "$out"
fi

# a dependency must never bring torch or its CUDA libraries along
if ls "$out" | grep -E -i '^(torch|nvidia_|triton)-' >/dev/null; then
  echo "error: a dependency pulled torch or its CUDA libraries into $out:" >&2
  ls "$out" | grep -E -i '^(torch|nvidia_|triton)-' >&2
  exit 1
fi

if [ -n "$skip_file" ]; then
  skipped=0
  while read -r name; do
    name=${name%%#*}; name=$(echo "$name" | tr -d '[:space:]' | tr 'A-Z-.' 'a-z__')
    [ -n "$name" ] || continue
    for wheel in "$out"/*.whl; do
      wheel_name=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z-.' 'a-z__')
      if [ "$wheel_name" = "$name" ]; then rm -f "$wheel"; skipped=$((skipped + 1)); fi
    done
  done < "$skip_file"
  echo "wheelhouse: left out $skipped wheel(s) the target already has ($skip_file)"
fi

(cd "$out" && sha256sum -- *.whl > SHA256SUMS)
count=$(ls "$out"/*.whl | wc -l)
size=$(du -sh "$out" | cut -f1)
echo "wheelhouse: $count wheels, $size in $out"
echo "install there (torch already installed): pip install --no-index --find-links $out sweeper"
