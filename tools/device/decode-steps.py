#!/usr/bin/env python3
# nsys's trace of decode steps (llama-bench's or llama-batched-bench's: `decode_kernels`, `batched_kernels` in
# setup.sh), exported to SQLite: the steps are runs of kernels apart by more than 200 us. Per step of the last six: its
# kernels, GPU span and summed kernel time; the host's time between steps; their kernel time by kind (nsys_kernels.py's
# kinds) and the top kernels, in ms a step. Kernel times overlap under programmatic dependent launch, so their sum may
# pass the span.
#   python3 tools/device/decode-steps.py trace.sqlite
import json, sys
from collections import defaultdict
from nsys_kernels import kernel_rows, kind

rows = [(start, end, name) for start, end, _, name in kernel_rows(sys.argv[1])]
steps, cur = [], [rows[0]]
for r in rows[1:]:
    if r[0] - cur[-1][1] > 200_000:
        steps.append(cur)
        cur = [r]
    else:
        cur.append(r)
steps.append(cur)
last = steps[-6:]
out = {'kernels': len(rows), 'steps': len(steps), 'last': []}
for s in last:
    out['last'].append({'kernels': len(s), 'span_ms': round((s[-1][1] - s[0][0]) / 1e6, 3),
                        'kernel_ms': round(sum(e - b for b, e, _ in s) / 1e6, 3)})
out['between_steps_ms'] = [round((steps[i + 1][0][0] - steps[i][-1][1]) / 1e6, 3) for i in range(len(steps) - 7, len(steps) - 1) if i >= 0]
by_kind, by_name = defaultdict(float), defaultdict(float)
for s in last:
    for b, e, name in s:
        by_kind[kind(name)] += (e - b) / 1e6 / len(last)
        by_name[name[:90]] += (e - b) / 1e6 / len(last)
out['kind_ms_per_step'] = {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda x: -x[1])}
out['top_ms_per_step'] = {k: round(v, 3) for k, v in sorted(by_name.items(), key=lambda x: -x[1])[:8]}
print(json.dumps(out))
