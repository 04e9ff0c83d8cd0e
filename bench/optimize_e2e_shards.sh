#!/usr/bin/env bash
# One device call of bench/optimize_e2e.py spread over $GPUS GPUs of one host: the models $MODELS (comma-separated)
# dealt round-robin to the GPUs, each shard an optimize_e2e_device.sh run on its own GPU (CUDA_VISIBLE_DEVICES)
# with columns $COLUMNS, resuming $RESUME when set (RETRY=1: its unfinished entries again), stopping by $DEADLINE
# seconds; then the shards' checkpoints merged (with $RESUME) into $OUT/$NAME.json and .md, their logs into
# $OUT/$NAME.log (a call returns few files: the shards' own stay in /tmp). $DB and $COMMIT as for
# optimize_e2e_device.sh. Run with carry [".whl", "$DB"]; set TORCHINDUCTOR_COMPILE_THREADS to the host's cores
# over $GPUS so that compiles side by side get the cores one GPU's host would have.
set -u
SHARDS=/tmp/shards-$NAME
mkdir -p "$SHARDS"
IFS=, read -r -a ALL <<< "$MODELS"
for ((g = 0; g < GPUS; g++)); do
  PART=""
  for ((m = g; m < ${#ALL[@]}; m += GPUS)); do PART="$PART${PART:+,}${ALL[m]}"; done
  [ -z "$PART" ] && continue
  CUDA_VISIBLE_DEVICES=$g OUT=$SHARDS NAME=$NAME-gpu$g ONLY=$PART bash bench/optimize_e2e_device.sh \
    > "$SHARDS/$NAME-gpu$g.out" 2>&1 &
done
wait
cat "$SHARDS"/$NAME-gpu*.log > "$OUT/$NAME.log"
PYTHONPATH=/tmp/e2e-$NAME-gpu0/py:$PWD python bench/optimize_e2e.py --merge ${RESUME:-} "$SHARDS"/$NAME-gpu*.json \
  --out "$OUT/$NAME" | tail -22
