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
  PERCEPT_CUDA_MMQ_MAX_BATCH=${p#*:} bench_frame ${p%%:*}
done
# Each cameras run: a name, the widest matmul MMQ takes, the group hold (batching.groupWaitMs; empty: the default).
for r in ${CAMERA_RUNS:-mmq:: above128:128: above128-hold300:128:300}; do
  IFS=: read -r name mmq hold <<< "$r"
  [ $(el) -lt ${STOP_AT:-480} ] || { log "skip cameras $name (time)"; continue; }
  PERCEPT_CUDA_MMQ_MAX_BATCH=$mmq bench_cameras $name 280 together ${hold:+--group-wait-ms $hold}
  keep
done
log "done"
