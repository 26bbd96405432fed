#!/usr/bin/env bash
# bench cameras, 16 cameras x 10 Hz, together and each at 280 and 70 image tokens (E4B Q4_K + f16 tower), then bench frame.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $OUT/log.txt
prepare || exit 1
for r in ${RUNS:-280:together 280:each 70:together 70:each}; do
  tok=${r%%:*}; adm=${r##*:}
  [ $(el) -lt ${STOP_AT:-470} ] || { log "skip $r (time)"; continue; }
  bench_cameras $tok-$adm $tok $adm ${CAMERAS_ARGS:-}
done
if [ $(el) -lt ${FRAME_BY:-500} ]; then
  bench_frame 280
fi
log "done"
