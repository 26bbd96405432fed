#!/usr/bin/env bash
# bench cameras (16 x 10 Hz, together) under variants of one setting at a time, to see what moves actions/s.
# VARIANTS: "name:tokens:options" entries (options with commas for spaces), e.g. "wait20:70:--encode-wait-ms,20".
set -uo pipefail
OUT=${1:?OUT}; RES=/tmp/res; source tools/device/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $OUT/log.txt
prepare || exit 1
for v in ${VARIANTS:-base70:70: proj70:70:-e,projection base280:280: proj280:280:-e,projection}; do
  IFS=: read -r name tokens options <<< "$v"
  [ $(el) -lt ${STOP_AT:-540} ] || { log "skip $name (time)"; continue; }
  # shellcheck disable=SC2086
  bench_cameras $name $tokens together ${options//,/ }
  keep
done
log "done"
