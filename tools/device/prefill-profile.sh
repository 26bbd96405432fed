#!/usr/bin/env bash
# llama-bench prefill (290 and 4640 positions) on the E4B file, per-kernel times of one prefill (nsys, else ncu),
# and the PyTorch peer (peer-torch-decoder.py) on the same shapes.
set -uo pipefail
OUT=${1:?OUT}; source tools/device/setup.sh
build || exit 1
synth > /tmp/synth.log 2>&1; M=$(sed -n 's/^M=//p' /tmp/synth.log)
log "peers"; node tools/build-native.mjs --peers llama-bench llama-batched-bench > /tmp/peers.log 2>&1 || tail -30 /tmp/peers.log | tee -a $OUT/log.txt
LB=build/native/bin/llama-bench
log "llama-bench"
$LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p 290,4640 -n 32 -r 3 -o json > $OUT/llama-bench.json 2>> $OUT/err.txt
node -e "for (const r of require('$OUT/llama-bench.json')) console.log(r.n_prompt, r.n_gen, r.avg_ts)" | tee -a $OUT/log.txt
kern() { # $1 tag, rest: llama-bench args
  tag=$1; shift
  if command -v nsys >/dev/null; then
    nsys profile -t cuda -o /tmp/p$tag -f true $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 "$@" -r 2 > /dev/null 2>>$OUT/err.txt
    nsys stats -r cuda_gpu_kern_sum -f csv -o /tmp/k$tag /tmp/p$tag.nsys-rep > /dev/null 2>>$OUT/err.txt
    cat /tmp/k${tag}_cuda_gpu_kern_sum.csv
  else
    ncu --metrics gpu__time_duration.sum --csv $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 "$@" -r 1 --no-warmup 2>>$OUT/err.txt
  fi
}
for s in 290 4640; do
  [ $(el) -lt 480 ] || { log "skip kernels $s"; continue; }
  log "kernels pp$s"; { echo "## pp$s"; kern $s -p $s -n 0; } >> $OUT/kernels.csv
done
[ $(el) -lt 520 ] && { log "torch peer"
( PYTHONUNBUFFERED=1 python3 tools/device/peer-torch-decoder.py > $OUT/torch-decoder.json 2>> $OUT/err.txt || echo "torch peer failed" >> $OUT/log.txt ) ; }
log "done"
