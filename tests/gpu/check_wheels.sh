#!/usr/bin/env bash
# Run by hand (it downloads from PyPI): does the GPU check's wheel set, installed beside the
# lent machine's packages, import everything the check runs? It makes the wheel set
# (tests/gpu/prepare_wheels.sh) into a temporary folder, creates a fresh venv, installs
# there the lent machine's packages that the set reaches at the machine's versions
# (tests/gpu/lent_machine.txt: torch, transformers, accelerate, ...; peft and those the
# README gives no version for at this checkout's), then the wheels exactly as
# tests/gpu/gpu_check.sh installs them (--no-index --no-deps), runs `pip check`, and imports
# every sieverag module the check runs (tests/gpu/wheel_set.py modules). Exit 1 when any
# import fails.
#
#     bash tests/gpu/check_wheels.sh
#
# TORCH: the torch to install (default the machine's, torch==2.11.0; a CPU build of that
# version is enough, e.g. TORCH=torch==2.11.0+cpu with a CPU index). BASE_PYTHON: the
# interpreter of the fresh venv (default python3); the wheels are made for its version,
# which is the machine's (3.12) where that interpreter is 3.12.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
repo=$PWD
python=${PYTHON:-.venv/bin/python}
base_python=${BASE_PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/sieverag-check-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT
version=$("$base_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

echo "== the wheel set, for CPython $version (the machine runs 3.12)"
WHEEL_DIR="$work/whl" PYTHON_VERSION="$version" PYTHON="$python" \
    bash tests/gpu/prepare_wheels.sh | tail -n 3

echo "== a fresh venv ($("$base_python" -V)) with the machine's packages"
"$base_python" -m venv "$work/venv"
venv=$work/venv/bin/python
"$venv" -m pip install -q --upgrade pip
torch=${TORCH:-$(grep -E '^torch==' tests/gpu/lent_machine.txt)}
"$venv" -m pip install -q "$torch"
# The machine's packages the set reaches: the README's version, else this checkout's.
machine=$("$python" tests/gpu/wheel_set.py machine --pinned | grep -v '^torch==')
echo "torch==$("$venv" -c 'import torch; print(torch.__version__)')" >"$work/constraints.txt"
if ! "$venv" -m pip install -q -c "$work/constraints.txt" $machine; then
    echo "-- not all at once for CPython $version; one by one, unpinned where needed"
    for spec in $machine; do
        "$venv" -m pip install -q -c "$work/constraints.txt" "$spec" 2>/dev/null || {
            echo "   $spec: no release for CPython $version here; installing ${spec%%==*}"
            "$venv" -m pip install -q -c "$work/constraints.txt" "${spec%%==*}"; }
    done
fi
"$venv" -m pip install -q --no-index --no-deps --no-compile --upgrade "$work"/whl/*.whl
"$venv" -c 'import importlib.metadata as m
print("   " + ", ".join(f"{n} {m.version(n)}" for n in
                       ("torch", "transformers", "peft", "accelerate", "sieverag")))'

echo "== pip check"
"$venv" -m pip check || true

echo "== importing the modules the GPU check runs"
"$python" tests/gpu/wheel_set.py modules >"$work/modules.txt"
cd "$work"  # not the checkout: its folders would shadow the installed sieverag
HF_HUB_OFFLINE=1 "$venv" - "$work/modules.txt" "$repo" <<'PY'
import importlib
import sys
import traceback

modules = open(sys.argv[1], encoding="utf-8").read().split()
failed = {}
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as error:  # every module that fails, not the first only
        failed[name] = f"{type(error).__name__}: {error}"
        traceback.print_exc(limit=1)
for name, error in failed.items():
    print(f"FAILED {name}: {error}")
print(f"imported {len(modules) - len(failed)} of {len(modules)} modules"
      + (f"; {len(failed)} failed" if failed else ""))
sys.exit(1 if failed else 0)
PY
