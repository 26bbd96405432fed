#!/usr/bin/env bash
# The decoder's weights as Q4_K and as F16, both on percept's default matmul path (cuBLAS above 128 tokens):
# llama-bench by width, bench frame (280 tokens) and bench cameras (16 x 10 Hz, together) at 280 and 70 tokens.
# The F16 file is synthesized while the addon builds. RUNGS picks the weights, TOKENS the camera runs.
set -uo pipefail
OUT=${1:?OUT}; RES=/tmp/res; source tools/device/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $OUT/log.txt
# llama-bench does not load percept's binding, which sets this default for node.
export PERCEPT_CUDA_MMQ_MAX_BATCH=${PERCEPT_CUDA_MMQ_MAX_BATCH-128}
RUNGS=${RUNGS:-q4_k f16}
if [[ " $RUNGS " == *" f16 "* ]]; then
  node --import tsx --input-type=module -e "const {resolveModel}=await import('./models/resolve.ts');
    console.log('M=' + await resolveModel('synth:gemma4-e4b?wtype=f16', 'decoder'));" > /tmp/synth-f16.log 2>&1 &
  f16=$!
fi
BUILD_JOBS=14 prepare || exit 1
Q4=$M
for w in $RUNGS; do
  if [ $w = f16 ]; then
    wait $f16 || { cat /tmp/synth-f16.log | tee -a $OUT/log.txt; continue; }
    M=$(sed -n 's/^M=//p' /tmp/synth-f16.log)
  else
    M=$Q4
  fi
  [ $(el) -lt ${STOP_AT:-500} ] || { log "skip $w (time)"; continue; }
  LB_SIZES=${LB_SIZES:-16,64,290,1024,4640} llama_bench $w
  keep
  bench_frame $w
  keep
  for tok in ${TOKENS:-280 70}; do
    [ $(el) -lt ${STOP_AT:-500} ] || { log "skip cameras $w-$tok (time)"; continue; }
    bench_cameras $w-$tok $tok together
    keep
  done
done
log "done"
