#!/usr/bin/env bash
# How a decode step's time grows with its rows: llama-bench at 1 to 64 positions (warmed up, so CUDA graphs run
# where ggml-cuda takes them); bench cameras (VARIANTS, as cameras-variants.sh; an option VAR=value sets that
# variable for its run); then, with the time left, each step's kernels summed by nsys against its wall time.
set -uo pipefail
OUT=${1:?OUT}; RES=/tmp/res; source tools/device/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/log.txt
prepare || exit 1
LB_SIZES=${STEP_SIZES:-1,2,4,8,9,16,32,64} llama_bench steps
for v in ${VARIANTS:-together70:70: lanes2_70:70:--lanes,2 lanes4_70:70:--lanes,4 together280:280: lanes2_280:280:--lanes,2}; do
  IFS=: read -r name tokens options <<< "$v"
  [ $(el) -lt ${STOP_AT:-520} ] || { log "skip $name (time)"; continue; }
  envs=(); args=()
  for o in ${options//,/ }; do [[ $o =~ ^[A-Z_]+= ]] && envs+=("$o") || args+=("$o"); done
  for e in "${envs[@]}"; do export "$e"; done
  bench_cameras $name $tokens together "${args[@]}"
  for e in "${envs[@]}"; do unset "${e%%=*}"; done
  keep
done
if command -v nsys >/dev/null; then
  for s in ${PROFILE_SIZES:-8 16}; do
    [ $(el) -lt ${STOP_AT:-520} ] || break
    log "nsys pp$s (1 warm-up + 5 runs)"
    nsys profile -t cuda -o /tmp/s$s -f true $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p $s -n 0 -r 5 > /dev/null 2>> $OUT/err.txt
    nsys stats -r cuda_gpu_kern_sum,cuda_api_sum -f csv -o /tmp/s$s /tmp/s$s.nsys-rep > /dev/null 2>> $OUT/err.txt
    { echo "## pp$s (6 runs)"; cat /tmp/s${s}_cuda_gpu_kern_sum.csv; } >> $RES/step-kernels.csv
    cp /tmp/s${s}_cuda_api_sum.csv $RES/step-api-pp$s.csv 2>/dev/null
    keep
  done
  python3 tools/device/kernel-summary.py $RES/step-kernels.csv 2>&1 | head -60 | tee -a $OUT/log.txt
else
  log "no nsys"
fi
log "done"
