#!/usr/bin/env bash
# One self-contained training run on the GPU host (python3 with torch + transformers, no Node.js, no
# network), from the repository root:
#   bash tools/demo-model/run-device.sh OUT_DIR [train.py options...]
#   TRAINER=train-assistant.py bash tools/demo-model/run-device.sh OUT_DIR --target CKPT [options...]  (the draft)
# It needs DATA (default .carry/demo-data) with
#   scenegen.tar.xz   nodebin/node (this machine's Node.js) + scenegen/ (tools/make-scenes.ts bundled
#                     by esbuild, with sharp and its libvips beside it): see README.md
#   tokens.json.gz    tools/demo-model/prompt-tokens.ts output for train 0..NTRAIN-1 and val 0..NVAL-1
#                     (and test 0..NTEST-1, SAMPLE's frames; env TOKENS names another file)
# Steps: draws the scenes with make-scenes (JOBS processes, deterministic from the seeds), runs a short
# smoke test of train.py on the val frames (20 steps, the transformers parity check), then the run.
# NTEST > 0 draws that many test frames and SAMPLE (a sample-frames.ts folder) is scored too, at the end.
set -euo pipefail
OUT=${1:?usage: run-device.sh OUT_DIR [train.py options...]}
shift
DATA=${DATA:-.carry/demo-data}
WORK=${WORK:-/tmp/demo-model}
NTRAIN=${NTRAIN:-48000}
NVAL=${NVAL:-1000}
NTEST=${NTEST:-0}
SAMPLE=${SAMPLE:-}
TOKENS=${TOKENS:-$DATA/tokens.json.gz}
JOBS=${JOBS:-16}
WIDTH=${WIDTH:-640}
HEIGHT=${HEIGHT:-360}
SMOKE=${SMOKE:-1}
TRAINER=${TRAINER:-train.py}
t0=$(date +%s)
stamp() { echo "[run-device +$(( $(date +%s) - t0 ))s] $*"; }

mkdir -p "$WORK" "$OUT"
tar -C "$WORK" -xJf "$DATA/scenegen.tar.xz"
NODE="$WORK/nodebin/node"
GEN="$WORK/scenegen/make-scenes.mjs"
stamp "node $("$NODE" --version), python $(python3 -c 'import sys; print(sys.version.split()[0])')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# Scenes: the val split in one process, the train split in JOBS slices (--start/--count), all at once.
rm -rf "$WORK/scenes"
"$NODE" "$GEN" dataset --split val --count "$NVAL" --out "$WORK/scenes/val" --width "$WIDTH" --height "$HEIGHT" --jobs 1 >"$WORK/gen-val.log" 2>&1 &
val_pid=$!
test_pid=
if [ "$NTEST" -gt 0 ]; then
  "$NODE" "$GEN" dataset --split test --count "$NTEST" --out "$WORK/scenes/test" --width "$WIDTH" --height "$HEIGHT" --jobs 1 >"$WORK/gen-test.log" 2>&1 &
  test_pid=$!
fi
per=$(( (NTRAIN + JOBS - 1) / JOBS ))
train_pids=()
train_dirs=()
for k in $(seq 0 $((JOBS - 1))); do
  start=$((k * per))
  count=$(( per < NTRAIN - start ? per : NTRAIN - start ))
  [ "$count" -gt 0 ] || continue
  "$NODE" "$GEN" dataset --split train --start "$start" --count "$count" --out "$WORK/scenes/train-$k" \
    --width "$WIDTH" --height "$HEIGHT" --jobs 1 >"$WORK/gen-train-$k.log" 2>&1 &
  train_pids+=($!)
  train_dirs+=("$WORK/scenes/train-$k")
done
wait "$val_pid" || { cat "$WORK/gen-val.log"; exit 1; }
stamp "val scenes: $(cat "$WORK/gen-val.log")"

if [ "$SMOKE" = 1 ]; then
  stamp "smoke test"
  if [ "$TRAINER" = train.py ]; then
    PYTHONUNBUFFERED=1 python3 tools/demo-model/train.py --tokens "$TOKENS" \
      --train "$WORK/scenes/val" --val "$WORK/scenes/val" --max-train 512 --max-val 64 --steps 20 --log-every 5 \
      --batch 32 --val-greedy 64 --out "$WORK/smoke" --workers 4
  else
    PYTHONUNBUFFERED=1 python3 "tools/demo-model/$TRAINER" --tokens "$TOKENS" \
      --train "$WORK/scenes/val" --val "$WORK/scenes/val" --max-train 256 --max-val 64 --steps 3 --log-every 1 \
      --batch 32 --out "$WORK/smoke" --workers 4 "$@"
  fi
  stamp "smoke passed"
fi

for p in "${train_pids[@]}"; do wait "$p" || { cat "$WORK"/gen-train-*.log; exit 1; }; done
stamp "train scenes: $(cat "$WORK"/gen-train-*.log | awk '{n += $2} END {print n}') frames"
evals=()
if [ -n "$test_pid" ]; then
  wait "$test_pid" || { cat "$WORK/gen-test.log"; exit 1; }
  stamp "test scenes: $(cat "$WORK/gen-test.log")"
  evals+=(--eval "test=$WORK/scenes/test")
fi
[ -z "$SAMPLE" ] || evals+=(--eval "sample=$SAMPLE")

if [ "$TRAINER" = train.py ]; then
  PYTHONUNBUFFERED=1 python3 tools/demo-model/train.py --tokens "$TOKENS" \
    --train "${train_dirs[@]}" --val "$WORK/scenes/val" --out "$OUT" --save-every-epoch "${evals[@]}" "$@"
else
  PYTHONUNBUFFERED=1 python3 "tools/demo-model/$TRAINER" --tokens "$TOKENS" \
    --train "${train_dirs[@]}" --val "$WORK/scenes/val" --out "$OUT" "$@"
fi
stamp "done"
