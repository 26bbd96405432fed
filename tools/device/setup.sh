# Sourced by every device script: node on the PATH, node_modules and build/llama.cpp unpacked once per machine,
# the CUDA addon built once (the build stays on a warm machine between calls).
T0=${T0:-$(date +%s)}
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[+$(el)s] $*" | tee -a "$OUT/log.txt"; }
mkdir -p "$OUT" /tmp/nodebin
[ -x /tmp/nodebin/node ] || { xz -dc .carry/device/node.xz > /tmp/nodebin/node && chmod +x /tmp/nodebin/node; }
export PATH=/tmp/nodebin:$PATH
[ -d node_modules/rxjs ] || { tar -xJf .carry/device/tree.tar.xz && log "unpacked"; }
P="node --import tsx app/cli.ts"
MODEL='synth:gemma4-e4b?wtype=q4_k'
MMPROJ='synth:gemma4-vision-e4b-mmproj?dtype=f16'
synth() { node --import tsx --input-type=module -e "const {resolveModel}=await import('./models/resolve.ts'); for (const [s,k] of [['$MODEL','decoder'],['$MMPROJ','mmproj']]) console.log((k==='decoder'?'M=':'E=')+await resolveModel(s,k));"; }
build() {
  if grep -q "GGML_CUDA:BOOL=ON" build/native/CMakeCache.txt 2>/dev/null && [ -f build/native/Release/percept.node ]; then return 0; fi
  PERCEPT_CUDA=1 PERCEPT_BUILD_JOBS=16 PERCEPT_PEERS=llama-bench node tools/build-native.mjs > /tmp/build.log 2>&1 || { tail -40 /tmp/build.log | tee -a "$OUT/log.txt"; return 1; }
}
