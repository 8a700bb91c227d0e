#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels tests/gpu/gpu_check.py needs on the GPU machine,
# which has Python 3.12 with torch, transformers, peft and accelerate but no network: a
# sieverag wheel of this checkout, trl, deepspeed (built here from its sdist with
# DS_BUILD_OPS=0: no CUDA op is compiled, the ops it needs are JIT-built there if ever), and
# the packages sieverag, trl and deepspeed import that the machine lacks. Pinned to the
# versions this project is tested with; each is fetched for CPython 3.12 on manylinux x86_64
# whatever this machine runs. Run from anywhere in the checkout (~32 MB):
#
#     bash tests/gpu/prepare_wheels.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
for ignored in /.whl/ /.gpu_check/; do
    grep -qxF "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >>"$exclude"
done
rm -rf .whl && mkdir .whl
python=${PYTHON:-python3}

# Missing on the GPU machine (its package list: the device README's KINDS.md). One version
# of each: two would stop the install there. bm25s, PyStemmer and faiss-cpu (18 MB) because
# `sieverag train` imports the retrieval stack at start (through eval-filter's settings).
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 \
    pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 typing-inspection==0.4.5 \
    annotated-types==0.8.0 python-dotenv==1.2.4 typing-extensions==4.16.0 \
    fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 \
    platformdirs==4.14.9 bm25s==0.3.16 PyStemmer==3.1.0 faiss-cpu==1.15.1

# deepspeed ships only an sdist; its setup.py imports torch, so build without isolation.
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl \
    deepspeed==0.19.8
# setuptools reuses build/ in the checkout: a stale one would put deleted files in the wheel.
rm -rf build
"$python" -m pip wheel -q --no-deps -w .whl .

du -sh .whl
ls -l .whl
