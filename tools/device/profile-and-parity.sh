#!/usr/bin/env bash
# For a fresh machine in one call: the build, llama-bench, per-kernel times of one 290-position prefill, then the demo
# model against PyTorch's fixture on the GPU (test/e2e/demo-model.test.ts, mmproj case) and its draft in bench frame.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
prepare || exit 1
llama_bench
NCU_S=${NCU_S:-70} kernels 290
python3 tools/device/kernel-summary.py $OUT/kernels.csv 2>&1 | head -30 | tee -a $OUT/log.txt
[ $(el) -lt ${PARITY_BY:-330} ] || { log "stop (time)"; exit 0; }
log "parity"
PERCEPT_TEST_GPU_LAYERS=99 node --import tsx --test --test-reporter=spec --test-name-pattern="mmproj encoder" \
  test/e2e/demo-model.test.ts > $OUT/parity-gpu.txt 2>&1
grep -E "✔|✖|actions identical" $OUT/parity-gpu.txt | tee -a $OUT/log.txt
[ $(el) -lt ${FRAME_BY:-380} ] || { log "stop (time)"; exit 0; }
log "frame demo draft"
DE=$(node --import tsx --input-type=module -e "const {resolveModel}=await import('./models/resolve.ts'); console.log(await resolveModel('demo:gemma4-robot','mmproj'))")
$P bench frame -m demo:gemma4-robot -e "$DE" --gpu-layers 99 --image-tokens 70 --frames 40 --fps 5 --draft-mtp demo:gemma4-robot-assistant \
  --json > $OUT/frame-demo-draft.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
log "done"
