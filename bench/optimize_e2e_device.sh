#!/usr/bin/env bash
# One device call of bench/optimize_e2e.py: columns $COLUMNS over $ONLY (default: every held-out model) into
# $OUT/$NAME.json (resuming $RESUME when set; with RETRY=1 measuring its unfinished entries again), stopping by
# $DEADLINE seconds. The GPU machine lacks the database packages, so they come as wheels in .whl (pip download
# --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps sqlalchemy alembic mako
# faiss-cpu pydantic pydantic-core pydantic-settings
# python-dotenv safetensors annotated-types typing-inspection packaging; where the tree and the wheels pass the 64 MiB a
# call carries, the largest repacked with LZMA, which `python -m zipfile -e` extracts: bench/README.md, twenty-fifth
# session), and the tunebank column's database comes as
# $DB, built from a transfer recording whose models exclude the held-out ones (bench/README.md says how):
#   out/h200.db (default): bench/db_from_recording.py bench/results/transfer_h200.json out/h200.db, run in a checkout
#     of 9061a44 (the recording predates e023981, whose cuda spaces give reshaped contractions gemm recipes it never
#     measured, so a replay at a later commit stops with "the recording has no measurement of 'gemm(cublaslt,0)'");
#   out/h100.db (on an H100): bench/db_from_recording.py bench/results/transfer_strong_h100.json out/h100.db
#     --models <its 12 zoo models>, run in a checkout of 3d13e2c (c0fb686's batched twins are recipes the
#     recording never measured either).
# Pass $COMMIT (the commit under test) yourself: the device copy's git HEAD can be an older commit than its files.
# Run with carry [".whl", "$DB"]. Calls with different $NAMEs can run side by side, each on its own GPU
# (CUDA_VISIBLE_DEVICES), and their checkpoints be combined with bench/optimize_e2e.py --merge.
set -u
TMP=/tmp/e2e-$NAME
# a fresh machine's caches unless the caller names others: CuPy's compiled kernels (the reference evaluator's, the
# check's) and CUDA's JIT cache (kernels cuDNN's TF32 searches compile once a machine)
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$TMP/cupy} CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$TMP/nv-cache}
mkdir -p $TMP/py && for w in .whl/*.whl; do python -m zipfile -e "$w" $TMP/py; done
# bytecode compiled ahead and kept, as an installed environment has it: the GPU image sets PYTHONDONTWRITEBYTECODE and
# its packages have none, so each process (optimize's worker, too) would compile every module it imports
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$TMP/pycache
python -m compileall -q -j 0 $TMP/py embed transforms service db tunebank > /dev/null
# torch and sympy likewise (4-5 s of byte-compiling torch.export's imports fell on the first model of a call)
python -m compileall -q -j 0 $(python -c "import os, sympy, torch; print(*(os.path.dirname(m.__file__) for m in (torch, sympy)))") > /dev/null
export PYTHONPATH=$TMP/py:$PWD
cp "${DB:-out/h200.db}" $TMP/e2e.db
MODELS=$(python -c "import sys; sys.path.insert(0,'.'); from bench.e2e_models import MODELS; print(','.join(MODELS))")
TUNEBANK_E2E_DB=$TMP/e2e.db python bench/optimize_e2e.py ${RESUME:+--resume $RESUME} ${RETRY:+--retry-unfinished} \
  --out "$OUT/$NAME" --columns "$COLUMNS" --deadline "${DEADLINE:-500}" --models "${ONLY:-$MODELS}" \
  --commit "${COMMIT:-unknown}" 2>&1 \
  | awk '!/warnings.warn|capture_end/ && !(/Warning/ && !/tunebank:/)' | tee "$OUT/$NAME.log" | tail -40
