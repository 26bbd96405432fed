#!/usr/bin/env bash
# llama-bench prefill (290 and 4640 positions) on the E4B file, per-kernel times of both prefills,
# and the PyTorch peer (peer-torch-decoder.py) on the same shapes.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
prepare || exit 1
llama_bench
for s in 290 4640; do
  [ $(el) -lt 450 ] && kernels $s
done
python3 tools/device/kernel-summary.py $OUT/kernels.csv 2>&1 | head -40 | tee -a $OUT/log.txt
if [ $(el) -lt 520 ]; then
  log "torch peer"
  PYTHONUNBUFFERED=1 python3 tools/device/peer-torch-decoder.py > $OUT/torch-decoder.json 2>> $OUT/err.txt || log "torch peer failed"
fi
log "done"
