#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels tests/gpu/gpu_check.py needs on the lent GPU
# machine, which has Python 3.12 and the packages of tests/gpu/lent_machine.txt (torch,
# transformers, peft, accelerate, ...) but no network. The list is not kept here: it is
# tests/gpu/wheel_set.py's, derived from pyproject.toml's dependencies (and the deepspeed
# extra) with what they require in turn, less what the machine has, each at the version
# installed in this checkout's environment (the tested one); tests/gpu/test_wheels.py checks
# that it covers every import of the check. A sieverag wheel of this checkout is added.
# Binary wheels are fetched for CPython $PYTHON_VERSION (3.12) on manylinux x86_64, whatever
# this machine runs; a distribution published only as source (rouge-score) is built here and
# must come out pure Python; deepspeed is built from its sdist with DS_BUILD_OPS=0 (no CUDA
# op compiled: those it needs are JIT-built there if ever). Run from anywhere in the checkout
# (about 40 MB; a call to the machine carries 64 MiB in all, the checkout included):
#
#     bash tests/gpu/prepare_wheels.sh
#
# PYTHON: the environment whose metadata and versions are read (default .venv/bin/python);
# WHEEL_DIR: where the wheels go (default .whl); PYTHON_VERSION: the target CPython.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
target=${PYTHON_VERSION:-3.12}
out=${WHEEL_DIR:-.whl}
if [ "$out" = .whl ]; then
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    for ignored in /.whl/ /.gpu_check/; do
        grep -qxF "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >>"$exclude"
    done
fi
rm -rf "$out" && mkdir -p "$out"

wheels=$("$python" tests/gpu/wheel_set.py wheels)
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 \
        manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
for spec in $wheels; do
    case "$spec" in
    deepspeed==*)  # only an sdist; its setup.py imports torch: no build isolation
        DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$out" \
            "$spec" ;;
    *)
        if ! "$python" -m pip download -q --no-deps --only-binary=:all: \
                --python-version "$target" --implementation cp "${platforms[@]}" \
                -d "$out" "$spec" 2>/dev/null; then
            echo "$spec: no wheel for CPython $target on PyPI; building it from source"
            built=$(mktemp -d)
            "$python" -m pip wheel -q --no-deps -w "$built" "$spec"
            for wheel in "$built"/*.whl; do
                case "$wheel" in
                *-py3-none-any.whl | *-py2.py3-none-any.whl) mv "$wheel" "$out"/ ;;
                *) echo "$spec builds into $(basename "$wheel"), not pure Python: it cannot" \
                        "be built here for CPython $target" >&2; exit 1 ;;
                esac
            done
            rm -rf "$built"
        fi ;;
    esac
done
# setuptools reuses build/ in the checkout: a stale one would put deleted files in the wheel.
rm -rf build
"$python" -m pip wheel -q --no-deps -w "$out" .

ls "$out"
echo "$(echo "$wheels" | wc -w) wheels for CPython $target, and sieverag's:" \
    "$(du -sh "$out" | cut -f1)"
if [ "$(du -sm "$out" | cut -f1)" -gt 56 ]; then
    echo "warning: $out is over 56 MiB; with the checkout it may not fit the 64 MiB a call" \
        "to the GPU machine carries" >&2
fi
