#!/usr/bin/env bash
# bench cameras, 16 cameras x 10 Hz, together and each at 280 and 70 image tokens (E4B Q4_K + f16 tower), then bench frame.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $OUT/log.txt
prepare || exit 1
for r in ${RUNS:-280:together 280:each 70:together 70:each}; do
  tok=${r%%:*}; adm=${r##*:}
  [ $(el) -lt ${STOP_AT:-470} ] || { log "skip $r (time)"; continue; }
  log "cameras $tok $adm"
  $P bench cameras --cameras 16 --fps 10 --seconds 10 --image-tokens $tok --budget-ms 1000 -m "$M" -e "$E" --gpu-layers 99 \
    --admit $adm ${CAMERAS_ARGS:-} --json > $OUT/cameras-$tok-$adm.json 2>> $OUT/err.txt || tail -20 $OUT/err.txt
  node -e "const j=require('$OUT/cameras-$tok-$adm.json'); console.log(JSON.stringify({admit:j.admit, actions_per_s:j.actions_per_s, ceiling_share:j.ceiling_share, ceiling:j.ceiling, batch_mean:j.decode_batch_mean, graph_reuse:j.decode_graph_reuse, p50:j.e2e_ms_p50, p99:j.e2e_ms_p99, in:j.frames_in, out:j.frames_out, fair:j.fairness}))" 2>&1 | tee -a $OUT/log.txt
done
if [ $(el) -lt ${FRAME_BY:-500} ]; then
  log "frame"
  $P bench frame -m "$M" -e "$E" --gpu-layers 99 --image-tokens 280 --frames 30 --fps 4 --json > $OUT/frame-280.json 2>> $OUT/err.txt || tail -20 $OUT/err.txt
fi
log "done"
