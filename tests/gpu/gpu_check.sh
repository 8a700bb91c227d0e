#!/usr/bin/env bash
# The GPU check on a machine without network: install the wheels carried in .whl/ (made by
# tests/gpu/prepare_wheels.sh) into /tmp/site, then run tests/gpu/gpu_check.py with its
# arguments. On the device: `bash tests/gpu/gpu_check.sh --out $OUT/gpu_check.json`, carrying
# .whl and .gpu_check.
set -uo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "installing .whl/*.whl failed" >&2; exit 3; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec python3 tests/gpu/gpu_check.py "$@"
