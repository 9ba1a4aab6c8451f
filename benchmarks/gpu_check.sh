#!/usr/bin/env bash
# benchmarks/gpu_check.py on the lent GPU machine, from the repository root: the wheels it lacks
# (.whl: pydantic and its dependencies) into /tmp/site, the project from this source tree (not installed).
#     bash benchmarks/gpu_check.sh OUTDIR [gpu_check.py options]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD \
    || echo "gpu_check.sh: the wheels of .whl did not install; going on without them" >&2
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR [options]}
shift
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$out"
python3 benchmarks/gpu_check.py "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
