#!/usr/bin/env bash
# The decoder's quantized matmuls through MMQ against dequantize + cuBLAS (PERCEPT_CUDA_MMQ_MAX_BATCH,
# native/patches/ggml-cuda-mmq-max-batch.diff): llama-bench by width, bench frame and bench cameras (280 tokens,
# together; CAMERA_RUNS) under each; the PyTorch peer runs on the GPU while the addon builds on 14 of the 16 cores.
set -uo pipefail
OUT=${1:?OUT}; RES=/tmp/res; source tools/device/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $OUT/log.txt
if [ -z "${NO_TORCH:-}" ]; then
  (PYTHONUNBUFFERED=1 python3 tools/device/peer-torch-decoder.py > $RES/torch-decoder.json 2>> $OUT/err.txt) &
  torch=$!
fi
BUILD_JOBS=14 prepare || exit 1
[ -n "${torch:-}" ] && { wait $torch && log "torch peer done" || log "torch peer failed"; keep; }
# Each path: a name and the widest matmul MMQ takes (empty: every width; 128 is percept's default).
PATHS=${PATHS:-mmq: cublas:0 above128:128}
for p in $PATHS; do
  LB_SIZES=${LB_SIZES:-16,64,128,290,1024,4640} PERCEPT_CUDA_MMQ_MAX_BATCH=${p#*:} llama_bench ${p%%:*}
  keep
done
for p in $PATHS; do
  [ $(el) -lt ${FRAME_BY:-450} ] || { log "skip frame ${p%%:*} (time)"; continue; }
  log "frame ${p%%:*}"
  PERCEPT_CUDA_MMQ_MAX_BATCH=${p#*:} $P bench frame -m "$M" -e "$E" --gpu-layers 99 --image-tokens 280 --frames 30 --fps 4 \
    --json > $RES/frame-${p%%:*}.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
  node -e "const j=require('$RES/frame-${p%%:*}.json'); console.log(JSON.stringify({p50:j.frame_to_action_ms_p50, p99:j.frame_to_action_ms_p99, prefill:j.prefill_ms_median, token:j.decode_ms_per_token_median, out:j.frames_out}))" 2>&1 | tee -a $OUT/log.txt
done
# Each cameras run: a name, the widest matmul MMQ takes, the group hold (batching.groupWaitMs; empty: the default).
for r in ${CAMERA_RUNS:-mmq:: above128:128: above128-hold300:128:300}; do
  IFS=: read -r name mmq hold <<< "$r"
  [ $(el) -lt ${STOP_AT:-480} ] || { log "skip cameras $name (time)"; continue; }
  PERCEPT_CUDA_MMQ_MAX_BATCH=$mmq bench_cameras $name 280 together ${hold:+--group-wait-ms $hold}
  keep
done
log "done"
