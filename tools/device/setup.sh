# Sourced by every device script: node on the PATH, node_modules and build/llama.cpp unpacked once per machine,
# and the steps the scripts share. A warm machine keeps the build and the checkpoints between calls.
T0=${T0:-$(date +%s)}
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[+$(el)s] $*" | tee -a "$OUT/log.txt"; }
mkdir -p "$OUT" ${RES:-$OUT} /tmp/nodebin
[ -x /tmp/nodebin/node ] || { xz -dc .carry/device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node; }
export PATH=/tmp/nodebin:$PATH
[ -d node_modules/rxjs ] || { tar -xJf .carry/device/tree.tar.xz && log "unpacked"; }
P="node --import tsx app/cli.ts"
LB=build/native/bin/llama-bench

# M and E: the E4B checkpoint and its tower, synthesized (cached in .cache/models) while the CUDA addon and
# the llama.cpp programs in PEERS (default llama-bench) build (~250 s on 16 cores, once per machine).
prepare() {
  node --import tsx --input-type=module -e "const {resolveModel}=await import('./models/resolve.ts');
    console.log('M=' + await resolveModel('synth:gemma4-e4b?wtype=q4_k', 'decoder'));
    console.log('E=' + await resolveModel('synth:gemma4-vision-e4b-mmproj?dtype=f16', 'mmproj'));" > /tmp/synth.log 2>&1 &
  local synth=$!
  log "build"
  if ! grep -q "GGML_CUDA:BOOL=ON" build/native/CMakeCache.txt 2>/dev/null || ! [ -f build/native/Release/percept.node ]; then
    PERCEPT_CUDA=1 PERCEPT_BUILD_JOBS=${BUILD_JOBS:-16} PERCEPT_PEERS=${PEERS:-llama-bench} node tools/build-native.mjs > /tmp/build.log 2>&1 ||
      { tail -40 /tmp/build.log | tee -a "$OUT/log.txt"; return 1; }
  fi
  [ -x $LB ] || node tools/build-native.mjs --peers llama-bench > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log.txt"; return 1; }
  wait $synth || { cat /tmp/synth.log | tee -a "$OUT/log.txt"; return 1; }
  M=$(sed -n 's/^M=//p' /tmp/synth.log); E=$(sed -n 's/^E=//p' /tmp/synth.log)
  log "built; $M, $E"
}

# The tool brings back at most 8 files: a script with more results writes them to $RES and calls keep after each step.
RES=${RES:-$OUT}
keep() { [ "$RES" = "$OUT" ] || tar -czf $OUT/results.tgz -C $RES .; }

# llama-bench's prefill at $LB_SIZES positions (default 290 and 4640) and its decode, flash attention on, ubatch 4096,
# into $RES/llama-bench${1:+-$1}.json; run under PERCEPT_CUDA_MMQ_MAX_BATCH for the cuBLAS path.
llama_bench() {
  local json=$RES/llama-bench${1:+-$1}.json
  log "llama-bench ${1:-} (PERCEPT_CUDA_MMQ_MAX_BATCH=${PERCEPT_CUDA_MMQ_MAX_BATCH:-})"
  $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p ${LB_SIZES:-290,4640} -n 32 -r 3 -o json > $json 2>> $OUT/err.txt
  node -e "for (const r of require('$json')) console.log('pp', r.n_prompt, 'tg', r.n_gen, Math.round(r.avg_ts), 'tok/s')" | tee -a $OUT/log.txt
}

# bench cameras, 16 x 10 Hz for 10 s with a 1 s budget, at $2 image tokens, admitting $3, further options after them:
# into $RES/cameras-$1.json, its summary in the log.
bench_cameras() {
  local name=$1 tokens=$2 admit=$3; shift 3
  log "cameras $name"
  $P bench cameras --cameras 16 --fps 10 --seconds 10 --image-tokens $tokens --budget-ms 1000 -m "$M" -e "$E" --gpu-layers 99 \
    --admit $admit "$@" --json > $RES/cameras-$name.json 2>> $OUT/err.txt || tail -5 $OUT/err.txt
  node -e "const j=require('$RES/cameras-$name.json'); console.log(JSON.stringify({admit:j.admit, lanes:j.lanes, join:j.rolling_join, step_rows:j.step_rows, actions_per_s:j.actions_per_s, ceiling_share:j.ceiling_share, ceiling:j.ceiling, batch_mean:j.decode_batch_mean, graph_reuse:j.decode_graph_reuse, p50:j.e2e_ms_p50, p99:j.e2e_ms_p99, in:j.frames_in, out:j.frames_out, fair:j.fairness, decoder_ms:j.decoder_time_ms, encoder_ms:j.encoder_busy_ms}))" 2>&1 | tee -a $OUT/log.txt
}

# bench frame, 30 frames at 4 fps and 280 image tokens, further options after the name: into $RES/frame-$1.json,
# its summary in the log.
bench_frame() {
  local name=$1; shift
  log "frame $name $*"
  $P bench frame -m "$M" -e "$E" --gpu-layers 99 --image-tokens 280 --frames 30 --fps 4 "$@" --json > $RES/frame-$name.json 2>> $OUT/err.txt ||
    tail -5 $OUT/err.txt
  node -e "const j=require('$RES/frame-$name.json'); console.log(JSON.stringify({p50:j.frame_to_action_ms_p50, p99:j.frame_to_action_ms_p99, prefill:j.prefill_ms_median, calls:j.prefill_decode_calls_median, token:j.decode_ms_per_token_median, out:j.frames_out}))" 2>&1 | tee -a $OUT/log.txt
}

# Per-kernel times of one prefill of $1 positions, appended to $OUT/kernels.csv under "## pp$1": nsys where it is
# installed, else ncu over at most NCU_N kernels and NCU_S seconds. kernel-summary.py reads either.
kernels() {
  log "kernels pp$1"
  local args=(-m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p $1 -n 0 -r 1 --no-warmup)
  echo "## pp$1" >> $OUT/kernels.csv
  if command -v nsys >/dev/null; then
    nsys profile -t cuda -o /tmp/p$1 -f true $LB "${args[@]}" > /dev/null 2>> $OUT/err.txt
    nsys stats -r cuda_gpu_kern_sum -f csv -o /tmp/k$1 /tmp/p$1.nsys-rep > /dev/null 2>> $OUT/err.txt
    cat /tmp/k$1_cuda_gpu_kern_sum.csv >> $OUT/kernels.csv
  else
    timeout ${NCU_S:-110} ncu --metrics gpu__time_duration.sum --csv --launch-count ${NCU_N:-1400} --cache-control none \
      --clock-control none $LB "${args[@]}" >> $OUT/kernels.csv 2>> $OUT/err.txt
  fi
}

# nsys's trace of a command into /tmp/$1.nsys-rep and /tmp/$1.sqlite: $2 adds nsys options, the rest is the command.
# Where nsys is not on the PATH, Nsight Compute's copy; its importer needs the libdw that pack.sh carries.
# An earlier call's trace never stands in for this one's. Sets NSYS for the caller's reports.
nsys_trace() {
  local name=$1 opts=$2
  shift 2
  NSYS=$(command -v nsys || ls /opt/nvidia/nsight-*/*/host/target-linux-x64/nsys 2>/dev/null | head -1)
  [ -n "$NSYS" ] || { log "no nsys"; return 1; }
  rm -f /tmp/$name.qdstrm /tmp/$name.nsys-rep /tmp/$name.sqlite
  "$NSYS" profile -t cuda $opts -s none --cpuctxsw=none -o /tmp/$name -f true "$@" > /dev/null 2>> $OUT/err.txt
  if [ ! -f /tmp/$name.nsys-rep ]; then
    local importer=$(ls /opt/nvidia/nsight-*/*/host/linux-desktop-*/QdstrmImporter 2>/dev/null | head -1)
    LD_LIBRARY_PATH=$PWD/.carry/device/lib:${LD_LIBRARY_PATH:-} "$importer" -i /tmp/$name.qdstrm > /dev/null 2>> $OUT/err.txt
  fi
  [ -f /tmp/$name.nsys-rep ] || { log "$name: no trace (nsys's importer failed: err.txt)"; return 1; }
  "$NSYS" export --type=sqlite --output=/tmp/$name.sqlite --force-overwrite=true /tmp/$name.nsys-rep > /dev/null 2>> $OUT/err.txt
}

# The GPU's idle gaps within a prefill of $1 positions (llama-bench, 5 repeats after its warm-up) and the host's CUDA
# calls meanwhile: prefill-gaps.py over nsys's trace, into $RES/gaps-$1.json; the last repeat in the log.
gaps() {
  log "gaps pp$1"
  nsys_trace g$1 "" $LB -m "$M" -ngl 99 -fa 1 -b 4096 -ub 4096 -p $1 -n 0 -r 5 || return 1
  python3 tools/device/prefill-gaps.py /tmp/g$1.sqlite > $RES/gaps-$1.json 2>> $OUT/err.txt
  python3 -c "import json; print(json.dumps(json.load(open('$RES/gaps-$1.json'))[-1]))" 2>&1 | tee -a $OUT/log.txt
}

# Where a decode step goes: nsys's trace of llama-bench's $1 decode steps (default 32), each a CUDA graph traced
# node by node; the last six steps by kernel kind (decode-steps.py) into $RES/decode-steps.json and the log.
decode_kernels() {
  log "decode kernels tg${1:-32}"
  nsys_trace tg --cuda-graph-trace=node $LB -m "$M" -ngl 99 -fa 1 -p 0 -n ${1:-32} -r 1 || return 1
  python3 tools/device/decode-steps.py /tmp/tg.sqlite > $RES/decode-steps.json 2>> $OUT/err.txt
  cat $RES/decode-steps.json | tee -a $OUT/log.txt
}

# The same for the steps of $1 sequences decoded together after a prompt of ${2:-289} tokens each: llama-batched-bench
# (prepare with PEERS holding it) in one KV buffer, or a stream per sequence where KVU=0, into
# $RES/batched-steps-$1[-streams].json. The shape of bench cameras' ceiling step.
batched_kernels() {
  local n=$1 pp=${2:-289} kvu=(-kvu) tag=""
  [ "${KVU:-1}" = 0 ] && { kvu=(); tag=-streams; }
  log "batched decode kernels: $n sequences after $pp tokens${tag}"
  [ -x build/native/bin/llama-batched-bench ] || { log "no llama-batched-bench: PEERS=\"llama-bench llama-batched-bench\" prepare"; return 1; }
  nsys_trace bt --cuda-graph-trace=node build/native/bin/llama-batched-bench -m "$M" -ngl 99 -fa on -c $((n * (pp + 40))) \
    -b 4096 -ub 4096 -npp $pp -ntg 24 -npl $n "${kvu[@]}" || return 1
  python3 tools/device/decode-steps.py /tmp/bt.sqlite > $RES/batched-steps-$n$tag.json 2>> $OUT/err.txt
  cat $RES/batched-steps-$n$tag.json | tee -a $OUT/log.txt
}

# How busy the GPU was through a `bench cameras` run (16 x 10 Hz for 6 s, $1 image tokens, together; nsys, graphs node by
# node): gpu-busy.py's share of each 500 ms that some kernel ran, per CUDA stream (decoder, encoder, the ceiling's
# context), into $RES/cameras-busy-$1.json. Tracing slows the host: compare shares, not the run's actions/s.
cameras_busy() {
  log "GPU busy through bench cameras, $1 tokens"
  nsys_trace cams --cuda-graph-trace=node $P bench cameras --cameras 16 --fps 10 --seconds 6 --image-tokens $1 --budget-ms 1000 \
    -m "$M" -e "$E" --gpu-layers 99 --admit together --json || return 1
  python3 tools/device/gpu-busy.py /tmp/cams.sqlite --bin 500 > $RES/cameras-busy-$1.json 2>> $OUT/err.txt
  cat $RES/cameras-busy-$1.json | tee -a $OUT/log.txt
}

# Per-kernel times of a prefill of $1 sequences of $2 positions in one KV buffer and one ubatch (the shape of bench
# cameras' ceiling): nsys over llama-perplexity (prepare with PEERS holding it) reading three such ubatches, graphs
# traced node by node, percept's matmul path unless the caller sets its variables; the last ubatch's kernels by kind
# (kernel-summary.py) into $RES/seqs-kernels-$1x$2.txt. The first ubatch also makes the F16 weight copies.
seqs_kernels() {
  local n=$1 p=$2
  log "kernels of $n x $p in one ubatch"
  [ -x build/native/bin/llama-perplexity ] || { log "no llama-perplexity: PEERS=\"llama-bench llama-perplexity\" prepare"; return 1; }
  cat docs/*.md native/README.md pipeline/README.md app/README.md > /tmp/text.txt
  # The addon loader's defaults (native/binding.ts) for this program started outside percept; the caller's win.
  ( eval "$(node --import tsx --input-type=module -e "const b = await import('./native/binding.ts');
      for (const [k, v] of Object.entries(b.CUDA_PATCH_DEFAULTS)) console.log('export ' + k + '=\${' + k + '-' + v + '}');")"
    nsys_trace seqs --cuda-graph-trace=node build/native/bin/llama-perplexity -m "$M" -f /tmp/text.txt -ngl 99 -fa on \
      -c $p -b $((n * p)) -ub $((n * p)) -kvu --chunks $((3 * n)) ) || return 1
  python3 tools/device/kernel-summary.py /tmp/seqs.sqlite --last-of 3 > $RES/seqs-kernels-${n}x$p.txt 2>> $OUT/err.txt
  head -12 $RES/seqs-kernels-${n}x$p.txt | tee -a $OUT/log.txt
}
