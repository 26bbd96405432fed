#!/usr/bin/env bash
# For a fresh machine in one call: the CUDA build with llama-bench (E4B synthesized meanwhile), llama-bench prefill,
# per-kernel times of one 290-token prefill (ncu), the demo model against PyTorch on the GPU, its draft in bench frame.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
( synth > /tmp/synth.log 2>&1 ) &
SP=$!
log "build"
build || exit 1
log "built"; wait $SP; M=$(sed -n 's/^M=//p' /tmp/synth.log)
LB=build/native/bin/llama-bench
log "llama-bench"
$LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p 290,4640 -n 32 -r 3 -o json > $OUT/llama-bench.json 2>> $OUT/err.txt
node -e "for (const r of require('$OUT/llama-bench.json')) console.log('pp', r.n_prompt, 'tg', r.n_gen, Math.round(r.avg_ts), 'tok/s')" | tee -a $OUT/log.txt
NCU_S=${NCU_S:-70}
log "ncu pp290"
timeout ${NCU_S:-110} ncu --metrics gpu__time_duration.sum --csv --launch-count ${NCU_N:-1400} --cache-control none --clock-control none \
  $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p 290 -n 0 -r 1 --no-warmup > /tmp/ncu.csv 2>> $OUT/err.txt
{ echo "## pp290"; cat /tmp/ncu.csv; } > $OUT/kernels.csv
python3 tools/device/kernel-summary.py $OUT/kernels.csv 2>&1 | head -30 | tee -a $OUT/log.txt
[ $(el) -lt ${PARITY_BY:-330} ] || { log "stop (time)"; exit 0; }
log "parity"
node --import tsx tools/device/parity-gpu.ts > $OUT/parity-gpu.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
node -e "const j=require('$OUT/parity-gpu.json'); console.log(JSON.stringify({same_text:j.same_text, same_decision:j.same_decision, frames:j.frames, acc:j.accuracy&&j.accuracy.action, iou:j.accuracy&&j.accuracy.meanIoU}))" | tee -a $OUT/log.txt
DE=$(node --import tsx --input-type=module -e "const {resolveModel}=await import('./models/resolve.ts'); console.log(await resolveModel('demo:gemma4-robot','mmproj'))")
[ $(el) -lt ${FRAME_BY:-380} ] || { log "stop (time)"; exit 0; }
log "frame demo draft"
$P bench frame -m demo:gemma4-robot -e "$DE" --gpu-layers 99 --image-tokens 70 --frames 40 --fps 5 --draft-mtp demo:gemma4-robot-assistant --json > $OUT/frame-demo-draft.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
[ $(el) -lt ${CAMS_BY:-400} ] || { log "stop (time)"; exit 0; }
E=$(sed -n 's/^E=//p' /tmp/synth.log)
log "cameras 280 together, group wait 200, encode wait 40"
$P bench cameras --cameras 16 --fps 10 --seconds 10 --image-tokens 280 --budget-ms 1000 -m "$M" -e "$E" --gpu-layers 99 \
  --admit together --group-wait-ms 200 --encode-wait-ms 40 --no-ceiling --json > $OUT/cameras-280-gw200.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
node -e "const j=require('$OUT/cameras-280-gw200.json'); console.log(JSON.stringify({aps:j.actions_per_s, batch_mean:j.decode_batch_mean, p50:j.e2e_ms_p50, p99:j.e2e_ms_p99, outcomes:j.decode_outcomes, enc:[j.encoder_calls,j.encoder_frames], drops:j.dropped_by_stage}))" | tee -a $OUT/log.txt
log "done"
