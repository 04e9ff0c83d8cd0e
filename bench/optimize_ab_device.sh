#!/usr/bin/env bash
# Optimize times of two versions of tunebank in one device call: $BASE (a commit the device copy's git holds, e.g. its
# HEAD, as `git archive` extracts it, or a patch file that turns the working tree into the base, e.g. `git diff HEAD
# <commit> -- embed transforms service db tunebank > probe/base.patch`, carried) against the working tree, alternating
# for $PASSES passes (default 2), each pass of each side a fresh process with a fresh CuPy cache, a fresh CUDA JIT
# cache (cuDNN's TF32 searches JIT-compile kernels once a machine) and a fresh copy of $DB, the `tunebank` column only,
# over $ONLY (comma-separated models of bench/e2e_models.py). Two calls of the same code differ by up to 15% a model
# (bench/README.md, twenty-third session): compare versions only within one call. COLD=1 empties the page cache
# before each side (root only), so that each pays what a fresh machine's first optimize reads from disk. Writes $OUT/$NAME-<side><pass>.json
# and $OUT/$NAME.md, the table of optimize seconds and plan ms by model and pass. Run with carry [".whl", "$DB"]; see
# bench/optimize_e2e_device.sh for the wheels and the database.
set -u
: "${BASE:?a commit to compare with}" "${ONLY:?models}" "${NAME:=optimize_ab}"
TMP=/tmp/e2e-ab-$NAME
mkdir -p $TMP/base $TMP/py
if [ -f "$BASE" ]; then
  cp -r embed transforms service db tunebank bench $TMP/base && (base=$PWD/$BASE && cd $TMP/base && git apply "$base") \
    || { echo "$BASE does not apply to the working tree"; exit 3; }
else
  git archive "$BASE" embed transforms service db tunebank bench | tar -x -C $TMP/base \
    || { echo "the device copy's git has no commit $BASE"; exit 3; }
fi
for w in .whl/*.whl; do python -m zipfile -e "$w" $TMP/py; done
unset PYTHONDONTWRITEBYTECODE  # bytecode compiled ahead, as an installed environment has it
export PYTHONPYCACHEPREFIX=$TMP/pycache TORCHINDUCTOR_COMPILE_THREADS=16
python -m compileall -q -j 0 $TMP/py $TMP/base embed transforms service db tunebank > /dev/null
python -m compileall -q -j 0 $(python -c "import os, sympy, torch; print(*(os.path.dirname(m.__file__) for m in (torch, sympy)))") > /dev/null
HERE=$PWD
for pass in $(seq "${PASSES:-2}"); do
  for side in base new; do
    dir=$([ $side = base ] && echo $TMP/base || echo "$HERE")
    cp "$HERE/${DB:-out/h200.db}" $TMP/$side$pass.db
    # COLD=1: each side starts on an emptied page cache, as a machine's first process reads its libraries from disk
    [ "${COLD:-0}" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches || echo "cannot drop the page cache"; }
    (cd "$dir" && CUPY_CACHE_DIR=$TMP/cupy-$side$pass CUDA_CACHE_PATH=$TMP/nv-$side$pass PYTHONPATH=$TMP/py:$dir TUNEBANK_E2E_DB=$TMP/$side$pass.db \
      python bench/optimize_e2e.py --out $TMP/$side$pass --columns tunebank --deadline "${DEADLINE:-300}" \
      --models "$ONLY" --commit $side > $TMP/$side$pass.log 2>&1) || tail -5 $TMP/$side$pass.log
    [ -f $TMP/$side$pass.json ] && cp $TMP/$side$pass.json "$OUT/$NAME-$side$pass.json"
  done
done
python - "$OUT" "$NAME" <<'PY'
import json, pathlib, sys
out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = {p.stem.removeprefix(f"{name}-"): json.loads(p.read_text())["results"] for p in sorted(out.glob(f"{name}-*.json"))}
if not runs:
    sys.exit("no run left results")
models = list(next(iter(runs.values())))
lines = ["| model | " + " | ".join(f"{run} s (ms)" for run in runs) + " |", "|---" * (len(runs) + 1) + "|"]
for model in models:
    cells = []
    for results in runs.values():
        entry = results.get(model, {}).get("tunebank", {})
        cells.append(f"{entry['compile_s']:.1f} ({entry['ms']:.4g})" if entry.get("status") == "ok" else "-")
    lines.append(f"| {model} | " + " | ".join(cells) + " |")
(out / f"{name}.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
