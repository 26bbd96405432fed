#!/usr/bin/env python3
# How busy the GPU was, from nsys's SQLite export of a whole run (`bench cameras` under `nsys_trace` in setup.sh): per
# bin of --bin ms (default 1000), the share of it some kernel ran, and per CUDA stream (the decoder's context and the
# encoder each have their own) its share and kernels. Streams are named by their most-timed kernel.
#   python3 tools/device/gpu-busy.py trace.sqlite [--bin 1000]
import json, sys
from collections import defaultdict
from nsys_kernels import kernel_rows

args = sys.argv[1:]
bin_ns = int(float(args[args.index('--bin') + 1]) * 1e6) if '--bin' in args else 1_000_000_000
rows = kernel_rows(args[0])
t0 = rows[0][0]


def busy(intervals):
    """ns covered by the union of (start, end) intervals sorted by start, per bin."""
    per = defaultdict(int)
    cur_s, cur_e = None, None
    def add(s, e):
        while s < e:
            b = (s - t0) // bin_ns
            edge = t0 + (b + 1) * bin_ns
            per[b] += min(e, edge) - s
            s = min(e, edge)
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None: add(cur_s, cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None: add(cur_s, cur_e)
    return per


streams = defaultdict(list)
names = defaultdict(lambda: defaultdict(int))
for s, e, sid, name in rows:
    streams[sid].append((s, e))
    names[sid][name[:60]] += e - s
every = busy([(s, e) for s, e, _, _ in rows])
per_stream = {sid: busy(iv) for sid, iv in streams.items()}
nbins = (rows[-1][1] - t0) // bin_ns + 1
out = {'bin_ms': bin_ns / 1e6, 'span_ms': round((rows[-1][1] - t0) / 1e6, 1), 'kernels': len(rows), 'streams': {}, 'bins': []}
for sid, iv in streams.items():
    top = max(names[sid].items(), key=lambda x: x[1])[0]
    out['streams'][str(sid)] = {'kernels': len(iv), 'busy_ms': round(sum(per_stream[sid].values()) / 1e6, 1), 'top_kernel': top}
for b in range(nbins):
    out['bins'].append({'busy': round(every[b] / bin_ns, 3), **{str(sid): round(per_stream[sid][b] / bin_ns, 3) for sid in streams}})
print(json.dumps(out))
